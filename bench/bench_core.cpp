// bench_core: the library's per-message path without MQTT. Calls Consumer::handle with
// the ledger handler (ledger::CreditHandler) for --count messages with random UUID ids,
// on one thread, exactly as the Subscriber would from Paho's callback. Used for:
//   - scale: --prefill M first puts M retained ids in inbox_processed (one big
//     transaction, synchronous=OFF, prepared statement, keys inserted in order), then
//     measures; compare with an empty table.
//   - flash wear: counts what SQLite writes (counting VFS: WAL bytes, frames, database
//     bytes from checkpoints, fsyncs), what the process dirtied (/proc/self/io
//     write_bytes) and the device's sectors written, per message. Levers: --page-size,
//     --id, --metadata, --autocheckpoint.
//
//   bench_core --db /tmp/c.db --sync full --count 20000 [--prefill 10000000 --reuse]
#include <SQLiteCpp/SQLiteCpp.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <random>

#include <mqtt_inbox/mqtt_inbox.h>

#include "bench_util.h"
#include "ledger.h"

namespace {

// Creates a database the Inbox will accept (schema.sql applied, WAL) with `page_size`,
// and inserts `prefill` claim rows in key order in one transaction.
void create_db(const std::string& path, int page_size, int64_t prefill) {
  SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  db.exec("PRAGMA page_size = " + std::to_string(page_size));
  db.exec("PRAGMA auto_vacuum = INCREMENTAL");
  db.exec("PRAGMA journal_mode = OFF");
  db.exec("PRAGMA synchronous = OFF");
  db.exec("PRAGMA cache_size = -262144");  // 256 MiB for the fill only
  db.exec(mqtt_inbox::schema_sql());
  if (prefill > 0) {
    const int64_t t0 = bench::now_ns();
    std::mt19937_64 rng(7);
    SQLite::Transaction tx(db);
    SQLite::Statement ins(db,
                          "INSERT INTO inbox_processed (consumer_name, message_id, received_at,"
                          " topic, payload_hash) VALUES ('ledger', ?1, ?2, 'bench/credits', ?3)");
    const uint64_t step = UINT64_MAX / static_cast<uint64_t>(prefill);
    const int64_t t_base = 1700000000000LL;
    char id[40];
    for (int64_t k = 0; k < prefill; ++k) {
      // UUID-shaped ids whose 64-bit head grows with k: key order = insertion order, and
      // the measured (random) ids land uniformly between them.
      const uint64_t a = static_cast<uint64_t>(k) * step, b = rng();
      std::snprintf(id, sizeof id, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                    static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xffff),
                    static_cast<unsigned>(b >> 48),
                    static_cast<unsigned long long>(b & 0xffffffffffffULL));
      ins.bind(1, id);
      ins.bind(2, t_base + k / 100);  // ~100 messages per ms of history
      ins.bind(3, static_cast<int64_t>(rng()));
      ins.exec();
      ins.reset();
    }
    tx.commit();
    std::fprintf(stderr, "prefill: %lld rows in %.1f s\n", static_cast<long long>(prefill),
                 (bench::now_ns() - t0) / 1e9);
  }
  db.exec("PRAGMA journal_mode = WAL");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Consumer::handle throughput, scale and write volume (mqtt-inbox benchmark)"};
  std::string db_path, sync = "full", id_kind = "uuid", label = "core";
  int count = 20000, page_size = 4096, autocheckpoint = 1000;
  int64_t prefill = 0;
  bool reuse = false, keep = false, metadata = false;
  app.add_option("--db", db_path, "Database file")->required();
  app.add_option("--sync", sync)->check(CLI::IsMember({"full", "normal"}));
  app.add_option("--count", count, "Messages");
  app.add_option("--prefill", prefill, "Retained ids put in inbox_processed first");
  app.add_flag("--reuse", reuse, "Keep an existing --db that already holds >= --prefill ids");
  app.add_flag("--keep", keep, "Keep the database afterwards");
  app.add_option("--page-size", page_size, "page_size of a new file");
  app.add_option("--id", id_kind, "uuid | seq")->check(CLI::IsMember({"uuid", "seq"}));
  app.add_flag("--metadata", metadata, "InboxOptions::record_metadata = true (default false)");
  app.add_option("--autocheckpoint", autocheckpoint, "InboxOptions::wal_autocheckpoint_pages");
  app.add_option("--label", label, "Name in the JSON line");
  CLI11_PARSE(app, argc, argv);

  bool have = false;
  if (reuse && std::filesystem::exists(db_path)) {
    SQLite::Database db(db_path);
    have = db.execAndGet("SELECT count(*) FROM inbox_processed").getInt64() >= prefill;
  }
  if (!have) {
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path + suffix);
    create_db(db_path, page_size, prefill);
  }

  bench::register_counting_vfs();
  auto log =
      std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
  mqtt_inbox::InboxOptions io;
  io.logger = log;
  io.vfs = "counting";
  io.synchronous =
      sync == "full" ? mqtt_inbox::Synchronous::kFull : mqtt_inbox::Synchronous::kNormal;
  io.record_metadata = metadata;
  io.wal_autocheckpoint_pages = autocheckpoint;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(db_path, io, &inbox); !s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.to_string().c_str());
    return 1;
  }
  int64_t rows_before = 0;
  inbox->with_connection([&](SQLite::Database& db) {
    ledger::create_tables(db);
    rows_before = db.execAndGet("SELECT count(*) FROM inbox_processed").getInt64();
    db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  });
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  if (auto s = mqtt_inbox::Consumer::create(inbox.get(), "ledger", ledger::CreditHandler{}, {},
                                            &consumer);
      !s.ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.to_string().c_str());
    return 1;
  }

  std::mt19937_64 rng(static_cast<uint64_t>(bench::now_ns()));
  std::vector<mqtt_inbox::Message> msgs(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const std::string id =
        id_kind == "uuid" ? bench::uuid_like(rng) : "credit-" + std::to_string(i);
    msgs[i].topic = "bench/credits";
    msgs[i].payload = R"({"message_id":")" + id + R"(","account":"acct-)" + std::to_string(i % 10) +
                      R"(","amount":)" + std::to_string(i % 1000 + 1) + "}";
  }

  bench::vfs_counters().reset();
  const int64_t wb0 = bench::proc_write_bytes(), dev0 = bench::device_write_bytes(db_path);
  const int64_t t0 = bench::now_ns();
  int processed = 0;
  for (const auto& m : msgs)
    if (consumer->handle(m) == mqtt_inbox::Outcome::kProcessed) ++processed;
  const int64_t t1 = bench::now_ns();
  const int64_t wb1 = bench::proc_write_bytes(), dev1 = bench::device_write_bytes(db_path);
  const auto& c = bench::vfs_counters();
  const double secs = (t1 - t0) / 1e9;
  int actual_page_size = 0;
  inbox->with_connection(
      [&](SQLite::Database& db) { actual_page_size = db.execAndGet("PRAGMA page_size").getInt(); });
  const double n = count;
  bench::Json()
      .add("bench", "core")
      .add("label", label)
      .add("sync", sync)
      .add("count", count)
      .add("processed", processed)
      .add("retained_before", rows_before)
      .add("page_size", actual_page_size)
      .add("id", id_kind)
      .add("metadata", metadata)
      .add("autocheckpoint", autocheckpoint)
      .add("seconds", secs)
      .add("msgs_per_s", n / secs)
      .add("us_per_msg", secs * 1e6 / n)
      .add("proc_write_bytes_per_msg", (wb1 - wb0) / n)
      .add("device_write_bytes_per_msg", dev0 < 0 ? -1.0 : (dev1 - dev0) / n)
      .add("vfs_wal_bytes_per_msg", c.wal_write_bytes / n)
      .add("vfs_wal_frames_per_msg", c.wal_write_bytes / n / (actual_page_size + 24))
      .add("vfs_db_bytes_per_msg", c.db_write_bytes / n)
      .add("wal_syncs_per_msg", c.wal_syncs / n)
      .add("db_syncs_per_msg", c.db_syncs / n)
      .add("fsyncs_per_msg", (c.wal_syncs + c.db_syncs) / n)
      .print();
  std::fprintf(stderr,
               "core[%s] sync=%s retained=%lld page=%d id=%s: %d msgs in %.2f s = %.0f msg/s; "
               "write_bytes/msg=%.0f (WAL %.0f B = %.2f frames, db %.0f B, %.2f fsync)\n",
               label.c_str(), sync.c_str(), static_cast<long long>(rows_before), actual_page_size,
               id_kind.c_str(), count, secs, n / secs, (wb1 - wb0) / n, c.wal_write_bytes / n,
               c.wal_write_bytes / n / (actual_page_size + 24), c.db_write_bytes / n,
               (c.wal_syncs + c.db_syncs) / n);
  consumer.reset();  // its handler's statements belong to the inbox's connection
  inbox.reset();
  if (!keep)
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path + suffix);
  return processed == count ? 0 : 1;
}

// bench_raw_sqlite: the limit. A plain SQLite loop, one commit per message, no library,
// no MQTT:
//   BEGIN IMMEDIATE;
//   INSERT INTO inbox_processed (...) ON CONFLICT DO NOTHING;     -- the claim
//   INSERT INTO accounts ... ON CONFLICT DO UPDATE balance += ?;  -- the credit
//   INSERT INTO ledger_entries ...;                               -- the append
//   COMMIT;
// --shape minimal (the reference of issue 14): the claim table is PRIMARY KEY
//   (consumer_name, message_id) WITHOUT ROWID and nothing else: no secondary index, no
//   metadata columns filled, auto_vacuum NONE (SQLite's default).
// --shape inbox: the claim table as the inbox's schema version 3 had it (received_at
//   index, topic + payload hash filled, auto_vacuum INCREMENTAL).
// Each part can be switched on its own (--index, --metadata, --rowid, --auto-vacuum) to
// measure what it costs in WAL frames per message. Other flash-wear levers: --page-size,
// --id, --autocheckpoint. Prints one JSON line and a human summary.
//
//   bench_raw_sqlite --db /var/tmp/x.db --shape minimal --sync full --count 20000
#include <SQLiteCpp/SQLiteCpp.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <random>

#include "bench_util.h"

int main(int argc, char** argv) {
  CLI::App app{"Raw SQLite loop with the ledger transaction shape (mqtt-inbox benchmark)"};
  std::string db_path, sync = "full", id_kind = "uuid", label = "raw", shape = "inbox", auto_vacuum;
  int count = 20000, page_size = 4096, accounts = 10, autocheckpoint = 1000;
  bool metadata = true, rowid = false, keep = false, index = true, received_at = true;
  app.add_option("--db", db_path, "Database file (deleted first)")->required();
  app.add_option("--sync", sync, "full|normal")->check(CLI::IsMember({"full", "normal"}));
  app.add_option("--count", count, "Messages (commits)");
  app.add_option("--page-size", page_size, "PRAGMA page_size for the new file");
  app.add_option("--id", id_kind, "uuid (36-char text) | seq (credit-N) | blob16 (16 bytes)")
      ->check(CLI::IsMember({"uuid", "seq", "blob16"}));
  app.add_option("--shape", shape, "minimal | inbox (sets the defaults of the four below)")
      ->check(CLI::IsMember({"minimal", "inbox"}));
  app.add_option("--metadata", metadata, "Store topic and payload hash in the claim row (1/0)");
  app.add_option("--received-at", received_at, "received_at column (retention time) (1/0)");
  app.add_option("--index", index, "Secondary index on received_at (1/0)");
  app.add_option("--auto-vacuum", auto_vacuum, "none | incremental")
      ->check(CLI::IsMember({"none", "incremental"}));
  app.add_option("--rowid", rowid, "Claim table as a rowid table + unique index (1/0)");
  app.add_option("--autocheckpoint", autocheckpoint, "PRAGMA wal_autocheckpoint (pages)");
  app.add_option("--accounts", accounts, "Accounts credited round-robin");
  app.add_option("--label", label, "Name in the JSON line");
  app.add_flag("--keep", keep, "Keep the database file afterwards");
  CLI11_PARSE(app, argc, argv);
  const bool minimal = shape == "minimal";
  if (!app.count("--metadata")) metadata = !minimal;
  if (!app.count("--index")) index = !minimal;
  if (!app.count("--received-at")) received_at = !minimal || index;
  if (index && !received_at) {
    std::fprintf(stderr, "--index 1 needs --received-at 1\n");
    return 2;
  }
  if (auto_vacuum.empty()) auto_vacuum = minimal ? "none" : "incremental";

  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path + suffix);
  bench::register_counting_vfs();
  SQLite::Database db(db_path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE, 5000, "counting");
  db.exec("PRAGMA page_size = " + std::to_string(page_size));
  if (auto_vacuum == "incremental") db.exec("PRAGMA auto_vacuum = INCREMENTAL");
  db.exec("PRAGMA journal_mode = WAL");
  db.exec(std::string("PRAGMA synchronous = ") + (sync == "full" ? "FULL" : "NORMAL"));
  db.exec("PRAGMA wal_autocheckpoint = " + std::to_string(autocheckpoint));
  db.exec("PRAGMA journal_size_limit = 4194304");
  db.exec("PRAGMA cache_size = -2048");
  const char* id_type = id_kind == "blob16" ? "BLOB" : "TEXT";
  std::string columns =
      std::string("consumer_name TEXT NOT NULL, message_id ") + id_type + " NOT NULL";
  std::string insert = "consumer_name, message_id", values = "?1, ?2";
  if (received_at) {
    columns += ", received_at INTEGER NOT NULL";
    insert += ", received_at";
    values += ", ?3";
  }
  if (metadata) {
    columns += ", topic TEXT, message_type TEXT, correlation_id TEXT, payload_hash INTEGER";
    insert += ", topic, payload_hash";
    values += ", ?4, ?5";
  }
  db.exec("CREATE TABLE inbox_processed (" + columns +
          (rowid ? std::string(", UNIQUE (consumer_name, message_id))")
                 : std::string(", PRIMARY KEY (consumer_name, message_id)) WITHOUT ROWID")));
  if (index) db.exec("CREATE INDEX inbox_processed_received_at ON inbox_processed (received_at)");
  db.exec("CREATE TABLE accounts (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)");
  db.exec(
      "CREATE TABLE ledger_entries (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL,"
      " account TEXT NOT NULL, amount INTEGER NOT NULL)");

  SQLite::Statement claim(db, "INSERT INTO inbox_processed (" + insert + ") VALUES (" + values +
                                  ") ON CONFLICT (consumer_name, message_id) DO NOTHING");
  SQLite::Statement credit(db,
                           "INSERT INTO accounts (account, balance) VALUES (?1, ?2)"
                           " ON CONFLICT (account) DO UPDATE SET balance = balance + ?2");
  SQLite::Statement entry(db,
                          "INSERT INTO ledger_entries (message_id, account, amount)"
                          " VALUES (?1, ?2, ?3)");
  SQLite::Statement begin(db, "BEGIN IMMEDIATE");
  SQLite::Statement commit(db, "COMMIT");

  std::mt19937_64 rng(42);
  std::vector<std::string> ids(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    if (id_kind == "seq") {
      ids[i] = "credit-" + std::to_string(i);
    } else if (id_kind == "uuid") {
      ids[i] = bench::uuid_like(rng);
    } else {
      ids[i].resize(16);
      for (auto& c : ids[i]) c = static_cast<char>(rng());
    }
  }
  std::vector<std::string> account_names;
  for (int a = 0; a < accounts; ++a) account_names.push_back("acct-" + std::to_string(a));

  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  bench::vfs_counters().reset();
  const int64_t wb0 = bench::proc_write_bytes();
  const int64_t t0 = bench::now_ns();
  for (int i = 0; i < count; ++i) {
    begin.exec();
    begin.reset();
    claim.bind(1, "ledger");
    if (id_kind == "blob16")
      claim.bind(2, ids[i].data(), 16);
    else
      claim.bind(2, ids[i]);
    if (received_at) claim.bind(3, static_cast<int64_t>(1700000000000LL + i));
    if (metadata) {
      claim.bind(4, "bench/credits");
      claim.bind(5, static_cast<int64_t>(rng()));
    }
    claim.exec();
    claim.reset();
    if (db.getChanges() == 0) {
      db.exec("ROLLBACK");
      continue;
    }
    const int64_t amount = static_cast<int64_t>(i % 1000) + 1;
    const std::string& acct = account_names[static_cast<size_t>(i % accounts)];
    credit.bind(1, acct);
    credit.bind(2, amount);
    credit.exec();
    credit.reset();
    entry.bind(1, id_kind == "blob16" ? std::string("b") + std::to_string(i) : ids[i]);
    entry.bind(2, acct);
    entry.bind(3, amount);
    entry.exec();
    entry.reset();
    commit.exec();
    commit.reset();
  }
  const int64_t t1 = bench::now_ns();
  const int64_t wb1 = bench::proc_write_bytes();
  const auto& c = bench::vfs_counters();
  const double secs = static_cast<double>(t1 - t0) / 1e9;
  const double rate = count / secs;
  const int64_t db_bytes = std::filesystem::file_size(db_path);

  bench::Json()
      .add("bench", "raw_sqlite")
      .add("label", label)
      .add("sync", sync)
      .add("count", count)
      .add("shape", shape)
      .add("index", index)
      .add("received_at", received_at)
      .add("auto_vacuum", auto_vacuum)
      .add("page_size", page_size)
      .add("id", id_kind)
      .add("metadata", metadata)
      .add("rowid", rowid)
      .add("autocheckpoint", autocheckpoint)
      .add("seconds", secs)
      .add("msgs_per_s", rate)
      .add("us_per_msg", secs * 1e6 / count)
      .add("proc_write_bytes_per_msg", static_cast<double>(wb1 - wb0) / count)
      .add("vfs_wal_bytes_per_msg", static_cast<double>(c.wal_write_bytes) / count)
      .add("vfs_wal_frames_per_msg",
           static_cast<double>(c.wal_write_bytes) / (page_size + 24) / count)
      .add("vfs_db_bytes_per_msg", static_cast<double>(c.db_write_bytes) / count)
      .add("wal_syncs_per_msg", static_cast<double>(c.wal_syncs) / count)
      .add("db_syncs_per_msg", static_cast<double>(c.db_syncs) / count)
      .add("fsyncs_per_msg", static_cast<double>(c.wal_syncs + c.db_syncs) / count)
      .add("db_file_bytes", db_bytes)
      .print();
  std::fprintf(stderr,
               "raw_sqlite[%s] shape=%s sync=%s page=%d id=%s: %d msgs in %.2f s = %.0f msg/s; "
               "write_bytes/msg=%.0f (WAL %.0f B = %.2f frames, db %.0f B, %.2f fsync)\n",
               label.c_str(), shape.c_str(), sync.c_str(), page_size, id_kind.c_str(), count, secs,
               rate, static_cast<double>(wb1 - wb0) / count,
               static_cast<double>(c.wal_write_bytes) / count,
               static_cast<double>(c.wal_write_bytes) / (page_size + 24) / count,
               static_cast<double>(c.db_write_bytes) / count,
               static_cast<double>(c.wal_syncs + c.db_syncs) / count);
  if (!keep)
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path + suffix);
  return 0;
}

// handwritten_consumer: the peer mqtt-inbox is measured against (issue 14). The consumer a
// competent user writes in an afternoon without the library: Paho C++ async_client and
// SQLiteCpp, the commit inside Paho's message callback (so the PUBACK follows it), and per
// message
//   BEGIN IMMEDIATE;
//   INSERT INTO processed ... ON CONFLICT DO NOTHING;          -- the claim
//   INSERT INTO accounts ... ON CONFLICT DO UPDATE balance += ?;  -- the credit
//   INSERT INTO ledger_entries ...;                               -- the append
//   COMMIT;
// Statements are prepared once; the payload is parsed once with nlohmann-json. It has no
// dead letters, no attempt counting, no retention, no stats: a payload it cannot read is
// logged and acked, a store error aborts the process (no PUBACK, the broker redelivers).
// Its claim table is the minimal raw transaction's (bench_raw_sqlite --shape minimal):
// PRIMARY KEY (consumer, message_id) WITHOUT ROWID, nothing else.
//
// It is exactly-once under SIGKILL like the library (tests/crash/handwritten_peer_test.cpp kills
// it mid-stream and between commit and PUBACK), so the comparison is between equals.
//
//   handwritten_consumer --broker URI --topic T --client-id C --db F --count N
//                        [--sync full|normal] [--phase setup|run] [--label L]
//                        [--ready-file F] [--keep] [--crash-after-commit ID] [--synthetic]
// --phase setup: connect with a persistent session, subscribe, disconnect.
// --phase run: consume until --count messages committed (or seen as duplicates), print one
//   JSON line (the bench_util Drain figures) and a summary; with --count 0, run until
//   SIGTERM (the crash test's mode).
// --crash-after-commit ID: SIGKILL itself after ID's commit, before the callback returns.
// --synthetic: the callback ignores the payload and commits the same transaction for a
//   generated id (random UUIDs as bench_raw_sqlite's, accounts round-robin): the raw loop
//   inside Paho's callback and nothing else: the least work a consumer that commits in the
//   callback (the PUBACK after the commit) can do. scripts/bench.sh measures it as the
//   "Paho limit" beside the raw loop. Not exactly-once (the id is not the
//   message's); a benchmark reference only. Every delivery must commit (a generated id
//   that conflicts would skip the commit and its fsync, and flatter the limit): it aborts
//   if one does not, and takes neither --keep nor --count 0.
#include <SQLiteCpp/SQLiteCpp.h>
#include <mqtt/async_client.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "bench_util.h"

namespace {

struct Store {
  SQLite::Database db;
  SQLite::Statement begin, commit, rollback, claim, credit, entry;
  Store(const std::string& path, bool full, const std::string& vfs)
      : db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE, 5000, vfs),
        begin(init(db, full), "BEGIN IMMEDIATE"),
        commit(db, "COMMIT"),
        rollback(db, "ROLLBACK"),
        claim(db,
              "INSERT INTO processed (consumer, message_id) VALUES ('ledger', ?1)"
              " ON CONFLICT (consumer, message_id) DO NOTHING"),
        credit(db,
               "INSERT INTO accounts (account, balance) VALUES (?1, ?2)"
               " ON CONFLICT (account) DO UPDATE SET balance = balance + ?2"),
        entry(db, "INSERT INTO ledger_entries (message_id, account, amount) VALUES (?1, ?2, ?3)") {}

  static SQLite::Database& init(SQLite::Database& db, bool full) {
    db.exec("PRAGMA journal_mode = WAL");
    db.exec(full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
    db.exec(
        "CREATE TABLE IF NOT EXISTS processed (consumer TEXT NOT NULL, message_id TEXT NOT NULL,"
        "  PRIMARY KEY (consumer, message_id)) WITHOUT ROWID;"
        "CREATE TABLE IF NOT EXISTS accounts (account TEXT PRIMARY KEY, balance INTEGER NOT NULL);"
        "CREATE TABLE IF NOT EXISTS ledger_entries (id INTEGER PRIMARY KEY,"
        "  message_id TEXT NOT NULL, account TEXT NOT NULL, amount INTEGER NOT NULL)");
    return db;
  }

  static void run(SQLite::Statement& s) {
    s.exec();
    s.reset();
  }

  // True if the credit committed now, false if it was a duplicate.
  bool apply(const std::string& id, const std::string& account, int64_t amount) {
    run(begin);
    try {
      claim.bind(1, id);
      run(claim);
      if (db.getChanges() == 0) {
        run(rollback);
        return false;
      }
      credit.bind(1, account);
      credit.bind(2, amount);
      run(credit);
      entry.bind(1, id);
      entry.bind(2, account);
      entry.bind(3, amount);
      run(entry);
      run(commit);
      return true;
    } catch (...) {
      (void)db.tryExec("ROLLBACK");
      throw;
    }
  }
};

volatile std::sig_atomic_t g_stop = 0;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Hand-written exactly-once ledger consumer (the mqtt-inbox benchmark's peer)"};
  std::string phase = "run", broker, topic, client_id, db_path, sync = "full", label, ready_file,
              crash_after_commit, vfs = "counting";
  int count = 20000, timeout_s = 600;
  bool keep = false, synthetic = false;
  app.add_option("--phase", phase)->check(CLI::IsMember({"setup", "run"}));
  app.add_option("--broker", broker)->required();
  app.add_option("--topic", topic)->required();
  app.add_option("--client-id", client_id)->required();
  app.add_option("--db", db_path, "Database file (deleted first unless --keep)");
  app.add_option("--sync", sync)->check(CLI::IsMember({"full", "normal"}));
  app.add_option("--count", count, "Messages to wait for (0 = until SIGTERM)");
  app.add_option("--timeout", timeout_s, "Give up after this many seconds");
  app.add_option("--label", label, "Name in the JSON line");
  app.add_option("--ready-file", ready_file, "Touched once connected");
  app.add_option("--vfs", vfs, "SQLite VFS: counting (measures writes) or default ('')");
  app.add_flag("--keep", keep, "Keep an existing database (restarts in the crash test)");
  app.add_option("--crash-after-commit", crash_after_commit, "Test switch, see the header");
  app.add_flag("--synthetic", synthetic,
               "Commit generated ids, ignoring the payload: the Paho limit (needs --count > 0, "
               "no --keep; see the header)");
  CLI11_PARSE(app, argc, argv);
  if (label.empty()) label = "handwritten_" + sync;
  if (synthetic && (keep || count <= 0)) {
    std::fprintf(stderr, "--synthetic takes a --count > 0 and no --keep\n");
    return 2;
  }

  auto connect_opts = mqtt::connect_options_builder()
                          .mqtt_version(MQTTVERSION_3_1_1)
                          .clean_session(false)
                          .finalize();
  if (phase == "setup") {
    mqtt::async_client cli(broker, client_id, mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
    try {
      cli.connect(connect_opts)->wait();
      cli.subscribe(topic, 1)->wait();
      cli.disconnect()->wait();
    } catch (const mqtt::exception& e) {
      std::fprintf(stderr, "handwritten setup: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (db_path.empty()) {
    std::fprintf(stderr, "--db is required\n");
    return 2;
  }
  if (!keep)
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path + suffix);
  if (vfs == "counting") bench::register_counting_vfs();
  Store store(db_path, sync == "full", vfs);

  bench::Drain drain(count > 0 ? count : INT64_MAX);
  int64_t processed = 0, duplicates = 0, undecodable = 0;
  // --synthetic: what the callback commits, made before the clock starts.
  std::vector<std::string> synthetic_ids;
  const std::vector<std::string> synthetic_accounts = {"acct-0", "acct-1", "acct-2", "acct-3",
                                                       "acct-4", "acct-5", "acct-6", "acct-7",
                                                       "acct-8", "acct-9"};
  std::mt19937_64 synthetic_rng(42);
  if (synthetic) {
    synthetic_ids.reserve(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) synthetic_ids.push_back(bench::uuid_like(synthetic_rng));
  }
  size_t next_synthetic = 0;
  mqtt::async_client cli(broker, client_id, mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
  cli.set_message_callback([&](mqtt::const_message_ptr m) {
    // What to commit: the payload's fields, or with --synthetic the next generated ones
    // (no parsing; more deliveries than --count, none in a drain, get a new id each).
    std::string parsed_id, parsed_account;
    int64_t amount = 0;
    size_t i = 0;
    if (synthetic) {
      i = next_synthetic++;
      if (i >= synthetic_ids.size()) synthetic_ids.push_back(bench::uuid_like(synthetic_rng));
      amount = static_cast<int64_t>(i % 1000) + 1;
    } else {
      try {
        const auto j = nlohmann::json::parse(m->get_payload());
        parsed_id = j.at("message_id").get<std::string>();
        parsed_account = j.at("account").get<std::string>();
        amount = j.at("amount").get<int64_t>();
      } catch (const nlohmann::json::exception& e) {
        std::fprintf(stderr, "handwritten: skipping an unreadable payload: %s\n", e.what());
        ++undecodable;
        return;  // acked: nothing to store
      }
    }
    const std::string& id = synthetic ? synthetic_ids[i] : parsed_id;
    const std::string& account = synthetic ? synthetic_accounts[i % 10] : parsed_account;
    bool committed = false;
    try {
      committed = store.apply(id, account, amount);
    } catch (const std::exception& e) {
      // Returning would ack a message that is not stored: die, the broker redelivers.
      std::fprintf(stderr, "handwritten: store error on %s: %s\n", id.c_str(), e.what());
      std::abort();
    }
    if (committed) {
      ++processed;
    } else if (synthetic) {  // a skipped commit would flatter the limit (see the header)
      std::fprintf(stderr, "handwritten --synthetic: id %zu conflicted; nothing committed\n", i);
      std::abort();
    } else {
      ++duplicates;
    }
    if (id == crash_after_commit) std::raise(SIGKILL);
    drain.one();
  });
  try {
    auto tok = cli.connect(connect_opts);
    tok->wait();
    if (!tok->get_connect_response().is_session_present()) cli.subscribe(topic, 1)->wait();
  } catch (const mqtt::exception& e) {
    std::fprintf(stderr, "handwritten: %s\n", e.what());
    return 1;
  }
  if (!ready_file.empty()) std::ofstream(ready_file) << "ready\n";

  if (count == 0) {
    std::signal(SIGTERM, [](int) { g_stop = 1; });
    while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } else if (!drain.wait(timeout_s)) {
    std::fprintf(stderr, "handwritten: timeout after %lld of %d\n",
                 static_cast<long long>(drain.done()), count);
    std::_Exit(1);
  }
  try {
    cli.disconnect()->wait();
  } catch (const mqtt::exception&) {
  }
  std::printf("counters: processed=%lld duplicates=%lld undecodable=%lld\n",
              static_cast<long long>(processed), static_cast<long long>(duplicates),
              static_cast<long long>(undecodable));
  if (count == 0) return 0;

  bench::Json j;
  j.add("bench", "consumer")
      .add("label", label)
      .add("mode", "handwritten")
      .add("sync", sync)
      .add("count", count);
  drain.add_to(j, store.db.execAndGet("PRAGMA page_size").getInt());
  j.print();
  std::fprintf(stderr, "handwritten[%s]: %.0f msgs in %.2f s = %.0f msg/s\n", label.c_str(),
               drain.measured(), drain.seconds(), drain.rate());
  return 0;
}

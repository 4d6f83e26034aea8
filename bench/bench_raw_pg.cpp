// bench_raw_pg: the limit on PostgreSQL. The simplest libpqxx loop of the ledger's
// transaction, one commit per message, no library, no MQTT, over the server's unix socket:
//   BEGIN;
//   INSERT INTO processed (consumer, message_id) ... ON CONFLICT DO NOTHING;  -- the claim
//   INSERT INTO accounts ... ON CONFLICT DO UPDATE SET balance = balance + $2; -- the credit
//   INSERT INTO ledger_entries ...;                                           -- the append
//   COMMIT;
// (a pqxx::work per message: five round trips). Statements are prepared once. The claim
// table is the minimal one: PRIMARY KEY (consumer, message_id), nothing else. At
// synchronous_commit = on every COMMIT waits for its WAL flush (an fdatasync of the WAL
// segment), which is what the loop is made to measure. Prints one JSON line (msgs_per_s,
// txn_p50_us / commit_p50_us: the whole transaction / the COMMIT round trip alone, and
// wal_bytes_per_msg from pg_current_wal_lsn) and a human summary.
//
//   bench_raw_pg --uri postgresql:///bench?host=/tmp/s&user=postgres --count 5000
#include <CLI/CLI.hpp>
#include <pqxx/pqxx>

#include <cstdio>
#include <random>

#include "bench_pg_util.h"
#include "bench_util.h"

int main(int argc, char** argv) {
  CLI::App app{"Raw PostgreSQL loop with the ledger transaction shape (mqtt-inbox benchmark)"};
  std::string uri, label = "raw_pg";
  int count = 5000, accounts = 10;
  app.add_option("--uri", uri, "libpq connection URI of an empty database")->required();
  app.add_option("--count", count, "Messages (commits)");
  app.add_option("--accounts", accounts, "Accounts credited round-robin");
  app.add_option("--label", label, "Name in the JSON line");
  CLI11_PARSE(app, argc, argv);

  try {
    pqxx::connection c(uri);
    bench::pg_create_ledger_tables(c);
    {
      pqxx::nontransaction n(c);
      n.exec0(
          "CREATE TABLE processed (consumer TEXT NOT NULL, message_id TEXT NOT NULL,"
          "  PRIMARY KEY (consumer, message_id))");
    }
    c.prepare("claim",
              "INSERT INTO processed (consumer, message_id) VALUES ('ledger', $1)"
              " ON CONFLICT (consumer, message_id) DO NOTHING");
    c.prepare("credit", bench::kPgCreditSql);
    c.prepare("entry", bench::kPgEntrySql);

    std::mt19937_64 rng(42);
    std::vector<std::string> ids(static_cast<size_t>(count));
    for (auto& id : ids) id = bench::uuid_like(rng);
    std::vector<std::string> names;
    for (int a = 0; a < accounts; ++a) names.push_back("acct-" + std::to_string(a));
    std::vector<double> txn_us, commit_us;
    txn_us.reserve(static_cast<size_t>(count));
    commit_us.reserve(static_cast<size_t>(count));

    const int64_t wal0 = bench::pg_wal_position(uri);
    const int64_t t0 = bench::now_ns();
    int64_t skipped = 0;
    for (int i = 0; i < count; ++i) {
      const int64_t b = bench::now_ns();
      pqxx::work w(c);
      if (w.exec_prepared("claim", ids[i]).affected_rows() == 0) {
        w.abort();
        ++skipped;
        continue;
      }
      const int64_t amount = static_cast<int64_t>(i % 1000) + 1;
      const std::string& acct = names[static_cast<size_t>(i % accounts)];
      w.exec_prepared0("credit", acct, amount);
      w.exec_prepared0("entry", ids[i], acct, amount);
      const int64_t before_commit = bench::now_ns();
      w.commit();
      const int64_t e = bench::now_ns();
      txn_us.push_back(static_cast<double>(e - b) / 1e3);
      commit_us.push_back(static_cast<double>(e - before_commit) / 1e3);
    }
    const int64_t t1 = bench::now_ns();
    const int64_t wal1 = bench::pg_wal_position(uri);
    const double secs = static_cast<double>(t1 - t0) / 1e9;
    bench::Json j;
    j.add("bench", "raw_pg")
        .add("label", label)
        .add("sync", bench::pg_synchronous_commit(uri))
        .add("count", count)
        .add("skipped", skipped)
        .add("seconds", secs)
        .add("msgs_per_s", count / secs)
        .add("us_per_msg", secs * 1e6 / count)
        .add("wal_bytes_per_msg", static_cast<double>(wal1 - wal0) / count);
    bench::add_us(j, "txn", txn_us);
    bench::add_us(j, "commit", commit_us);
    j.print();
    std::fprintf(stderr,
                 "raw_pg[%s]: %d msgs in %.2f s = %.0f msg/s; txn p50 %.0f us, COMMIT p50 %.0f us,"
                 " WAL %.0f B/msg\n",
                 label.c_str(), count, secs, count / secs, bench::percentile(txn_us, 50),
                 bench::percentile(commit_us, 50), static_cast<double>(wal1 - wal0) / count);
    if (skipped) {
      std::fprintf(stderr, "raw_pg: %lld generated ids conflicted\n",
                   static_cast<long long>(skipped));
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_raw_pg: %s\n", e.what());
    return 1;
  }
  return 0;
}

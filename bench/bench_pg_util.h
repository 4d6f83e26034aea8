// Helpers shared by the PostgreSQL benchmark programs (bench_raw_pg, bench_pg_consumer,
// handwritten_pg_consumer): the ledger's business tables, the WAL position, and the
// per-transaction time figures.
#pragma once

#include <pqxx/pqxx>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"

namespace bench {

// The ledger's business tables on PostgreSQL (as ledger::create_tables on SQLite), made
// afresh: scripts/bench.sh gives every run a database of its own, so nothing is there.
inline void pg_create_ledger_tables(pqxx::connection& c) {
  pqxx::nontransaction n(c);
  n.exec0(
      "CREATE TABLE IF NOT EXISTS accounts (account TEXT PRIMARY KEY, balance BIGINT NOT NULL);"
      "CREATE TABLE IF NOT EXISTS ledger_entries (id BIGSERIAL PRIMARY KEY,"
      "  message_id TEXT NOT NULL, account TEXT NOT NULL, amount BIGINT NOT NULL)");
}

// The credit's two statements, $1 account, $2 amount / $1 message id, $2 account, $3 amount.
constexpr const char* kPgCreditSql =
    "INSERT INTO accounts (account, balance) VALUES ($1, $2)"
    " ON CONFLICT (account) DO UPDATE SET balance = accounts.balance + excluded.balance";
constexpr const char* kPgEntrySql =
    "INSERT INTO ledger_entries (message_id, account, amount) VALUES ($1, $2, $3)";

// The server's WAL insert position in bytes (pg_current_wal_lsn() - '0/0'), read on a
// connection of its own. The difference over a run is the WAL it wrote, all backends
// together (the benchmark's cluster has no other client).
inline int64_t pg_wal_position(const std::string& uri) {
  pqxx::connection c(uri);
  pqxx::nontransaction n(c);
  return n.exec1("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")[0].as<int64_t>();
}

// The WAL a drain writes per message over bench::Drain's timed span: the position is read
// (on a connection of its own) right before the message that starts the clock is counted,
// and again after the last one. Call before_one() before each Drain::one().
class PgWalSpan {
 public:
  PgWalSpan(const std::string& uri, int64_t target, double warm_fraction = 0.05)
      : uri_(uri),
        warm_(std::max<int64_t>(1,
                                static_cast<int64_t>(static_cast<double>(target) * warm_fraction))),
        target_(target) {}
  void before_one(int64_t done_so_far) {
    if (done_so_far + 1 == warm_) at_warm_ = pg_wal_position(uri_);
  }
  void at_end() { at_end_ = pg_wal_position(uri_); }
  double bytes_per_msg() const {
    return static_cast<double>(at_end_ - at_warm_) / static_cast<double>(target_ - warm_);
  }

 private:
  std::string uri_;
  int64_t warm_, target_, at_warm_ = 0, at_end_ = 0;
};

// Per-message times of a consumer: the transaction (BEGIN to COMMIT returned) and what
// lies between one message's commit and the next one's BEGIN (the PUBACK, Paho's receipt
// of the next PUBLISH, parsing it: everything outside the transaction). One thread.
struct PgTxnTimes {
  std::vector<double> txn_us, between_us;
  int64_t last_end = 0, begin = 0;
  void begin_txn() {
    begin = now_ns();
    if (last_end) between_us.push_back(static_cast<double>(begin - last_end) / 1e3);
  }
  void end_txn() {
    last_end = now_ns();
    txn_us.push_back(static_cast<double>(last_end - begin) / 1e3);
  }
};

// The server's synchronous_commit for a new session ("on" for the reference runs), for the
// JSON line's "sync".
inline std::string pg_synchronous_commit(const std::string& uri) {
  pqxx::connection c(uri);
  pqxx::nontransaction n(c);
  return n.exec1("SHOW synchronous_commit")[0].as<std::string>();
}

// Adds "<name>_p50_us", "<name>_p99_us" of `us` to a JSON line (nothing if empty).
inline void add_us(Json& j, const std::string& name, const std::vector<double>& us) {
  if (us.empty()) return;
  j.add(name + "_p50_us", percentile(us, 50)).add(name + "_p99_us", percentile(us, 99));
}

}  // namespace bench

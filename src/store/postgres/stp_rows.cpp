// The PostgreSQL store's store-then-process rows (store/stp_rows.h): <schema>.inbox_messages.
// Receipt runs one INSERT ... ON CONFLICT DO NOTHING on the store's shared connection
// (under its mutex); each worker and each consumer's maintenance have a connection of
// their own (PgBackend::open_connection: READ COMMITTED, lock_timeout), so workers never
// wait for one another's connection, and workers of several processes work one consumer's
// rows. There is no single write lock: a claim takes its aggregates with transaction-
// scoped advisory locks, tried and never waited for; a claim token checked at the end of
// the handler's transaction, by the UPDATE that marks the row 'done', fences a worker
// whose claim was returned. docs/store-then-process.md#postgresql has the steps.
//
// Durability: the handler's transaction and the dead mark commit with the server's
// synchronous_commit; claims, releases and retries with synchronous_commit off (losing
// one in a server crash only repeats a claim or undercounts an attempt). The Inbox's
// `synchronous` setting does not apply (docs/postgres.md).
#include "store/stp_rows.h"

#include <pqxx/pqxx>

#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <libpq-fe.h>
#include "mqtt_inbox/handler.h"
#include "store/contract.h"
#include "store/postgres/backend.h"
#include "store/postgres/errors.h"
#include "store/verdict.h"

namespace mqtt_inbox::detail {

namespace {

// A change of the row refused (a constraint, a data error, also at COMMIT): a failed
// attempt of this row, not a store failure to retry for ever.
bool refused_row(const std::exception& e) {
  const bool server_error = dynamic_cast<const pqxx::sql_error*>(&e) ||
                            dynamic_cast<const pqxx::transaction_rollback*>(&e);
  return server_error && classify_sqlstate(pg_sqlstate(e)).kind == PgErrorKind::kMessage;
}

void abort_quietly(std::optional<PgWork>& w) {
  try {
    if (w) w->abort_by_library();
  } catch (...) {
    // A lost connection rolls back by itself.
  }
  w.reset();
}

// "'{1,2,3}'::bigint[]": seqs are integers, so the literal needs no escaping.
std::string bigint_array(const std::vector<int64_t>& v) {
  std::string out = "'{";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "}'::bigint[]";
}

// How many aggregates one claim looks at (and holds an advisory lock on until it
// commits): enough for the chooser to spread aggregates over the workers, few enough that
// a backlog of many aggregates neither fills the server's lock table
// (max_locks_per_transaction) nor makes the claim slow.
int aggregates_per_claim(int max_rows) { return std::clamp(4 * max_rows, 64, 1024); }

// One connection of a worker or of the maintenance, reopened after it was lost.
class PgSession {
 public:
  PgSession(PgBackend& store, std::string label) : s_(store), label_(std::move(label)) {}

  Status connect() {
    if (s_.unusable()) return s_.fatal_status();
    if (c_ && c_->is_open()) return Status::Ok();
    drop();
    if (Status s = s_.open_connection(&c_, PgBackend::Role::kWorker, label_); !s.ok()) return s;
    watch_ = std::make_unique<PgNoticeWatch>(*c_);
    return Status::Ok();
  }

  // The classified Status of `e`; drops a lost connection (the next call reconnects).
  Status failed(const std::exception& e, const std::string& what) {
    bool lost = false;
    Status s = pg_to_status(e, what, &lost);
    if (lost || (c_ && !c_->is_open())) drop();
    return s;
  }

  void drop() {
    watch_.reset();
    c_.reset();
  }

  // A transaction the library's object no longer owns (a handler's commit() left libpqxx
  // thinking it ended) is rolled back on the server all the same.
  void end_transaction_on_server() {
    if (c_ && c_->raw() && PQtransactionStatus(c_->raw()) != PQTRANS_IDLE)
      if (PGresult* r = PQexec(c_->raw(), "ROLLBACK")) PQclear(r);
  }

  // Runs `fn` in one READ COMMITTED transaction and commits it; `async`: with
  // synchronous_commit off. A failure rolls back and comes back classified.
  template <typename Fn>
  Status txn(const std::string& what, bool async, Fn&& fn) {
    if (Status s = connect(); !s.ok()) return s;
    std::optional<PgWork> w;
    try {
      w.emplace(*c_);
      if (async) w->exec0("SET LOCAL synchronous_commit = off");
      fn(*w);
      w->commit_by_library();
      w.reset();
    } catch (const std::exception& e) {
      abort_quietly(w);
      return failed(e, what);
    }
    return Status::Ok();
  }

  PgConnection& conn() { return *c_; }

 protected:
  PgBackend& s_;
  const std::string label_;  // application_name: the consumer it works for
  std::unique_ptr<PgConnection> c_;
  std::unique_ptr<PgNoticeWatch> watch_;  // on c_: what a handler ran (txn_guard.cpp)
};

class PgStpWorkerSession final : public StpWorkerSession, PgSession {
 public:
  PgStpWorkerSession(PgBackend& store, std::string consumer)
      : PgSession(store, consumer), consumer_(std::move(consumer)), m_(store.t("inbox_messages")) {}

  Status open() { return connect(); }

  Status claim(const std::string& claimant, int max_rows, const ClaimChooser& choose,
               std::vector<StoredRow>* batch) override {
    batch->clear();
    const int64_t now = s_.retention_clock();
    std::vector<ClaimCandidate> offered;
    std::vector<int64_t> take;
    const Status s = txn("claiming rows", /*async=*/true, [&](PgWork& w) {
      batch->clear();
      offered.clear();
      take.clear();
      // 1. The aggregates: the head (first pending row) of each aggregate without a
      // 'processing' row, due ones first, oldest first; each taken with an advisory lock
      // on (consumer, aggregate), tried, never waited for: an aggregate another claim is
      // looking at is skipped (SKIP LOCKED). OFFSET 0 keeps the lock out of the inner
      // query, so it is tried on eligible aggregates only, in that order, until LIMIT.
      const pqxx::result aggs = w.exec_params(
          "SELECT a.aggregate_key FROM ("
          "  SELECT h.aggregate_key, h.seq, h.next_attempt_at FROM ("
          "    SELECT DISTINCT ON (aggregate_key) aggregate_key, seq, next_attempt_at FROM " +
              m_ +
              "    WHERE consumer_name = $1 AND status = 'pending'"
              "    ORDER BY aggregate_key, seq) h"
              "  WHERE NOT EXISTS (SELECT 1 FROM " +
              m_ +
              " p WHERE p.consumer_name = $1 AND p.status = 'processing'"
              "                    AND p.aggregate_key = h.aggregate_key)"
              "  ORDER BY h.next_attempt_at > $3, h.seq OFFSET 0) a"
              " WHERE pg_try_advisory_xact_lock(hashtext($1), hashtext(a.aggregate_key))"
              " LIMIT $2",
          consumer_, aggregates_per_claim(max_rows), now);
      if (aggs.empty()) return;
      // 2. A new statement, so a new snapshot, taken after the locks: a claim that held
      // one of them has committed, and its 'processing' rows are seen here.
      std::string keys = "ARRAY[";
      for (pqxx::result::size_type i = 0; i < aggs.size(); ++i)
        keys += (i ? "," : "") + w.quote(aggs[i][0].as<std::string>());
      keys += "]::text[]";
      const pqxx::result heads = w.exec_params(
          "SELECT x.seq, x.aggregate_key, x.next_attempt_at FROM ("
          "  SELECT seq, aggregate_key, next_attempt_at,"
          "         row_number() OVER (PARTITION BY aggregate_key ORDER BY seq) AS n FROM " +
              m_ + "  WHERE consumer_name = $1 AND status = 'pending' AND aggregate_key = ANY(" +
              keys +
              ")) x"
              " WHERE x.n <= $2 AND NOT EXISTS (SELECT 1 FROM " +
              m_ +
              " p WHERE p.consumer_name = $1 AND p.status = 'processing'"
              "                      AND p.aggregate_key = x.aggregate_key)"
              " ORDER BY x.aggregate_key, x.seq",
          consumer_, max_rows);
      for (const pqxx::row& r : heads)
        offered.push_back({r[0].as<int64_t>(), r[1].as<std::string>(), r[2].as<int64_t>()});
      if (offered.empty()) return;
      choose(now, offered, &take);
      if (take.size() > static_cast<size_t>(max_rows)) take.resize(static_cast<size_t>(max_rows));
      if (take.empty()) return;
      // 3. One UPDATE claims them, each with its next claim token.
      const pqxx::result got = w.exec_params(
          "UPDATE " + m_ +
              " SET status = 'processing', claimed_at = $1, claimant = $2,"
              "     claim_token = claim_token + 1"
              " WHERE seq = ANY(" +
              bigint_array(take) +
              ") AND status = 'pending'"
              " RETURNING seq, message_id, aggregate_key, topic, payload, properties_json, qos,"
              "           received_at, attempts, last_error, claim_token, expires_at, not_yet,"
              "           waiting_since",
          s_.clock->wall_ms(), claimant);
      std::map<int64_t, StoredRow> by_seq;
      for (const pqxx::row& q : got) {
        StoredRow r;
        r.claim.seq = q[0].as<int64_t>();
        r.message_id = q[1].as<std::string>();
        r.aggregate_key = q[2].as<std::string>();
        r.topic = q[3].as<std::string>();
        r.payload = q[4].is_null() ? "" : pqxx::binarystring(q[4]).str();
        r.properties_json = q[5].is_null() ? "{}" : q[5].as<std::string>();
        r.qos = q[6].as<int>();
        r.received_at = q[7].as<int64_t>();
        r.attempts = q[8].as<int>();
        r.last_error = q[9].is_null() ? "" : q[9].as<std::string>();
        r.claim.token = q[10].as<int64_t>();
        if (!q[11].is_null()) r.expires_at = q[11].as<int64_t>();
        r.wait.runs = q[12].as<int>();
        r.wait.since = q[13].is_null() ? 0 : q[13].as<int64_t>();
        by_seq.emplace(r.claim.seq, std::move(r));
      }
      for (const int64_t seq : take)  // in the order the chooser took them
        if (auto it = by_seq.find(seq); it != by_seq.end()) batch->push_back(std::move(it->second));
    });
    if (!s.ok()) batch->clear();  // rolled back: nothing is claimed
    return s;
  }

  Status holds(const RowClaim& c, bool* held) override {
    if (Status s = connect(); !s.ok()) return s;
    try {
      pqxx::nontransaction n(conn());
      *held = owned(n, c);
    } catch (const std::exception& e) {
      return failed(e, "checking a claim");
    }
    return Status::Ok();
  }

  Status process(const RowClaim& c, const std::string& claimant, const StoredStoreHandler& handler,
                 const StoredDelivery& d, FunctionRef<bool()> expired,
                 StoredRunResult* out) override {
    *out = StoredRunResult{};
    if (Status s = connect(); !s.ok()) return s;
    const int64_t began = s_.clock->steady_ms();
    std::optional<PgWork> w;
    try {
      w.emplace(conn(), /*guarded=*/true);
      // A claim returned long ago runs no handler (not the fence: that is the UPDATE
      // below). A row 'done' under this claim's token was finished by this claim: a
      // retry after a COMMIT whose outcome was unknown finds that it committed. That is
      // kDone, not kLost: the policy then goes on with the rest of the batch, whose rows
      // are still this claim's (a kLost would leave them until the lease ran out).
      const pqxx::result r =
          w->exec_params("SELECT status, claim_token FROM " + m_ + " WHERE seq = $1", c.seq);
      const bool ours = !r.empty() && r[0][1].as<int64_t>() == c.token;
      const std::string status = r.empty() ? "" : r[0][0].as<std::string>();
      if (!ours || status != "processing") {
        abort_quietly(w);
        out->kind =
            ours && status == "done" ? StoredRunResult::Kind::kDone : StoredRunResult::Kind::kLost;
        return Status::Ok();
      }
    } catch (const std::exception& e) {
      abort_quietly(w);
      return failed(e, "handler transaction");
    }
    // The handler's contract, judged as for a Consumer (store/contract.h).
    HandlerRun run;
    run_pg_handler(
        conn(), *w, *watch_, s_.owner(), [&](const TxnRef& txn) { handler(txn, d); }, &run);
    judge_contract(&run);
    const HandlerVerdict& v = run.verdict;
    if (run.left != TxnLeft::kOpen || v.kind != HandlerVerdict::Kind::kOk) {
      abort_quietly(w);
      end_transaction_on_server();
      if (run.left == TxnLeft::kClosed || (c_ && !c_->is_open())) drop();
      if (v.kind == HandlerVerdict::Kind::kStoreError) {  // run it again
        if (v.store.code() == Status::Code::kIoError) drop();
        return v.store;
      }
      out->kind = StoredRunResult::Kind::kNotDone;
      out->verdict = v;
      return Status::Ok();
    }
    // The handler ended the library's transaction and began another: nothing of its run
    // is left to commit (store/contract.h).
    const auto ended = [&](const TransactionNotOurs& e) {
      abort_quietly(w);
      end_transaction_on_server();
      run.left = TxnLeft::kEnded;
      run.how = e.what();
      judge_contract(&run);
      out->kind = StoredRunResult::Kind::kNotDone;
      out->verdict = run.verdict;
      return Status::Ok();
    };
    try {
      // The library writes only in the transaction it began (one round trip).
      w->confirm_ours();
      if (expired()) {  // the policy's decision, right before the row is marked done
        abort_quietly(w);
        out->kind = StoredRunResult::Kind::kExpired;
        return Status::Ok();
      }
      // The fence: the row must still carry this claim's token. This UPDATE's row lock
      // lasts to COMMIT, so a reaper returning the row waits for it and then finds it
      // done; a reaper that returned it first makes this match nothing.
      const pqxx::result done = w->exec_params(
          "UPDATE " + m_ + " SET status = 'done', attempts = $2, done_at = " + kPgNowMs +
              ", last_error = NULL, next_attempt_at = 0, not_yet = 0, waiting_since = NULL"
              " WHERE seq = $1 AND status = 'processing'"
              "   AND claim_token = $3",
          c.seq, d.attempt, c.token);
      if (done.affected_rows() != 1) {
        abort_quietly(w);
        out->kind = StoredRunResult::Kind::kLost;
        return Status::Ok();
      }
      // A successful run of a replayed dead letter closes it (usually matches nothing).
      w->exec_params0("UPDATE " + s_.t("inbox_dead_letters") +
                          " SET status = 'replayed', replayed_at = $3"
                          " WHERE consumer_name = $1 AND message_id = $2 AND status = 'dead'",
                      consumer_, d.message_id, s_.clock->wall_ms());
      // Only what people see: when the batch last made progress.
      w->exec_params0("UPDATE " + m_ +
                          " SET claimed_at = $3"
                          " WHERE consumer_name = $1 AND status = 'processing' AND claimant = $2",
                      consumer_, claimant, s_.clock->wall_ms());
    } catch (const TransactionNotOurs& e) {
      return ended(e);
    } catch (const std::exception& e) {
      abort_quietly(w);
      if (refused_row(e)) return refused(e, out);
      return failed(e, "handler transaction");
    }
    try {
      w->commit_by_library();
      w.reset();
    } catch (const pqxx::in_doubt_error& e) {
      // The outcome is unknown: a store error. The retried run finds the row 'done'
      // under this token (kDone: nothing runs twice) or still carrying it (it runs again).
      w.reset();
      drop();
      return pg_to_status(e, "handler transaction: COMMIT (outcome unknown)");
    } catch (const std::exception& e) {
      w.reset();
      if (refused_row(e)) return refused(e, out);  // a deferred constraint
      return failed(e, "handler transaction: COMMIT");
    }
    out->held_ms = s_.clock->steady_ms() - began;
    return Status::Ok();
  }

  Status retry_later(const RowClaim& c, int attempts, const std::string& error, const RowWait& wait,
                     int64_t delay_ms, const std::vector<RowClaim>& release_too,
                     bool* held) override {
    *held = true;
    const int64_t due = s_.retention_clock() + delay_ms;
    return txn("putting a row back to wait", /*async=*/true, [&](PgWork& w) {
      *held = w.exec_params("UPDATE " + m_ +
                                " SET status = 'pending', attempts = $2, last_error = $3,"
                                "     next_attempt_at = $4, claimant = NULL, claimed_at = NULL,"
                                "     not_yet = $6,"
                                "     waiting_since = CASE WHEN $6 > 0 THEN $7::bigint END"
                                " WHERE seq = $1 AND status = 'processing' AND claim_token = $5",
                            c.seq, attempts, error, due, c.token, wait.runs, wait.since)
                  .affected_rows() > 0;
      release_rows(w, release_too);
    });
  }

  Status release(const std::vector<RowClaim>& rows) override {
    return txn("releasing rows", /*async=*/true, [&](PgWork& w) { release_rows(w, rows); });
  }

  Status mark_dead(const RowClaim& c, int attempts, const std::string& text, bool* held) override {
    *held = true;
    return txn("marking a row dead", /*async=*/false, [&](PgWork& w) {
      *held =
          w.exec_params("UPDATE " + m_ + " SET status = 'dead', attempts = $2, last_error = $3," +
                            " done_at = " + kPgNowMs +
                            " WHERE seq = $1 AND status = 'processing' AND claim_token = $4",
                        c.seq, attempts, text, c.token)
              .affected_rows() > 0;
    });
  }

 private:
  bool owned(pqxx::transaction_base& t, const RowClaim& c) {
    return t
        .exec_params1("SELECT EXISTS (SELECT 1 FROM " + m_ +
                          " WHERE seq = $1 AND status = 'processing' AND claim_token = $2)",
                      c.seq, c.token)[0]
        .as<bool>();
  }

  void release_rows(PgWork& w, const std::vector<RowClaim>& rows) {
    for (const RowClaim& c : rows)  // a finished or returned row no longer matches
      w.exec_params0("UPDATE " + m_ +
                         " SET status = 'pending', claimant = NULL, claimed_at = NULL"
                         " WHERE seq = $1 AND status = 'processing' AND claim_token = $2",
                     c.seq, c.token);
  }

  static Status refused(const std::exception& e, StoredRunResult* out) {
    out->kind = StoredRunResult::Kind::kNotDone;
    out->verdict.kind = HandlerVerdict::Kind::kFailed;
    out->verdict.text = std::string("the store refused this row's transaction: ") + e.what();
    while (!out->verdict.text.empty() && out->verdict.text.back() == '\n')
      out->verdict.text.pop_back();
    return Status::Ok();
  }

  const std::string consumer_;
  const std::string m_;  // the table, schema-qualified
};

class PgStpConsumerRows final : public StpConsumerRows, PgSession {
 public:
  PgStpConsumerRows(PgBackend& store, std::string name)
      : PgSession(store, name), name_(std::move(name)), m_(store.t("inbox_messages")) {}

  Status open() { return connect(); }

  Status store_received(const std::string& message_id, const std::string& aggregate_key,
                        const Message& m, const std::string& properties_json,
                        std::optional<int64_t> expires_at, bool* stored) override {
    return on_shared_connection("storing message", [&](PgWork& w) {
      // Committed with the server's synchronous_commit before this returns.
      *stored =
          w.exec_params("INSERT INTO " + m_ +
                            " (consumer_name, message_id, aggregate_key, topic, payload,"
                            "  properties_json, qos, received_at, expires_at)"
                            " VALUES ($1, $2, $3, $4, $5::bytea, $6, $7, " +
                            kPgNowMs +
                            ", CASE WHEN $9 THEN $8::bigint END)"
                            " ON CONFLICT (consumer_name, message_id) DO NOTHING",
                        name_, message_id, aggregate_key, m.topic, w.esc_raw(m.payload),
                        properties_json, m.qos, expires_at.value_or(0), expires_at.has_value())
              .affected_rows() > 0;
    });
  }

  Status is_stored(const std::string& message_id, bool* found) override {
    return on_shared_connection("looking up a stored message", [&](PgWork& w) {
      *found = w.exec_params1("SELECT EXISTS (SELECT 1 FROM " + m_ +
                                  " WHERE consumer_name = $1 AND message_id = $2)",
                              name_, message_id)[0]
                   .as<bool>();
    });
  }

  Status open_worker(Synchronous, std::unique_ptr<StpWorkerSession>* out) override {
    auto w = std::make_unique<PgStpWorkerSession>(s_, name_);
    if (Status s = w->open(); !s.ok()) return s;
    *out = std::move(w);
    return Status::Ok();
  }

  Status reap(const ReapChooser& choose, int64_t* rows) override {
    *rows = 0;
    std::vector<LiveClaim> claims;
    std::vector<ReturnedClaim> back;
    return txn("reaping expired claims", /*async=*/true, [&](PgWork& w) {
      claims.clear();
      back.clear();
      *rows = 0;
      // The claims, their rows locked: a worker marking one of them 'done' holds its row
      // until COMMIT, and this waits for it (at most lock_timeout), then no longer sees
      // it. While this transaction holds them no claim can finish, so the chooser's
      // picture stays true until COMMIT.
      std::map<std::string, int64_t> running;
      for (const pqxx::row& r :
           w.exec_params("SELECT seq, coalesce(claimant, '') FROM " + m_ +
                             " WHERE consumer_name = $1 AND status = 'processing'"
                             " ORDER BY seq FOR UPDATE",
                         name_)) {
        const int64_t seq = r[0].as<int64_t>();
        running.emplace(r[1].as<std::string>(), seq);  // the first (lowest) seq stays
      }
      for (const auto& [claimant, seq] : running) claims.push_back({claimant, seq});
      choose(claims, &back);
      for (const ReturnedClaim& r : back) {
        w.exec_params0("UPDATE " + m_ +
                           " SET attempts = attempts + 1, last_error = $2"
                           " WHERE seq = $1 AND status = 'processing'",
                       r.running_seq, r.last_error);
        *rows += static_cast<int64_t>(
            w.exec_params("UPDATE " + m_ +
                              " SET status = 'pending', claimant = NULL, claimed_at = NULL"
                              " WHERE consumer_name = $1 AND status = 'processing'"
                              "   AND coalesce(claimant, '') = $2",
                          name_, r.claimant)
                .affected_rows());
      }
    });
  }

  Status replay(const ReplayFilter& f, ReplayResult* out) override {
    return txn("replaying rows", /*async=*/false, [&](PgWork& w) {
      *out = ReplayResult{};
      std::string where = " WHERE consumer_name = " + w.quote(name_);
      if (f.received_since_ms)
        where += " AND received_at >= " + std::to_string(*f.received_since_ms);
      if (f.received_before_ms)
        where += " AND received_at < " + std::to_string(*f.received_before_ms);
      if (f.aggregate_key) where += " AND aggregate_key = " + w.quote(*f.aggregate_key);
      if (f.message_id) where += " AND message_id = " + w.quote(*f.message_id);
      const std::string finished =
          f.include_dead ? " AND status IN ('done', 'dead')" : " AND status = 'done'";
      out->in_flight =
          w.exec1("SELECT count(*) FROM " + m_ + where + " AND status = 'processing'")[0]
              .as<int64_t>();
      out->not_replayable =
          w.exec1("SELECT count(*) FROM " + m_ + where + finished + " AND payload IS NULL")[0]
              .as<int64_t>();
      out->reset = static_cast<int64_t>(
          w.exec("UPDATE " + m_ +
                 " SET status = 'pending', attempts = 0, next_attempt_at = 0, last_error = NULL,"
                 "     claimant = NULL, claimed_at = NULL, done_at = NULL, not_yet = 0,"
                 "     waiting_since = NULL" +
                 where + finished + " AND payload IS NOT NULL")
              .affected_rows());
    });
  }

  Status compact_done(int64_t done_before, int limit, int64_t* rows) override {
    *rows = 0;
    return txn("compacting done rows", /*async=*/false, [&](PgWork& w) {
      // Served by the partial index inbox_messages_compact.
      *rows = static_cast<int64_t>(
          w.exec_params("UPDATE " + m_ +
                            " SET payload = NULL, properties_json = NULL"
                            " WHERE seq IN (SELECT seq FROM " +
                            m_ +
                            "   WHERE consumer_name = $1 AND status = 'done'"
                            "     AND payload IS NOT NULL AND done_at < $2 LIMIT $3)",
                        name_, done_before, limit)
              .affected_rows());
    });
  }

  Status delete_finished(int64_t received_before, int limit, int64_t* rows) override {
    *rows = 0;
    return txn("deleting old rows", /*async=*/false, [&](PgWork& w) {
      *rows = static_cast<int64_t>(
          w.exec_params("DELETE FROM " + m_ + " WHERE seq IN (SELECT seq FROM " + m_ +
                            "   WHERE received_at < $2 AND consumer_name = $1"
                            "     AND status IN ('done', 'dead') LIMIT $3)",
                        name_, received_before, limit)
              .affected_rows());
    });
  }

  Status count(StoreThenProcessStats* out) override {
    return txn("counting stored messages", /*async=*/false, [&](PgWork& w) {
      *out = StoreThenProcessStats{};
      for (const pqxx::row& r : w.exec_params(
               "SELECT status, count(*) FROM " + m_ + " WHERE consumer_name = $1 GROUP BY status",
               name_)) {
        const std::string st = r[0].as<std::string>();
        const int64_t n = r[1].as<int64_t>();
        if (st == "pending")
          out->pending = n;
        else if (st == "processing")
          out->processing = n;
        else if (st == "done")
          out->done = n;
        else if (st == "dead")
          out->dead = n;
      }
    });
  }

 private:
  // Runs `fn` in a transaction on the store's shared connection, under its mutex (as the
  // per-message path does); errors come back classified, not counted (the policy counts).
  template <typename Fn>
  Status on_shared_connection(const char* what, Fn&& fn) {
    if (s_.unusable()) return s_.fatal_status();
    std::lock_guard<std::mutex> lock(s_.mu);
    if (Status c = s_.connect_locked(false); !c.ok()) return c;
    std::optional<PgWork> w;
    try {
      w.emplace(*s_.conn);
      fn(*w);
      w->commit_by_library();
      w.reset();
    } catch (const std::exception& e) {
      abort_quietly(w);
      bool lost = false;
      Status s = pg_to_status(e, what, &lost);
      if (lost || (s_.conn && !s_.conn->is_open())) s_.drop_connection();
      return s;
    }
    return Status::Ok();
  }

  const std::string name_;
  const std::string m_;
};

class PgStpRows final : public StpRows {
 public:
  explicit PgStpRows(PgBackend& store) : store_(store) {}

  Status open(const std::string& name, std::unique_ptr<StpConsumerRows>* out) override {
    auto rows = std::make_unique<PgStpConsumerRows>(store_, name);
    if (Status s = rows->open(); !s.ok()) return s;
    *out = std::move(rows);
    return Status::Ok();
  }

  // Workers of other processes may work the same rows: a claim is returned by its lease.
  bool single_process() const override { return false; }

 private:
  PgBackend& store_;
};

}  // namespace

std::unique_ptr<StpRows> make_pg_stp_rows(PgBackend& store) {
  return std::make_unique<PgStpRows>(store);
}

}  // namespace mqtt_inbox::detail

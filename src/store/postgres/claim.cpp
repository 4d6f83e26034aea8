// The PostgreSQL store's claim transaction: its prepared statements and the claim and
// attempt primitives of store/backend.h, the handler's run in a guarded transaction
// (txn_guard.cpp), and the commit whose outcome is unknown. The decision is the front's
// (store/claims.cpp). All of their SQL is in this file; docs/postgres.md says how it works.
//
// The claim is `INSERT ... ON CONFLICT (consumer_name, message_id) DO NOTHING` inside the
// handler's transaction at READ COMMITTED: a second consumer claiming the same id waits for
// the first's transaction, then skips (committed) or claims (rolled back). Its wait is
// bounded by lock_timeout (InboxOptions::busy_timeout_ms): 55P03, transient, "not yet".
//
// A PostgreSQL consumer has no file next to the data for a running-attempt marker
// (mark_running is false): the front commits the attempt of a redelivery before its handler
// runs, so a message that kills its consumer is dead-lettered after max_attempts counted
// runs plus the first. Those attempt commits use synchronous_commit off: they must survive
// the consumer's death, not the server's.
//
// A COMMIT whose outcome is unknown (the connection lost during it: pqxx::in_doubt_error)
// is never acknowledged: the store reconnects and the claim row decides (present: it
// committed; absent: it did not, and the message runs again). Without a connection the
// call fails as a transient store error, and the Consumer's retry asks the claim again.
#include <pqxx/pqxx>

#include <chrono>
#include <exception>
#include <mutex>
#include <optional>

#include <libpq-fe.h>
#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/handler.h"
#include "store/postgres/backend.h"
#include "store/postgres/errors.h"
#include "store/reentry.h"
#include "store/verdict.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

void prepare_pg_statements(PgBackend& s) {
  pqxx::connection_base& c = *s.conn;
  const std::string p = s.t("inbox_processed"), a = s.t("inbox_attempts"),
                    d = s.t("inbox_dead_letters");
  // The claim of a first delivery: inserted only if nothing is recorded for the id either
  // (no attempts, no dead letter), so one statement claims and checks.
  c.prepare("mi_claim_if_nothing",
            "INSERT INTO " + p +
                " (consumer_name, message_id, topic, message_type, correlation_id, payload_hash)"
                " SELECT $1, $2, NULLIF($3, ''), NULLIF($4, ''), NULLIF($5, '')::bytea,"
                "        NULLIF($6, '')::bigint"
                " WHERE NOT EXISTS (SELECT 1 FROM " +
                a +
                " WHERE consumer_name = $1 AND message_id = $2)"
                "   AND NOT EXISTS (SELECT 1 FROM " +
                d +
                " WHERE consumer_name = $1 AND message_id = $2"
                "                   AND status IN ('dead', 'requeued'))"
                " ON CONFLICT (consumer_name, message_id) DO NOTHING");
  c.prepare("mi_claim",
            "INSERT INTO " + p +
                " (consumer_name, message_id, topic, message_type, correlation_id, payload_hash)"
                " VALUES ($1, $2, NULLIF($3, ''), NULLIF($4, ''), NULLIF($5, '')::bytea,"
                "         NULLIF($6, '')::bigint)"
                " ON CONFLICT (consumer_name, message_id) DO NOTHING");
  c.prepare("mi_lookup", "SELECT EXISTS (SELECT 1 FROM " + p +
                             " WHERE consumer_name = $1 AND message_id = $2),"
                             " (SELECT id FROM " +
                             d +
                             " WHERE consumer_name = $1 AND message_id = $2"
                             "  AND status IN ('dead', 'requeued') ORDER BY id DESC LIMIT 1),"
                             " a.attempts, a.state, a.last_error, a.first_attempt_at"
                             " FROM (SELECT 1) x LEFT JOIN " +
                             a + " a ON a.consumer_name = $1 AND a.message_id = $2");
  c.prepare("mi_begin_attempt",
            "INSERT INTO " + a +
                " AS a (consumer_name, message_id, attempts, first_attempt_at, last_attempt_at,"
                " state) VALUES ($1, $2, 1, $3, $3, 'running')"
                " ON CONFLICT (consumer_name, message_id) DO UPDATE"
                " SET attempts = a.attempts + 1, last_attempt_at = excluded.last_attempt_at,"
                "     state = 'running' RETURNING attempts");
  c.prepare("mi_attempt_failed", "UPDATE " + a +
                                     " SET state = 'failed', last_error = $3"
                                     " WHERE consumer_name = $1 AND message_id = $2");
  c.prepare("mi_attempt_failed_counted",
            "INSERT INTO " + a +
                " AS a (consumer_name, message_id, attempts, first_attempt_at, last_attempt_at,"
                " state, last_error) VALUES ($1, $2, 1, $3, $3, 'failed', $4)"
                " ON CONFLICT (consumer_name, message_id) DO UPDATE"
                " SET attempts = a.attempts + 1, last_attempt_at = excluded.last_attempt_at,"
                "     state = 'failed', last_error = excluded.last_error RETURNING attempts");
  c.prepare("mi_delete_attempts",
            "DELETE FROM " + a + " WHERE consumer_name = $1 AND message_id = $2");
  c.prepare("mi_mark_replayed",
            "UPDATE " + d + " SET status = 'replayed', replayed_at = $2 WHERE id = $1");
  c.prepare("mi_claimed",
            "SELECT EXISTS (SELECT 1 FROM " + p + " WHERE consumer_name = $1 AND message_id = $2)");
}

pqxx::transaction_base& PgBackend::tx() {
  if (txn) {
    // After a handler's run, the library writes only in the transaction it began.
    if (txn->unconfirmed()) txn->confirm_ours();
    return *txn;
  }
  if (reading) return *reading;
  throw std::logic_error("no transaction open on the inbox's connection");
}

void PgBackend::begin(bool for_handler) {
  if (txn) txn->abort_by_library();
  txn.reset();
  reading.reset();
  txn.emplace(*conn, for_handler);
}

void PgBackend::rollback() noexcept {
  reading.reset();
  if (txn) {
    txn->abort_by_library();
    txn.reset();
  }
  // A transaction the library's object no longer owns (a handler's commit() left libpqxx
  // thinking it aborted) is rolled back on the server all the same.
  if (conn && conn->raw() && PQtransactionStatus(conn->raw()) != PQTRANS_IDLE) {
    if (PGresult* r = PQexec(conn->raw(), "ROLLBACK")) PQclear(r);
  }
}

void PgBackend::begin_read() {
  reading.reset();
  reading.emplace(*conn);
}

void PgBackend::end_read() noexcept { reading.reset(); }

CommitOutcome PgBackend::commit(const ClaimKey* claim, std::string* why) {
  try {
    txn->commit_by_library();
    txn.reset();
  } catch (const pqxx::in_doubt_error& e) {
    txn.reset();
    if (!claim) throw;
    return resolve_in_doubt(e, *claim);
  } catch (const pqxx::broken_connection& e) {
    txn.reset();
    if (!claim) throw;
    return resolve_in_doubt(e, *claim);
  } catch (const TransactionNotOurs&) {
    txn.reset();  // the front rolls back what the handler began
    throw;
  } catch (const std::exception& e) {
    txn.reset();
    // A deferred constraint refused this message's change: its fault, not the store's.
    const bool server_error = dynamic_cast<const pqxx::sql_error*>(&e) ||
                              dynamic_cast<const pqxx::transaction_rollback*>(&e);
    if (server_error && classify_sqlstate(pg_sqlstate(e)).kind == PgErrorKind::kMessage) {
      *why = e.what();
      while (!why->empty() && why->back() == '\n') why->pop_back();
      return CommitOutcome::kRefused;
    }
    throw;
  }
  outbox_committed();  // the relays, if the transaction enqueued
  return CommitOutcome::kCommitted;
}

CommitOutcome PgBackend::resolve_in_doubt(const std::exception& e, const ClaimKey& claim) {
  log->warn(
      "consumer '{}', message '{}': the outcome of COMMIT is unknown ({}); the claim row "
      "decides",
      printable(claim.consumer), printable(claim.message_id), printable(e.what()));
  drop_connection();
  if (Status c = connect_locked(false); !c.ok())
    throw pqxx::broken_connection("commit outcome unknown and the server cannot be reached: " +
                                  c.message());
  pqxx::nontransaction n(*conn);
  if (n.exec_prepared1("mi_claimed", claim.consumer, claim.message_id)[0].as<bool>())
    return CommitOutcome::kCommitted;
  throw pqxx::broken_connection(
      "the connection was lost during COMMIT and the claim is not there: not committed, the "
      "message runs again");
}

bool PgBackend::insert_claim(const ClaimKey& key, const Message& message,
                             bool only_if_nothing_recorded) {
  const bool meta = options.record_metadata;
  pqxx::transaction_base& w = tx();
  const std::string corr = meta && message.correlation_data && !message.correlation_data->empty()
                               ? w.esc_raw(*message.correlation_data)
                               : "";
  const pqxx::result r = w.exec_prepared(
      only_if_nothing_recorded ? "mi_claim_if_nothing" : "mi_claim", key.consumer, key.message_id,
      meta ? message.topic : "", meta ? message.content_type.value_or("") : "", corr,
      meta ? std::to_string(claim_payload_hash(message.payload)) : "");
  return r.affected_rows() == 1;
}

bool PgBackend::read_state(const ClaimKey& key, MessageState* out) {
  *out = MessageState{};
  const pqxx::row r = tx().exec_prepared1("mi_lookup", key.consumer, key.message_id);
  out->processed = r[0].as<bool>();
  if (!r[1].is_null()) out->dead_letter_id = r[1].as<int64_t>();
  if (!r[2].is_null()) {
    out->attempts = r[2].as<int>();
    out->last_attempt_running = r[3].as<std::string>() == "running";
    out->last_error = r[4].is_null() ? "" : r[4].as<std::string>();
    out->first_attempt_at_ms = r[5].as<int64_t>();
  }
  return out->processed;
}

void PgBackend::delete_attempts(const ClaimKey& key) {
  tx().exec_prepared0("mi_delete_attempts", key.consumer, key.message_id);
}

void PgBackend::mark_replayed(int64_t dead_letter_id) {
  tx().exec_prepared0("mi_mark_replayed", dead_letter_id, clock->wall_ms());
}

int PgBackend::count_attempt(const ClaimKey& key, const std::string* error) {
  PgWork w(*conn);
  w.exec0("SET LOCAL synchronous_commit = off");
  const pqxx::row r =
      error ? w.exec_prepared1("mi_attempt_failed_counted", key.consumer, key.message_id,
                               clock->wall_ms(), *error)
            : w.exec_prepared1("mi_begin_attempt", key.consumer, key.message_id, clock->wall_ms());
  const int n = r[0].as<int>();
  w.commit_by_library();
  return n;
}

void PgBackend::mark_attempt_failed(const ClaimKey& key, const std::string& error) {
  PgWork w(*conn);
  w.exec0("SET LOCAL synchronous_commit = off");
  w.exec_prepared0("mi_attempt_failed", key.consumer, key.message_id, error);
  w.commit_by_library();
}

void PgBackend::uncount_attempt(const ClaimKey& key) {
  PgWork w(*conn);
  w.exec0("SET LOCAL synchronous_commit = off");
  const std::string a = t("inbox_attempts");
  w.exec_params0(
      "DELETE FROM " + a + " WHERE consumer_name = $1 AND message_id = $2 AND attempts <= 1",
      key.consumer, key.message_id);
  w.exec_params0("UPDATE " + a +
                     " SET attempts = attempts - 1, state = 'failed'"
                     " WHERE consumer_name = $1 AND message_id = $2",
                 key.consumer, key.message_id);
  w.commit_by_library();
}

void PgBackend::run_handler(const Inbox* owner, FunctionRef<void(const TxnRef&)> call,
                            HandlerRun* out) {
  run_pg_handler(*conn, *txn, *watch, owner, call, out);
  // A handler's statement that failed with the connection gone, or a connection it closed:
  // the next call makes a new one.
  if (out->left == TxnLeft::kClosed || !conn->is_open()) {
    txn.reset();
    drop_connection();
  }
}

}  // namespace mqtt_inbox::detail

// PgClaims (store/claims.h): the claim transaction with the handler inside it, and the
// attempt counting that stops crash loops, on the PostgreSQL store. All of their SQL is in
// this file; docs/postgres.md says how it works.
//
// The claim is `INSERT ... ON CONFLICT (consumer_name, message_id) DO NOTHING` inside the
// handler's transaction at READ COMMITTED: a second consumer claiming the same id waits for
// the first's transaction, then skips (committed) or claims (rolled back). Its wait is
// bounded by lock_timeout (InboxOptions::busy_timeout_ms): 55P03, transient, "not yet".
//
// A first delivery (MQTT DUP flag clear, nothing recorded for the id) costs one
// transaction: the claim, the handler, COMMIT; its attempt is not written in advance. The
// SQLite store counts such an attempt in its lock file while the handler runs; a
// PostgreSQL consumer has no file next to the data, so a handler that kills the process
// on a first delivery goes uncounted, and the broker's redelivery (DUP set) is counted in
// advance, committed before its handler runs (with synchronous_commit off: it survives the
// consumer's death, which is what it is for). So a message that kills its consumer is
// dead-lettered after max_attempts counted runs plus the first.
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

#include "mqtt_inbox/clock.h"
#include "store/postgres/errors.h"
#include "store/postgres/store.h"
#include "store/reentry.h"
#include "store/txn.h"
#include "store/verdict.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

namespace {

// A change of this message refused (a constraint, a data error), also at COMMIT: a
// failed attempt, not a store failure.
bool refused_message(const std::exception& e, ClaimResult* result, std::string* error) {
  const bool server_error = dynamic_cast<const pqxx::sql_error*>(&e) ||
                            dynamic_cast<const pqxx::transaction_rollback*>(&e);
  if (!server_error || classify_sqlstate(pg_sqlstate(e)).kind != PgErrorKind::kMessage)
    return false;
  *result = ClaimResult::kHandlerFailed;
  *error = std::string("the store refused this message's transaction: ") + e.what();
  while (!error->empty() && error->back() == '\n') error->pop_back();
  return true;
}

void abort_quietly(std::optional<pqxx::work>& w) {
  try {
    if (w) w->abort();
  } catch (...) {
    // A lost connection rolls back by itself.
  }
  w.reset();
}

}  // namespace

void prepare_pg_statements(PgStore& s) {
  pqxx::connection& c = *s.conn;
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

namespace {

// The per-message path's steps on the store's connection, under its mutex.
struct ClaimTxn {
  PgStore& s;
  const std::string& consumer;
  const Message& message;
  const std::string& id;

  bool insert_claim(pqxx::work& w, bool only_if_nothing_recorded) {
    const bool meta = s.options.record_metadata;
    const std::string corr = meta && message.correlation_data && !message.correlation_data->empty()
                                 ? w.esc_raw(*message.correlation_data)
                                 : "";
    const pqxx::result r =
        w.exec_prepared(only_if_nothing_recorded ? "mi_claim_if_nothing" : "mi_claim", consumer, id,
                        meta ? message.topic : "", meta ? message.content_type.value_or("") : "",
                        corr, meta ? std::to_string(claim_payload_hash(message.payload)) : "");
    return r.affected_rows() == 1;
  }

  bool read_lookup(pqxx::transaction_base& w, MessageState* out) {
    *out = MessageState{};
    const pqxx::row r = w.exec_prepared1("mi_lookup", consumer, id);
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

  // One more attempt, committed on its own (synchronous_commit off: it must survive the
  // consumer's death, not the server's). `error`: a failed attempt not counted before.
  int count_attempt(const std::string* error) {
    pqxx::work w(*s.conn);
    w.exec0("SET LOCAL synchronous_commit = off");
    const pqxx::row r =
        error ? w.exec_prepared1("mi_attempt_failed_counted", consumer, id, s.clock->wall_ms(),
                                 *error)
              : w.exec_prepared1("mi_begin_attempt", consumer, id, s.clock->wall_ms());
    const int n = r[0].as<int>();
    w.commit();
    return n;
  }

  void mark_failed(const std::string& error) {
    pqxx::work w(*s.conn);
    w.exec0("SET LOCAL synchronous_commit = off");
    w.exec_prepared0("mi_attempt_failed", consumer, id, error);
    w.commit();
  }

  // The commit's outcome is unknown: reconnect and ask the claim row.
  Status resolve_in_doubt(const std::exception& e, ClaimResult* result) {
    s.log->warn(
        "consumer '{}', message '{}': the outcome of COMMIT is unknown ({}); the claim "
        "row decides",
        printable(consumer), printable(id), printable(e.what()));
    s.conn.reset();
    if (Status c = s.connect_locked(false); !c.ok())
      return s.store_error(
          Status(Status::Code::kIoError,
                 "commit outcome unknown and the server cannot be reached: " + c.message()));
    try {
      pqxx::nontransaction n(*s.conn);
      if (n.exec_prepared1("mi_claimed", consumer, id)[0].as<bool>()) {
        *result = ClaimResult::kProcessed;
        return Status::Ok();
      }
    } catch (const std::exception& e2) {
      return s.failed(e2, "reading the claim after an unknown commit outcome");
    }
    return s.store_error(Status(Status::Code::kIoError,
                                "the connection was lost during COMMIT and the claim is not "
                                "there: not committed, the message runs again"));
  }

  // With `w` open and the claim inserted: the handler, then COMMIT, or a rollback on any
  // failure. Every path ends the transaction.
  Status run(std::optional<pqxx::work>& w, int attempt, const StoreHandler& handler,
             bool delete_attempt_row, std::optional<int64_t> replayed, ClaimResult* result,
             std::string* handler_error, const nlohmann::json* payload_json) {
    const Delivery delivery{message, id, attempt, payload_json};
    const TypedTxn<pqxx::transaction_base> txn(*w);
    const HandlerVerdict v =
        run_handler(s.owner, &classify_pg_exception, [&] { handler(txn, delivery); });
    switch (v.kind) {
      case HandlerVerdict::Kind::kOk:
        break;
      case HandlerVerdict::Kind::kStoreError:
        abort_quietly(w);
        // A lost connection (kIoError) is made again by the next call.
        if (v.store.code() == Status::Code::kIoError || (s.conn && !s.conn->is_open()))
          s.conn.reset();
        return s.store_error(v.store);
      case HandlerVerdict::Kind::kFailed:
      case HandlerVerdict::Kind::kDeadLetter:
      case HandlerVerdict::Kind::kOutboxFull:
        abort_quietly(w);
        *result = v.kind == HandlerVerdict::Kind::kFailed       ? ClaimResult::kHandlerFailed
                  : v.kind == HandlerVerdict::Kind::kOutboxFull ? ClaimResult::kOutboxFull
                                                                : claim_result_for(v.reason);
        *handler_error = v.text;
        return Status::Ok();
    }
    try {
      if (delete_attempt_row) w->exec_prepared0("mi_delete_attempts", consumer, id);
      if (replayed) w->exec_prepared0("mi_mark_replayed", *replayed, s.clock->wall_ms());
    } catch (const std::exception& e) {
      abort_quietly(w);
      if (refused_message(e, result, handler_error)) return Status::Ok();
      return s.failed(e, "claim transaction");
    }
    try {
      w->commit();
      w.reset();
    } catch (const pqxx::in_doubt_error& e) {
      w.reset();
      if (Status r = resolve_in_doubt(e, result); !r.ok()) return r;
      ++s.processed;
      return Status::Ok();
    } catch (const pqxx::broken_connection& e) {
      w.reset();
      if (Status r = resolve_in_doubt(e, result); !r.ok()) return r;
      ++s.processed;
      return Status::Ok();
    } catch (const std::exception& e) {
      w.reset();
      if (refused_message(e, result, handler_error)) return Status::Ok();  // a deferred constraint
      return s.failed(e, "COMMIT");
    }
    *result = ClaimResult::kProcessed;
    ++s.processed;
    s.last_commit_steady_ms = s.clock->steady_ms();
    s.outbox_committed();  // the relays, if the handler enqueued
    return Status::Ok();
  }
};

}  // namespace

Status PgClaims::process(const std::string& consumer, const Message& message,
                         const std::string& message_id, const StoreHandler& handler,
                         int max_attempts, std::optional<int64_t> replayed_dead_letter,
                         const nlohmann::json* payload_json, ProcessReport* report) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::process"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  if (s_.options.before_claim_hook) s_.options.before_claim_hook(consumer, message_id);
  std::lock_guard<std::mutex> lock(s_.mu);
  *report = ProcessReport{};
  if (Status c = s_.connect_locked(false); !c.ok()) return c;
  const auto started = std::chrono::steady_clock::now();
  ClaimTxn c{s_, consumer, message, message_id};
  std::optional<pqxx::work> w;
  // Count this attempt before the handler runs: for a redelivery, and for an id with
  // something recorded (an earlier attempt failed, or died).
  bool count_first = message.dup;
  bool counted = false;
  bool refused = false;
  try {
    w.emplace(*s_.conn);
    if (!c.insert_claim(*w, /*only_if_nothing_recorded=*/true)) {
      if (c.read_lookup(*w, &report->state)) {
        if (replayed_dead_letter) {
          w->exec_prepared0("mi_mark_replayed", *replayed_dead_letter, s_.clock->wall_ms());
          w->commit();
          w.reset();
        } else {
          abort_quietly(w);
        }
        report->result = ClaimResult::kDuplicate;
        ++s_.duplicates;
        return Status::Ok();
      }
      if (report->state.dead_letter_id && !replayed_dead_letter) {
        abort_quietly(w);
        report->result = ClaimResult::kDeadLettered;
        return Status::Ok();
      }
      if (report->state.attempts >= max_attempts) {
        abort_quietly(w);
        report->result = ClaimResult::kAttemptsExhausted;
        return Status::Ok();
      }
      if (report->state.attempts > 0) count_first = true;
      if (!count_first && !c.insert_claim(*w, false)) {
        // A concurrent claim committed between the two statements: a duplicate.
        abort_quietly(w);
        report->result = ClaimResult::kDuplicate;
        ++s_.duplicates;
        return Status::Ok();
      }
    }
    report->attempt = report->state.attempts + 1;
    if (count_first) {
      abort_quietly(w);
      report->attempt = c.count_attempt(nullptr);
      counted = true;
      w.emplace(*s_.conn);
      if (!c.insert_claim(*w, false)) {
        // A concurrent delivery committed meanwhile: our attempt row goes with it.
        w->exec_prepared0("mi_delete_attempts", consumer, message_id);
        w->commit();
        w.reset();
        report->result = ClaimResult::kDuplicate;
        ++s_.duplicates;
        return Status::Ok();
      }
    }
  } catch (const std::exception& e) {
    abort_quietly(w);
    if (!refused_message(e, &report->result, &report->handler_error))
      return s_.failed(e, "claim transaction");
    refused = true;
  }
  const bool attempt_row = counted || report->state.attempts > 0;
  Status s = refused ? Status::Ok()
                     : c.run(w, report->attempt, handler, attempt_row, replayed_dead_letter,
                             &report->result, &report->handler_error, payload_json);
  if (s.ok() && report->result == ClaimResult::kHandlerFailed) {
    try {
      if (!counted)
        report->attempt = c.count_attempt(&report->handler_error);
      else
        c.mark_failed(report->handler_error);
      ++s_.retries;
    } catch (const std::exception& e) {
      s = s_.failed(e, "recording attempt failure");
    }
  }
  if (s.ok() && report->result == ClaimResult::kProcessed) {
    s_.record_latency(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - started)
                          .count());
    if (s_.options.after_commit_hook) s_.options.after_commit_hook(consumer, message_id);
  }
  return s;
}

Status PgClaims::claim(const std::string& consumer, const Message& message,
                       const std::string& message_id, int attempt, const StoreHandler& handler,
                       std::optional<int64_t> replayed_dead_letter, ClaimResult* result,
                       std::string* handler_error) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::claim"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  if (s_.options.before_claim_hook) s_.options.before_claim_hook(consumer, message_id);
  std::lock_guard<std::mutex> lock(s_.mu);
  if (Status c = s_.connect_locked(false); !c.ok()) return c;
  const auto started = std::chrono::steady_clock::now();
  ClaimTxn c{s_, consumer, message, message_id};
  std::optional<pqxx::work> w;
  try {
    w.emplace(*s_.conn);
    if (!c.insert_claim(*w, false)) {
      w->exec_prepared0("mi_delete_attempts", consumer, message_id);
      w->commit();
      w.reset();
      *result = ClaimResult::kDuplicate;
      ++s_.duplicates;
      return Status::Ok();
    }
  } catch (const std::exception& e) {
    abort_quietly(w);
    if (refused_message(e, result, handler_error)) return Status::Ok();
    return s_.failed(e, "claim transaction");
  }
  const Status s =
      c.run(w, attempt, handler, true, replayed_dead_letter, result, handler_error, nullptr);
  if (s.ok() && *result == ClaimResult::kProcessed) {
    s_.record_latency(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - started)
                          .count());
    if (s_.options.after_commit_hook) s_.options.after_commit_hook(consumer, message_id);
  }
  return s;
}

Status PgClaims::lookup(const std::string& consumer, const std::string& message_id,
                        MessageState* out) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::lookup"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  if (Status c = s_.connect_locked(false); !c.ok()) return c;
  static const Message kNone{};
  ClaimTxn c{s_, consumer, kNone, message_id};
  try {
    pqxx::nontransaction n(*s_.conn);
    if (c.read_lookup(n, out)) ++s_.duplicates;
  } catch (const std::exception& e) {
    return s_.failed(e, "looking up message");
  }
  return Status::Ok();
}

Status PgClaims::begin_attempt(const std::string& consumer, const std::string& message_id,
                               int* attempt) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::begin_attempt"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  if (Status c = s_.connect_locked(false); !c.ok()) return c;
  static const Message kNone{};
  ClaimTxn c{s_, consumer, kNone, message_id};
  try {
    *attempt = c.count_attempt(nullptr);
  } catch (const std::exception& e) {
    return s_.failed(e, "recording attempt");
  }
  return Status::Ok();
}

Status PgClaims::record_attempt_failure(const std::string& consumer, const std::string& message_id,
                                        const std::string& error) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::record_attempt_failure"); !r.ok())
    return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  if (Status c = s_.connect_locked(false); !c.ok()) return c;
  static const Message kNone{};
  ClaimTxn c{s_, consumer, kNone, message_id};
  try {
    c.mark_failed(error);
  } catch (const std::exception& e) {
    return s_.failed(e, "recording attempt failure");
  }
  ++s_.retries;
  return Status::Ok();
}

Status PgClaims::count_claims(const std::string& consumer, int64_t* rows) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::count_claims"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  if (Status c = s_.connect_locked(false); !c.ok()) return c;
  try {
    pqxx::nontransaction n(*s_.conn);
    *rows = n.exec_params1(
                 "SELECT count(*) FROM " + s_.t("inbox_processed") + " WHERE consumer_name = $1",
                 consumer)[0]
                .as<int64_t>();
  } catch (const std::exception& e) {
    return s_.failed(e, "counting processed rows");
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

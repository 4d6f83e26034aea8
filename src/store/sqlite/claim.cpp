// SqliteClaims (store/claims.h): the claim transaction with the handler inside it, and the
// attempt counting that stops crash loops, on the SQLite store. All of their SQL is in this
// file; how it works: docs/design.md#the-claim-transaction and
// docs/design.md#attempts-and-crash-loops.
//
// A first delivery costs one write transaction (BEGIN IMMEDIATE, claim, what is recorded
// for the id, handler, COMMIT): one fsync with synchronous=FULL, and in the WAL only the
// pages the claim and the handler changed. The attempt is counted outside the database
// while the handler runs (store/sqlite/attempt_marker.h) and written to inbox_attempts
// only when it failed, or at the next open when the process died inside it.
#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <chrono>
#include <exception>
#include <mutex>

#include "mqtt_inbox/clock.h"
#include "store/reentry.h"
#include "store/sqlite/errors.h"
#include "store/sqlite/store.h"
#include "store/sqlite/txn_fence.h"
#include "store/sqlite/util.h"
#include "store/txn.h"
#include "store/verdict.h"
#include "util/text.h"

namespace mqtt_inbox::detail {

StoreHandler bind_sqlite_handler(Handler handler) {
  return bind_handler<SQLite::Database>(std::move(handler));
}

namespace {

constexpr const char* kLookupSql =
    "SELECT EXISTS(SELECT 1 FROM inbox_processed"
    "              WHERE consumer_name = ?1 AND message_id = ?2),"
    "       (SELECT id FROM inbox_dead_letters"
    "        WHERE consumer_name = ?1 AND message_id = ?2 AND status IN ('dead', 'requeued')"
    "        ORDER BY id DESC LIMIT 1),"
    "       a.attempts, a.state, a.last_error, a.first_attempt_at"
    "  FROM (SELECT 1) LEFT JOIN inbox_attempts a"
    "    ON a.consumer_name = ?1 AND a.message_id = ?2";

constexpr const char* kBeginAttemptSql =
    "INSERT INTO inbox_attempts (consumer_name, message_id, attempts, first_attempt_at,"
    "                            last_attempt_at, state)"
    " VALUES (?1, ?2, 1, ?3, ?3, 'running')"
    " ON CONFLICT (consumer_name, message_id) DO UPDATE"
    "   SET attempts = attempts + 1, last_attempt_at = excluded.last_attempt_at,"
    "       state = 'running'"
    " RETURNING attempts";

// After a failed attempt that was counted in advance (begin_attempt).
constexpr const char* kAttemptFailedSql =
    "UPDATE inbox_attempts SET state = 'failed', last_error = ?3"
    " WHERE consumer_name = ?1 AND message_id = ?2";

// After a failed attempt that was not counted in advance (the marker counted it).
constexpr const char* kAttemptFailedCountedSql =
    "INSERT INTO inbox_attempts (consumer_name, message_id, attempts, first_attempt_at,"
    "                            last_attempt_at, state, last_error)"
    " VALUES (?1, ?2, 1, ?3, ?3, 'failed', ?4)"
    " ON CONFLICT (consumer_name, message_id) DO UPDATE"
    "   SET attempts = attempts + 1, last_attempt_at = excluded.last_attempt_at,"
    "       state = 'failed', last_error = excluded.last_error"
    " RETURNING attempts";

constexpr const char* kClaimSql =
    "INSERT INTO inbox_processed (consumer_name, message_id, received_at, topic,"
    "                             message_type, correlation_id, payload_hash)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
    " ON CONFLICT (consumer_name, message_id) DO NOTHING";

// The claim of the common case, a first delivery: inserted only if nothing is recorded for
// the id either (no attempts, no dead letter), so that one statement both claims and
// checks. Zero rows changed sends process() to the slow path, which reads why. The check
// makes received_at NULL, which its NOT NULL turns into a skipped row under OR IGNORE
// (https://sqlite.org/lang_conflict.html: IGNORE skips the one row that violates a NOT
// NULL or UNIQUE constraint); the table has no other constraint it could skip. (It is the
// library's table: a BEFORE INSERT trigger someone added on it would fire for a skipped
// row too, and OR IGNORE would apply inside its body.) A
// single-row VALUES insert needs no statement journal, where INSERT ... SELECT ... WHERE
// opened one per message: 3,000 fewer instructions per claim (callgrind, 20,000 claims).
constexpr const char* kClaimIfNothingRecordedSql =
    "INSERT OR IGNORE INTO inbox_processed (consumer_name, message_id, received_at, topic,"
    "                                       message_type, correlation_id, payload_hash)"
    " VALUES (?1, ?2,"
    "         CASE WHEN EXISTS (SELECT 1 FROM inbox_attempts"
    "                           WHERE consumer_name = ?1 AND message_id = ?2)"
    "                OR EXISTS (SELECT 1 FROM inbox_dead_letters WHERE consumer_name = ?1"
    "                           AND message_id = ?2 AND status IN ('dead', 'requeued'))"
    "              THEN NULL ELSE ?3 END,"
    "         ?4, ?5, ?6, ?7)";

constexpr const char* kDeleteAttemptsSql =
    "DELETE FROM inbox_attempts WHERE consumer_name = ?1 AND message_id = ?2";

constexpr const char* kMarkReplayedSql =
    "UPDATE inbox_dead_letters SET status = 'replayed', replayed_at = ?2 WHERE id = ?1";

// A change of this message refused at any point of its transaction, COMMIT included (a
// deferred foreign key, a CHECK, the commit hook's veto): a failure of this message, not
// of the store (store/sqlite/errors.h), so it counts as a handler attempt instead of being
// retried forever. True (and the result set) if `e` is one; else the caller reports a
// store error (transient: retried; fatal: latched).
bool refused_message(const SQLite::Exception& e, ClaimResult* result, std::string* error) {
  if (error_class(e.getErrorCode()) != ErrorClass::kMessage) return false;
  *result = ClaimResult::kHandlerFailed;
  *error = std::string("the store refused this message's transaction: ") + e.what();
  return true;
}

// Runs a cached statement that returns no rows, once.
void run(SQLite::Statement& q) {
  StatementReset reset(q);
  q.exec();
}

}  // namespace

void SqliteStore::prepare_statements() {
  SQLite::Database& d = *db;
  begin_immediate = std::make_unique<SQLite::Statement>(d, "BEGIN IMMEDIATE");
  commit = std::make_unique<SQLite::Statement>(d, "COMMIT");
  lookup = std::make_unique<SQLite::Statement>(d, kLookupSql);
  claim_if_nothing_recorded = std::make_unique<SQLite::Statement>(d, kClaimIfNothingRecordedSql);
  begin_attempt = std::make_unique<SQLite::Statement>(d, kBeginAttemptSql);
  attempt_failed = std::make_unique<SQLite::Statement>(d, kAttemptFailedSql);
  attempt_failed_counted = std::make_unique<SQLite::Statement>(d, kAttemptFailedCountedSql);
  claim = std::make_unique<SQLite::Statement>(d, kClaimSql);
  delete_attempts = std::make_unique<SQLite::Statement>(d, kDeleteAttemptsSql);
  mark_replayed = std::make_unique<SQLite::Statement>(d, kMarkReplayedSql);
}

void SqliteStore::recover_marked_attempt() {
  AttemptMarker::Entry e;
  if (!marker->read(&e)) return;
  enum class Recovery { kNothing, kCounted, kRequeuedIsDeadAgain } outcome = Recovery::kNothing;
  write_transaction([&] {
    outcome = Recovery::kNothing;
    // Nothing to do if this marker was handled already (a death between that commit and
    // the clear), or if the attempt ended after all (committed, or dead-lettered, just
    // before the death).
    SQLite::Statement q(*db,
                        "SELECT EXISTS(SELECT 1 FROM inbox_meta WHERE key = 'attempt_marker_nonce'"
                        "              AND value = ?3)"
                        "    OR EXISTS(SELECT 1 FROM inbox_processed"
                        "              WHERE consumer_name = ?1 AND message_id = ?2)"
                        "    OR EXISTS(SELECT 1 FROM inbox_dead_letters WHERE consumer_name = ?1"
                        "              AND message_id = ?2 AND status = 'dead'),"
                        "       EXISTS(SELECT 1 FROM inbox_dead_letters WHERE consumer_name = ?1"
                        "              AND message_id = ?2 AND status = 'requeued')");
    q.bind(1, e.consumer);
    q.bind(2, e.message_id);
    q.bind(3, std::to_string(e.nonce));
    if (!q.executeStep() || q.getColumn(0).getInt() != 0) return;
    if (q.getColumn(1).getInt() != 0) {
      // Only the requeue replay runs the handler of an id whose dead letter is
      // 'requeued' (a delivery of it is counted on the row, not handled): the process
      // died replaying it. Back to 'dead', or the running consumer would replay it, and
      // die, at every start: a crash loop made by an operator's requeue.
      SQLite::Statement back(*db,
                             "UPDATE inbox_dead_letters SET status = 'dead',"
                             "       reason = 'handler_crashed', reason_text = ?3,"
                             "       attempts = attempts + 1, last_attempt_at = ?4"
                             " WHERE consumer_name = ?1 AND message_id = ?2"
                             "   AND status = 'requeued'");
      back.bind(1, e.consumer);
      back.bind(2, e.message_id);
      back.bind(3,
                "the process died inside the handler while replaying this requeued "
                "dead letter");
      back.bind(4, clock->wall_ms());
      back.exec();
      outcome = Recovery::kRequeuedIsDeadAgain;
    } else {
      SQLite::Statement& a = *begin_attempt;
      StatementReset reset(a);
      a.bind(1, e.consumer);
      a.bind(2, e.message_id);
      a.bind(3, clock->wall_ms());
      while (a.executeStep()) {
      }
      outcome = Recovery::kCounted;
    }
    SQLite::Statement n(*db,
                        "INSERT INTO inbox_meta (key, value) VALUES ('attempt_marker_nonce', ?1)"
                        " ON CONFLICT (key) DO UPDATE SET value = excluded.value");
    n.bind(1, std::to_string(e.nonce));
    n.exec();
  });
  marker->clear();
  if (outcome == Recovery::kCounted)
    log->warn(
        "{}: the last process died inside the handler of message '{}' (consumer '{}'); "
        "that attempt is counted",
        path, printable(e.message_id), printable(e.consumer));
  else if (outcome == Recovery::kRequeuedIsDeadAgain)
    log->error(
        "{}: the last process died inside the handler while replaying the requeued dead "
        "letter of message '{}' (consumer '{}'); it is dead again (handler_crashed) and "
        "is not replayed until it is requeued again",
        path, printable(e.message_id), printable(e.consumer));
}

int SqliteStore::count_attempt(const std::string& consumer, const std::string& id,
                               const std::string* error) {
  RelaxedSync relaxed(*this);
  const bool failed = error != nullptr;
  SQLite::Statement& q = failed ? *attempt_failed_counted : *begin_attempt;
  StatementReset reset(q);
  q.bind(1, consumer);
  q.bind(2, id);
  q.bind(3, clock->wall_ms());
  if (failed) q.bind(4, *error);
  if (!q.executeStep()) throw SQLite::Exception("attempt upsert returned no row", SQLITE_INTERNAL);
  const int attempts = q.getColumn(0).getInt();
  // Step to SQLITE_DONE so the autocommit transaction commits before we return.
  while (q.executeStep()) {
  }
  return attempts;
}

Status SqliteClaims::lookup(const std::string& consumer, const std::string& message_id,
                            MessageState* out) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::lookup"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  try {
    if (s_.read_lookup(consumer, message_id, out))
      ++s_.duplicates;  // the caller skips it as a duplicate
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "looking up message"));
  }
  return Status::Ok();
}

Status SqliteClaims::begin_attempt(const std::string& consumer, const std::string& message_id,
                                   int* attempt) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::begin_attempt"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  try {
    *attempt = s_.count_attempt(consumer, message_id, nullptr);
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "recording attempt"));
  }
  return Status::Ok();
}

Status SqliteClaims::record_attempt_failure(const std::string& consumer,
                                            const std::string& message_id,
                                            const std::string& error) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::record_attempt_failure"); !r.ok())
    return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  try {
    SqliteStore::RelaxedSync relaxed(s_);
    SQLite::Statement& q = *s_.attempt_failed;
    StatementReset reset(q);
    q.bind(1, consumer);
    q.bind(2, message_id);
    q.bind(3, error);
    q.exec();
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "recording attempt failure"));
  }
  ++s_.retries;
  return Status::Ok();
}

Status SqliteClaims::count_claims(const std::string& consumer, int64_t* rows) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::count_claims"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  try {
    SQLite::Statement q(*s_.db, "SELECT count(*) FROM inbox_processed WHERE consumer_name = ?1");
    q.bind(1, consumer);
    q.executeStep();
    *rows = q.getColumn(0).getInt64();
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "counting processed rows"));
  }
  return Status::Ok();
}

bool SqliteStore::insert_claim(const std::string& consumer, const Message& message,
                               const std::string& message_id, bool only_if_nothing_recorded) {
  SqliteStore& m = *this;
  SQLite::Statement& q = only_if_nothing_recorded ? *m.claim_if_nothing_recorded : *m.claim;
  StatementReset reset(q);
  // No copies: the strings outlive the statement's step (StatementReset clears them).
  q.bindNoCopy(1, consumer);
  q.bindNoCopy(2, message_id);
  q.bind(3, m.retention_clock());
  if (m.options.record_metadata) {
    q.bindNoCopy(4, message.topic);
    if (message.content_type) q.bindNoCopy(5, *message.content_type);
    if (message.correlation_data && is_valid_utf8(*message.correlation_data))
      q.bindNoCopy(6, *message.correlation_data);
    q.bind(7, claim_payload_hash(message.payload));
  }
  q.exec();
  return m.db->getChanges() > 0;
}

bool SqliteStore::read_lookup(const std::string& consumer, const std::string& message_id,
                              MessageState* out) {
  SQLite::Statement& q = *lookup;
  StatementReset reset(q);
  q.bindNoCopy(1, consumer);
  q.bindNoCopy(2, message_id);
  *out = MessageState{};
  if (!q.executeStep()) return false;
  out->processed = q.getColumn(0).getInt() != 0;
  if (!q.getColumn(1).isNull()) out->dead_letter_id = q.getColumn(1).getInt64();
  if (!q.getColumn(2).isNull()) {
    out->attempts = q.getColumn(2).getInt();
    out->last_attempt_running = q.getColumn(3).getString() == "running";
    out->last_error = q.getColumn(4).isNull() ? "" : q.getColumn(4).getString();
    out->first_attempt_at_ms = q.getColumn(5).getInt64();
  }
  return out->processed;
}

void SqliteStore::delete_attempt_row(const std::string& consumer, const std::string& id) {
  SQLite::Statement& q = *delete_attempts;
  StatementReset reset(q);
  q.bind(1, consumer);
  q.bind(2, id);
  q.exec();
}

void SqliteStore::mark_replayed_row(int64_t dead_letter_id) {
  SQLite::Statement& q = *mark_replayed;
  StatementReset reset(q);
  q.bind(1, dead_letter_id);
  q.bind(2, clock->wall_ms());
  q.exec();
}

Status SqliteStore::claim_locked(const std::string& consumer, const Message& message,
                                 const std::string& message_id, int attempt,
                                 const StoreHandler& handler, bool delete_attempt_row_after,
                                 std::optional<int64_t> replayed_dead_letter, ClaimResult* result,
                                 std::string* handler_error, const nlohmann::json* payload_json) {
  // Called with the transaction open and the claim inserted. From here on, every path
  // either commits or rolls back before returning.
  SQLite::Database& d = *db;
  try {
    const Delivery delivery{message, message_id, attempt, payload_json};
    const TypedTxn<SQLite::Database> txn(d);
    HandlerVerdict v;
    {
      const TxnFence fence(d.getHandle());
      v = run_handler(owner, &classify_sqlite_exception, [&] { handler(txn, delivery); });
      fence.judge(&v);
    }
    switch (v.kind) {
      case HandlerVerdict::Kind::kOk:
        break;
      case HandlerVerdict::Kind::kStoreError:
        rollback_quietly(d);
        return store_error(v.store);
      case HandlerVerdict::Kind::kFailed:
      case HandlerVerdict::Kind::kDeadLetter:
      case HandlerVerdict::Kind::kOutboxFull:
        rollback_quietly(d);
        if (v.text.rfind(kHandlerEndedTransaction, 0) == 0)
          log->error("consumer '{}', message '{}': {}", printable(consumer), printable(message_id),
                     v.text);
        *result = v.kind == HandlerVerdict::Kind::kFailed       ? ClaimResult::kHandlerFailed
                  : v.kind == HandlerVerdict::Kind::kOutboxFull ? ClaimResult::kOutboxFull
                                                                : claim_result_for(v.reason);
        *handler_error = v.text;
        return Status::Ok();
    }
    if (delete_attempt_row_after) delete_attempt_row(consumer, message_id);
    if (replayed_dead_letter) mark_replayed_row(*replayed_dead_letter);
    run(*commit);
  } catch (const SQLite::Exception& e) {
    rollback_quietly(d);
    if (refused_message(e, result, handler_error)) return Status::Ok();
    return store_error(to_status(e, "claim transaction"));
  } catch (const std::exception& e) {
    rollback_quietly(d);
    return Status::Internal(std::string("claim transaction: ") + e.what());
  }
  *result = ClaimResult::kProcessed;
  ++processed;
  last_commit_steady_ms = clock->steady_ms();
  return Status::Ok();
}

Status SqliteClaims::claim(const std::string& consumer, const Message& message,
                           const std::string& message_id, int attempt, const StoreHandler& handler,
                           std::optional<int64_t> replayed_dead_letter, ClaimResult* result,
                           std::string* handler_error) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::claim"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  SqliteStore& m = s_;
  if (m.options.before_claim_hook) m.options.before_claim_hook(consumer, message_id);
  std::lock_guard<std::mutex> lock(m.mu);
  const auto started = std::chrono::steady_clock::now();
  try {
    run(*m.begin_immediate);
  } catch (const SQLite::Exception& e) {
    return m.store_error(to_status(e, "BEGIN IMMEDIATE"));
  }
  const RollbackOnThrow rollback_on_throw(*m.db);
  try {
    if (!m.insert_claim(consumer, message, message_id, false)) {
      // Someone else's claim won (a concurrent delivery). Our begin_attempt may have
      // re-created the attempts row after their commit deleted it; remove it with them.
      m.delete_attempt_row(consumer, message_id);
      if (m.db->getChanges() > 0)
        run(*m.commit);
      else
        rollback_quietly(*m.db);
      *result = ClaimResult::kDuplicate;
      ++m.duplicates;
      return Status::Ok();
    }
  } catch (const SQLite::Exception& e) {
    rollback_quietly(*m.db);
    if (refused_message(e, result, handler_error)) return Status::Ok();
    return m.store_error(to_status(e, "claim transaction"));
  }
  const Status s = m.claim_locked(consumer, message, message_id, attempt, handler, true,
                                  replayed_dead_letter, result, handler_error);
  if (s.ok() && *result == ClaimResult::kProcessed) {
    m.record_latency(std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - started)
                         .count());
    if (m.options.after_commit_hook) m.options.after_commit_hook(consumer, message_id);
  }
  return s;
}

Status SqliteClaims::process(const std::string& consumer, const Message& message,
                             const std::string& message_id, const StoreHandler& handler,
                             int max_attempts, std::optional<int64_t> replayed_dead_letter,
                             const nlohmann::json* payload_json, ProcessReport* report) {
  if (Status r = refuse_if_in_handler(s_.owner, "ClaimStore::process"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  SqliteStore& m = s_;
  if (m.options.before_claim_hook) m.options.before_claim_hook(consumer, message_id);
  std::lock_guard<std::mutex> lock(m.mu);
  SQLite::Database& db = *m.db;
  *report = ProcessReport{};
  const auto started = std::chrono::steady_clock::now();
  try {
    run(*m.begin_immediate);
  } catch (const SQLite::Exception& e) {
    return m.store_error(to_status(e, "BEGIN IMMEDIATE"));
  }
  const RollbackOnThrow rollback_on_throw(*m.db);
  bool marked = false;       // the marker counts this attempt while the handler runs
  bool attempt_row = false;  // inbox_attempts has a row for the id
  bool counted = false;      // this attempt is already counted in inbox_attempts
  bool refused = false;      // the store refused this message's change before the handler
  try {
    if (!m.insert_claim(consumer, message, message_id, /*only_if_nothing_recorded=*/true)) {
      // A duplicate, or something is recorded for the id: read what (the slow path).
      if (m.read_lookup(consumer, message_id, &report->state)) {
        if (replayed_dead_letter) {
          // The replayed message's effect is already committed: close its dead letter, so
          // a requeued row always ends (Consumer::replay_requeued).
          m.mark_replayed_row(*replayed_dead_letter);
          run(*m.commit);
        } else {
          rollback_quietly(db);
        }
        report->result = ClaimResult::kDuplicate;
        ++m.duplicates;
        return Status::Ok();
      }
      if (report->state.dead_letter_id && !replayed_dead_letter) {
        rollback_quietly(db);
        report->result = ClaimResult::kDeadLettered;
        return Status::Ok();
      }
      if (report->state.attempts >= max_attempts) {
        rollback_quietly(db);
        report->result = ClaimResult::kAttemptsExhausted;
        return Status::Ok();
      }
      // Not processed, and we hold the write lock since BEGIN IMMEDIATE: this claims.
      if (!m.insert_claim(consumer, message, message_id, false))
        throw SQLite::Exception("the claim changed no row after a lookup found none",
                                SQLITE_INTERNAL);
    }
    report->attempt = report->state.attempts + 1;
    attempt_row = report->state.attempts > 0;
    marked = m.marker && m.marker->set(consumer, message_id);
    if (!marked) {
      // No marker (a non-exclusive Inbox, or its write failed): the attempt goes into the
      // database, committed before the handler runs, and the claim is made again.
      rollback_quietly(db);
      report->attempt = m.count_attempt(consumer, message_id, nullptr);
      attempt_row = counted = true;
      run(*m.begin_immediate);
      if (!m.insert_claim(consumer, message, message_id, false)) {
        // A concurrent delivery committed meanwhile: our attempt row goes with it.
        m.delete_attempt_row(consumer, message_id);
        run(*m.commit);
        report->result = ClaimResult::kDuplicate;
        ++m.duplicates;
        return Status::Ok();
      }
    }
  } catch (const SQLite::Exception& e) {
    rollback_quietly(db);
    if (!refused_message(e, &report->result, &report->handler_error)) {
      if (marked) m.marker->clear();
      return m.store_error(to_status(e, "claim transaction"));
    }
    refused = true;
  }

  Status s = refused ? Status::Ok()
                     : m.claim_locked(consumer, message, message_id, report->attempt, handler,
                                      attempt_row, replayed_dead_letter, &report->result,
                                      &report->handler_error, payload_json);
  if (s.ok() && report->result == ClaimResult::kHandlerFailed) {
    // The attempt failed and was rolled back: count it (the marker only counted it while
    // the handler ran), so the next delivery knows how many are left.
    try {
      if (!counted) {
        report->attempt = m.count_attempt(consumer, message_id, &report->handler_error);
      } else {
        SqliteStore::RelaxedSync relaxed(m);
        SQLite::Statement& q = *m.attempt_failed;
        StatementReset reset(q);
        q.bind(1, consumer);
        q.bind(2, message_id);
        q.bind(3, report->handler_error);
        q.exec();
      }
      ++m.retries;
    } catch (const SQLite::Exception& e) {
      s = m.store_error(to_status(e, "recording attempt failure"));
    }
  }
  const bool committed = s.ok() && report->result == ClaimResult::kProcessed;
  // After a commit the marker may stay: the next open skips an id that is processed, and
  // the next message overwrites it (one pwrite per message instead of two).
  if (marked && !committed) m.marker->clear();
  if (committed) {
    m.record_latency(std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - started)
                         .count());
    if (m.options.after_commit_hook) m.options.after_commit_hook(consumer, message_id);
  }
  return s;
}

}  // namespace mqtt_inbox::detail

// The SQLite store's claim transaction: its statements (store/backend.h's claim and
// attempt primitives), the running-attempt marker, and the handler's run under the
// transaction fence. The decision is the front's (store/claims.cpp). All of their SQL is
// in this file; how it works: docs/design.md#the-claim-transaction and
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
#include "mqtt_inbox/handler.h"
#include "store/reentry.h"
#include "store/sqlite/backend.h"
#include "store/sqlite/errors.h"
#include "store/sqlite/txn_fence.h"
#include "store/sqlite/util.h"
#include "store/verdict.h"
#include "util/log.h"
#include "util/text.h"

namespace mqtt_inbox::detail {

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

// Runs a cached statement that returns no rows, once.
void run(SQLite::Statement& q) {
  StatementReset reset(q);
  q.exec();
}

}  // namespace

void SqliteBackend::prepare_statements() {
  SQLite::Database& d = *db;
  begin_immediate = std::make_unique<SQLite::Statement>(d, "BEGIN IMMEDIATE");
  commit_stmt = std::make_unique<SQLite::Statement>(d, "COMMIT");
  rollback_stmt = std::make_unique<SQLite::Statement>(d, "ROLLBACK");
  lookup = std::make_unique<SQLite::Statement>(d, kLookupSql);
  claim_if_nothing_recorded = std::make_unique<SQLite::Statement>(d, kClaimIfNothingRecordedSql);
  begin_attempt = std::make_unique<SQLite::Statement>(d, kBeginAttemptSql);
  attempt_failed = std::make_unique<SQLite::Statement>(d, kAttemptFailedSql);
  attempt_failed_counted = std::make_unique<SQLite::Statement>(d, kAttemptFailedCountedSql);
  claim = std::make_unique<SQLite::Statement>(d, kClaimSql);
  delete_attempts_stmt = std::make_unique<SQLite::Statement>(d, kDeleteAttemptsSql);
  mark_replayed_stmt = std::make_unique<SQLite::Statement>(d, kMarkReplayedSql);
}

void SqliteBackend::recover_marked_attempt() {
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

int SqliteBackend::count_attempt(const ClaimKey& key, const std::string* error) {
  RelaxedSync relaxed(*this);
  const bool failed = error != nullptr;
  SQLite::Statement& q = failed ? *attempt_failed_counted : *begin_attempt;
  StatementReset reset(q);
  q.bind(1, key.consumer);
  q.bind(2, key.message_id);
  q.bind(3, clock->wall_ms());
  if (failed) q.bind(4, *error);
  if (!q.executeStep()) throw SQLite::Exception("attempt upsert returned no row", SQLITE_INTERNAL);
  const int attempts = q.getColumn(0).getInt();
  // Step to SQLITE_DONE so the autocommit transaction commits before we return.
  while (q.executeStep()) {
  }
  return attempts;
}

void SqliteBackend::mark_attempt_failed(const ClaimKey& key, const std::string& error) {
  RelaxedSync relaxed(*this);
  SQLite::Statement& q = *attempt_failed;
  StatementReset reset(q);
  q.bind(1, key.consumer);
  q.bind(2, key.message_id);
  q.bind(3, error);
  q.exec();
}

bool SqliteBackend::mark_running(const ClaimKey& key) {
  return marker && marker->set(key.consumer, key.message_id);
}

void SqliteBackend::clear_running() noexcept {
  if (marker) marker->clear();
}

void SqliteBackend::begin(bool for_handler) {
  (void)for_handler;  // the fence is the connection's authorizer, always installed
  run(*begin_immediate);
}

// The claim is not needed: an SQLite commit's outcome is never unknown to its process.
CommitOutcome SqliteBackend::commit(const ClaimKey* /*claim*/, std::string* why) {
  try {
    run(*commit_stmt);
  } catch (const SQLite::Exception& e) {
    // A change of this message refused at COMMIT (a deferred foreign key, the commit
    // hook's veto): a failure of this message, not of the store (store/sqlite/errors.h).
    if (error_class(e.getErrorCode()) != ErrorClass::kMessage) throw;
    rollback();
    *why = e.what();
    return CommitOutcome::kRefused;
  }
  return CommitOutcome::kCommitted;
}

void SqliteBackend::rollback() noexcept {
  if (db && !connection_closed_by_handler_) rollback_quietly(*db);
}

bool SqliteBackend::insert_claim(const ClaimKey& key, const Message& message,
                                 bool only_if_nothing_recorded) {
  SQLite::Statement& q = only_if_nothing_recorded ? *claim_if_nothing_recorded : *claim;
  StatementReset reset(q);
  // No copies: the strings outlive the statement's step (StatementReset clears them).
  q.bindNoCopy(1, key.consumer);
  q.bindNoCopy(2, key.message_id);
  q.bind(3, retention_clock());
  if (options.record_metadata) {
    q.bindNoCopy(4, message.topic);
    if (message.content_type) q.bindNoCopy(5, *message.content_type);
    if (message.correlation_data && is_valid_utf8(*message.correlation_data))
      q.bindNoCopy(6, *message.correlation_data);
    q.bind(7, claim_payload_hash(message.payload));
  }
  q.exec();
  return db->getChanges() > 0;
}

bool SqliteBackend::read_state(const ClaimKey& key, MessageState* out) {
  SQLite::Statement& q = *lookup;
  StatementReset reset(q);
  q.bindNoCopy(1, key.consumer);
  q.bindNoCopy(2, key.message_id);
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

void SqliteBackend::delete_attempts(const ClaimKey& key) {
  SQLite::Statement& q = *delete_attempts_stmt;
  StatementReset reset(q);
  q.bind(1, key.consumer);
  q.bind(2, key.message_id);
  q.exec();
}

void SqliteBackend::mark_replayed(int64_t dead_letter_id) {
  SQLite::Statement& q = *mark_replayed_stmt;
  StatementReset reset(q);
  q.bind(1, dead_letter_id);
  q.bind(2, clock->wall_ms());
  q.exec();
}

void SqliteBackend::run_handler(const Inbox* owner, FunctionRef<void(const TxnRef&)> call,
                                HandlerRun* out) {
  run_sqlite_handler(*db, owner, call, out);
  // A connection the handler closed is let go (close_connection) and made anew by the
  // next call (ready()).
  if (out->left == TxnLeft::kClosed) connection_closed_by_handler_ = true;
}

}  // namespace mqtt_inbox::detail

// Inbox: the SQLite store behind the idempotent consumer. Knows nothing of MQTT.
//
// One Inbox owns one SQLite connection to one database file in WAL mode. Several
// consumer names can share the file: every row is keyed by (consumer_name, message_id),
// so each consumer records its own claim. One process owns the file at a time
// (InboxOptions::exclusive, a flock); tools and tests may open more connections with
// exclusive=false, and SQLite's single-writer lock serialises the short transactions.
//
// Most applications do not call the claim methods directly: a Consumer (consumer.h)
// runs the whole per-message policy on top of process(). The dead-letter methods back the
// library's and the admin tool's dead-letter commands.
//
// Thread safety: an Inbox is thread-safe; calls are serialised on an internal mutex
// (the handler runs under it). Errors: every method returns a Status and never throws.
#pragma once

#include <cstdint>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

// The schema version this library writes (PRAGMA user_version). Opening a database with
// a higher version fails with kCorruption: a newer library wrote it.
constexpr int kSchemaVersion = 4;

// The text of schema.sql, embedded at build time.
const char* schema_sql();

// What the store knows about (consumer, message id) before a delivery is processed.
struct MessageState {
  bool processed = false;                    // a claim row exists
  std::optional<int64_t> dead_letter_id;     // a dead letter with status 'dead' exists
  int attempts = 0;                          // attempts recorded so far (0 = none)
  bool last_attempt_running = false;         // the last attempt never finished: the
                                             // process died inside the handler
  std::string last_error;                    // error text of the last failed attempt
  int64_t first_attempt_at_ms = 0;
};

// Result of one claim transaction.
enum class ClaimResult {
  kProcessed,          // claim inserted, handler ran, committed
  kDuplicate,          // claim row already there: rolled back, handler not run
  kHandlerFailed,      // handler threw (not a store error): rolled back
  kUndecodable,        // handler threw UndecodablePayload: rolled back
  kDeadLettered,       // process() only: the id has a dead letter (status 'dead'): rolled
                       // back, handler not run
  kAttemptsExhausted,  // process() only: max_attempts attempts are recorded for the id:
                       // rolled back, handler not run
};

// What Inbox::process() found and did for one delivery.
struct ProcessReport {
  ClaimResult result = ClaimResult::kHandlerFailed;
  // The attempt the handler ran as: 1-based, counting the attempts of earlier processes;
  // 0 if the handler did not run.
  int attempt = 0;
  // What was recorded for the id before this delivery (claim, attempts, a dead letter).
  // Read only when the claim did not go through at once: all zero for a first delivery.
  MessageState state;
  // The handler's exception text, for kHandlerFailed and kUndecodable.
  std::string handler_error;
};

class Inbox {
 public:
  // Opens (creating if needed) the database at `path`, applies schema.sql to a new file,
  // and sets the pragmas: journal_mode=WAL (refused if the file system cannot do WAL),
  // synchronous per options, busy_timeout, foreign_keys=ON, cache_size,
  // journal_size_limit, wal_autocheckpoint. On success *out owns the inbox.
  // Errors: kInvalidArgument for bad options; kCorruption for a file that is not a
  // database or has a newer schema; store codes for I/O failures.
  static Status open(const std::string& path, const InboxOptions& options,
                     std::unique_ptr<Inbox>* out);

  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  const std::string& path() const;
  const InboxOptions& options() const;

  // --- the per-message path (used by Consumer) ---

  // One delivery in one write transaction: BEGIN IMMEDIATE; INSERT the claim ON CONFLICT
  // DO NOTHING, in the same statement only if no attempts and no dead letter are recorded
  // for the id. If that changed no row, read why, in the same transaction: a claim
  // (-> kDuplicate), a dead letter with status 'dead' (-> kDeadLettered, unless
  // `replayed_dead_letter` is set) or `max_attempts` attempts (-> kAttemptsExhausted), all
  // rolled back without running the handler; else claim. Otherwise run `handler` on this
  // connection, delete the attempts row if there is one, mark `replayed_dead_letter`
  // replayed if set, and COMMIT (fsync with synchronous=FULL). A first delivery therefore
  // costs one transaction and one fsync, and writes no page but the claim's and the
  // handler's.
  //
  // Attempts, so that a handler that kills the process is still counted (crash loops):
  // while the handler runs, the id is written to "<path>.lock" (pwrite, no fsync; needs
  // InboxOptions::exclusive) and the next open() records a marker left there by a dead
  // process as a 'running' attempt. A failed attempt is recorded at once (attempts + 1,
  // 'failed', the error) in a small commit without fsync. Without the lock file the
  // attempt is committed before the handler runs instead (one more transaction). After a
  // power loss, the attempt that was running can be missing: one extra attempt at most.
  //
  // A Status error means the store failed (nothing committed; retry later: a handler
  // failure is then not counted). The handler's own failures come back in *report.
  Status process(const std::string& consumer, const Message& message,
                 const std::string& message_id, const Handler& handler, int max_attempts,
                 std::optional<int64_t> replayed_dead_letter, ProcessReport* report);

  // --- finer building blocks (the previous per-message path; for custom policies) ---

  // Reads what is known about (consumer, id). A read only: it never blocks a writer.
  Status lookup(const std::string& consumer, const std::string& message_id,
                MessageState* out);

  // Records the start of one more handler attempt (attempts+1, state 'running') and
  // commits it before returning, without fsync (synchronous=NORMAL for this one small
  // transaction): the count survives a crash of the process, which is what it is for;
  // on power loss the next FULL commit's fsync has usually carried it, and losing it
  // costs one extra attempt at most. *attempt receives the new count (1-based).
  Status begin_attempt(const std::string& consumer, const std::string& message_id,
                       int* attempt);

  // Marks the running attempt as failed with `error` (same durability as begin_attempt).
  Status record_attempt_failure(const std::string& consumer, const std::string& message_id,
                                const std::string& error);

  // The claim transaction alone: BEGIN IMMEDIATE; INSERT the claim ON CONFLICT DO NOTHING;
  // zero rows changed -> kDuplicate (rollback, handler not run); else run `handler` on
  // this connection; delete the attempts row; if `replayed_dead_letter` is set, mark that
  // dead letter replayed; COMMIT (fsync with synchronous=FULL). It neither reads nor
  // counts attempts (lookup and begin_attempt do, before it). A Status error means the
  // store failed (nothing committed; retry later); the handler's own failures come back
  // as ClaimResult with the exception text in *handler_error.
  Status claim(const std::string& consumer, const Message& message,
               const std::string& message_id, int attempt, const Handler& handler,
               std::optional<int64_t> replayed_dead_letter, ClaimResult* result,
               std::string* handler_error);

  // Writes a dead letter and deletes the attempts row, in one committed transaction.
  // If dl.message_id is set and a dead letter with status 'dead' already exists for
  // (consumer, id), that row's redeliveries count is bumped instead (a lost PUBACK after
  // dead-lettering must not create a second row). If `replace_id` is set, that row is
  // updated in place (a failed replay). *id receives the row id.
  Status add_dead_letter(const DeadLetter& dl, std::optional<int64_t> replace_id,
                         int64_t* id);

  // --- dead-letter administration ---

  // Rows matching `filter`, newest first, payloads included.
  Status list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out);
  // One row by id; kNotFound if absent.
  Status get_dead_letter(int64_t id, DeadLetter* out);
  // Deletes rows matching `filter` (its limit is ignored); *removed gets the row count.
  Status purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed);

  // --- inspection ---

  // Rows in inbox_processed for `consumer`.
  Status count_processed(const std::string& consumer, int64_t* rows);

  // Runs `fn` with exclusive use of the connection, outside any transaction. For creating
  // the application's tables at start-up, and for tools and tests that need plain SQL on
  // the same connection. The one call that can throw: whatever `fn` throws (SQLiteCpp
  // exceptions included) propagates to the caller.
  void with_connection(const std::function<void(SQLite::Database&)>& fn);

  // --- retention clock and stats ---

  // The retention clock, ms: received_at of new claims. Starts at the wall clock when the
  // database is created, then advances only with the monotonic clock while an Inbox is
  // open, and continues from its persisted value after a restart, so wall-clock jumps
  // never move it (README "Clock safety"). Cheap; any thread.
  int64_t retention_clock_ms() const;
  // Stores the retention clock in inbox_meta (the Pruner does this every pass, and the
  // destructor once). Errors: store codes.
  Status persist_retention_clock();

  // A snapshot of counters, commit latency, file sizes and the last row measurement.
  // Cheap and safe from any thread: never waits for the store (stats.h).
  InboxStats stats() const;
  // Measures rows per consumer now (one aggregate query, a scan of inbox_processed, under
  // the connection lock: message commits wait for it). The Pruner measures on its own
  // connection instead, after each pass.
  Status refresh_row_stats();

 private:
  friend class Pruner;
  struct Impl;
  explicit Inbox(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mqtt_inbox

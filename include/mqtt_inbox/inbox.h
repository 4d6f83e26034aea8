// Inbox: the SQLite store behind the idempotent consumer. Knows nothing of MQTT.
//
// One Inbox owns one SQLite connection to one database file in WAL mode. Several
// consumer names can share the file: every row is keyed by (consumer_name, message_id),
// so each consumer records its own claim. One process owns the file at a time
// (InboxOptions::exclusive, a flock); tools and tests may open more connections with
// exclusive=false, and SQLite's single-writer lock serialises the short transactions.
//
// Most applications do not call the claim methods directly: a Consumer (consumer.h)
// runs the whole per-message policy on top of them. The dead-letter methods back the
// library's and the admin tool's dead-letter commands.
//
// Backups: in WAL mode a committed transaction may live only in "<path>-wal" until a
// checkpoint copies it into the database file (https://sqlite.org/wal.html). A copy of
// the database file alone, or of both files while a consumer runs, can miss committed
// messages (their ids then look new: duplicates get through after a restore) or be torn.
// Back up with SQLite's online backup (`sqlite3 <path> ".backup <copy>"`, the
// sqlite3_backup_* API) or `VACUUM INTO '<copy>'`, both consistent snapshots taken next to
// a running consumer; or stop the consumer and copy the database file together with its
// -wal file. The -shm file and "<path>.lock" are not needed.
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
constexpr int kSchemaVersion = 3;

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
  kProcessed,       // claim inserted, handler ran, committed
  kDuplicate,       // claim row already there: rolled back, handler not run
  kHandlerFailed,   // handler threw (not a store error): rolled back
  kUndecodable,     // handler threw UndecodablePayload: rolled back
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

  // --- building blocks of the per-message path (used by Consumer) ---

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

  // The claim transaction: BEGIN IMMEDIATE; INSERT the claim ON CONFLICT DO NOTHING;
  // zero rows changed -> kDuplicate (rollback, handler not run); else run `handler` on
  // this connection; delete the attempts row; if `replayed_dead_letter` is set, mark that
  // dead letter replayed; COMMIT (fsync with synchronous=FULL). A Status error means the
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

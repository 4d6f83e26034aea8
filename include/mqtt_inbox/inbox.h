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
#include "mqtt_inbox/health.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

namespace detail {
class Store;         // the store layer's seam (src/store/store.h)
struct SqliteStore;  // the SQLite store behind an Inbox (src/store/sqlite/store.h)
}

// The schema version this library writes (PRAGMA user_version). Opening a database with
// a higher version fails with kCorruption: a newer library wrote it.
constexpr int kSchemaVersion = 12;

// The text of schema.sql, embedded at build time.
const char* schema_sql();

// The free space, in bytes, that the file system holding the database must keep so the
// inbox can always recover from a full disk by itself once the outside cause is gone
// (README "Disk space"): room for its smallest WAL (32 pages) and for the database growth
// that checkpointing it needs, twice over, plus the -shm file (32 KiB): 544 KiB with 4 KiB
// pages. The growth of your own data comes on top. `mqtt-inbox check` warns below it.
int64_t min_free_bytes(int page_size_bytes);

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
  kRejected,           // handler threw RejectMessage: rolled back (dead letter
                       // invalid_payload at once)
  kReentered,          // handler called back into this inbox (handler.h): rolled back
                       // (dead letter handler_reentered at once)
  kOutboxRefused,      // handler threw OutboxRefused (an outgoing message the outbox
                       // refuses for good, outbox.h): rolled back (dead letter
                       // outbox_refused at once)
  kDeadLettered,       // process() only: the id has a dead letter (status 'dead'): rolled
                       // back, handler not run
  kAttemptsExhausted,  // process() only: max_attempts attempts are recorded for the id:
                       // rolled back, handler not run
  kOutboxFull,         // handler threw OutboxFull (a full kReject outbox class): rolled
                       // back and, in process(), no failure recorded: the message is not
                       // at fault (the Consumer parks it, dead_letter.h kOutboxFull, which
                       // also clears the attempt a non-exclusive Inbox committed before
                       // the handler ran)
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
  // The handler's exception text, for kHandlerFailed, kUndecodable, kRejected and
  // kOutboxRefused; the refused call, for kReentered.
  std::string handler_error;
};

class Inbox {
 public:
  // Opens (creating if needed) the database at `path`, applies schema.sql to a new file
  // (and the missing steps to an older one), and sets the pragmas: journal_mode=WAL
  // (refused if the file system cannot do WAL), synchronous per options, busy_timeout,
  // foreign_keys=ON, cache_size, journal_size_limit, wal_autocheckpoint. On success
  // *out owns the inbox.
  // Start-up: while the store is transiently unavailable (another process holds the
  // write lock, the disk is full, I/O fails, the file is read-only) it waits and retries
  // with capped backoff (InboxOptions::startup_*), reporting through
  // InboxOptions::startup_progress; it returns when the store is ready, so nothing can
  // connect to the broker before. Before touching SQLite it checks that this process can
  // write the database, its -wal, -shm and .lock files and their folder.
  // Errors: kInvalidArgument for bad options; kBusy if another consumer process holds
  // the database (InboxOptions::exclusive); kPermissionDenied for a file this process
  // cannot write (the message names it, its owner and the fix: README "Files created
  // under another user"); kCorruption for a file that is not a database, is corrupt, or
  // has a newer schema (the file is left untouched: README "Recovering a corrupt
  // database"); the last transient store error (kBusy, kFull, kIoError, kReadOnly) when
  // startup_deadline_ms ran out.
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
  // `payload_json`: the payload's parse, if the caller has made one (the Consumer's id
  // extraction from a JSON field), handed to the handler as Delivery::payload_json; must
  // stay valid during the call. Default nullptr.
  //
  // A Status error means the store failed (nothing committed; retry later: a handler
  // failure is then not counted). The handler's own failures come back in *report.
  Status process(const std::string& consumer, const Message& message,
                 const std::string& message_id, const Handler& handler, int max_attempts,
                 std::optional<int64_t> replayed_dead_letter, ProcessReport* report,
                 const nlohmann::json* payload_json = nullptr);

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
  // If dl.message_id is set and a dead letter with status 'dead' or 'requeued' already
  // exists for (consumer, id), that row's redeliveries count is bumped instead (a lost
  // PUBACK after dead-lettering must not create a second row). If `replace_id` is set,
  // that row is updated in place (a failed replay); if it was purged meanwhile, the dead
  // letter is written as a new row, so the message is never lost. A new or replaced row
  // gets status
  // 'requeued' if dl.requeued (a message parked by a full outbox), else 'dead'. *id
  // receives the row id.
  Status add_dead_letter(const DeadLetter& dl, std::optional<int64_t> replace_id,
                         int64_t* id);

  // --- dead-letter administration ---

  // Rows matching `filter`, newest first, payloads included.
  Status list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out);
  // One row by id; kNotFound if absent.
  Status get_dead_letter(int64_t id, DeadLetter* out);
  // Deletes rows matching `filter` (its limit is ignored); *removed gets the row count.
  Status purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed);
  // Marks dead letter `id` 'requeued': the running Consumer of its consumer name replays
  // it by itself, on its own thread (ConsumerOptions::requeue_poll_ms; README "Replaying
  // a dead letter while the service runs"), through the handler in its own transaction;
  // it ends 'replayed' (committed once, like Consumer::replay_dead_letter) or 'dead' again
  // with the new reason; if the replay kills the process, the next Inbox::open makes it
  // 'dead' again as handler_crashed (one more attempt), so it is not replayed at every
  // start. Meant for a second connection (the admin tool opens the file
  // with exclusive=false next to the running service; SQLite serialises the one short
  // write). Errors: kNotFound; kInvalidArgument if the row is not 'dead' (already
  // requeued or replayed), its payload was cut (dead_letter_payload_bytes), or it belongs
  // to a store-then-process consumer (use StoreThenProcess::replay); store codes.
  Status requeue_dead_letter(int64_t id);
  // Ids of `consumer`'s dead letters with status 'requeued', oldest first, at most
  // `limit` (> 0). One index probe; what a Consumer polls.
  Status requeued_dead_letters(const std::string& consumer, int64_t limit,
                               std::vector<int64_t>* ids);

  // --- inspection ---

  // Rows in inbox_processed for `consumer`.
  Status count_processed(const std::string& consumer, int64_t* rows);

  // The application's start-up SQL (CREATE TABLE IF NOT EXISTS ..., its own migrations,
  // seed rows): runs `fn` on the inbox's connection inside one BEGIN IMMEDIATE ... COMMIT,
  // waiting out transient store errors exactly like open() (InboxOptions::startup_*); a
  // failed attempt is rolled back, so `fn` always starts from the same state. `fn` may
  // not open or end transactions, nor run PRAGMAs that cannot run inside one
  // (journal_mode). Never throws: an SQLite error of `fn` comes back classified (kRejected,
  // kInternal, ...), another exception as kInvalidArgument with its text. Errors: as for
  // open's start-up (the last transient error after startup_deadline_ms; kCorruption).
  Status setup(const std::function<void(SQLite::Database&)>& fn);

  // Runs `fn` with exclusive use of the connection, outside any transaction, once. For
  // tools and tests that need plain SQL on the same connection; start-up SQL belongs in
  // setup(), which waits for a locked store. The one call that can throw: whatever `fn`
  // throws (SQLiteCpp exceptions included) propagates to the caller. Once the file was
  // found corrupt it throws SQLite::Exception (SQLITE_CORRUPT) without running `fn`.
  void with_connection(const std::function<void(SQLite::Database&)>& fn);

  // The inbox's own view of the store (health.h): its start-up and maintenance waits
  // (setup, Pruner::create, ...) and, for every user of the file, whether the file was
  // found corrupt (`fatal`, red). Cheap; any thread; never waits for the store.
  Health health() const;

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

  // The transport's session records in this inbox (session_record.h): what the MQTT
  // Subscriber's persistent sessions hold, which the Pruner checks its retention window
  // against. Lives as long as the Inbox; thread-safe.
  SessionRecords& sessions() const;

  // The store behind this inbox, for the library's own parts made on it (Consumer,
  // Outbox, Pruner, StoreThenProcess); an incomplete type to applications.
  detail::Store& store() const;

 private:
  explicit Inbox(std::unique_ptr<detail::SqliteStore> impl);
  std::unique_ptr<detail::SqliteStore> impl_;
};

}  // namespace mqtt_inbox

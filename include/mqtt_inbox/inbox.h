// Inbox: the database behind the idempotent consumer ("the file"). Knows nothing of MQTT.
//
// One Inbox owns one SQLite connection to one database file in WAL mode. Several
// consumer names can share the file: every row is keyed by (consumer_name, message_id),
// so each consumer records its own claim. One process owns the file at a time
// (InboxOptions::exclusive, a flock); tools and tests may open more connections with
// exclusive=false, and SQLite's single-writer lock serialises the short transactions.
//
// Applications open it, run their start-up SQL in setup(), and make the library's parts
// on it: a Consumer (consumer.h) or StoreThenProcess (store_then_process.h) per consumer
// name, an Outbox, a Pruner. Beyond that the Inbox offers what an operator needs: stats,
// health, the dead letters, and the transport's session records.
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
// Thread safety: an Inbox is thread-safe; calls that use the connection are serialised
// on it (a handler runs holding it, and a call from inside a handler of this inbox is
// refused: handler.h). Errors: every method returns a Status and never throws, except
// with_connection.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/health.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

namespace detail {
class Store;  // the store layer's seam, internal to the library
}

// The schema version this library writes (PRAGMA user_version). Opening a database with
// a higher version fails with kCorruption: a newer library wrote it.
constexpr int kSchemaVersion = 13;

// The text of schema.sql, embedded at build time.
const char* schema_sql();

// The free space, in bytes, that the file system holding the database must keep so the
// inbox can always recover from a full disk by itself once the outside cause is gone
// (docs/operations.md#disk-space): room for its smallest WAL (32 pages) and for the database growth
// that checkpointing it needs, twice over, plus the -shm file (32 KiB): 544 KiB with 4 KiB
// pages. The growth of your own data comes on top. `mqtt-inbox check` warns below it.
int64_t min_free_bytes(int page_size_bytes);

class Inbox {
 public:
  // The store is chosen by `path`: a PostgreSQL connection URI ("postgresql://...",
  // "postgres://...") opens the PostgreSQL store (postgres.h, docs/postgres.md: its own
  // errors, and a URI holding a password is kInvalidArgument); anything else is an SQLite
  // file, as follows.
  // Opens (creating if needed) the database at `path` in WAL mode (refused where the file
  // system cannot do WAL), brings its schema to kSchemaVersion and applies `options`;
  // docs/design.md#opening-an-inbox says how. On success *out owns the inbox.
  // Start-up: while the store is transiently unavailable (another process holds the
  // write lock, the disk is full under an existing database, I/O fails, the file is
  // read-only) it waits and retries
  // with capped backoff (InboxOptions::startup_*), reporting through
  // InboxOptions::startup_progress; it returns when the store is ready, so nothing can
  // connect to the broker before. Before touching SQLite it checks that this process can
  // write the database, its -wal, -shm and .lock files and their folder.
  // What waiting cannot mend fails at once, creating nothing: kInvalidArgument for a path
  // that is a folder or a device or whose folder does not exist, kReadOnly for a new
  // database in a folder this process cannot write, kFull for a new database that does
  // not fit (its files removed). Errors: kInvalidArgument for bad options; kBusy if another
  // consumer process holds
  // the database (InboxOptions::exclusive); kPermissionDenied for a file this process
  // cannot write (the message names it, its owner and the fix:
  // docs/operations.md#files-created-under-another-user); kCorruption for a file that is
  // not a database, is corrupt, or has a newer schema (the file is left untouched:
  // docs/operations.md#recovering-a-corrupt-database); the last transient store error
  // (kBusy, kFull, kIoError, kReadOnly) when startup_deadline_ms ran out.
  static Status open(const std::string& path, const InboxOptions& options,
                     std::unique_ptr<Inbox>* out);

  // Persists the retention clock (best effort, waiting at most 200 ms for another
  // process's lock) and closes the database, then gives up the lock file. Everything
  // made on the Inbox (Consumer, StoreThenProcess, Outbox, Pruner, relays) must be
  // destroyed first.
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // The database path and the options given to open(). Any thread; never wait.
  const std::string& path() const;
  const InboxOptions& options() const;

  // The application's start-up SQL (CREATE TABLE IF NOT EXISTS ..., its own migrations,
  // seed rows): runs `fn` on the inbox's connection inside one transaction, waiting out
  // transient store errors exactly like open() (InboxOptions::startup_*); a failed
  // attempt is rolled back, so `fn` always starts from the same state. `fn` may not open
  // or end transactions, nor run PRAGMAs that cannot run inside one (journal_mode).
  // Never throws: an SQLite error of `fn` comes back classified (kRejected, kInternal,
  // ...), another exception as kInvalidArgument with its text. Errors: as for open's
  // start-up (the last transient error after startup_deadline_ms; kCorruption).
  Status setup(const std::function<void(SQLite::Database&)>& fn);
  // setup() with SQL text: runs `sql` (one or more statements separated by ';') inside
  // that transaction (SQLite: sqlite3_exec; PostgreSQL: one simple-protocol query), with
  // the same waits and errors. For callers that hold their schema as text (the C API's
  // mqtt_inbox_setup, c.h) and for the PostgreSQL store, whose set-up is text only. On
  // PostgreSQL look before you create (docs/postgres.md#privileges); there set-ups take
  // turns per database (an advisory lock held to the commit), so processes starting
  // together do not race on the same CREATE TABLE.
  Status setup_sql(const std::string& sql);

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

  // The retention clock, ms: received_at of new claims. Starts at the wall clock when the
  // database is created, then advances only with the monotonic clock while an Inbox is
  // open, and continues from its persisted value after a restart, so wall-clock jumps
  // never move it (docs/operations.md#clock-safety). Cheap; any thread.
  int64_t retention_clock_ms() const;

  // A snapshot of counters, commit latency, file sizes and the last row measurement.
  // Cheap and safe from any thread: never waits for the store (stats.h).
  InboxStats stats() const;
  // Measures rows per consumer now (a scan of the claims under the connection: message
  // commits wait for it). The Pruner measures on its own connection instead, after each
  // pass. Errors: store codes.
  Status refresh_row_stats();

  // --- dead-letter administration (dead_letter.h) ---

  // Rows matching `filter`, newest first, payloads included.
  Status list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out);
  // One row by id; kNotFound if absent.
  Status get_dead_letter(int64_t id, DeadLetter* out);
  // Deletes rows matching `filter` (its limit is ignored); *removed gets the row count.
  Status purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed);
  // Marks dead letter `id` 'requeued': the running Consumer of its consumer name replays
  // it by itself, on its own thread (ConsumerOptions::requeue_poll_ms;
  // docs/api-guide.md#replaying-a-dead-letter-while-the-service-runs), through the handler
  // in its own transaction;
  // it ends 'replayed' (committed once, like Consumer::replay_dead_letter) or 'dead' again
  // with the new reason; if the replay kills the process, the next Inbox::open makes it
  // 'dead' again as handler_crashed (one more attempt), so it is not replayed at every
  // start. Meant for a second connection (the admin tool opens the file with
  // exclusive=false next to the running service; SQLite serialises the one short write).
  // Errors: kNotFound; kInvalidArgument if the row is not 'dead' (already requeued or
  // replayed), its payload was cut (dead_letter_payload_bytes), or it belongs to a
  // store-then-process consumer (use StoreThenProcess::replay); store codes.
  Status requeue_dead_letter(int64_t id);

  // The transport's session records in this inbox (session_record.h): what the MQTT
  // Subscriber's persistent sessions hold, which the Pruner checks its retention window
  // against. Lives as long as the Inbox; thread-safe.
  SessionRecords& sessions() const;

  // The store behind this inbox, for the library's own parts made on it (Consumer,
  // Outbox, Pruner, StoreThenProcess); an incomplete type to applications.
  detail::Store& store() const;

 private:
  explicit Inbox(std::unique_ptr<detail::Store> store);
  std::unique_ptr<detail::Store> store_;
};

}  // namespace mqtt_inbox

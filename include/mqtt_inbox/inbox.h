// Inbox: the database behind the idempotent consumer. Knows nothing of MQTT.
//
// One Inbox owns one connection to one store: an SQLite database file in WAL mode
// (mqtt_inbox/sqlite.h), or a schema on a PostgreSQL server (mqtt_inbox/postgres.h);
// Inbox::open chooses by the location. Several consumer names can share it: every row is
// keyed by (consumer_name, message_id), so each consumer records its own claim. On SQLite
// one process owns the file at a time (InboxOptions::exclusive, a flock); tools and tests
// may open more connections with exclusive=false, and SQLite's single-writer lock
// serialises the short transactions. On PostgreSQL any number of processes share it.
//
// Applications open it, run their start-up SQL in setup(), and make the library's parts
// on it: a Consumer (consumer.h) or StoreThenProcess (store_then_process.h) per consumer
// name, an Outbox, a Pruner. Beyond that the Inbox offers what an operator needs: stats,
// health, the dead letters, and the transport's session records.
//
// Backups of an SQLite inbox: in WAL mode a committed transaction may live only in "<path>-wal"
// until a checkpoint copies it into the database file (https://sqlite.org/wal.html). A copy of the
// database file alone, or of both files while a consumer runs, can miss committed messages (their
// ids then look new: duplicates get through after a restore) or be torn. Back up with SQLite's
// online backup (`sqlite3 <path> ".backup <copy>"`, the sqlite3_backup_* API) or `VACUUM INTO
// '<copy>'`, both consistent snapshots taken next to a running consumer; or stop the consumer and
// copy the database file together with its -wal file. The -shm file and "<path>.lock" are not
// needed.
//
// Thread safety: an Inbox is thread-safe; calls that use the connection are serialised
// on it (a handler runs holding it, and a call from inside a handler of this inbox is
// refused: handler.h). Errors: every method returns a Status and never throws, except
// with_connection. The error codes are the same on every store (status.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/health.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

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
  virtual ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // The database path and the options given to open(). Any thread; never wait.
  virtual const std::string& path() const = 0;
  virtual const InboxOptions& options() const = 0;

  // The application's start-up SQL (CREATE TABLE IF NOT EXISTS ..., its own migrations,
  // seed rows): runs `fn` inside one transaction of the store, waiting out transient store
  // errors exactly like open() (InboxOptions::startup_*); a failed attempt is rolled back,
  // so `fn` always starts from the same state. `fn` is a function of the store's
  // transaction: (SQLite::Database&) on SQLite (mqtt_inbox/sqlite.h), on the inbox's
  // connection inside BEGIN IMMEDIATE; (pqxx::transaction_base&) on PostgreSQL
  // (mqtt_inbox/postgres.h). `fn` may not open or end transactions, nor run what cannot
  // run inside one (SQLite's journal_mode). Never throws: a store error of `fn` comes back
  // classified (kRejected, kInternal, ...), another exception as kInvalidArgument with its
  // text, and a function of the other store's type as kInvalidArgument. Errors: as for
  // open's start-up (the last transient error after startup_deadline_ms; kCorruption).
  template <typename F>
  Status setup(F&& fn) {
    using T = detail::FirstParamObject<F>;
    return setup_with(&typeid(T*), [f = std::forward<F>(fn)](const detail::TxnRef& txn) mutable {
      f(*static_cast<T*>(txn.handle));
    });
  }
  // setup() with SQL text: runs `sql` (one or more statements separated by ';') inside
  // that transaction (SQLite: sqlite3_exec; PostgreSQL: one simple-protocol query), with
  // the same waits and errors. For callers that hold their schema as text (the C API's
  // mqtt_inbox_setup, c.h). On PostgreSQL look before you create
  // (docs/postgres.md#privileges); there set-ups take turns per database (an advisory
  // lock held to the commit), so processes starting together do not race on the same
  // CREATE TABLE.
  virtual Status setup_sql(const std::string& sql) = 0;

  // Runs `fn` with exclusive use of the store's connection, outside any transaction, once:
  // a function of (SQLite::Database&) on SQLite, of (pqxx::connection_base&) on PostgreSQL.
  // For tools and tests that need plain SQL on the same connection; start-up SQL belongs
  // in setup(), which waits for a locked store. The one call that can throw: whatever
  // `fn` throws (the store's exceptions included) propagates to the caller;
  // std::logic_error for a function of another store's type or a call from inside a
  // handler of this inbox. Once the store was found unusable it throws without running
  // `fn` (SQLite: SQLite::Exception with SQLITE_CORRUPT).
  template <typename F>
  void with_connection(F&& fn) {
    using T = detail::FirstParamObject<F>;
    auto call = [&fn](const detail::TxnRef& txn) { fn(*static_cast<T*>(txn.handle)); };
    with_connection_of(&typeid(T*), call);
  }

  // The inbox's own view of the store (health.h): its start-up and maintenance waits
  // (setup, Pruner::create, ...) and, for every user of the file, whether the file was
  // found corrupt (`fatal`, red). Cheap; any thread; never waits for the store.
  virtual Health health() const = 0;

  // The retention clock, ms: received_at of new claims. Starts at the wall clock when the
  // database is created, then advances only with the monotonic clock while an Inbox is
  // open, and continues from its persisted value after a restart, so wall-clock jumps
  // never move it (docs/operations.md#clock-safety). Cheap; any thread.
  virtual int64_t retention_clock_ms() const = 0;

  // A snapshot of counters, commit latency, file sizes and the last row measurement.
  // Cheap and safe from any thread: never waits for the store (stats.h).
  virtual InboxStats stats() const = 0;
  // Measures rows per consumer now (a scan of the claims under the connection: message
  // commits wait for it). The Pruner measures on its own connection instead, after each
  // pass. Errors: store codes.
  virtual Status refresh_row_stats() = 0;

  // --- dead-letter administration (dead_letter.h) ---

  // Rows matching `filter`, newest first, payloads included.
  virtual Status list_dead_letters(const DeadLetterFilter& filter,
                                   std::vector<DeadLetter>* out) = 0;
  // One row by id; kNotFound if absent.
  virtual Status get_dead_letter(int64_t id, DeadLetter* out) = 0;
  // Deletes rows matching `filter` (its limit is ignored); *removed gets the row count.
  virtual Status purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed) = 0;
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
  virtual Status requeue_dead_letter(int64_t id) = 0;

  // The transport's session records in this inbox (session_record.h): what the MQTT
  // Subscriber's persistent sessions hold, which the Pruner checks its retention window
  // against. Lives as long as the Inbox; thread-safe.
  virtual SessionRecords& sessions() const = 0;

 protected:
  Inbox() = default;

 private:
  // The typed calls' common part (the store checks the type; src/store/inbox.h).
  virtual Status setup_with(const std::type_info* type,
                            std::function<void(const detail::TxnRef&)> fn) = 0;
  virtual void with_connection_of(const std::type_info* type,
                                  const std::function<void(const detail::TxnRef&)>& fn) = 0;
};

}  // namespace mqtt_inbox

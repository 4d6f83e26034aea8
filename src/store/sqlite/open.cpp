// Opening the SQLite store, and everything else it does at start-up: the per-database lock
// file, the check that this process can write the files, the connection with its pragmas,
// schema and migrations and the retention clock's base, the application's own set-up SQL
// (Inbox::setup), and the attempt a process that died inside a handler left in the lock
// file (store/sqlite/attempt_marker.h). The front (store/store.h) waits out each attempt
// while the store is transiently unavailable. Also what the store does once it is found
// unusable: never checkpoint the WAL into the damaged file again.
#include <SQLiteCpp/SQLiteCpp.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>

#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/sqlite.h"
#include "store/reentry.h"
#include "store/sqlite/backend.h"
#include "store/sqlite/errors.h"
#include "store/sqlite/schema.h"
#include "store/sqlite/txn_fence.h"
#include "store/sqlite/unclosed.h"
#include "store/sqlite/util.h"
#include "util/file_access.h"
#include "util/log.h"

namespace mqtt_inbox {

namespace {

// Takes the per-database flock ("<path>.lock") that keeps a second consumer process off
// the file. Created by root, the lock file is handed to the database's owner, as SQLite
// does with the -wal and -shm it creates as root: the service user must be able to open
// it on its next start.
Status take_lock_file(const std::string& path, int* fd_out) {
  const std::string lock_path = path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status(errno == EACCES ? Status::Code::kPermissionDenied : Status::Code::kIoError,
                  "cannot open lock file " + lock_path + ": " + std::strerror(errno));
  struct stat db {
  }, lk{};
  if (::geteuid() == 0 && ::stat(path.c_str(), &db) == 0 && ::fstat(fd, &lk) == 0 &&
      (lk.st_uid != db.st_uid || lk.st_gid != db.st_gid))
    (void)::fchown(fd, db.st_uid, db.st_gid);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK)
      return Status(Status::Code::kBusy, path + " is in use by another consumer (" + lock_path +
                                             " is locked): run one consumer process per database");
    return Status(Status::Code::kIoError, "cannot lock " + lock_path + ": " + std::strerror(err));
  }
  *fd_out = fd;
  return Status::Ok();
}

}  // namespace

Status detail::make_sqlite_backend(detail::Store& front,
                                   std::unique_ptr<detail::StoreBackend>* out) {
  const InboxOptions& options = front.options();
  if (options.cache_size_kib <= 0) return Status::InvalidArgument("cache_size_kib <= 0");
  if (options.page_size_bytes < 512 || options.page_size_bytes > 65536 ||
      (options.page_size_bytes & (options.page_size_bytes - 1)) != 0)
    return Status::InvalidArgument("page_size_bytes must be a power of two in 512..65536");
  if (options.journal_size_limit_bytes < -1)
    return Status::InvalidArgument("journal_size_limit_bytes < -1");
  if (options.wal_autocheckpoint_pages < 0)
    return Status::InvalidArgument("wal_autocheckpoint_pages < 0");
  auto backend = std::make_unique<detail::SqliteBackend>(front);
  if (Status s = backend->prepare_files(); !s.ok()) return s;
  *out = std::move(backend);
  return Status::Ok();
}

detail::SqliteBackend::SqliteBackend(Store& front) : StoreBackend(front), path(front.location()) {
  retention = make_sqlite_retention_rows(*this);
  stp = make_sqlite_stp_rows(*this);
  outbox_store = make_sqlite_outbox(*this);
}

Status detail::SqliteBackend::prepare_files() {
  // What waiting would never mend fails before anything is created (a lock file beside a
  // folder): a folder or a device as the path, a missing folder, a new database in a
  // folder that cannot be written.
  if (Status s = detail::check_database_location(path, &existed_); !s.ok()) {
    log->error("inbox {}: {}", path, s.message());
    return s;
  }
  // Files another user left behind do not clear by themselves: refuse before SQLite
  // quietly opens the database read-only.
  if (Status s = detail::check_writable(path, options.exclusive); !s.ok()) {
    log->error("inbox {}: {}", path, s.message());
    return s;
  }
  struct stat lock_st {};
  lock_existed_ = ::stat((path + ".lock").c_str(), &lock_st) == 0;
  if (options.exclusive) return take_lock_file(path, &lock_fd);
  return Status::Ok();
}

Status detail::SqliteBackend::open(int lock_wait_ms) {
  const Status s = open_connection(lock_wait_ms);
  if (!s.ok()) {
    // A new database that does not fit on the file system: no message waits in it, so
    // there is nothing to wait for (kFull is transient for an existing one). A status
    // that ends the start-up wait; failed_open() reports it as kFull.
    if (existed_ || s.code() != Status::Code::kFull) return s;
    new_file_full_ = true;
    return Status::InvalidArgument(s.message());
  }
  sqlite3_busy_timeout(db->getHandle(), options.busy_timeout_ms);
  opened_ = true;
  return s;
}

Status detail::SqliteBackend::failed_open(Status s) {
  std::lock_guard<std::mutex> lock(mu);
  close_connection();
  marker.reset();
  if (!new_file_full_) return s;
  s = Status(Status::Code::kFull, "no room to create the new database " + path + " (" +
                                      s.message() + "); nothing was left behind");
  // The files this call created, while it still holds the lock file: a database that was
  // never made leaves nothing behind.
  for (const char* suffix : {"-wal", "-shm", ""}) ::unlink((path + suffix).c_str());
  if (!lock_existed_ && lock_fd >= 0) ::unlink((path + ".lock").c_str());
  log->error("inbox {}: {}", path, s.message());
  return s;
}

Status detail::SqliteBackend::classify_current(const std::string& context) {
  try {
    throw;
  } catch (const SQLite::Exception& e) {
    return detail::to_status(e, db ? db->getHandle() : nullptr, context);
  } catch (const std::exception& e) {
    return Status::Internal(context + ": " + e.what());
  } catch (...) {
    return Status::Internal(context + ": a non-standard exception");
  }
}

void detail::SqliteBackend::on_store_error(const Status& s) {
  // On a full disk the WAL gives its space back at once (the caller holds the connection).
  if (s.code() == Status::Code::kFull && wal_guard) wal_guard->on_full();
}

void detail::SqliteBackend::close_connection() {
  wal_guard.reset();
  for (auto* q : {&begin_immediate, &commit_stmt, &rollback_stmt, &lookup,
                  &claim_if_nothing_recorded, &begin_attempt, &attempt_failed,
                  &attempt_failed_counted, &claim, &delete_attempts_stmt, &mark_replayed_stmt})
    q->reset();
  if (!db) return;
  // A statement of the application's own still prepared on the connection (a handler that
  // kept one), or a connection a handler closed itself: SQLiteCpp's close would fail and
  // assert (SQLITE_BUSY, or a call on a closed connection). sqlite3_close_v2 makes it a
  // zombie that SQLite frees when the last statement is finalized; the wrapper is let go
  // without its destructor.
  sqlite3* h = db->getHandle();
  sqlite3_stmt* left = connection_closed_by_handler_ ? nullptr : sqlite3_next_stmt(h, nullptr);
  if (connection_closed_by_handler_ || left) {
    if (left)
      log->warn(
          "{}: the connection closes with a statement of the application still prepared on "
          "it ({}); it is freed when that statement is finalized",
          path, printable(sqlite3_sql(left) ? sqlite3_sql(left) : "?", 200));
    if (!connection_closed_by_handler_) sqlite3_close_v2(h);
    keep_unclosed(std::move(db));
    connection_closed_by_handler_ = false;
    return;
  }
  db.reset();
}

Status detail::SqliteBackend::open_connection(int busy_timeout_ms) {
  // A failed attempt leaves nothing behind: the next one starts with a new connection.
  close_connection();
  try {
    const auto connect = [&] {
      db = std::make_unique<SQLite::Database>(
          path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE | SQLite::OPEN_URI, busy_timeout_ms,
          options.vfs);
    };
    connect();
    {
      SQLite::Database& c = *db;
      // auto_vacuum only takes effect before the first table is written; on a brand new
      // file it must come before journal_mode=WAL, which writes the header.
      if (c.execAndGet("PRAGMA page_count").getInt64() == 0) {
        c.exec("PRAGMA page_size = " + std::to_string(options.page_size_bytes));
        c.exec("PRAGMA auto_vacuum = INCREMENTAL");
      }
      const std::string mode = c.execAndGet("PRAGMA journal_mode = WAL").getString();
      if (mode != "wal")
        return Status::InvalidArgument("cannot use WAL journal mode on " + path + " (got '" + mode +
                                       "'); the inbox requires WAL");

      const int version = c.execAndGet("PRAGMA user_version").getInt();
      if (version > kSchemaVersion)
        return Status(Status::Code::kSchema,
                      "database schema version " + std::to_string(version) +
                          " is newer than this library's " + std::to_string(kSchemaVersion) +
                          ": a newer mqtt-inbox wrote it; use that version (the file is left "
                          "as it is)");
      bool migrated = false;
      for (const detail::SchemaStep& step : detail::schema_steps()) {
        if (step.version <= version) continue;
        write_transaction([&] {
          // Re-read under the write lock: another process may have migrated meanwhile.
          if (c.execAndGet("PRAGMA user_version").getInt() < step.version) c.exec(step.sql);
        });
        migrated = true;
        if (version > 0) log->info("{}: schema migrated to version {}", path, step.version);
      }
      // The per-message path runs on a connection that has applied no schema step. Steps
      // 5, 7 and 9 rebuild inbox_dead_letters with ALTER TABLE ... RENAME, which opens the
      // connection's TEMP database (SQLite checks the temp schema for references to the
      // renamed table), and from then on every BEGIN IMMEDIATE starts, and every COMMIT
      // ends, a write transaction there too (about 500 instructions per message, callgrind),
      // for as long as the process that created or migrated the file runs. A new
      // connection starts without it.
      if (migrated) connect();
    }
    SQLite::Database& c = *db;
    const int now_version = c.execAndGet("PRAGMA user_version").getInt();
    if (now_version != kSchemaVersion)
      return Status::Internal("schema.sql ends at user_version " + std::to_string(now_version) +
                              ", expected " + std::to_string(kSchemaVersion));

    // The retention clock continues from its persisted value, or from the newest row if
    // the process died before persisting (both only ever move it forward).
    {
      int64_t base = 0;
      SQLite::Statement q(c, "SELECT value FROM inbox_meta WHERE key = 'retention_clock_ms'");
      if (q.executeStep())
        base = std::stoll(q.getColumn(0).getString());
      else
        base = clock->wall_ms();  // a new database starts at the wall clock
      for (const char* t : {"inbox_processed", "inbox_messages"}) {
        const int64_t newest =
            c.execAndGet(std::string("SELECT coalesce(max(received_at), 0) FROM ") + t).getInt64();
        base = std::max(base, newest);
      }
      // The outbox's clock stamps, each read from an index: the newest row (seq order is
      // enqueue order, and a replayed row gets a new seq) and the latest marks.
      for (const char* sql :
           {"SELECT coalesce((SELECT enqueued_clock FROM outbox_messages ORDER BY seq DESC "
            "LIMIT 1), 0)",
            "SELECT coalesce(max(retention_at), 0) FROM outbox_messages WHERE state = 'sent'",
            "SELECT coalesce(max(retention_at), 0) FROM outbox_messages WHERE state = 'dead'"})
        base = std::max(base, c.execAndGet(sql).getInt64());
      front().set_retention_clock_base(base);
    }

    c.exec(options.synchronous == Synchronous::kFull ? "PRAGMA synchronous = FULL"
                                                     : "PRAGMA synchronous = NORMAL");
    // synchronous is a per-connection setting that the file does not keep; record the
    // owner's choice so `mqtt-inbox check` can report it. Choosing kNormal through the
    // API is the explicit opt-in, recorded as such.
    if (options.exclusive) {
      const bool full = options.synchronous == Synchronous::kFull;
      SQLite::Statement q(c, "SELECT value FROM inbox_meta WHERE key = 'synchronous'");
      if (!q.executeStep() || q.getColumn(0).getString() != (full ? "full" : "normal")) {
        SQLite::Statement u(c,
                            "INSERT INTO inbox_meta (key, value) VALUES ('synchronous', ?1),"
                            " ('synchronous_opt_in', ?2)"
                            " ON CONFLICT (key) DO UPDATE SET value = excluded.value");
        u.bind(1, full ? "full" : "normal");
        u.bind(2, full ? "false" : "true");
        u.exec();
      }
    }
    c.exec("PRAGMA foreign_keys = ON");
    c.exec("PRAGMA cache_size = -" + std::to_string(options.cache_size_kib));
    c.exec("PRAGMA wal_autocheckpoint = " + std::to_string(options.wal_autocheckpoint_pages));
    // Replaces SQLite's autocheckpoint with one that adapts to free space
    // (store/sqlite/wal_guard.h), and keeps the WAL file no larger than that after a checkpoint
    // either.
    const int page_size = c.execAndGet("PRAGMA page_size").getInt();
    if (!commit_wake) commit_wake = detail::CommitWake::of_file(path);
    wal_guard = std::make_unique<detail::WalGuard>(
        c.getHandle(), path, page_size, options.wal_autocheckpoint_pages, log, commit_wake);
    // The WAL file left after a checkpoint resets it: at most one cycle's WAL, the
    // checkpoint threshold's frames (each a page and a 24-byte frame header, after the
    // 32-byte WAL header, https://sqlite.org/fileformat2.html#walformat) and room for the
    // commit that crosses it. A smaller limit than one cycle (it was threshold * page
    // size) cut the file at every reset and the cycle's last commits grew it again: an
    // ftruncate, and WAL fdatasyncs that also had to commit the file's new size, in every
    // cycle (issue 14).
    int64_t size_limit = options.journal_size_limit_bytes;
    if (options.wal_autocheckpoint_pages > 0) {
      const int64_t frames = wal_guard->checkpoint_pages() + detail::WalGuard::kMinWalPages;
      const int64_t wal_bytes = 32 + frames * (page_size + 24);
      if (size_limit < 0 || size_limit > wal_bytes) size_limit = wal_bytes;
    }
    c.exec("PRAGMA journal_size_limit = " + std::to_string(size_limit));
    // The handler's transaction fence (store/sqlite/txn_fence.h), installed once.
    detail::TxnFence::install(c.getHandle());
    prepare_statements();
    // A marker left in the lock file means the last owner died inside a handler: count
    // that attempt before anything is delivered (store/sqlite/attempt_marker.h).
    if (lock_fd >= 0) {
      if (!marker) marker = std::make_unique<detail::AttemptMarker>(lock_fd);
      recover_marked_attempt();
      if (!marker->prepare())
        log->warn(
            "{}: cannot size the attempt marker in {}.lock ({}); attempts are "
            "committed to the database instead",
            path, path, std::strerror(errno));
    }
  } catch (...) {
    return classify_current("opening " + path);
  }
  return Status::Ok();
}

void detail::SqliteBackend::setup(int lock_wait_ms, FunctionRef<void(const TxnRef&)> fn) {
  BusyTimeout busy(db->getHandle(), lock_wait_ms, options.busy_timeout_ms);
  write_transaction([&] { fn(TxnRef{db.get(), &typeid(SQLite::Database*)}); });
}

void detail::SqliteBackend::setup_sql(int lock_wait_ms, const std::string& sql) {
  setup(lock_wait_ms, [&](const TxnRef&) { db->exec(sql); });
}

void detail::SqliteBackend::on_fatal() {
  // No checkpoint may write the WAL into a damaged file, not even the closing one.
  if (wal_guard) wal_guard->disable();
  if (db) sqlite3_db_config(db->getHandle(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
}

std::string detail::SqliteBackend::fatal_advice(const std::string& error) const {
  return "the database is unusable (" + error +
         "). From now on the inbox neither reads nor writes it, and leaves it exactly as it is "
         "(it never deletes or recreates it). Stop the application, copy what can be read into "
         "a new file (`sqlite3 " +
         path + " .recover`, or `.dump` where sqlite3 lacks .recover, piped into `sqlite3 " + path +
         ".recovered`), verify it with `mqtt-inbox check`, and put it in place of the original: "
         "docs/operations.md#recovering-a-corrupt-database has the exact commands.";
}

std::string detail::SqliteBackend::fatal_text(const std::string& error) const {
  return "the database " + path + " is unusable (" + error +
         "); the inbox no longer reads or writes it "
         "(docs/operations.md#recovering-a-corrupt-database)";
}

}  // namespace mqtt_inbox

// Opening an inbox, and everything else an inbox does at start-up: the per-database lock
// file, the check that this process can write the files, the connection with its
// pragmas, schema and migrations and the retention clock, the application's own set-up
// SQL (Inbox::setup), each attempt waited out while the store is transiently unavailable
// (detail::StoreRetry::until_ready), and the attempt a process that died inside a handler
// left in the lock file (store/sqlite/attempt_marker.h). Also the fatal latch: once the file is
// found corrupt, the inbox never touches it again.
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
#include "mqtt_inbox/inbox.h"
#include "store/reentry.h"
#include "store/sqlite/schema.h"
#include "store/sqlite/store.h"
#include "store/sqlite/txn_fence.h"
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

Status detail::open_sqlite_store(const std::string& path, const InboxOptions& options,
                                 std::unique_ptr<detail::Store>* out) {
  if (path.empty()) return Status::InvalidArgument("database path is empty");
  if (options.busy_timeout_ms < 0) return Status::InvalidArgument("busy_timeout_ms < 0");
  if (options.cache_size_kib <= 0) return Status::InvalidArgument("cache_size_kib <= 0");
  if (options.page_size_bytes < 512 || options.page_size_bytes > 65536 ||
      (options.page_size_bytes & (options.page_size_bytes - 1)) != 0)
    return Status::InvalidArgument("page_size_bytes must be a power of two in 512..65536");
  if (options.journal_size_limit_bytes < -1)
    return Status::InvalidArgument("journal_size_limit_bytes < -1");
  if (options.wal_autocheckpoint_pages < 0)
    return Status::InvalidArgument("wal_autocheckpoint_pages < 0");
  if (options.startup_backoff_initial.count() < 1 ||
      options.startup_backoff_max < options.startup_backoff_initial ||
      options.startup_deadline_ms < 0 || options.startup_log_interval_ms < 0)
    return Status::InvalidArgument(
        "start-up options: need 1 ms <= startup_backoff_initial <= startup_backoff_max, "
        "startup_deadline_ms >= 0, startup_log_interval_ms >= 0");

  auto impl = std::make_unique<detail::SqliteStore>();
  impl->path = path;
  impl->options = options;
  impl->clock = options.clock ? options.clock : Clock::system();
  impl->log = detail::logger_or_default(options.logger);
  impl->startup = std::make_unique<detail::StoreRetry>(
      "inbox " + path, path, options.startup_backoff_initial.count(),
      options.startup_backoff_max.count(), options.startup_log_interval_ms, impl->clock, impl->log);
  // What waiting would never mend fails before anything is created (a lock file beside a
  // folder): a folder or a device as the path, a missing folder, a new database in a
  // folder that cannot be written.
  bool existed = false;
  if (Status s = detail::check_database_location(path, &existed); !s.ok()) {
    impl->log->error("inbox {}: {}", path, s.message());
    return s;
  }
  // Files another user left behind do not clear by themselves: refuse before SQLite
  // quietly opens the database read-only.
  if (Status s = detail::check_writable(path, options.exclusive); !s.ok()) {
    impl->log->error("inbox {}: {}", path, s.message());
    return s;
  }
  struct stat lock_st {};
  const bool lock_existed = ::stat((path + ".lock").c_str(), &lock_st) == 0;
  if (options.exclusive) {
    if (Status s = take_lock_file(path, &impl->lock_fd); !s.ok()) return s;
  }
  detail::SqliteStore* m = impl.get();
  // A new database that does not fit on the file system: no message waits in it, so
  // there is nothing to wait for (kFull is transient for an existing one). Reported as a
  // non-transient status to end the start-up wait, and as kFull below.
  bool new_file_full = false;
  Status s = m->wait_at_startup("opening the database", [m, existed, &new_file_full](int busy_ms) {
    Status r = m->open_connection(busy_ms);
    if (existed || r.code() != Status::Code::kFull) return r;
    new_file_full = true;
    return Status::InvalidArgument(r.message());
  });
  if (new_file_full)
    s = Status(Status::Code::kFull, "no room to create the new database " + path + " (" +
                                        s.message() + "); nothing was left behind");
  if (impl->db) sqlite3_busy_timeout(impl->db->getHandle(), options.busy_timeout_ms);
  if (!s.ok()) {
    // Closed here, without what ~SqliteStore does after a successful open (persisting the
    // clock, clearing a marker that may hold an attempt not yet counted).
    impl->close_connection();
    impl->marker.reset();
    if (new_file_full) {
      // The files this call created, while it still holds the lock file: a database that
      // was never made leaves nothing behind.
      for (const char* suffix : {"-wal", "-shm", ""}) ::unlink((path + suffix).c_str());
      if (!lock_existed && impl->lock_fd >= 0) ::unlink((path + ".lock").c_str());
      impl->log->error("inbox {}: {}", path, s.message());
    }
    if (impl->lock_fd >= 0) ::close(impl->lock_fd);
    impl->lock_fd = -1;
    return s;
  }
  *out = std::move(impl);
  return Status::Ok();
}

void detail::SqliteStore::close_connection() {
  wal_guard.reset();
  for (auto* q :
       {&begin_immediate, &commit, &lookup, &claim_if_nothing_recorded, &begin_attempt,
        &attempt_failed, &attempt_failed_counted, &claim, &delete_attempts, &mark_replayed})
    q->reset();
  db.reset();
}

Status detail::SqliteStore::open_connection(int busy_timeout_ms) {
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
        return Status(Status::Code::kCorruption,
                      "database schema version " + std::to_string(version) +
                          " is newer than this library's " + std::to_string(kSchemaVersion));
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
      clock_base_ms = base;
      steady_base_ms = clock->steady_ms();
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
  } catch (const SQLite::Exception& e) {
    return store_error(detail::to_status(e, db ? db->getHandle() : nullptr, "opening " + path));
  } catch (const std::exception& e) {
    return Status::Internal("opening " + path + ": " + e.what());
  }
  return Status::Ok();
}

Status Inbox::setup(const std::function<void(SQLite::Database&)>& fn) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::setup"); !r.ok()) return r;
  if (store_->kind() != detail::StoreKind::kSqlite)
    return Status::InvalidArgument("Inbox::setup takes an SQLite::Database, and " +
                                   store_->location() +
                                   " is not an SQLite store: use Inbox::setup_sql");
  return static_cast<detail::SqliteStore&>(*store_).setup(fn);
}

Status detail::SqliteStore::setup(const std::function<void(SQLite::Database&)>& fn) {
  detail::SqliteStore& m = *this;
  return m.wait_at_startup("running the application's set-up", [&](int busy_ms) -> Status {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.fatal.load()) return m.fatal_status();
    detail::SqliteStore::BusyTimeout busy(m.db->getHandle(), busy_ms, m.options.busy_timeout_ms);
    try {
      m.write_transaction([&] { fn(*m.db); });
    } catch (const SQLite::Exception& e) {
      return m.store_error(detail::to_status(e, m.db->getHandle(), "application set-up"));
    } catch (const std::exception& e) {
      return Status::InvalidArgument(std::string("application set-up: ") + e.what());
    } catch (...) {
      return Status::InvalidArgument("application set-up threw a non-standard exception");
    }
    return Status::Ok();
  });
}

Status Inbox::setup_sql(const std::string& sql) { return store_->setup_sql(sql); }

Status detail::SqliteStore::setup_sql(const std::string& sql) {
  if (Status r = refuse_if_in_handler(owner, "Inbox::setup_sql"); !r.ok()) return r;
  return setup([&](SQLite::Database& d) { d.exec(sql); });
}

void detail::SqliteStore::latch_fatal(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    if (fatal.load()) return;
    fatal_error = s.to_string();
    fatal = true;
  }
  // No checkpoint may write the WAL into a damaged file, not even the closing one.
  if (wal_guard) wal_guard->disable();
  if (db) sqlite3_db_config(db->getHandle(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  startup->set_fatal(s);
  log->critical(
      "inbox {}: the database is unusable ({}). From now on the inbox neither reads "
      "nor writes it, and leaves it exactly as it is (it never deletes or recreates "
      "it). Stop the application, copy what can be read into a new file (`sqlite3 {} "
      ".recover`, or `.dump` where sqlite3 lacks .recover, piped into `sqlite3 "
      "{}.recovered`), verify it with `mqtt-inbox check`, and put it in place of the "
      "original: docs/operations.md#recovering-a-corrupt-database has the exact commands.",
      path, s.to_string(), path, path);
}

Status detail::SqliteStore::fatal_status() const {
  std::lock_guard<std::mutex> lock(stats_mu);
  return Status(Status::Code::kCorruption,
                "the database " + path + " is unusable (" + fatal_error +
                    "); the inbox no longer reads or writes it "
                    "(docs/operations.md#recovering-a-corrupt-database)");
}

}  // namespace mqtt_inbox

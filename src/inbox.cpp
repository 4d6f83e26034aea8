// The SQLite store: opening a database (file lock, schema, pragmas), its retention clock,
// stats and inspection. The per-message path is in claim.cpp, the dead letters in
// dead_letters.cpp.
#include "mqtt_inbox/inbox.h"

#include <sqlite3.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <chrono>
#include <exception>
#include <mutex>
#include <vector>

#include "log.h"
#include "mqtt_inbox/clock.h"
#include "inbox_impl.h"
#include "schema.h"
#include "sqlite_util.h"
#include "text.h"

namespace mqtt_inbox {

Inbox::Inbox(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Inbox::~Inbox() {
  // Best effort: a clock that restarts from an older value only keeps rows longer.
  (void)persist_retention_clock();
  if (impl_->marker) impl_->marker->clear();  // a clean close leaves no marker behind
  impl_->stop_checkpointer();
  const int fd = impl_->lock_fd;
  impl_.reset();  // close the database before giving up the lock
  if (fd >= 0) ::close(fd);
}

int64_t Inbox::retention_clock_ms() const { return impl_->retention_clock(); }

Status Inbox::persist_retention_clock() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "INSERT INTO inbox_meta (key, value) VALUES ('retention_clock_ms', ?1)"
                        " ON CONFLICT (key) DO UPDATE SET value = CAST(max(CAST(value AS INTEGER),"
                        " CAST(excluded.value AS INTEGER)) AS TEXT)");
    q.bind(1, std::to_string(impl_->retention_clock()));
    q.exec();
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "persisting the retention clock"));
  }
  return Status::Ok();
}

namespace {
int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}
}  // namespace

InboxStats Inbox::stats() const {
  const Impl& m = *impl_;
  InboxStats s;
  s.processed = m.processed.load();
  s.duplicates = m.duplicates.load();
  s.dead_lettered = m.dead_lettered.load();
  s.retries = m.retries.load();
  s.store_errors = m.store_errors.load();
  s.pruned = m.pruned.load();
  s.dead_letters_pruned = m.dead_letters_pruned.load();
  const int64_t seen = s.processed + s.duplicates;
  s.duplicate_ratio = seen ? static_cast<double>(s.duplicates) / static_cast<double>(seen) : 0.0;

  const uint64_t n = std::min<uint64_t>(m.latency_next.load(), Impl::kLatencySamples);
  std::vector<int32_t> lat;
  lat.reserve(n);
  for (uint64_t i = 0; i < n; ++i) lat.push_back(m.latency_us[i].load(std::memory_order_relaxed));
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    s.commit_p50_us = lat[lat.size() / 2];
    s.commit_p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  }
  s.commit_max_us = m.commit_max_us.load();
  s.db_bytes = file_size(m.path);
  s.wal_bytes = file_size(m.path + "-wal");
  s.schema_version = kSchemaVersion;
  s.retention_clock_ms = m.retention_clock();
  {
    std::lock_guard<std::mutex> lock(m.stats_mu);
    s.consumers = m.consumer_rows;
    s.rows_measured_at = m.rows_measured_at;
  }
  return s;
}

int Inbox::Impl::on_wal_commit(void* self, sqlite3* db, const char* name, int frames) {
  static_cast<Impl*>(self)->checkpointer->on_commit(db, name, frames);
  return SQLITE_OK;  // the commit stands whatever a checkpoint did
}

Status Inbox::refresh_row_stats() { return impl_->measure_rows(nullptr); }

Status Inbox::Impl::measure_rows(SQLite::Database* reader) {
  std::map<std::string, ConsumerRows> rows;
  auto run = [&](SQLite::Database& conn) {
    SQLite::Statement q(conn,
                        "SELECT consumer_name, count(*), min(received_at), max(received_at)"
                        " FROM inbox_processed GROUP BY consumer_name");
    while (q.executeStep()) {
      ConsumerRows r;
      r.rows = q.getColumn(1).getInt64();
      r.oldest_received_at = q.getColumn(2).getInt64();
      r.newest_received_at = q.getColumn(3).getInt64();
      rows[q.getColumn(0).getString()] = r;
    }
  };
  try {
    if (reader) {
      run(*reader);
    } else {
      std::lock_guard<std::mutex> lock(mu);
      run(*db);
    }
  } catch (const SQLite::Exception& e) {
    return store_error(detail::to_status(e, "measuring rows"));
  }
  std::lock_guard<std::mutex> lock(stats_mu);
  consumer_rows = std::move(rows);
  rows_measured_at = retention_clock();
  return Status::Ok();
}

const std::string& Inbox::path() const { return impl_->path; }
const InboxOptions& Inbox::options() const { return impl_->options; }

Status Inbox::open(const std::string& path, const InboxOptions& options,
                   std::unique_ptr<Inbox>* out) {
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

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->options = options;
  impl->clock = options.clock ? options.clock : Clock::system();
  impl->log = detail::logger_or_default(options.logger);
  if (options.exclusive) {
    const std::string lock_path = path + ".lock";
    impl->lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (impl->lock_fd < 0)
      return Status(Status::Code::kIoError, "cannot open lock file " + lock_path + ": " +
                                                std::strerror(errno));
    if (::flock(impl->lock_fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(impl->lock_fd);
      impl->lock_fd = -1;
      if (err == EWOULDBLOCK)
        return Status(Status::Code::kBusy,
                      path + " is in use by another consumer (" + lock_path +
                          " is locked): run one consumer process per database");
      return Status(Status::Code::kIoError, "cannot lock " + lock_path + ": " + std::strerror(err));
    }
  }
  try {
    impl->db = std::make_unique<SQLite::Database>(
        path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE | SQLite::OPEN_URI,
        options.busy_timeout_ms, options.vfs);
    SQLite::Database& db = *impl->db;

    // auto_vacuum only takes effect before the first table is written; on a brand new
    // file it must come before journal_mode=WAL, which writes the header.
    if (db.execAndGet("PRAGMA page_count").getInt64() == 0) {
      db.exec("PRAGMA page_size = " + std::to_string(options.page_size_bytes));
      db.exec("PRAGMA auto_vacuum = INCREMENTAL");
    }
    const std::string mode = db.execAndGet("PRAGMA journal_mode = WAL").getString();
    if (mode != "wal")
      return Status::InvalidArgument("cannot use WAL journal mode on " + path +
                                     " (got '" + mode + "'); the inbox requires WAL");

    const int version = db.execAndGet("PRAGMA user_version").getInt();
    if (version > kSchemaVersion)
      return Status(Status::Code::kCorruption,
                    "database schema version " + std::to_string(version) +
                        " is newer than this library's " + std::to_string(kSchemaVersion));
    for (const detail::SchemaStep& step : detail::schema_steps()) {
      if (step.version <= version) continue;
      impl->write_transaction([&] {
        // Re-read under the write lock: another process may have migrated meanwhile.
        if (db.execAndGet("PRAGMA user_version").getInt() < step.version) db.exec(step.sql);
      });
      if (version > 0)
        impl->log->info("{}: schema migrated to version {}", path, step.version);
    }
    const int now_version = db.execAndGet("PRAGMA user_version").getInt();
    if (now_version != kSchemaVersion)
      return Status::Internal("schema.sql ends at user_version " + std::to_string(now_version) +
                              ", expected " + std::to_string(kSchemaVersion));

    // The retention clock continues from its persisted value, or from the newest row if
    // the process died before persisting (both only ever move it forward).
    {
      int64_t base = 0;
      SQLite::Statement q(db, "SELECT value FROM inbox_meta WHERE key = 'retention_clock_ms'");
      if (q.executeStep()) base = std::stoll(q.getColumn(0).getString());
      else base = impl->clock->wall_ms();  // a new database starts at the wall clock
      for (const char* t : {"inbox_processed", "inbox_messages"}) {
        const int64_t newest =
            db.execAndGet(std::string("SELECT coalesce(max(received_at), 0) FROM ") + t).getInt64();
        base = std::max(base, newest);
      }
      impl->clock_base_ms = base;
      impl->steady_base_ms = impl->clock->steady_ms();
    }

    db.exec(options.synchronous == Synchronous::kFull ? "PRAGMA synchronous = FULL"
                                                      : "PRAGMA synchronous = NORMAL");
    // synchronous is a per-connection setting that the file does not keep; record the
    // owner's choice so `mqtt-inbox check` can report it. Choosing kNormal through the
    // API is the explicit opt-in, recorded as such.
    if (options.exclusive) {
      const bool full = options.synchronous == Synchronous::kFull;
      SQLite::Statement q(db, "SELECT value FROM inbox_meta WHERE key = 'synchronous'");
      if (!q.executeStep() || q.getColumn(0).getString() != (full ? "full" : "normal")) {
        SQLite::Statement u(db, "INSERT INTO inbox_meta (key, value) VALUES ('synchronous', ?1),"
                                " ('synchronous_opt_in', ?2)"
                                " ON CONFLICT (key) DO UPDATE SET value = excluded.value");
        u.bind(1, full ? "full" : "normal");
        u.bind(2, full ? "false" : "true");
        u.exec();
      }
    }
    db.exec("PRAGMA foreign_keys = ON");
    db.exec("PRAGMA cache_size = -" + std::to_string(options.cache_size_kib));
    db.exec("PRAGMA journal_size_limit = " + std::to_string(options.journal_size_limit_bytes));
    db.exec("PRAGMA wal_autocheckpoint = " + std::to_string(options.wal_autocheckpoint_pages));
    if (options.exclusive && options.background_checkpoint &&
        options.wal_autocheckpoint_pages > 0) {
      impl->checkpointer = std::make_unique<detail::Checkpointer>(
          path, options.vfs, options.synchronous == Synchronous::kFull, options.busy_timeout_ms,
          options.wal_autocheckpoint_pages, &impl->mu, impl->log);
      // Replaces SQLite's autocheckpoint hook on this connection (checkpointer.h).
      sqlite3_wal_hook(db.getHandle(), &Impl::on_wal_commit, impl.get());
    }

    // Installed once: setting an authorizer expires every prepared statement, so doing it
    // around each handler run would re-prepare the cached statements for every message.
    sqlite3_set_authorizer(db.getHandle(), &Impl::authorize, impl.get());
    impl->prepare_statements();
    // A marker left in the lock file means the last owner died inside a handler: count
    // that attempt before anything is delivered (attempt_marker.h).
    if (impl->lock_fd >= 0) {
      impl->marker = std::make_unique<detail::AttemptMarker>(impl->lock_fd);
      impl->recover_marked_attempt();
      if (!impl->marker->prepare())
        impl->log->warn("{}: cannot size the attempt marker in {}.lock ({}); attempts are "
                        "committed to the database instead",
                        path, path, std::strerror(errno));
    }
  } catch (const SQLite::Exception& e) {
    return detail::to_status(e, "opening " + path);
  } catch (const std::exception& e) {
    return Status::Internal("opening " + path + ": " + e.what());
  }
  out->reset(new Inbox(std::move(impl)));
  return Status::Ok();
}

Status Inbox::count_processed(const std::string& consumer, int64_t* rows) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "SELECT count(*) FROM inbox_processed WHERE consumer_name = ?1");
    q.bind(1, consumer);
    q.executeStep();
    *rows = q.getColumn(0).getInt64();
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "counting processed rows"));
  }
  return Status::Ok();
}

void Inbox::with_connection(const std::function<void(SQLite::Database&)>& fn) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  fn(*impl_->db);
}

}  // namespace mqtt_inbox

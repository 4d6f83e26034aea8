// The SQLite store: opening a database (file lock, schema, pragmas), its retention clock,
// stats and inspection. The per-message path is in store/sqlite/claim.cpp, the dead letters in
// store/sqlite/dead_letters.cpp.
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
#include <stdexcept>
#include <mutex>
#include <vector>

#include "util/log.h"
#include "mqtt_inbox/clock.h"
#include "store/sqlite/store.h"
#include "store/reentry.h"
#include "store/sqlite/schema.h"
#include "store/sqlite/util.h"
#include "util/text.h"

namespace mqtt_inbox {

Inbox::Inbox(std::unique_ptr<detail::SqliteStore> impl) : impl_(std::move(impl)) { impl_->owner = this; }

Inbox::~Inbox() {
  // Best effort: a clock that restarts from an older value only keeps rows longer. So
  // it waits for another process's lock only briefly: an application that exits
  // because the store is locked (a start-up deadline) must not hang here.
  if (impl_->db) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    sqlite3_busy_timeout(impl_->db->getHandle(), std::min(impl_->options.busy_timeout_ms, 200));
  }
  (void)persist_retention_clock();
  if (impl_->marker) impl_->marker->clear();  // a clean close leaves no marker behind
  const int fd = impl_->lock_fd;
  impl_.reset();  // close the database before giving up the lock
  if (fd >= 0) ::close(fd);
}

detail::Store& Inbox::store() const { return *impl_; }

SessionRecords& Inbox::sessions() const { return impl_->sessions(); }

int64_t Inbox::retention_clock_ms() const { return impl_->retention_clock(); }

Status Inbox::persist_retention_clock() {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::persist_retention_clock"); !r.ok()) return r;
  if (impl_->fatal.load()) return impl_->fatal_status();
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
  const detail::SqliteStore& m = *impl_;
  InboxStats s;
  s.processed = m.processed.load();
  s.duplicates = m.duplicates.load();
  s.dead_lettered = m.dead_lettered.load();
  s.retries = m.retries.load();
  s.store_errors = m.store_errors.load();
  s.pruned = m.pruned.load();
  s.dead_letters_pruned = m.dead_letters_pruned.load();
  s.sessions_lost = m.sessions_lost.load();
  const int64_t seen = s.processed + s.duplicates;
  s.duplicate_ratio = seen ? static_cast<double>(s.duplicates) / static_cast<double>(seen) : 0.0;

  const uint64_t n = std::min<uint64_t>(m.latency_next.load(), detail::Store::kLatencySamples);
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
    s.outbox = m.outbox_rows;
    s.rows_measured_at = m.rows_measured_at;
  }
  return s;
}

Status Inbox::refresh_row_stats() {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::refresh_row_stats"); !r.ok()) return r;
  return impl_->measure_rows(nullptr);
}

Status detail::SqliteStore::measure_rows(SQLite::Database* reader) {
  if (fatal.load()) return fatal_status();
  std::map<std::string, ConsumerRows> rows;
  OutboxRows outbox;
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
    // The outbox: per class from outbox_usage (kept by triggers), the rest from the
    // indexes of each state (schema.sql version 8).
    outbox = OutboxRows{};
    SQLite::Statement u(conn, "SELECT class, rows, bytes, dropped FROM outbox_usage");
    while (u.executeStep())
      outbox.classes[u.getColumn(0).getString()] = {
          u.getColumn(1).getInt64(), u.getColumn(2).getInt64(), u.getColumn(3).getInt64()};
    SQLite::Statement n(conn,
                        "SELECT (SELECT count(*) FROM outbox_messages WHERE state = 'sent'),"
                        " (SELECT count(*) FROM outbox_messages WHERE state = 'dead'),"
                        " (SELECT enqueued_clock FROM outbox_messages WHERE state = 'pending'"
                        "  ORDER BY seq LIMIT 1)");
    if (n.executeStep()) {
      outbox.sent_rows = n.getColumn(0).getInt64();
      outbox.dead_rows = n.getColumn(1).getInt64();
      if (!n.getColumn(2).isNull())
        outbox.oldest_pending_age_ms =
            std::max<int64_t>(0, retention_clock() - n.getColumn(2).getInt64());
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
    return store_error(detail::to_status(e, "measuring rows"), /*holding_connection=*/reader == nullptr);
  }
  std::lock_guard<std::mutex> lock(stats_mu);
  consumer_rows = std::move(rows);
  outbox_rows = std::move(outbox);
  rows_measured_at = std::max<int64_t>(1, retention_clock());  // 0 means "never measured"
  return Status::Ok();
}

const std::string& Inbox::path() const { return impl_->path; }
const InboxOptions& Inbox::options() const { return impl_->options; }

Status Inbox::count_processed(const std::string& consumer, int64_t* rows) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::count_processed"); !r.ok()) return r;
  if (impl_->fatal.load()) return impl_->fatal_status();
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
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::with_connection"); !r.ok())
    throw std::logic_error(r.message());
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->fatal.load()) throw SQLite::Exception(impl_->fatal_status().message(), SQLITE_CORRUPT);
  fn(*impl_->db);
}

}  // namespace mqtt_inbox

// The SQLite store's side of the public Inbox: the calls typed with SQLite (with_connection;
// setup and open are in store/sqlite/open.cpp) and the options, and what SqliteStore does
// for the Store interface beyond the per-concept parts: closing, the retention clock,
// row measurement and file sizes. The Inbox's store-agnostic calls are in inbox/inbox.cpp.
#include "mqtt_inbox/inbox.h"

#include <sqlite3.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "store/reentry.h"
#include "store/sqlite/store.h"
#include "store/sqlite/util.h"

namespace mqtt_inbox {

namespace detail {

SqliteStore::~SqliteStore() {
  // Best effort: a clock that restarts from an older value only keeps rows longer. So
  // it waits for another process's lock only briefly: an application that exits
  // because the store is locked (a start-up deadline) must not hang here. Nothing to do
  // after a failed open, which closed everything itself.
  if (db) {
    {
      std::lock_guard<std::mutex> lock(mu);
      sqlite3_busy_timeout(db->getHandle(), std::min(options.busy_timeout_ms, 200));
    }
    (void)persist_retention_clock();
  }
  if (marker) marker->clear();  // a clean close leaves no marker behind
  close_connection();           // the database closes before the lock is given up
  marker.reset();
  if (lock_fd >= 0) ::close(lock_fd);
}

Status SqliteStore::persist_retention_clock() {
  if (Status r = refuse_if_in_handler(owner, "Store::persist_retention_clock"); !r.ok()) return r;
  return retention_rows().persist_clock();
}

namespace {
int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}
}  // namespace

void SqliteStore::file_stats(InboxStats* out) const {
  out->db_bytes = file_size(path);
  out->wal_bytes = file_size(path + "-wal");
  out->schema_version = kSchemaVersion;
}

Status SqliteStore::measure_rows(SQLite::Database* reader) {
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
    return store_error(to_status(e, "measuring rows"), /*holding_connection=*/reader == nullptr);
  }
  std::lock_guard<std::mutex> lock(stats_mu);
  consumer_rows = std::move(rows);
  outbox_rows = std::move(outbox);
  rows_measured_at = std::max<int64_t>(1, retention_clock());  // 0 means "never measured"
  return Status::Ok();
}

}  // namespace detail

const InboxOptions& Inbox::options() const { return store_->inbox_options(); }

void Inbox::with_connection(const std::function<void(SQLite::Database&)>& fn) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::with_connection"); !r.ok())
    throw std::logic_error(r.message());
  if (store_->kind() != detail::StoreKind::kSqlite)
    throw std::logic_error("Inbox::with_connection: " + store_->location() +
                           " is not an SQLite store");
  detail::SqliteStore& m = static_cast<detail::SqliteStore&>(*store_);
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.fatal.load()) throw SQLite::Exception(m.fatal_status().message(), SQLITE_CORRUPT);
  fn(*m.db);
}

}  // namespace mqtt_inbox

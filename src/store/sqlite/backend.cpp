// The SQLite backend beyond opening and the claims: closing, the connection a handler
// closed (made anew), statistics (file sizes, rows), the connection lent to the
// application (Inbox::with_connection), and what this store does not have (slot leases).
#include <sqlite3.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "mqtt_inbox/sqlite.h"
#include "store/reentry.h"
#include "store/sqlite/backend.h"
#include "store/sqlite/util.h"

namespace mqtt_inbox {

namespace detail {

SqliteBackend::~SqliteBackend() {
  // Best effort: a clock that restarts from an older value only keeps rows longer. So
  // it waits for another process's lock only briefly: an application that exits
  // because the store is locked (a start-up deadline) must not hang here. After a failed
  // open nothing is persisted, and a marker that may hold an attempt not yet counted stays.
  if (opened_ && db && !connection_closed_by_handler_ && !front().unusable()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      sqlite3_busy_timeout(db->getHandle(), std::min(options.busy_timeout_ms, 200));
    }
    (void)retention->persist_clock();
  }
  if (opened_ && marker) marker->clear();  // a clean close leaves no marker behind
  close_connection();                      // the database closes before the lock is given up
  marker.reset();
  if (lock_fd >= 0) ::close(lock_fd);
}

Status SqliteBackend::ready() {
  if (db && !connection_closed_by_handler_) return Status::Ok();
  if (!opened_) return Status::Ok();
  // A handler closed the connection (store/sqlite/txn_fence.h): a new one, as at open.
  close_connection();
  const Status s = open_connection(options.busy_timeout_ms);
  if (s.ok()) {
    sqlite3_busy_timeout(db->getHandle(), options.busy_timeout_ms);
    log->warn("{}: a new connection replaces the one a handler closed", path);
  }
  return s;
}

Status SqliteBackend::open_slot_leases(const SlotLeaseOptions& /*options*/,
                                       std::unique_ptr<SlotLeases>* /*out*/) {
  return Status::InvalidArgument(
      "a fleet's slot leases need a store that every member reaches: " + path +
      " is an SQLite file; open the inbox on PostgreSQL (docs/fleet.md)");
}

Status SqliteBackend::measure_rows() { return measure_rows(nullptr); }

namespace {
int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}
}  // namespace

void SqliteBackend::file_stats(InboxStats* out) const {
  out->db_bytes = file_size(path);
  out->wal_bytes = file_size(path + "-wal");
  out->schema_version = kSchemaVersion;
}

Status SqliteBackend::measure_rows(SQLite::Database* reader) {
  if (unusable()) return fatal_status();
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
  front().set_row_stats(std::move(rows), std::move(outbox));
  return Status::Ok();
}

void SqliteBackend::with_connection(FunctionRef<void(const TxnRef&)> fn) {
  if (unusable()) throw SQLite::Exception(fatal_status().message(), SQLITE_CORRUPT);
  fn(TxnRef{db.get(), &typeid(SQLite::Database*)});
}

}  // namespace detail
}  // namespace mqtt_inbox

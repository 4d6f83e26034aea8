// What the admin tool reads of an SQLite inbox beyond the public Inbox (admin.h): short
// statements on a connection of its own or on the Inbox's, nothing created or migrated.
#include "store/sqlite/admin.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <exception>
#include <memory>
#include <utility>

#include "mqtt_inbox/sqlite.h"
#include "store/sqlite/errors.h"

namespace mqtt_inbox::detail {

namespace {

Status from_exception(const SQLite::Exception& e) { return to_status(e.getErrorCode(), e.what()); }

// Runs `fn` on `inbox`'s connection; what `fn` throws becomes the Status (admin.h).
template <typename Fn>
Status on_connection(Inbox& inbox, Fn&& fn) {
  Status status;
  inbox.with_connection([&](SQLite::Database& db) {
    try {
      fn(db);
    } catch (const SQLite::Exception& e) {
      status = from_exception(e);
    } catch (const std::exception& e) {
      status = Status::Internal(e.what());
    }
  });
  return status;
}

void read_meta(SQLite::Database& db, std::map<std::string, std::string>* out) {
  SQLite::Statement q(db, "SELECT key, value FROM inbox_meta");
  while (q.executeStep()) (*out)[q.getColumn(0).getString()] = q.getColumn(1).getString();
}

}  // namespace

Status read_sqlite_facts(const std::string& path, const InboxOptions& options,
                         SqliteFileFacts* out) {
  try {
    SQLite::Database db(path, SQLite::OPEN_READONLY, options.busy_timeout_ms);
    out->user_version = db.execAndGet("PRAGMA user_version").getInt();
    out->journal_mode = db.execAndGet("PRAGMA journal_mode").getString();
    out->has_inbox_tables = db.execAndGet(
                                  "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                                  "name = 'inbox_processed'")
                                .getInt() > 0;
  } catch (const SQLite::Exception& e) {
    return from_exception(e);
  }
  return Status::Ok();
}

Status inspect_sqlite(const std::string& path, const InboxOptions& options,
                      int64_t processing_cutoff_ms, SqliteInspection* out) {
  std::unique_ptr<SQLite::Database> conn;
  // A corrupt file is never written, not even by the closing checkpoint.
  auto found_corrupt = [&] {
    out->corrupt = true;
    if (conn) sqlite3_db_config(conn->getHandle(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  };
  try {
    // Read-write only for the PASSIVE checkpoint; nothing else writes. Never creates.
    conn =
        std::make_unique<SQLite::Database>(path, SQLite::OPEN_READWRITE, options.busy_timeout_ms);
    SQLite::Database& db = *conn;
    const int version = db.execAndGet("PRAGMA user_version").getInt();
    out->schema_version = version;
    const bool tables =
        db.execAndGet("SELECT count(*) FROM sqlite_master WHERE name = 'inbox_processed'")
            .getInt() > 0;
    out->has_inbox_tables = tables;
    out->journal_mode = db.execAndGet("PRAGMA journal_mode").getString();

    auto run_check = [&](const char* pragma, std::optional<SqliteInspection::Check>* result) {
      SQLite::Statement q(db, pragma);
      SqliteInspection::Check check;
      check.statement = pragma;
      while (q.executeStep()) check.lines.push_back(q.getColumn(0).getString());
      if (!(check.lines.size() == 1 && check.lines[0] == "ok")) found_corrupt();
      *result = std::move(check);
    };
    run_check("PRAGMA quick_check", &out->quick_check);
    run_check("PRAGMA integrity_check", &out->integrity_check);

    std::map<std::string, std::string> meta;
    if (tables) read_meta(db, &meta);
    out->meta = std::move(meta);

    if (tables && version >= 2) {
      // store-then-process's table and its claimed_at came with schema step 2.
      SQLite::Statement q(db,
                          "SELECT count(*) FROM inbox_messages WHERE status = 'processing' "
                          "AND claimed_at < ?1");
      q.bind(1, processing_cutoff_ms);
      q.executeStep();
      out->processing_claimed_before = q.getColumn(0).getInt64();
    }
    if (tables)
      out->attempts_running =
          db.execAndGet("SELECT count(*) FROM inbox_attempts WHERE state = 'running'").getInt64();

    SqliteInspection::Wal wal;
    struct stat st {};
    wal.bytes = ::stat((path + "-wal").c_str(), &st) == 0 ? st.st_size : 0;
    int log = -1, ckpt = -1;
    const int rc = out->corrupt ? SQLITE_OK
                                : sqlite3_wal_checkpoint_v2(db.getHandle(), nullptr,
                                                            SQLITE_CHECKPOINT_PASSIVE, &log, &ckpt);
    wal.checkpoint_rc = rc;
    wal.checkpoint_failed = rc != SQLITE_OK && rc != SQLITE_BUSY;
    wal.checkpoint_error = sqlite3_errstr(rc);
    wal.frames_in_wal = log;
    wal.frames_checkpointed = ckpt;
    wal.fully_checkpointed = rc == SQLITE_OK && log == ckpt;
    out->wal = std::move(wal);

    out->page_size = db.execAndGet("PRAGMA page_size").getInt64();
    out->page_count = db.execAndGet("PRAGMA page_count").getInt64();
    out->freelist_count = db.execAndGet("PRAGMA freelist_count").getInt64();
    out->auto_vacuum = db.execAndGet("PRAGMA auto_vacuum").getInt();
  } catch (const SQLite::Exception& e) {
    // One classification of SQLite errors (store/sqlite/errors.h): a corrupt file is
    // never written again.
    if (error_class(e.getErrorCode()) == ErrorClass::kFatal) found_corrupt();
    return from_exception(e);
  }
  return Status::Ok();
}

Status read_sqlite_meta(Inbox& inbox, std::map<std::string, std::string>* out) {
  return on_connection(inbox, [&](SQLite::Database& db) { read_meta(db, out); });
}

Status list_sqlite_stp_consumers(Inbox& inbox, std::set<std::string>* out) {
  return on_connection(inbox, [&](SQLite::Database& db) {
    SQLite::Statement q(db, "SELECT DISTINCT consumer_name FROM inbox_messages");
    while (q.executeStep()) out->insert(q.getColumn(0).getString());
  });
}

Status read_sqlite_stored_status(Inbox& inbox, const std::string& consumer,
                                 const std::string& message_id, std::optional<std::string>* out) {
  return on_connection(inbox, [&](SQLite::Database& db) {
    SQLite::Statement q(
        db, "SELECT status FROM inbox_messages WHERE consumer_name = ?1 AND message_id = ?2");
    q.bind(1, consumer);
    q.bind(2, message_id);
    if (q.executeStep()) *out = q.getColumn(0).getString();
  });
}

Status count_sqlite(Inbox& inbox, SqliteCounts* out) {
  return on_connection(inbox, [&](SQLite::Database& db) {
    SQLite::Statement q(db,
                        "SELECT consumer_name, reason, status, count(*) FROM inbox_dead_letters"
                        " GROUP BY consumer_name, reason, status");
    while (q.executeStep())
      out->dead_letters.push_back({q.getColumn(0).getString(), q.getColumn(1).getString(),
                                   q.getColumn(2).getString(), q.getColumn(3).getInt64()});
    SQLite::Statement a(
        db, "SELECT consumer_name, count(*) FROM inbox_attempts GROUP BY consumer_name");
    while (a.executeStep())
      out->attempts_by_consumer[a.getColumn(0).getString()] = a.getColumn(1).getInt64();
  });
}

Status count_expired_sqlite(Inbox& inbox, int64_t claims_cutoff, int64_t dead_letters_cutoff,
                            std::map<std::string, int64_t>* claims_by_consumer,
                            int64_t* dead_letters, int64_t* outbox_sent, int64_t* outbox_dead) {
  return on_connection(inbox, [&](SQLite::Database& db) {
    SQLite::Statement q(db,
                        "SELECT consumer_name, count(*) FROM inbox_processed WHERE received_at < ?1"
                        " GROUP BY consumer_name");
    q.bind(1, claims_cutoff);
    while (q.executeStep())
      (*claims_by_consumer)[q.getColumn(0).getString()] = q.getColumn(1).getInt64();
    if (dead_letters_cutoff > 0) {
      SQLite::Statement d(db,
                          "SELECT count(*) FROM inbox_dead_letters WHERE retention_at < ?1 AND "
                          "status <> 'requeued'");
      d.bind(1, dead_letters_cutoff);
      d.executeStep();
      *dead_letters = d.getColumn(0).getInt64();
      SQLite::Statement od(
          db, "SELECT count(*) FROM outbox_messages WHERE state = 'dead' AND retention_at < ?1");
      od.bind(1, dead_letters_cutoff);
      od.executeStep();
      *outbox_dead = od.getColumn(0).getInt64();
    }
    // The Pruner deletes sent outbox rows with the claims' window (docs/outbox.md#limits).
    SQLite::Statement os(
        db, "SELECT count(*) FROM outbox_messages WHERE state = 'sent' AND retention_at < ?1");
    os.bind(1, claims_cutoff);
    os.executeStep();
    *outbox_sent = os.getColumn(0).getInt64();
  });
}

Status read_sqlite_processed_page(Inbox& inbox, const SqliteProcessedPage& page,
                                  const std::function<void(const SqliteProcessedRow&)>& row,
                                  int64_t* count) {
  int64_t n = 0;
  Status s = on_connection(inbox, [&](SQLite::Database& db) {
    std::string sql =
        "SELECT consumer_name, message_id, received_at, topic, message_type, correlation_id, "
        "payload_hash"
        " FROM inbox_processed WHERE (?1 OR (consumer_name, message_id) > (?2, ?3))";
    if (page.since_received_at) sql += " AND received_at >= ?4";
    if (!page.consumer.empty()) sql += " AND consumer_name = ?5";
    sql += " ORDER BY consumer_name, message_id LIMIT " + std::to_string(page.limit);
    SQLite::Statement q(db, sql);
    q.bind(1, page.from_start ? 1 : 0);
    q.bind(2, page.after_consumer);
    q.bind(3, page.after_message_id);
    if (page.since_received_at) q.bind(4, *page.since_received_at);
    if (!page.consumer.empty()) q.bind(5, page.consumer);
    while (q.executeStep()) {
      SqliteProcessedRow r;
      r.consumer = q.getColumn(0).getString();
      r.message_id = q.getColumn(1).getString();
      r.received_at = q.getColumn(2).getInt64();
      if (!q.getColumn(3).isNull()) r.topic = q.getColumn(3).getString();
      if (!q.getColumn(4).isNull()) r.message_type = q.getColumn(4).getString();
      if (!q.getColumn(5).isNull()) r.correlation_id = q.getColumn(5).getString();
      if (!q.getColumn(6).isNull()) r.payload_hash = q.getColumn(6).getInt64();
      row(r);
      ++n;
    }
  });
  if (count) *count = n;
  return s;
}

}  // namespace mqtt_inbox::detail

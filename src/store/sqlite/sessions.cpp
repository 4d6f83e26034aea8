// The SQLite store's session-record rows (store/backend.h): what each client id's
// persistent session holds at the broker as the transport recorded it. All SQL on
// inbox_sessions and inbox_session_filters lives in this file; the checks are
// SessionStore's (store/sessions.cpp).
#include <mutex>

#include "mqtt_inbox/session_record.h"
#include "store/sqlite/backend.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

namespace {

constexpr const char* kUpsertSessionSql =
    "INSERT INTO inbox_sessions (client_id, session_expiry_ms, expiry_source, updated_at)"
    " VALUES (?1, ?2, ?3, ?4)"
    " ON CONFLICT (client_id) DO UPDATE SET session_expiry_ms = excluded.session_expiry_ms,"
    "   expiry_source = excluded.expiry_source, updated_at = excluded.updated_at";

constexpr const char* kSelectSessionsSql =
    "SELECT client_id, session_expiry_ms, expiry_source, updated_at, sessions_lost,"
    " coalesce(last_lost_at, 0) FROM inbox_sessions"
    " WHERE ?1 IS NULL OR client_id = ?1 ORDER BY client_id";

constexpr const char* kSelectFiltersSql =
    "SELECT topic_filter FROM inbox_session_filters WHERE client_id = ?1"
    " ORDER BY topic_filter";

// Reads the records of `client_id`, or all of them with nullptr, on `db`.
std::vector<SessionRecord> read_sessions(SQLite::Database& db, const std::string* client_id) {
  std::vector<SessionRecord> out;
  SQLite::Statement q(db, kSelectSessionsSql);
  if (client_id) q.bind(1, *client_id);
  while (q.executeStep()) {
    SessionRecord r;
    r.client_id = q.getColumn(0).getString();
    r.session_expiry_ms = q.getColumn(1).getInt64();
    if (!parse_session_expiry_source(q.getColumn(2).getString(), &r.expiry_source))
      r.expiry_source = SessionExpirySource::kDeclared;  // the CHECK constraint forbids it
    r.updated_at_ms = q.getColumn(3).getInt64();
    r.sessions_lost = q.getColumn(4).getInt64();
    r.last_lost_at_ms = q.getColumn(5).getInt64();
    out.push_back(std::move(r));
  }
  for (SessionRecord& r : out) {
    SQLite::Statement f(db, kSelectFiltersSql);
    f.bind(1, r.client_id);
    while (f.executeStep()) r.topic_filters.push_back(f.getColumn(0).getString());
  }
  return out;
}

}  // namespace

void SqliteBackend::write_session(const SessionRecord& record) {
  SQLite::Statement up(*db, kUpsertSessionSql);
  up.bind(1, record.client_id);
  up.bind(2, record.session_expiry_ms);
  up.bind(3, to_string(record.expiry_source));
  up.bind(4, record.updated_at_ms);
  up.exec();
  SQLite::Statement del(*db, "DELETE FROM inbox_session_filters WHERE client_id = ?1");
  del.bind(1, record.client_id);
  del.exec();
  SQLite::Statement ins(*db,
                        "INSERT INTO inbox_session_filters (client_id, topic_filter)"
                        " VALUES (?1, ?2)");
  for (const std::string& f : record.topic_filters) {
    ins.bind(1, record.client_id);
    ins.bind(2, f);
    ins.exec();
    ins.reset();
  }
}

void SqliteBackend::add_lost_session(const std::string& client_id, int64_t at_ms) {
  SQLite::Statement up(*db,
                       "UPDATE inbox_sessions SET sessions_lost = sessions_lost + 1,"
                       " last_lost_at = ?2 WHERE client_id = ?1");
  up.bind(1, client_id);
  up.bind(2, at_ms);
  up.exec();
}

void SqliteBackend::read_sessions(const std::string* client_id, std::vector<SessionRecord>* out) {
  *out = detail::read_sessions(*db, client_id);
}

bool SqliteBackend::remove_session(const std::string& client_id) {
  SQLite::Statement f(*db, "DELETE FROM inbox_session_filters WHERE client_id = ?1");
  f.bind(1, client_id);
  f.exec();
  SQLite::Statement s(*db, "DELETE FROM inbox_sessions WHERE client_id = ?1");
  s.bind(1, client_id);
  return s.exec() > 0;
}

}  // namespace mqtt_inbox::detail

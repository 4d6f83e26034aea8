// The session records (session_record.h): what each client id's persistent session holds
// at the broker, as the transport recorded it. All SQL on inbox_sessions and
// inbox_session_filters lives in this file.
#include <algorithm>
#include <mutex>
#include <set>

#include "store/sqlite/store.h"
#include "store/reentry.h"
#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/session_record.h"

namespace mqtt_inbox {

const char* to_string(SessionExpirySource source) {
  switch (source) {
    case SessionExpirySource::kRequested: return "requested";
    case SessionExpirySource::kGranted: return "granted";
    case SessionExpirySource::kDeclared: return "declared";
  }
  return "unknown";
}

bool parse_session_expiry_source(const std::string& text, SessionExpirySource* out) {
  for (auto s : {SessionExpirySource::kRequested, SessionExpirySource::kGranted,
                 SessionExpirySource::kDeclared}) {
    if (text == to_string(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

namespace {

constexpr const char* kUpsertSessionSql =
    "INSERT INTO inbox_sessions (client_id, session_expiry_ms, expiry_source, updated_at)"
    " VALUES (?1, ?2, ?3, ?4)"
    " ON CONFLICT (client_id) DO UPDATE SET session_expiry_ms = excluded.session_expiry_ms,"
    "   expiry_source = excluded.expiry_source, updated_at = excluded.updated_at";

constexpr const char* kSelectSessionsSql =
    "SELECT client_id, session_expiry_ms, expiry_source, updated_at FROM inbox_sessions"
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

Status Inbox::record_session(const SessionRecord& record) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::record_session"); !r.ok()) return r;
  if (impl_->fatal.load()) return impl_->fatal_status();  // the file is corrupt
  if (record.client_id.empty()) return Status::InvalidArgument("session record: client id is empty");
  if (record.session_expiry_ms < 0)
    return Status::InvalidArgument("session record: session expiry must be >= 0 ms");
  const std::set<std::string> filters(record.topic_filters.begin(), record.topic_filters.end());
  if (filters.count(""))
    return Status::InvalidArgument("session record: a topic filter is empty");
  detail::SqliteStore& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  try {
    m.write_transaction([&] {
      SQLite::Statement up(*m.db, kUpsertSessionSql);
      up.bind(1, record.client_id);
      up.bind(2, record.session_expiry_ms);
      up.bind(3, to_string(record.expiry_source));
      up.bind(4, m.clock->wall_ms());
      up.exec();
      SQLite::Statement del(*m.db, "DELETE FROM inbox_session_filters WHERE client_id = ?1");
      del.bind(1, record.client_id);
      del.exec();
      SQLite::Statement ins(*m.db,
                            "INSERT INTO inbox_session_filters (client_id, topic_filter)"
                            " VALUES (?1, ?2)");
      for (const std::string& f : filters) {
        ins.bind(1, record.client_id);
        ins.bind(2, f);
        ins.exec();
        ins.reset();
      }
    });
  } catch (const SQLite::Exception& e) {
    return m.store_error(detail::to_status(e, "recording the session of client '" +
                                                  detail::printable(record.client_id) + "'"));
  }
  return Status::Ok();
}

Status Inbox::load_session(const std::string& client_id, SessionRecord* out) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::load_session"); !r.ok()) return r;
  if (impl_->fatal.load()) return impl_->fatal_status();  // the file is corrupt
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    std::vector<SessionRecord> found = read_sessions(*impl_->db, &client_id);
    if (found.empty())
      return Status::NotFound("no session recorded for client '" + detail::printable(client_id) +
                              "'");
    *out = std::move(found.front());
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "reading a session record"));
  }
  return Status::Ok();
}

Status Inbox::list_sessions(std::vector<SessionRecord>* out) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::list_sessions"); !r.ok()) return r;
  if (impl_->fatal.load()) return impl_->fatal_status();  // the file is corrupt
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    *out = read_sessions(*impl_->db, nullptr);
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "reading the session records"));
  }
  return Status::Ok();
}

Status Inbox::forget_session(const std::string& client_id, bool* removed) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::forget_session"); !r.ok()) return r;
  if (impl_->fatal.load()) return impl_->fatal_status();  // the file is corrupt
  detail::SqliteStore& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  try {
    m.write_transaction([&] {
      SQLite::Statement f(*m.db, "DELETE FROM inbox_session_filters WHERE client_id = ?1");
      f.bind(1, client_id);
      f.exec();
      SQLite::Statement s(*m.db, "DELETE FROM inbox_sessions WHERE client_id = ?1");
      s.bind(1, client_id);
      *removed = s.exec() > 0;
    });
  } catch (const SQLite::Exception& e) {
    return m.store_error(detail::to_status(e, "forgetting the session of client '" +
                                                  detail::printable(client_id) + "'"));
  }
  if (*removed)
    m.log->warn("inbox {}: forgot the session record of client '{}'; the Pruner no longer "
                "checks the retention window against its session expiry",
                m.path, detail::printable(client_id));
  return Status::Ok();
}

void Inbox::note_session_lost(const std::string& client_id) {
  (void)client_id;  // one counter for every client id: the transport's log names it
  impl_->sessions_lost.fetch_add(1);
}

}  // namespace mqtt_inbox

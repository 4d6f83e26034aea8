// The session records' checks and normal form, shared by every store (store/sessions.h),
// and the text forms of SessionExpirySource (session_record.h).
#include "store/sessions.h"

#include <set>
#include <utility>

#include "store/reentry.h"
#include "store/store.h"
#include "util/log.h"

namespace mqtt_inbox {

const char* to_string(SessionExpirySource source) {
  switch (source) {
    case SessionExpirySource::kRequested:
      return "requested";
    case SessionExpirySource::kGranted:
      return "granted";
    case SessionExpirySource::kDeclared:
      return "declared";
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

namespace detail {

Status SessionStore::record(const SessionRecord& record) {
  if (Status r = refuse_if_in_handler(store_.owner(), "SessionRecords::record"); !r.ok()) return r;
  if (record.client_id.empty())
    return Status::InvalidArgument("session record: client id is empty");
  if (record.session_expiry_ms < 0)
    return Status::InvalidArgument("session record: session expiry must be >= 0 ms");
  const std::set<std::string> filters(record.topic_filters.begin(), record.topic_filters.end());
  if (filters.count("")) return Status::InvalidArgument("session record: a topic filter is empty");
  SessionRecord normal;
  normal.client_id = record.client_id;
  normal.topic_filters.assign(filters.begin(), filters.end());
  normal.session_expiry_ms = record.session_expiry_ms;
  normal.expiry_source = record.expiry_source;
  normal.updated_at_ms = store_.clock()->wall_ms();
  return store_.write_txn("recording a session", [&](StoreBackend& b) { b.write_session(normal); });
}

Status SessionStore::load(const std::string& client_id, SessionRecord* out) {
  if (Status r = refuse_if_in_handler(store_.owner(), "SessionRecords::load"); !r.ok()) return r;
  std::vector<SessionRecord> found;
  if (Status s = store_.read_txn("reading a session record",
                                 [&](StoreBackend& b) { b.read_sessions(&client_id, &found); });
      !s.ok())
    return s;
  if (found.empty())
    return Status::NotFound("no session recorded for client '" + printable(client_id) + "'");
  *out = std::move(found.front());
  return Status::Ok();
}

Status SessionStore::list(std::vector<SessionRecord>* out) {
  if (Status r = refuse_if_in_handler(store_.owner(), "SessionRecords::list"); !r.ok()) return r;
  return store_.read_txn("reading the session records", [&](StoreBackend& b) {
    out->clear();
    b.read_sessions(nullptr, out);
  });
}

Status SessionStore::forget(const std::string& client_id, bool* removed) {
  if (Status r = refuse_if_in_handler(store_.owner(), "SessionRecords::forget"); !r.ok()) return r;
  if (Status s = store_.write_txn("forgetting a session",
                                  [&](StoreBackend& b) { *removed = b.remove_session(client_id); });
      !s.ok())
    return s;
  if (*removed)
    store_.log()->warn(
        "inbox {}: forgot the session record of client '{}'; the Pruner no longer "
        "checks the retention window against its session expiry",
        store_.location(), printable(client_id));
  return Status::Ok();
}

void SessionStore::note_lost(const std::string& client_id) {
  store_.count_session_lost();
  // From inside a handler of this inbox the write would wait for the connection that
  // handler holds, for ever (tests/reentry_test.cpp): counted in memory only, as before.
  if (in_handler_of(store_.owner())) return;
  if (store_.unusable()) return;
  const int64_t at = store_.clock()->wall_ms();
  if (Status s = store_.write_txn("recording a lost session",
                                  [&](StoreBackend& b) { b.add_lost_session(client_id, at); });
      !s.ok())
    store_.log()->warn(
        "inbox {}: cannot record the lost session of client '{}' ({}); counted "
        "in this process only",
        store_.location(), printable(client_id), s.to_string());
}

}  // namespace detail
}  // namespace mqtt_inbox

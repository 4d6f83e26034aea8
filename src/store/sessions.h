// Internal: the session records as a store keeps them. Their interface is the public
// SessionRecords (session_record.h), which the transport writes through without knowing
// the store. SessionStore implements it once for every store: the checks (a call from
// inside a handler, the fatal latch, the record's validity), the normal form of a record
// (its topic filters a sorted set, updated_at from the store's wall clock), the count of
// lost sessions and the log line of a forgotten one; the rows are the backend's
// (StoreBackend::write_session and the rest, store/backend.h). How they are kept:
// docs/design.md#session-records.
//
// Thread safety: as SessionRecords (thread-safe).
#pragma once

#include <string>
#include <vector>

#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

class Store;

class SessionStore final : public SessionRecords {
 public:
  // `store` must outlive this object (a store owns its SessionStore).
  explicit SessionStore(Store& store) : store_(store) {}
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  Status record(const SessionRecord& record) override;
  Status load(const std::string& client_id, SessionRecord* out) override;
  Status list(std::vector<SessionRecord>* out) override;
  Status forget(const std::string& client_id, bool* removed) override;
  void note_lost(const std::string& client_id) override;

 private:
  Store& store_;
};

}  // namespace mqtt_inbox::detail

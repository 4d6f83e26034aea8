// Internal: the session records as a store keeps them. Their interface is the public
// SessionRecords (session_record.h), which the transport writes through without knowing
// the store. SessionStore implements it once for every store: the checks (a call from
// inside a handler, the fatal latch, the record's validity), the normal form of a record
// (its topic filters a sorted set, updated_at from the store's wall clock), the count of
// lost sessions and the log line of a forgotten one. A store supplies the three
// operations on its rows (SQLite: store/sqlite/sessions.cpp); how they are kept:
// docs/design.md#session-records.
//
// Thread safety: as SessionRecords (thread-safe); the row operations are called from any
// thread and take the store's connection themselves.
#pragma once

#include <string>
#include <vector>

#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

class Store;

class SessionStore : public SessionRecords {
 public:
  // `store` must outlive this object (a store owns its SessionStore).
  explicit SessionStore(Store& store) : store_(store) {}
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  Status record(const SessionRecord& record) final;
  Status load(const std::string& client_id, SessionRecord* out) final;
  Status list(std::vector<SessionRecord>* out) final;
  Status forget(const std::string& client_id, bool* removed) final;
  void note_lost(const std::string& client_id) final;

 protected:
  // Replaces the record of record.client_id (its expiry, source, updated_at and topic
  // filters) with `record`, whose filters are sorted and unique, in one committed
  // transaction synced like a claim.
  virtual Status write(const SessionRecord& record) = 0;
  // The record of *client_id, or every record if client_id is null, ordered by client id,
  // each with its filters sorted; none found is OK (an empty *out).
  virtual Status read(const std::string* client_id, std::vector<SessionRecord>* out) = 0;
  // Deletes the record of `client_id` and its filters in one committed transaction;
  // *removed says whether there was one.
  virtual Status remove(const std::string& client_id, bool* removed) = 0;
  // Adds one to the lost sessions of `client_id`'s record and sets its last loss to
  // `at_ms` (wall clock), in one committed transaction; no record: nothing changes.
  virtual Status add_lost(const std::string& client_id, int64_t at_ms) = 0;

  Store& store_;
};

}  // namespace mqtt_inbox::detail

// SessionRecord: what a transport's persistent session at the broker holds for one client
// id, as the transport records it in the inbox database through SessionRecords
// (Inbox::sessions()). The MQTT Subscriber writes it; the core only stores it and reads it
// back. Two rules rest on it:
//  - the subscriber UNSUBSCRIBEs recorded topic filters that are no longer configured
//    (a persistent session keeps every subscription it was ever given), and on MQTT
//    3.1.1 does not SUBSCRIBE again while the session holds exactly the configured
//    filters (every SUBSCRIBE makes the broker resend retained messages, MQTT 3.1.1
//    section 3.3.1.3);
//  - the Pruner refuses a retention window shorter than the longest recorded session
//    expiry plus its margin (retention.h): the broker can redeliver a message until the
//    session expires, and its id must be remembered that long.
//
// Thread safety: SessionRecord is a value type; SessionRecords is thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

// Where SessionRecord::session_expiry_ms comes from.
enum class SessionExpirySource {
  kRequested,  // the Session Expiry Interval the client sent in CONNECT (MQTT 5.0
               // section 3.1.2.11.2), recorded before the CONNECT leaves
  kGranted,    // the Session Expiry Interval the broker returned in CONNACK instead (MQTT
               // 5.0 section 3.2.2.3.2): the broker uses that one
  kDeclared,   // declared by the user for MQTT 3.1.1, where the broker alone sets it
               // (mosquitto: persistent_client_expiration); nothing is sent
};
// "requested", "granted", "declared" (the text the database stores).
const char* to_string(SessionExpirySource source);
// Parses the text form; returns false for an unknown name.
bool parse_session_expiry_source(const std::string& text, SessionExpirySource* out);

struct SessionRecord {
  // The client id the broker keeps the session under. Non-empty.
  std::string client_id;
  // The topic filters the session holds, as subscribed (exact strings, "$share/..."
  // included). SessionRecords::record stores them as a set: order and repeats do not
  // matter, and load returns them sorted.
  std::vector<std::string> topic_filters;
  // How long the broker keeps the session after a disconnect, ms. >= 0. An MQTT 5
  // Session Expiry Interval of 0xFFFFFFFF ("never expires") is recorded as
  // 0xFFFFFFFF * 1000 ms (136 years): no finite retention window covers it.
  int64_t session_expiry_ms = 0;
  SessionExpirySource expiry_source = SessionExpirySource::kRequested;
  // Wall-clock Unix ms of the last SessionRecords::record for this client id. Set by
  // record (ignored on input). The Subscriber records at every connection, so
  // this is also about when the broker last held the session: its warning when a
  // session is lost says since when (subscriber.h).
  int64_t updated_at_ms = 0;
  // Sessions of this client id the broker lost (note_lost), since the record was made,
  // across restarts, and the wall-clock Unix ms of the last one (0: never). Set by
  // note_lost (ignored on input to record).
  int64_t sessions_lost = 0;
  int64_t last_lost_at_ms = 0;
};

// The session records of one inbox (Inbox::sessions()): what the transport writes its
// persistent sessions through, without knowing the inbox or its store. An MQTT sink
// (MessageSink::sessions(), message.h) hands them to the Subscriber.
//
// Thread safety: thread-safe. Called from inside a handler of the same inbox, every call
// but note_lost is refused with kInvalidArgument naming it (handler.h).
class SessionRecords {
 public:
  virtual ~SessionRecords();

  // Records what the persistent session of record.client_id holds: replaces that client
  // id's topic filters and session expiry, committed and synced like a message's claim,
  // and sets updated_at to the wall clock. The MQTT Subscriber calls it before each
  // CONNECT whose session expiry differs from the record, and after each change of
  // subscriptions. Errors: kInvalidArgument for an empty client id, an empty topic filter
  // or a negative expiry; store codes.
  virtual Status record(const SessionRecord& record) = 0;

  // Reads the record of `client_id` (filters sorted). kNotFound if there is none.
  virtual Status load(const std::string& client_id, SessionRecord* out) = 0;

  // Every record, ordered by client id.
  virtual Status list(std::vector<SessionRecord>* out) = 0;

  // Deletes the record of `client_id` (a client id that is retired for good: its session
  // expiry no longer binds the Pruner). *removed is set to whether one existed. Do not
  // call it for a client id that may still connect: the Pruner would then check against
  // the other records only. Errors: store codes.
  virtual Status forget(const std::string& client_id, bool* removed) = 0;

  // Counts a session lost at the broker: the transport calls it when the broker answers a
  // CONNECT of `client_id` without a session (session present = 0) although a recorded
  // one held topic filters. Messages sent to that session while the client was away are
  // gone, and no redelivery will bring them. Counted in this process's memory
  // (InboxStats::sessions_lost) and in the record itself (SessionRecord::sessions_lost,
  // last_lost_at_ms), so that it is seen after a restart (`mqtt-inbox stats`): one short
  // write transaction, which waits for the store up to the busy timeout; call it from
  // the transport's connect path, never from a message callback. Called from inside a
  // handler of this inbox it only counts in memory (the write would wait for the
  // handler's own connection). A failed write is logged; the in-memory count stays.
  virtual void note_lost(const std::string& client_id) = 0;
};

}  // namespace mqtt_inbox

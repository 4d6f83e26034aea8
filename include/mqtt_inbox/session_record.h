// SessionRecord: what a transport's persistent session at the broker holds for one client
// id, as the transport records it in the inbox database (Inbox::record_session). The MQTT
// Subscriber writes it; the core only stores it and reads it back. Two rules rest on it:
//  - the subscriber UNSUBSCRIBEs recorded topic filters that are no longer configured
//    (a persistent session keeps every subscription it was ever given), and on MQTT
//    3.1.1 does not SUBSCRIBE again while the session holds exactly the configured
//    filters (every SUBSCRIBE makes the broker resend retained messages, MQTT 3.1.1
//    section 3.3.1.3);
//  - the Pruner refuses a retention window shorter than the longest recorded session
//    expiry plus its margin (retention.h): the broker can redeliver a message until the
//    session expires, and its id must be remembered that long.
//
// Thread safety: a value type; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  // included). record_session stores them as a set: order and repeats do not matter, and
  // load_session returns them sorted.
  std::vector<std::string> topic_filters;
  // How long the broker keeps the session after a disconnect, ms. >= 0. An MQTT 5
  // Session Expiry Interval of 0xFFFFFFFF ("never expires") is recorded as
  // 0xFFFFFFFF * 1000 ms (136 years): no finite retention window covers it.
  int64_t session_expiry_ms = 0;
  SessionExpirySource expiry_source = SessionExpirySource::kRequested;
  // Wall-clock Unix ms of the last record_session for this client id. Set by
  // record_session (ignored on input). The Subscriber records at every connection, so
  // this is also about when the broker last held the session: its warning when a
  // session is lost says since when (subscriber.h).
  int64_t updated_at_ms = 0;
};

}  // namespace mqtt_inbox

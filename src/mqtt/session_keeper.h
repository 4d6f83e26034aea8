// The subscriber's record of its persistent session (session_record.h), kept in the
// session records of the Inbox behind each of its sinks: what the session holds at the
// broker (topic filters, session expiry), and from that what to UNSUBSCRIBE and whether
// to SUBSCRIBE on each CONNACK. Part of the MQTT layer, but without Paho and without SQL:
// it decides, and writes through SessionRecords; mqtt/subscriber.cpp sends the packets.
//
// Thread safety: none; used only by the subscriber's connection thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/status.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox::detail {

class SessionKeeper {
 public:
  // `records`: the distinct session records behind the subscriber's sinks (one per
  // Inbox; each gets the same record). `configured`: the topic filters of the
  // subscriber. `expiry_ms`: the session expiry the next CONNECT asks for (MQTT 5) or the
  // user declares (MQTT 3.1.1, `source` kDeclared).
  SessionKeeper(std::string client_id, std::vector<SessionRecords*> records,
                std::vector<std::string> configured, int64_t expiry_ms, SessionExpirySource source,
                std::shared_ptr<spdlog::logger> log);

  // Before each CONNECT: reads the records once (the union of their filters is what the
  // session holds), then makes sure every Inbox records an expiry at least as long as
  // both the recorded one (the broker's session until this CONNECT) and the one this
  // CONNECT asks for, so no Pruner ever sees less than the broker may keep. An error
  // means the attempt must not connect: the broker would hold a session no Pruner knows.
  Status before_connect();

  // A session the inbox recorded and the broker no longer has: what may have been lost.
  struct LostSession {
    std::vector<std::string> topic_filters;  // the filters the recorded session held, sorted
    // When the broker last held the session, as far as the inbox knows, wall-clock Unix
    // ms: this process's last CONNACK, or else the newest record's updated_at (the
    // subscriber records at every connection, save()). 0 if unknown.
    int64_t seen_at_ms = 0;
    int64_t session_expiry_ms = 0;  // as recorded
    SessionExpirySource expiry_source = SessionExpirySource::kRequested;
  };

  // After CONNACK: the expiry the session now has, `granted_ms` if the broker returned
  // one (MQTT 5 CONNACK Session Expiry Interval), else the requested or declared one;
  // recorded if it differs (a lowered expiry takes effect here). With session present =
  // 0 while the records (of an earlier process, or of this one's last connection) hold
  // topic filters, the broker lost the session: returns what it held, and counts the
  // loss in every Inbox (SessionRecords::note_lost: in memory and in the record, a short
  // write on this, the connect thread). A first connection (no record, or
  // one without filters) returns nothing.
  std::optional<LostSession> after_connack(bool session_present, const int64_t* granted_ms);

  // What to do now that CONNACK arrived (after after_connack()).
  struct Plan {
    std::vector<std::string> unsubscribe;  // held by the session, no longer configured
    bool subscribe = false;                // SUBSCRIBE the configured filters
  };
  // With a session present: UNSUBSCRIBE what it holds beyond the configured filters;
  // SUBSCRIBE with MQTT 5 always (Retain Handling 1 resends no retained message for an
  // existing subscription, and a SUBSCRIBE repairs a session that lost one), with MQTT
  // 3.1.1 only when the held filters differ from the configured ones (every 3.1.1
  // SUBSCRIBE resends the retained messages, section 3.3.1.3) or one of them is a shared
  // subscription ("$share/...", which mosquitto forgets over a restart). Without a
  // session: nothing to UNSUBSCRIBE, SUBSCRIBE.
  Plan plan(bool mqtt5) const;

  // Outcomes of the packets of the plan; save() records them.
  void unsubscribed(const std::string& filter);
  void subscribed(const std::string& filter);
  // Records the filters held now. Written once per connection even when nothing
  // changed, so that the record's updated_at tells the next process when the broker last
  // held the session (LostSession::seen_at_ms). A failure is logged; the next CONNACK
  // tries again (the held set then differs from the record).
  void save();

 private:
  Status write(int64_t expiry_ms, SessionExpirySource source, const char* when);

  std::string client_id_;
  std::vector<SessionRecords*> records_;
  std::set<std::string> configured_;
  int64_t expiry_ms_;
  SessionExpirySource source_;
  std::shared_ptr<spdlog::logger> log_;

  bool loaded_ = false;
  std::set<std::string> held_;       // what the broker's session holds, as known
  std::set<std::string> recorded_;   // filters in the records (the last write)
  bool records_agree_ = false;       // every Inbox had a record, all with the same filters
  int64_t recorded_expiry_ms_ = -1;  // the smallest expiry among the records (-1: none)
  SessionExpirySource recorded_source_ = SessionExpirySource::kRequested;
  int64_t seen_at_ms_ = 0;      // see LostSession::seen_at_ms
  int64_t lost_expiry_ms_ = 0;  // the recorded expiry before this CONNECT
  SessionExpirySource lost_source_ = SessionExpirySource::kRequested;
  bool connected_since_save_ = false;  // a CONNACK came since the last save()
};

// The warning for a lost session: the broker, the client id, which filters the session
// held and since when, what is lost, and the likely causes (whether the recorded expiry
// can explain it, at `now_ms`, wall clock).
std::string lost_session_warning(const std::string& broker_uri, const std::string& client_id,
                                 const SessionKeeper::LostSession& lost, int64_t now_ms);

}  // namespace mqtt_inbox::detail

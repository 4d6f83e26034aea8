// The subscriber's record of its persistent session (session_record.h), kept in the
// Inbox behind each of its sinks: what the session holds at the broker (topic filters,
// session expiry), and from that what to UNSUBSCRIBE and whether to SUBSCRIBE on each
// CONNACK. Part of the MQTT layer, but without Paho and without SQL: it decides, and
// writes through Inbox::record_session; subscriber.cpp sends the packets.
//
// Thread safety: none; used only by the subscriber's connection thread.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/status.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox::detail {

class SessionKeeper {
 public:
  // `inboxes`: the distinct Inboxes behind the subscriber's sinks (each gets the same
  // record). `configured`: the topic filters of the subscriber. `expiry_ms`: the session
  // expiry the next CONNECT asks for (MQTT 5) or the user declares (MQTT 3.1.1, `source`
  // kDeclared).
  SessionKeeper(std::string client_id, std::vector<Inbox*> inboxes,
                std::vector<std::string> configured, int64_t expiry_ms,
                SessionExpirySource source, std::shared_ptr<spdlog::logger> log);

  // Before each CONNECT: reads the records once (the union of their filters is what the
  // session holds), then makes sure every Inbox records an expiry at least as long as
  // both the recorded one (the broker's session until this CONNECT) and the one this
  // CONNECT asks for, so no Pruner ever sees less than the broker may keep. An error
  // means the attempt must not connect: the broker would hold a session no Pruner knows.
  Status before_connect();

  // After CONNACK: the expiry the session now has, `granted_ms` if the broker returned
  // one (MQTT 5 CONNACK Session Expiry Interval), else the requested or declared one;
  // recorded if it differs (a lowered expiry takes effect here).
  void after_connack(bool session_present, const int64_t* granted_ms);

  // What to do now that CONNACK arrived (after after_connack()).
  struct Plan {
    std::vector<std::string> unsubscribe;  // held by the session, no longer configured
    bool subscribe = false;                // SUBSCRIBE the configured filters
  };
  // With a session present: UNSUBSCRIBE what it holds beyond the configured filters;
  // SUBSCRIBE with MQTT 5 always (Retain Handling 1 resends no retained message for an
  // existing subscription, and a SUBSCRIBE repairs a session that lost one), with MQTT
  // 3.1.1 only when the held filters differ from the configured ones (every 3.1.1
  // SUBSCRIBE resends the retained messages, section 3.3.1.3). Without a session: nothing
  // to UNSUBSCRIBE, SUBSCRIBE.
  Plan plan(bool mqtt5) const;

  // Outcomes of the packets of the plan; save() records them.
  void unsubscribed(const std::string& filter);
  void subscribed(const std::string& filter);
  // Records the filters held now, if they changed. A failure is logged; the next CONNACK
  // tries again (the held set then differs from the record).
  void save();

 private:
  Status write(int64_t expiry_ms, SessionExpirySource source, const char* when);

  std::string client_id_;
  std::vector<Inbox*> inboxes_;
  std::set<std::string> configured_;
  int64_t expiry_ms_;
  SessionExpirySource source_;
  std::shared_ptr<spdlog::logger> log_;

  bool loaded_ = false;
  std::set<std::string> held_;          // what the broker's session holds, as known
  std::set<std::string> recorded_;      // filters in the records (the last write)
  bool records_agree_ = false;          // every Inbox had a record, all with the same filters
  int64_t recorded_expiry_ms_ = -1;     // the smallest expiry among the records (-1: none)
  SessionExpirySource recorded_source_ = SessionExpirySource::kRequested;
};

}  // namespace mqtt_inbox::detail

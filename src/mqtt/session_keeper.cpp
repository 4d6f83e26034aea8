// The subscriber's session record: see mqtt/session_keeper.h.
#include "mqtt/session_keeper.h"

#include <algorithm>
#include <ctime>

#include "mqtt_inbox/clock.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

namespace {

std::string list(const std::set<std::string>& filters) {
  std::string out;
  for (const std::string& f : filters) out += (out.empty() ? "'" : ", '") + printable(f) + "'";
  return out.empty() ? "none" : out;
}

// "45 s", "12 min", "5 h", "7 d": how long, to the unit a person reads at a glance.
std::string duration(int64_t ms) {
  const int64_t s = std::max<int64_t>(ms, 0) / 1000;
  if (s < 120) return std::to_string(s) + " s";
  if (s < 120 * 60) return std::to_string(s / 60) + " min";
  if (s < 48 * 3600) return std::to_string(s / 3600) + " h";
  return std::to_string(s / 86400) + " d";
}

// ISO 8601, UTC, to the second.
std::string utc(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  char buf[32];
  if (!gmtime_r(&t, &tm) || std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    return std::to_string(ms) + " ms";
  return buf;
}

// An MQTT 5 Session Expiry Interval of 0xFFFFFFFF: the session never expires.
constexpr int64_t kNeverExpiresMs = 0xFFFFFFFFLL * 1000;

}  // namespace

std::string lost_session_warning(const std::string& broker_uri, const std::string& client_id,
                                 const SessionKeeper::LostSession& lost, int64_t now_ms) {
  std::string filters;
  for (const std::string& f : lost.topic_filters)
    filters += (filters.empty() ? "'" : ", '") + printable(f) + "'";
  const bool never = lost.session_expiry_ms >= kNeverExpiresMs;
  const std::string expiry =
      never ? "never expires"
            : duration(lost.session_expiry_ms) + ", " + to_string(lost.expiry_source);
  std::string since = "when the broker last held it is not recorded";
  const int64_t age_ms = now_ms - lost.seen_at_ms;
  if (lost.seen_at_ms > 0)
    since = "the broker last held it at " + utc(lost.seen_at_ms) + ", " + duration(age_ms) + " ago";
  const std::string takeover = "another client connected with client id '" + printable(client_id) +
                               "' and a clean session (MQTT 3.1.1 clean session, MQTT 5 clean "
                               "start), which ends the session";
  std::string causes;
  if (never || (lost.seen_at_ms > 0 && age_ms >= 0 && age_ms < lost.session_expiry_ms)) {
    // The session expiry counts from the disconnect, which came after seen_at: it cannot
    // have run out yet (if the recorded expiry is what the broker uses).
    causes = "less than the session expiry has passed, so it did not expire";
    if (lost.expiry_source == SessionExpirySource::kDeclared)
      causes += " (unless the broker keeps sessions for less than the declared " +
                duration(lost.session_expiry_ms) + ")";
    causes += ": the broker restarted without persistence, or " + takeover;
  } else {
    causes =
        "the session expiry ran out while the client was offline, the broker restarted "
        "without persistence, or " +
        takeover;
  }
  return "SESSION LOST: broker " + broker_uri + " has no session for client '" +
         printable(client_id) + "', but the inbox recorded one holding topic filter(s) " + filters +
         " (" + since + "; session expiry " + expiry +
         "). Messages published to those filters while the client was away, and any it had "
         "not acknowledged, are lost: no redelivery will bring them. Likely causes: " +
         causes + ". Subscribing again.";
}

SessionKeeper::SessionKeeper(std::string client_id, std::vector<SessionRecords*> records,
                             std::vector<std::string> configured, int64_t expiry_ms,
                             SessionExpirySource source, std::shared_ptr<spdlog::logger> log)
    : client_id_(std::move(client_id)),
      records_(std::move(records)),
      configured_(configured.begin(), configured.end()),
      expiry_ms_(expiry_ms),
      source_(source),
      log_(std::move(log)) {}

Status SessionKeeper::before_connect() {
  if (!loaded_) {
    held_.clear();
    records_agree_ = true;
    recorded_expiry_ms_ = -1;
    bool first = true, missing = false;
    for (SessionRecords* records : records_) {
      SessionRecord r;
      const Status s = records->load(client_id_, &r);
      if (s.code() == Status::Code::kNotFound) {
        missing = true;
        continue;
      }
      if (!s.ok()) return s;
      const std::set<std::string> filters(r.topic_filters.begin(), r.topic_filters.end());
      held_.insert(filters.begin(), filters.end());
      seen_at_ms_ = std::max(seen_at_ms_, r.updated_at_ms);
      if (first) {
        recorded_ = filters;
        recorded_expiry_ms_ = r.session_expiry_ms;
        recorded_source_ = r.expiry_source;
        first = false;
      } else if (filters != recorded_ || r.session_expiry_ms != recorded_expiry_ms_) {
        records_agree_ = false;
        recorded_expiry_ms_ = std::max(recorded_expiry_ms_, r.session_expiry_ms);
      }
    }
    if (missing) records_agree_ = false;
    loaded_ = true;
  }
  // The session the broker had until this CONNECT, for after_connack() should it be gone.
  lost_expiry_ms_ = recorded_expiry_ms_ >= 0 ? recorded_expiry_ms_ : expiry_ms_;
  lost_source_ = recorded_expiry_ms_ >= 0 ? recorded_source_ : source_;
  // Until this CONNECT is answered the broker keeps the session it had (the recorded
  // expiry); from then on the one asked for. Record the longer of the two meanwhile.
  const int64_t need = std::max(expiry_ms_, recorded_expiry_ms_);
  if (records_agree_ && recorded_expiry_ms_ == need) return Status::Ok();
  return write(need, need == expiry_ms_ ? source_ : recorded_source_, "before connecting");
}

std::optional<SessionKeeper::LostSession> SessionKeeper::after_connack(bool session_present,
                                                                       const int64_t* granted_ms) {
  std::optional<LostSession> lost;
  if (!session_present && !held_.empty()) {
    // The records say the broker held a session with these filters; it has none now.
    lost = LostSession{std::vector<std::string>(held_.begin(), held_.end()), seen_at_ms_,
                       lost_expiry_ms_, lost_source_};
    for (SessionRecords* records : records_) records->note_lost(client_id_);
  }
  if (!session_present) held_.clear();  // a new session holds no subscription yet
  // Wall clock, as updated_at: only to say when the broker last held the session.
  seen_at_ms_ = Clock::system()->wall_ms();
  connected_since_save_ = true;
  const int64_t effective = granted_ms ? *granted_ms : expiry_ms_;
  const SessionExpirySource source = granted_ms ? SessionExpirySource::kGranted : source_;
  if (effective == recorded_expiry_ms_ && source == recorded_source_ && held_ == recorded_)
    return lost;
  if (granted_ms && *granted_ms != expiry_ms_)
    log_->warn(
        "broker set the session expiry of client '{}' to {} s instead of the {} s "
        "asked for; the retention check uses the broker's",
        printable(client_id_), *granted_ms / 1000, expiry_ms_ / 1000);
  const Status s = write(effective, source, "after CONNACK");
  if (!s.ok())
    log_->error(
        "cannot record the session of client '{}' after CONNACK ({}); the inbox "
        "keeps the previous record and the next connection tries again",
        printable(client_id_), s.to_string());
  return lost;
}

SessionKeeper::Plan SessionKeeper::plan(bool mqtt5) const {
  Plan p;
  for (const std::string& f : held_)
    if (!configured_.count(f)) p.unsubscribe.push_back(f);
  p.subscribe = mqtt5 || held_ != configured_;
  // A shared subscription is subscribed again on every connection, also with MQTT 3.1.1:
  // mosquitto 2.0 keeps a durable session over its restart but not the session's
  // $share subscriptions (docs/brokers-and-tls.md#shared-subscriptions, measured), so a
  // session that "holds" one may not, and nothing published reaches the group until a
  // member subscribes again. The cost: mosquitto resends the retained messages to it
  // (measured; MQTT 3.1.1, and MQTT 5 for a subscription it forgot), which reach the
  // consumer with RETAIN set, for ConsumerOptions::retained (skipped by default).
  for (const std::string& f : configured_)
    if (f.rfind("$share/", 0) == 0) p.subscribe = true;
  return p;
}

void SessionKeeper::unsubscribed(const std::string& filter) { held_.erase(filter); }
void SessionKeeper::subscribed(const std::string& filter) { held_.insert(filter); }

void SessionKeeper::save() {
  // Nothing changed, but a CONNACK came since the last write: record it anyway, so that
  // updated_at says when the broker last held the session (LostSession::seen_at_ms).
  const bool unchanged = held_ == recorded_ && records_agree_;
  if (unchanged && !connected_since_save_) return;
  const Status s = write(recorded_expiry_ms_, recorded_source_,
                         unchanged ? "at connection" : "after (un)subscribing");
  if (!s.ok())
    log_->error(
        "cannot record the topic filters of client '{}' ({}); the next connection "
        "tries again",
        printable(client_id_), s.to_string());
}

Status SessionKeeper::write(int64_t expiry_ms, SessionExpirySource source, const char* when) {
  SessionRecord r;
  r.client_id = client_id_;
  r.topic_filters.assign(held_.begin(), held_.end());
  r.session_expiry_ms = expiry_ms;
  r.expiry_source = source;
  for (SessionRecords* records : records_)
    if (Status s = records->record(r); !s.ok()) return s;
  const bool changed = !records_agree_ || held_ != recorded_ || expiry_ms != recorded_expiry_ms_ ||
                       source != recorded_source_;
  recorded_ = held_;
  recorded_expiry_ms_ = expiry_ms;
  recorded_source_ = source;
  records_agree_ = true;
  connected_since_save_ = false;
  log_->log(changed ? spdlog::level::info : spdlog::level::debug,
            "recorded the session of client '{}' {}: expiry {} s ({}), topic filters {}",
            printable(client_id_), when, expiry_ms / 1000, to_string(source), list(held_));
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

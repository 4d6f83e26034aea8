// The subscriber's session record: see subscriber_session.h.
#include "subscriber_session.h"

#include <algorithm>

#include "log.h"

namespace mqtt_inbox::detail {

namespace {

std::string list(const std::set<std::string>& filters) {
  std::string out;
  for (const std::string& f : filters) out += (out.empty() ? "'" : ", '") + printable(f) + "'";
  return out.empty() ? "none" : out;
}

}  // namespace

SessionKeeper::SessionKeeper(std::string client_id, std::vector<Inbox*> inboxes,
                             std::vector<std::string> configured, int64_t expiry_ms,
                             SessionExpirySource source, std::shared_ptr<spdlog::logger> log)
    : client_id_(std::move(client_id)),
      inboxes_(std::move(inboxes)),
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
    for (Inbox* inbox : inboxes_) {
      SessionRecord r;
      const Status s = inbox->load_session(client_id_, &r);
      if (s.code() == Status::Code::kNotFound) {
        missing = true;
        continue;
      }
      if (!s.ok()) return s;
      const std::set<std::string> filters(r.topic_filters.begin(), r.topic_filters.end());
      held_.insert(filters.begin(), filters.end());
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
  // Until this CONNECT is answered the broker keeps the session it had (the recorded
  // expiry); from then on the one asked for. Record the longer of the two meanwhile.
  const int64_t need = std::max(expiry_ms_, recorded_expiry_ms_);
  if (records_agree_ && recorded_expiry_ms_ == need) return Status::Ok();
  return write(need, need == expiry_ms_ ? source_ : recorded_source_, "before connecting");
}

void SessionKeeper::after_connack(bool session_present, const int64_t* granted_ms) {
  if (!session_present) held_.clear();  // a new session holds no subscription yet
  const int64_t effective = granted_ms ? *granted_ms : expiry_ms_;
  const SessionExpirySource source = granted_ms ? SessionExpirySource::kGranted : source_;
  if (effective == recorded_expiry_ms_ && source == recorded_source_ && held_ == recorded_)
    return;
  if (granted_ms && *granted_ms != expiry_ms_)
    log_->warn("broker set the session expiry of client '{}' to {} s instead of the {} s "
               "asked for; the retention check uses the broker's",
               printable(client_id_), *granted_ms / 1000, expiry_ms_ / 1000);
  const Status s = write(effective, source, "after CONNACK");
  if (!s.ok())
    log_->error("cannot record the session of client '{}' after CONNACK ({}); the inbox "
                "keeps the previous record and the next connection tries again",
                printable(client_id_), s.to_string());
}

SessionKeeper::Plan SessionKeeper::plan(bool mqtt5) const {
  Plan p;
  for (const std::string& f : held_)
    if (!configured_.count(f)) p.unsubscribe.push_back(f);
  p.subscribe = mqtt5 || held_ != configured_;
  return p;
}

void SessionKeeper::unsubscribed(const std::string& filter) { held_.erase(filter); }
void SessionKeeper::subscribed(const std::string& filter) { held_.insert(filter); }

void SessionKeeper::save() {
  if (held_ == recorded_ && records_agree_) return;
  const Status s = write(recorded_expiry_ms_, recorded_source_, "after (un)subscribing");
  if (!s.ok())
    log_->error("cannot record the topic filters of client '{}' ({}); the next connection "
                "tries again",
                printable(client_id_), s.to_string());
}

Status SessionKeeper::write(int64_t expiry_ms, SessionExpirySource source, const char* when) {
  SessionRecord r;
  r.client_id = client_id_;
  r.topic_filters.assign(held_.begin(), held_.end());
  r.session_expiry_ms = expiry_ms;
  r.expiry_source = source;
  for (Inbox* inbox : inboxes_)
    if (Status s = inbox->record_session(r); !s.ok()) return s;
  recorded_ = held_;
  recorded_expiry_ms_ = expiry_ms;
  recorded_source_ = source;
  records_agree_ = true;
  log_->info("recorded the session of client '{}' {}: expiry {} s ({}), topic filters {}",
             printable(client_id_), when, expiry_ms / 1000, to_string(source), list(held_));
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

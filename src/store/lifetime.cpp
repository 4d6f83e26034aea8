// A message's lifetime (store/lifetime.h): its expiry and the dependency schedule.
#include "store/lifetime.h"

#include <algorithm>

namespace mqtt_inbox::detail {

std::optional<Expiry> expiry_of(const Message& m, ExpiredPolicy policy, int64_t now) {
  if (policy == ExpiredPolicy::kApply || !m.message_expiry_interval_s) return std::nullopt;
  Expiry e;
  e.received_at = now;
  e.interval_s = *m.message_expiry_interval_s;
  return e;
}

std::string expired_text(const Expiry& e, int64_t now, const char* where) {
  return "message expiry interval " + std::to_string(e.interval_s) +
         " s ran out before it could be applied: waited " +
         std::to_string(std::max<int64_t>(0, now - e.received_at)) + " ms since it was received (" +
         where + ")";
}

int64_t not_yet_delay_ms(const ConsumerOptions& o, int runs, int64_t since, int64_t now) {
  const int64_t end = since + o.dependency_wait_max.count();
  if (now >= end) return -1;
  int64_t delay;
  if (runs <= o.dependency_immediate_attempts) {
    // The immediate runs, at the pace of a failed attempt's retries.
    delay = o.retry_backoff_initial.count();
    for (int i = 1; i < runs && delay < o.retry_backoff_max.count(); ++i) delay *= 2;
    delay = std::min<int64_t>(delay, o.retry_backoff_max.count());
  } else {
    delay = o.dependency_backoff_initial.count();
    for (int i = o.dependency_immediate_attempts + 1;
         i < runs && delay < o.dependency_backoff_max.count(); ++i)
      delay *= 2;
    delay = std::min<int64_t>(delay, o.dependency_backoff_max.count());
  }
  // The last run comes when the wait is over, not after it.
  return std::min(delay, end - now);
}

std::string duration_text(int64_t ms) {
  return ms < 10000 ? std::to_string(ms) + " ms" : std::to_string(ms / 1000) + " s";
}

std::string dependency_unavailable_text(int runs, int64_t waited_ms, const std::string& last) {
  return "the handler said \"not yet\" on " + std::to_string(runs) + " run(s) over " +
         duration_text(waited_ms) + " (the dependency schedule is over); last: " + last;
}

Status check_lifetime_options(const ConsumerOptions& o) {
  if (o.expired != ExpiredPolicy::kDeadLetter && o.expired != ExpiredPolicy::kApply)
    return Status::InvalidArgument("expired must be ExpiredPolicy::kDeadLetter or kApply");
  if (o.dependency_immediate_attempts < 0 || o.dependency_backoff_initial.count() < 1 ||
      o.dependency_backoff_max < o.dependency_backoff_initial || o.dependency_wait_max.count() < 0)
    return Status::InvalidArgument(
        "dependency schedule: need dependency_immediate_attempts >= 0, 1 ms <= "
        "dependency_backoff_initial <= dependency_backoff_max, dependency_wait_max >= 0");
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

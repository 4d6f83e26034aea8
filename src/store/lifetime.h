// Internal: a message's lifetime, the two rules written once above every store for the
// Consumer's claim transaction (store/claims.cpp, inbox/consumer.cpp) and store-then-process's
// workers (stp/): when a message's MQTT 5 message expiry has run out
// (ConsumerOptions::expired), and when a message whose handler keeps saying "not yet"
// (RetryLater) is run again or given up (ConsumerOptions::dependency_*).
//
// Every time here is on the store's retention clock (Store::retention_clock(), ms): it
// advances only with the monotonic clock and never goes back, so no wall-clock step
// expires a message early or keeps it alive, and across a restart only running time
// counts (docs/operations.md#clock-safety). A store-then-process row keeps its deadline
// and its wait on that clock, so both survive the row's claims and the process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// A message's MQTT 5 message expiry, from when the library received it.
struct Expiry {
  int64_t received_at = 0;  // retention clock when the library received the message
  int64_t interval_s = 0;   // the message expiry interval it arrived with, s
  int64_t expires_at() const { return received_at + interval_s * 1000; }
  // Strictly more time has passed than the interval: a message whose interval is 0 (the
  // broker forwarded it in its last second) is applied only if that takes no time at all.
  bool ran_out(int64_t now) const { return now > expires_at(); }
};

// The expiry `m` carries when received at `now` (retention clock), or none: no Message
// Expiry Interval (MQTT 3.1.1 has none), or `policy` kApply.
std::optional<Expiry> expiry_of(const Message& m, ExpiredPolicy policy, int64_t now);

// The dead letter's text for `e` found run out at `now`: "message expiry interval 5 s ran
// out before it could be applied: waited 7412 ms since it was received (<where>)".
std::string expired_text(const Expiry& e, int64_t now, const char* where);

// The dependency schedule. `runs`: the consecutive runs that said "not yet" so far (>= 1),
// the first of them at `since`; `now`. Returns how long to wait before the next run, ms,
// or -1 when the schedule is over (dependency_wait_max has passed since `since`): the
// message is then the dead letter dependency_unavailable.
int64_t not_yet_delay_ms(const ConsumerOptions& o, int runs, int64_t since, int64_t now);

// The dead letter's text when the schedule is over.
std::string dependency_unavailable_text(int runs, int64_t waited_ms, const std::string& last);

// A duration for people: "412 ms" below 10 s, else "42 s".
std::string duration_text(int64_t ms);

// kInvalidArgument for expired and dependency_* values outside their ranges (options.h).
Status check_lifetime_options(const ConsumerOptions& o);

}  // namespace mqtt_inbox::detail

// Internal (MQTT layer): finds the outbox row that ends the relay's connection every time
// it is published, so that it alone becomes a dead letter (connection_dropped) and the
// rows behind it flow. On MQTT 3.1.1 a broker cannot announce its packet size limit:
// mosquitto closes the connection of a client that sends a larger PUBLISH ("disconnected
// due to oversize packet"), every publish in flight with it fails, and after every
// reconnect the relay would send that row first again (relay.h, kConnectionDropsBeforeDeadLetter).
// Pure: the relay passes what it saw; tested in relay_drops_test.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace mqtt_inbox::detail {

// The row a connection's end is blamed on, or nullopt. The connection ended at `ended_at`
// with `oldest_seq` the oldest publish without PUBACK (if any: `in_flight`), published at
// `oldest_published_at`; `last_puback_at` is the last PUBACK of that connection (a
// default time_point if none). The row is blamed only if the connection ended soon after
// it was published (within `window`) and no PUBACK arrived on it since: a broker that
// closes the connection as it reads a packet acknowledges nothing after it, while a
// connection that carried PUBACKs after the row, or lasted long, ended for another reason
// (a broker restart, a network outage found by the keep-alive).
template <typename TimePoint, typename Duration>
std::optional<int64_t> drop_culprit(bool in_flight, int64_t oldest_seq,
                                    TimePoint oldest_published_at, TimePoint last_puback_at,
                                    TimePoint ended_at, Duration window) {
  if (!in_flight) return std::nullopt;
  if (last_puback_at >= oldest_published_at) return std::nullopt;
  if (ended_at - oldest_published_at > window) return std::nullopt;
  return oldest_seq;
}

// Counts consecutive connection ends blamed on the same row.
class DropTracker {
 public:
  explicit DropTracker(int limit) : limit_(limit) {}

  // A connection that was up has ended, blamed on `culprit` (drop_culprit). Returns the
  // row to make a dead letter once the same row was blamed `limit` times in a row (and
  // starts counting afresh); else nullopt. A connection end blamed on no row, or on
  // another row, starts the count again: only consecutive drops count. Failed connection
  // attempts in between are not connection ends and change nothing.
  std::optional<int64_t> connection_ended(std::optional<int64_t> culprit) {
    if (!culprit) {
      count_ = 0;
      return std::nullopt;
    }
    if (count_ == 0 || *culprit != suspect_) {
      suspect_ = *culprit;
      count_ = 0;
    }
    if (++count_ < limit_) return std::nullopt;
    count_ = 0;
    return suspect_;
  }

  // How many consecutive ends were blamed on suspect() (0: none).
  int count() const { return count_; }
  int64_t suspect() const { return suspect_; }

 private:
  int limit_;
  int count_ = 0;
  int64_t suspect_ = 0;
};

}  // namespace mqtt_inbox::detail

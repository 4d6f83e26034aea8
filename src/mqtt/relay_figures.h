// Internal (MQTT layer): the outbox relay's figures that are more than one counter:
// publish-to-PUBACK and commit-to-PUBACK latency (percentiles over the last
// kLatencySamples PUBACKs; sum and count of the first over all), PUBACKs by reason code, and the
// time spent without a connection since start(). The Relay feeds it from its thread and from Paho's
// callback thread; counters() reads it from any. Its own mutex, held for a few instructions, never
// while calling anything else.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "mqtt_inbox/relay.h"

namespace mqtt_inbox::detail {

class RelayFigures {
 public:
  using Clock = std::chrono::steady_clock;
  // PUBACKs the latency percentiles are taken over: the most recent ones.
  static constexpr size_t kLatencySamples = 1024;

  // The offline clock runs from start() until the first connection, and between a lost
  // connection and the next; stop() stops it.
  void started(Clock::time_point now);
  void connected(Clock::time_point now);
  void disconnected(Clock::time_point now);
  void stopped(Clock::time_point now);
  // A PUBACK with `reason_code` (MQTT 5.0 section 3.4.2.1; 0 on MQTT 3.1.1), `latency`
  // after its publish was handed to Paho and `since_enqueue` after its row was enqueued.
  void acked(int reason_code, Clock::duration latency, Clock::duration since_enqueue);

  // Fills the latency, reason-code and offline fields of *c.
  void fill(RelayCounters* c, Clock::time_point now) const;

 private:
  mutable std::mutex mu_;
  struct Sample {
    int64_t puback_us;  // publish to PUBACK
    int64_t commit_us;  // enqueue (in the committed transaction) to PUBACK
  };
  std::vector<Sample> latency_us_;  // ring of the last kLatencySamples
  size_t next_ = 0;
  int64_t latency_count_ = 0;
  int64_t latency_sum_us_ = 0;
  std::map<int, int64_t> by_reason_;
  enum class State { kStopped, kOffline, kOnline };
  State state_ = State::kStopped;  // kOffline: the offline clock runs
  Clock::time_point offline_since_{};
  Clock::duration offline_{};
};

}  // namespace mqtt_inbox::detail

// Clock: the one source of time for the library, injectable through the options so tests
// can move time (leveldb's Env idea, reduced to what the inbox needs).
//
// Thread safety: implementations must be safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace mqtt_inbox {

class Clock {
 public:
  virtual ~Clock();
  // Wall-clock Unix time in ms (UTC). May jump: gateways boot at 1970 and step forward
  // when NTP syncs, and operators set clocks back.
  virtual int64_t wall_ms() = 0;
  // Monotonic ms since an arbitrary origin; never goes back within one process.
  virtual int64_t steady_ms() = 0;
  // Blocks the calling thread for about `ms`. Used for retry backoff and the pruner's
  // pause between batches.
  virtual void sleep_ms(int64_t ms) = 0;

  // The process-wide system clock (std::chrono::system_clock / steady_clock).
  static Clock* system();
};

}  // namespace mqtt_inbox

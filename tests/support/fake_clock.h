// Test support: time under the test's control. sleep_ms() advances it, so backoff costs
// no real time; advance() moves the wall and steady clocks together.
#pragma once

#include <atomic>
#include <cstdint>

#include "mqtt_inbox/clock.h"

namespace mqtt_inbox::test {

class FakeClock final : public Clock {
 public:
  std::atomic<int64_t> wall{1'700'000'000'000}, steady{1'000};
  int64_t wall_ms() override { return wall.load(); }
  int64_t steady_ms() override { return steady.load(); }
  void sleep_ms(int64_t ms) override { advance(ms); }
  void advance(int64_t ms) {
    wall += ms;
    steady += ms;
  }
};

}  // namespace mqtt_inbox::test

#include "mqtt_inbox/clock.h"

#include <thread>

namespace mqtt_inbox {
namespace {

class SystemClock final : public Clock {
 public:
  int64_t wall_ms() override {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
  }
  int64_t steady_ms() override {
    using namespace std::chrono;
    return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
  }
  void sleep_ms(int64_t ms) override {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
};

}  // namespace

Clock* Clock::system() {
  static SystemClock clock;
  return &clock;
}

}  // namespace mqtt_inbox

// The Consumer's health source for the ServiceNotifier (service_notifier.h): what STATUS
// says about one consumer name. Reads only health() and counters(), which never wait for
// the store.
#include <string>

#include "mqtt_inbox/consumer.h"

namespace mqtt_inbox {

HealthSource health_source(const Consumer& consumer) {
  return [&consumer] {
    ServiceHealth h;
    h.name = consumer.name();
    const Health health = consumer.health();
    const ConsumerCounters c = consumer.counters();
    h.processed = c.processed;
    h.dead_letters = c.dead_lettered;
    h.stuck = health.stuck;
    if (health.stuck) h.stuck_reason = "store failed: " + health.last_error;
    h.stuck_for_ms = health.stuck_for_ms;
    // A message (or row) its handler holds for a dependency ("not yet"): shown, not stuck.
    h.dependency_wait = to_string(health.dependency);
    h.dependency_wait_ms = health.dependency.waiting ? health.dependency.waited_ms : 0;
    return h;
  };
}

}  // namespace mqtt_inbox

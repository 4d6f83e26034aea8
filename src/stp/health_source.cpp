// The StoreThenProcess's health source for the ServiceNotifier (service_notifier.h): what
// STATUS says about receipt and the workers of one consumer name. Reads only health() and
// counters(), which never wait for the store.
#include <string>

#include "mqtt_inbox/store_then_process.h"

namespace mqtt_inbox {

HealthSource health_source(const StoreThenProcess& store_then_process) {
  return [&store_then_process] {
    ServiceHealth h;
    h.name = store_then_process.name();
    const Health health = store_then_process.health();
    const StoreThenProcessCounters c = store_then_process.counters();
    h.processed = c.processed;
    h.dead_letters = c.dead_lettered;
    h.stuck = health.stuck;
    if (health.stuck) h.stuck_reason = "store failed at receipt: " + health.last_error;
    h.stuck_for_ms = health.stuck_for_ms;
    // A message (or row) its handler holds for a dependency ("not yet"): shown, not stuck.
    h.dependency_wait = to_string(health.dependency);
    h.dependency_wait_ms = health.dependency.waiting ? health.dependency.waited_ms : 0;
    if (c.worker_store_errors > 0)
      h.note = std::to_string(c.worker_store_errors) + " worker store errors";
    return h;
  };
}

}  // namespace mqtt_inbox

// The fleet member's health source for the ServiceNotifier (service_notifier.h): what
// STATUS says about the lease and the slots' connections. Reads only Fleet::health().
#include <string>

#include "mqtt_inbox/fleet.h"

namespace mqtt_inbox {

namespace {

std::string list(const std::vector<int>& v) {
  std::string out;
  for (int i : v) out += (out.empty() ? "" : ",") + std::to_string(i);
  return out.empty() ? "none" : out;
}

}  // namespace

HealthSource health_source(const Fleet& fleet) {
  return [&fleet] {
    ServiceHealth h;
    h.name = "fleet";
    const FleetHealth f = fleet.health();
    // Fresh as the member itself judges it (fleet.h): under half a lease since the last
    // successful renewal began.
    const bool fresh = f.renewed_ms_ago >= 0 && f.renewed_ms_ago < f.lease_ms / 2;
    // Every slot held is served and connected (one whose Subscriber does not start, say
    // for a client-id lock another process on this host holds, counts against it).
    const bool all_connected = f.connected == f.slots;
    h.connected = fresh && all_connected;
    // Stable while all is well (STATUS= changes only when something does): the slots and
    // the members; the lease's age and the reason only once it is stale.
    h.note = "slots " + list(f.slots) + " of " + std::to_string(f.slot_count) + ", " +
             std::to_string(f.members) + " member(s)";
    if (!fresh) {
      h.note += f.renewed_ms_ago < 0
                    ? std::string("; lease not held")
                    : "; lease not renewed for " + std::to_string(f.renewed_ms_ago / 1000) + " s";
      if (!f.last_error.empty()) h.note += ": " + f.last_error;
    } else if (!all_connected) {
      for (size_t i = 0; i < f.serving.size() && i < f.serving_health.size(); ++i) {
        const ConnectionHealth& s = f.serving_health[i];
        if (s.connected || s.last_error.empty()) continue;
        h.note += "; slot " + std::to_string(f.serving[i]) + ": " + s.last_error;
        break;
      }
    }
    return h;
  };
}

}  // namespace mqtt_inbox

// The Subscriber's and the Relay's health sources for the ServiceNotifier
// (service_notifier.h): the MQTT layer's side of what STATUS says about the connections.
// They read only health() and the counters, which never take Paho's lock.
#include "mqtt_inbox/relay.h"
#include "mqtt_inbox/service_notifier.h"
#include "mqtt_inbox/subscriber.h"

namespace mqtt_inbox {

HealthSource health_source(const Subscriber& subscriber) {
  return [&subscriber] {
    ServiceHealth h;
    h.name = "mqtt";
    const ConnectionHealth s = subscriber.health();
    h.connected = s.connected;
    // While disconnected, why the last attempt failed (TLS, refusal, network), so that
    // `systemctl status` shows what to fix; health() never holds a secret.
    if (!s.connected && !s.last_error.empty()) h.note = s.last_error;
    if (const int64_t lost = subscriber.sessions_lost(); lost > 0)
      h.note += std::string(h.note.empty() ? "" : "; ") + "broker lost the session " +
                std::to_string(lost) + " time(s): messages may have been missed";
    return h;
  };
}

HealthSource health_source(const Relay& relay) {
  return [&relay] {
    ServiceHealth h;
    h.name = "relay";
    const ConnectionHealth s = relay.health();
    h.connected = s.connected;
    if (!s.connected && !s.last_error.empty()) h.note = s.last_error;
    // Its effects are PUBACKed events; its dead letters the outbox rows it made dead.
    const RelayCounters c = relay.counters();
    h.processed = c.acked;
    h.dead_letters = c.rejected + c.expired + c.too_large + c.connection_dropped;
    return h;
  };
}

}  // namespace mqtt_inbox

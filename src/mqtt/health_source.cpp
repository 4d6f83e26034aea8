// The Subscriber's health source for the ServiceNotifier (service_notifier.h): the MQTT
// layer's side of what STATUS says about the connection. Reads only Subscriber::health()
// and its counters, which never take Paho's lock.
#include "mqtt_inbox/service_notifier.h"
#include "mqtt_inbox/subscriber.h"

namespace mqtt_inbox {

HealthSource health_source(const Subscriber& subscriber) {
  return [&subscriber] {
    ServiceHealth h;
    h.name = "mqtt";
    const SubscriberHealth s = subscriber.health();
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

}  // namespace mqtt_inbox

// The Subscriber's health source for the ServiceNotifier (service_notifier.h): the MQTT
// layer's side of what STATUS says about the connection. Reads only the Subscriber's
// lock-free status queries, never Paho's lock.
#include "mqtt_inbox/service_notifier.h"
#include "mqtt_inbox/subscriber.h"

namespace mqtt_inbox {

HealthSource health_source(const Subscriber& subscriber) {
  return [&subscriber] {
    ServiceHealth h;
    h.name = "mqtt";
    h.connected = subscriber.is_connected();
    if (const int64_t lost = subscriber.sessions_lost(); lost > 0)
      h.note = "broker lost the session " + std::to_string(lost) +
               " time(s): messages may have been missed";
    return h;
  };
}

}  // namespace mqtt_inbox

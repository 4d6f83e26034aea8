// Internal (MQTT layer): a Subscriber's connection lent to an outbox Relay, for brokers
// that allow one connection per device (Azure IoT Hub) or sites that want one. The
// Subscriber keeps owning the connection (connect, reconnect with backoff, session, TLS,
// client-id lock, and a new Paho client at each reconnect once lent); the Relay is told
// when it is up and down and publishes on the Subscriber's Paho client meanwhile.
#pragma once

#include <mqtt/async_client.h>

#include <memory>

#include "mqtt_inbox/status.h"
#include "mqtt_inbox/subscriber.h"

namespace mqtt_inbox::detail {

// Implemented by the Relay. Called with the Subscriber's mutex held, so that nothing is
// called after detach() returns: keep each call to a few instructions under a mutex of
// your own, never call the Subscriber or Paho from it.
class ConnectionWatcher {
 public:
  virtual ~ConnectionWatcher() = default;
  // The Subscriber is connected and subscribed; `connack` holds the CONNACK's MQTT 5
  // properties (Receive Maximum, Maximum Packet Size). On the Subscriber's supervisor
  // thread, or in attach() when it is connected already.
  virtual void connection_up(const mqtt::properties& connack) = 0;
  // The connection is gone (lost, closed by the broker, or stop()); on the supervisor
  // thread.
  virtual void connection_down() = 0;
};

struct SubscriberConnection {
  // Lends `subscriber`'s connection to `watcher` (one at a time). The Subscriber keeps a
  // reference to `watcher` until it is destroyed, after its Paho client: a PUBACK of a
  // publish made on its client may arrive after detach(), and must find the listener
  // alive. Errors: kInvalidArgument if another watcher is attached.
  static Status attach(Subscriber& subscriber, std::shared_ptr<ConnectionWatcher> watcher);
  // No more calls to the watcher after this returns.
  static void detach(Subscriber& subscriber, const ConnectionWatcher* watcher);
  // The Subscriber's Paho client of the moment. Once its connection has been lent, the
  // Subscriber makes a new one before each reconnect: after connection_down() and possibly
  // connected before connection_up(). So take the copy, then check that no
  // connection_down() came since the last connection_up(), then publish, and hold the
  // copy for that one publish. Publishing on an old client, or while not connected,
  // throws mqtt::exception. Never null. Takes the Subscriber's mutex: not from a watcher
  // call. The last copy's release destroys an old client, and Paho then calls the
  // on_failure of its pending publishes: release it under none of your mutexes.
  static std::shared_ptr<mqtt::async_client> client(Subscriber& subscriber);
  static MqttVersion version(const Subscriber& subscriber);
};

}  // namespace mqtt_inbox::detail

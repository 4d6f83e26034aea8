// Subscriber: the MQTT layer. Receives QoS 1 messages with Paho C++ (async_client) and
// hands each one to a Consumer inside Paho's synchronous message callback, so the
// PUBACK, which Paho sends when that callback returns, always follows the commit
// (docs/guarantees.md section 1). It never uses Paho's consumer queue: that
// acks before the message is stored. This layer holds no SQL.
//
// What it enforces (guarantees.md section 2):
//  - A persistent session: MQTT 3.1.1 with clean_session=false, MQTT 5 with
//    clean_start=false and a session expiry interval > 0. Anything else is refused:
//    without a session the broker forgets unacknowledged messages on reconnect.
//  - Consumers are attached before start(): the broker redelivers unacknowledged
//    messages right after CONNACK, before connect() completes or any SUBSCRIBE.
//  - Subscriptions are QoS 1 (MQTT 3.1.1 section 3.8.3.1).
//  - Reconnects are its own, with capped exponential backoff. When CONNACK reports no
//    session (session present = 0, MQTT 3.1.1 section 3.2.2.2) it subscribes again and,
//    on a reconnect, logs a warning that messages may have been missed.
//
// Thread safety: all methods are safe from any thread except that subscribe() must not
// race with start(). Status queries (is_connected, health) never take Paho's lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mqtt_inbox/message.h"
#include "mqtt_inbox/status.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox {

enum class MqttVersion { kV3_1_1, kV5 };

struct SubscriberOptions {
  // Broker address, e.g. "tcp://127.0.0.1:1883" or "ssl://broker:8883". Required.
  std::string broker_uri;
  // MQTT client id. Required, and stable across restarts: the broker keeps the session,
  // and with it the unacknowledged messages, under this id.
  std::string client_id;
  MqttVersion mqtt_version = MqttVersion::kV3_1_1;
  // Must stay false (MQTT 3.1.1 clean session / MQTT 5 clean start). true is refused.
  bool clean_session = false;
  // MQTT 5 session expiry interval in seconds (MQTT 5.0 section 3.1.2.11.2). Must be > 0;
  // 0xFFFFFFFF means the session never expires. Default 7 days. Size it to the longest
  // time a device may stay offline; the retention window must cover it. Ignored for
  // MQTT 3.1.1, where the broker's own setting (mosquitto: persistent_client_expiration)
  // applies.
  uint32_t session_expiry_s = 7 * 24 * 3600;
  // Keep-alive in seconds. Default 30. A handler or store wait longer than 1.5 times this
  // makes the broker drop the connection; the message is then redelivered, not lost.
  int keep_alive_s = 30;
  // Timeout of one connection attempt, ms. Default 10000.
  int connect_timeout_ms = 10000;
  // Reconnect backoff, ms: first wait, doubled each failure, capped. Defaults 500, 30000.
  int reconnect_backoff_initial_ms = 500;
  int reconnect_backoff_max_ms = 30000;
  // Credentials; empty means none.
  std::string username;
  std::string password;
  // Folder for the client-id lock: start() takes an exclusive flock(2) on
  // "<dir>/mqtt-inbox-client-<id>.lock", so a second process on this host with the same
  // client id fails with kBusy instead of taking the session over (the broker closes the
  // older connection whenever a client with the same id connects, MQTT 3.1.1 section
  // 3.1.4, and two such clients can push each other off forever). Default "auto", chosen
  // at start(): $RUNTIME_DIRECTORY (systemd sets it for a unit with RuntimeDirectory=; the
  // first folder if it lists several), else /run/mqtt-inbox if this process can write it,
  // else /tmp. Processes that pick different folders cannot see each other's lock, so run
  // a second instance beside a service as the service's user (README "Running as a
  // service"). "" disables the lock. A clean stop() (and the destructor after one)
  // removes the file; start() checks that the file it locked is still the one at the
  // path, so removing it can never let two processes hold the lock at once. After a
  // crash the file stays, unlocked, and the next start() takes it.
  std::string client_id_lock_dir = "auto";
  // A connection lost within this many ms of being made counts as unstable (for example
  // another client, on another host, using the same client id): reconnects then back
  // off exponentially up to reconnect_backoff_max_ms instead of reconnecting at once,
  // so two such clients do not storm the broker. Default 10000.
  int unstable_connection_ms = 10000;
  // How long stop() waits for a message that is in the callback, ms. Default 10000.
  int stop_timeout_ms = 10000;
  // Logger; default nullptr = the "mqtt_inbox" logger (see options.h).
  std::shared_ptr<spdlog::logger> logger;
};

class Subscriber {
 public:
  // Validates the options. Errors: kInvalidArgument with the reason, e.g. a clean session
  // or a session expiry of 0 ("would void redelivery").
  static Status create(const SubscriberOptions& options, std::unique_ptr<Subscriber>* out);

  // Stops (see stop()) if still running.
  ~Subscriber();

  // Routes messages matching `topic_filter` (MQTT wildcards + and #; a "$share/group/"
  // prefix is allowed) to `sink` (a Consumer, or a store-then-process receiver),
  // subscribed at QoS 1. One sink per filter; call before start(). A message matching
  // several filters goes to the first one added. `sink` must outlive the Subscriber.
  Status subscribe(const std::string& topic_filter, MessageSink* sink);

  // Takes the client-id lock, then starts connecting in the background and returns at
  // once; the device may boot before the network is up. Use wait_connected() to wait for
  // the first CONNACK. Errors: kBusy if another process holds the client-id lock.
  Status start();

  // True once connected and subscribed, or until `timeout_ms` elapsed.
  bool wait_connected(int timeout_ms);
  bool is_connected() const;

  // Disconnects and stops reconnecting. If a message is in the callback (for example the
  // store is failing), it waits up to stop_timeout_ms; if the message is still not
  // committed then, it returns kBusy and leaves Paho's client running so that the message
  // is never acked without a commit. The process should then exit: the broker redelivers
  // the message to the next run. (Destroying a Paho client whose callback is blocked would
  // hang, so the Subscriber then deliberately leaks it.)
  Status stop();

  // Messages received through the callback (all outcomes), this process.
  int64_t messages_received() const;
  // Connections established (first connect included) and those without a session.
  int64_t connects() const;
  int64_t sessions_lost() const;

 private:
  struct Impl;
  explicit Subscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// MQTT topic filter matching (MQTT 3.1.1 section 4.7): '+' one level, '#' the rest.
// Topics starting with '$' do not match filters starting with a wildcard.
bool topic_matches(const std::string& filter, const std::string& topic);

}  // namespace mqtt_inbox

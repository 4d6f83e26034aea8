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
//  - Its session is recorded in the Inbox behind each sink (session_record.h): the
//    session expiry, before each CONNECT that could lengthen it, so that the Pruner of
//    that Inbox refuses a retention window the session outlasts (retention.h); and the
//    topic filters the session holds, after each (UN)SUBSCRIBE. On each CONNACK with a
//    session present it UNSUBSCRIBEs recorded filters that are no longer configured (one
//    log line each): a persistent session keeps every subscription it was given.
//  - Retained messages are not resent by its reconnects (a broker resends them on every
//    SUBSCRIBE, MQTT 3.1.1 section 3.3.1.3): with MQTT 5 it subscribes with Retain
//    Handling 1 (only for a new subscription, MQTT 5.0 section 3.8.3.1); with MQTT 3.1.1
//    it does not SUBSCRIBE again while the session is present and holds exactly the
//    configured filters. What reaches a sink with RETAIN set is for
//    ConsumerOptions::retained to decide.
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
  // Session expiry in seconds. MQTT 5: sent as the Session Expiry Interval (MQTT 5.0
  // section 3.1.2.11.2); must be > 0; 0xFFFFFFFF means the session never expires.
  // MQTT 3.1.1: declared, not sent: the broker alone sets it (mosquitto:
  // persistent_client_expiration, which never expires by default), so declare here what
  // the broker is configured to keep. Either way it is recorded in the Inbox behind each
  // sink (Inbox::record_session) and the Pruner refuses a retention window shorter than
  // it plus its margin (retention.h): the one source of truth for how long ids must be
  // kept. Size it to the longest time a device may stay offline. Default 7 days.
  uint32_t session_expiry_s = 7 * 24 * 3600;
  // MQTT 5 Receive Maximum sent in CONNECT (MQTT 5.0 section 3.1.2.11.3): how many QoS 1
  // messages the broker sends before it waits for their PUBACKs. It bounds the in-flight
  // window, and with it the burst of redeliveries after a crash; the callback commits one
  // message at a time anyway, so a larger window buys little. 1..65535. Default 20.
  // Ignored for MQTT 3.1.1, where the broker's own limit applies (mosquitto:
  // max_inflight_messages, default 20).
  uint16_t receive_maximum = 20;
  // MQTT 5 Maximum Packet Size sent in CONNECT (MQTT 5.0 section 3.1.2.11.4), bytes;
  // 0 = not sent (no limit). It keeps a huge PUBLISH (100 MB) from being read into the
  // memory of a small device before ConsumerOptions::max_payload_bytes can refuse it.
  // The trade-off: the broker then discards a larger message for this client without
  // sending it (section 3.1.2.11.4), after acknowledging it to its publisher, so the
  // message is lost without a dead letter, and only the broker's log or metrics show it.
  // Without it the library receives the message and dead-letters it as
  // payload_too_large, and nothing is lost silently. Set it well above
  // max_payload_bytes plus topic and properties (a few KiB), or leave it 0. Ignored for
  // MQTT 3.1.1, which has no such field. Default 0.
  uint32_t maximum_packet_size = 0;
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
  // 3.1.4, and two such clients can push each other off forever). Default "/tmp";
  // "" disables the lock.
  std::string client_id_lock_dir = "/tmp";
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
  // several filters goes to the first one added. `sink` must outlive the Subscriber, and
  // so must its Inbox (MessageSink::inbox()), where the session is recorded. Errors:
  // kInvalidArgument for a null sink, a sink without an Inbox, an empty or repeated
  // filter, or a call after start().
  Status subscribe(const std::string& topic_filter, MessageSink* sink);

  // Takes the client-id lock, then starts connecting in the background and returns at
  // once; the device may boot before the network is up. Use wait_connected() to wait for
  // the first CONNACK. Each connection attempt first records the session expiry in the
  // sinks' Inboxes when it would lengthen the recorded one; while that record cannot be
  // written (the store fails), the attempt is not made and is retried with the backoff.
  // Errors: kBusy if another process holds the client-id lock.
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

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
//    session (session present = 0, MQTT 3.1.1 section 3.2.2.2) it subscribes again. If
//    the inbox recorded a session with topic filters for this client id (this process's
//    last connection, or an earlier run's: the session expired while the device was
//    off, the broker restarted without persistence, another client connected with this
//    client id and a clean session), the broker lost it: a warning ("SESSION LOST: ...",
//    journal priority 4) names the filters, when the broker last held the session and
//    its expiry, and the loss is counted in sessions_lost(), health() and the Inboxes'
//    InboxStats::sessions_lost (Prometheus mqtt_inbox_sessions_lost_total). A first
//    connection (no such record) is logged at info.
//  - TLS verifies the broker's certificate chain and host name unless an explicitly
//    insecure option says otherwise (tls.h). A refused CONNECT (bad user name or
//    password, not authorized, ...) is logged with its meaning, shown in health(), and
//    retried only after reconnect_backoff_max_ms: it will not fix itself sooner.
//  - A failed connection attempt is reported with a reason a person can act on, never
//    Paho's bare "TCP/TLS connect failure": OpenSSL's reason from Paho's SSL error
//    callback, and for failures Paho does not explain (host name mismatch, a broker that
//    wants a client certificate, nothing listening) the result of a TCP/TLS handshake of
//    the library's own, made with the same settings after the failure.
//  - Secrets (password, password_provider's output, tls.key_password) never appear in a
//    log line, in health(), or in a Status message.
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
//    configured filters. A shared subscription ("$share/...") is the exception: it is
//    subscribed again at every CONNACK, because mosquitto 2.0 restores a durable session
//    over its restart without its $share subscriptions (measured; until a member
//    subscribes again, what is published to the group is dropped: docs/fleet.md). What
//    reaches a sink with RETAIN set is for ConsumerOptions::retained to decide.
//
// Thread safety: all methods are safe from any thread except that subscribe() must not
// race with start(). Status queries (is_connected, health) never take Paho's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "mqtt_inbox/connection.h"  // ConnectionOptions, ConnectionHealth, MqttVersion
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/service_notifier.h"  // HealthSource
#include "mqtt_inbox/status.h"
#include "mqtt_inbox/tls.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox {

// The Subscriber's options: the connection (ConnectionOptions, connection.h: broker_uri,
// client_id, mqtt_version, keep_alive_s, connect_timeout_ms, reconnect backoff, username,
// password, password_provider, tls, client_id_lock_dir, logger) and the session's own
// settings below. For the Subscriber, client_id must be stable across restarts: the broker
// keeps the session, and with it the unacknowledged messages, under it. mqtt_version
// defaults to kV3_1_1 here.
struct SubscriberOptions : ConnectionOptions {
  // Must stay false (MQTT 3.1.1 clean session / MQTT 5 clean start). true is refused.
  bool clean_session = false;
  // Session expiry in seconds. MQTT 5: sent as the Session Expiry Interval (MQTT 5.0
  // section 3.1.2.11.2); must be > 0; 0xFFFFFFFF means the session never expires.
  // MQTT 3.1.1: declared, not sent: the broker alone sets it (mosquitto:
  // persistent_client_expiration, which never expires by default), so declare here what
  // the broker is configured to keep. Either way it is recorded in the Inbox behind each
  // sink (SessionRecords::record) and the Pruner refuses a retention window shorter than
  // it plus its margin (retention.h): the one source of truth for how long ids must be
  // kept. Size it to the longest time a device may stay offline. Default 7 days.
  uint32_t session_expiry_s = 7 * 24 * 3600;
  // MQTT 5 Receive Maximum sent in CONNECT (MQTT 5.0 section 3.1.2.11.3): how many QoS 1
  // messages the broker may send before it waits for their PUBACKs. A broker that keeps
  // it bounds the in-flight window, and with it the burst of redeliveries after a crash;
  // mosquitto 2.0.11 keeps it only at 1 (each PUBACK releases up to this many more while
  // messages wait: docs/brokers-and-tls.md#the-in-flight-window). Every redelivery is
  // still applied once, and the callback commits one message at a time, so a larger
  // window buys little. 1..65535. Default 20. Ignored for MQTT 3.1.1, where the broker's
  // own limit applies (mosquitto: max_inflight_messages, default 20, likewise kept only
  // at 1).
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
  // A connection lost within this many ms of being made counts as unstable (for example
  // another client, on another host, using the same client id): reconnects then back
  // off exponentially up to reconnect_backoff_max_ms instead of reconnecting at once,
  // so two such clients do not storm the broker. The warning names a takeover only when
  // the broker said so (MQTT 5 DISCONNECT reason code 0x8E); otherwise it gives the
  // reason code the broker sent, or says that none came (always on MQTT 3.1.1).
  // Default 10000.
  int unstable_connection_ms = 10000;
  // How long stop() waits for a message that is in the callback, ms. Default 10000.
  int stop_timeout_ms = 10000;
  // Asked on the Subscriber's own thread before each connection attempt, the first and
  // every reconnect; false: the attempt is not made, and it is asked again after
  // reconnect_backoff_initial_ms. For a client id this process may use only while it
  // holds a lease kept elsewhere (a Fleet's slot, fleet.h, sets it): without it, a
  // process whose lease passed to another would take the client id back from the new
  // holder at its next reconnect, and the broker would hand the session back and forth.
  // Must be cheap, must not block, and must not call into this Subscriber. Default:
  // empty (always connect).
  std::function<bool()> may_connect;
};

// The Subscriber's health() was SubscriberHealth until 0.4.0: deprecated, removed in 0.5.0.
using SubscriberHealth [[deprecated("use ConnectionHealth (connection.h)")]] = ConnectionHealth;

namespace detail {
struct SubscriberConnection;
}

class Subscriber {
 public:
  // Validates the options. Errors: kInvalidArgument with the reason, e.g. a clean session
  // or a session expiry of 0 ("would void redelivery"), a TLS setting or file refused by
  // check_tls_options() (the file named), a password without a user name on MQTT 3.1.1,
  // or both password and password_provider set.
  static Status create(const SubscriberOptions& options, std::unique_ptr<Subscriber>* out);

  // Stops (see stop()) if still running.
  ~Subscriber();

  // Routes messages matching `topic_filter` (MQTT wildcards + and #; a "$share/group/"
  // prefix is allowed) to `sink` (a Consumer, or a store-then-process receiver),
  // subscribed at QoS 1. One sink per filter; call before start(). A message matching
  // several filters goes to the first one added. `sink` must outlive the Subscriber, and
  // so must its session records (MessageSink::sessions(): its Inbox's), where the
  // session is recorded. Errors: kInvalidArgument for a null sink, a sink without session
  // records, a filter check_topic_filter() refuses (topic.h: empty, '+' or '#' not a
  // whole level, not UTF-8), a repeated filter, or a call after start().
  Status subscribe(const std::string& topic_filter, MessageSink* sink);

  // Takes the client-id lock, then starts connecting in the background and returns at
  // once; the device may boot before the network is up. Use wait_connected() to wait for
  // the first CONNACK. Each connection attempt first records the session expiry in the
  // sinks' Inboxes when it would lengthen the recorded one; while that record cannot be
  // written (the store fails), the attempt is not made and is retried with the backoff.
  // Errors: kBusy if another process holds the client-id lock.
  Status start();

  // Waits up to `timeout_ms` (ms; 0 or less: does not wait) until the subscriber is
  // connected and every filter is subscribed. Returns true at once if it already is.
  // Returns false when the timeout elapses first, or when stop() is called meanwhile, or
  // if start() was never called. false is not an error and stops nothing: the subscriber
  // keeps reconnecting in the background, and health() says why it is not connected
  // (last_failure, last_error). A connection that is lost later is not reported here
  // (is_connected(), health()). Thread-safe.
  bool wait_connected(int timeout_ms);
  bool is_connected() const;

  // Disconnects and stops reconnecting; a connection attempt in progress is let finish
  // first (see connect_timeout_ms). If a message is in the callback (for example the
  // store is failing), it waits up to stop_timeout_ms; if the message is still not
  // committed then, it returns kBusy and leaves Paho's client running so that the message
  // is never acked without a commit. The process should then exit: the broker redelivers
  // the message to the next run. Or call stop() again later: each call waits up to
  // stop_timeout_ms once more, and once the message has committed it finishes the stop
  // and returns OK (a Fleet does so for a slot it gives up). (Destroying a Paho client
  // whose callback is blocked would hang, so a Subscriber destroyed while stop() still
  // says kBusy deliberately leaks it.)
  Status stop();

  // The connection's state: connected or not since when, connection attempts, and the
  // last failure with its reason (TLS, refusal, network). Cheap, and safe from any
  // thread at any time (a small mutex of its own; never Paho's lock, never waits for a
  // connection attempt or a message in the callback).
  ConnectionHealth health() const;

  // Messages received through the callback (all outcomes), this process.
  int64_t messages_received() const;
  // Connections established (first connect included).
  int64_t connects() const;
  // Sessions the broker lost, this process: CONNACKs with session present = 0 although
  // the inbox recorded a session holding topic filters for this client id (see above).
  // A first connection is not counted.
  int64_t sessions_lost() const;

 private:
  friend struct detail::SubscriberConnection;  // lends the connection to a Relay (relay.h)
  struct Impl;
  explicit Subscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A ServiceNotifier source (service_notifier.h) for a Subscriber: connected from health();
// while disconnected, a note with the last failed attempt's reason (health().last_error:
// TLS, CONNACK refusal, network); a note when the broker lost the session. Keeps a
// reference: the subscriber must outlive the notifier.
HealthSource health_source(const Subscriber& subscriber);

// MQTT topic filter matching (MQTT 3.1.1 section 4.7): '+' one level, '#' the rest.
// Topics starting with '$' do not match filters starting with a wildcard.
bool topic_matches(const std::string& filter, const std::string& topic);

}  // namespace mqtt_inbox

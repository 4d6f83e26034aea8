// Relay: the MQTT layer of the transactional outbox (outbox.h). Publishes committed outbox
// rows at QoS 1 from a thread of its own and marks a row sent only after its PUBACK, so a
// crash anywhere means a resend with the same message id, never a loss. Holds no SQL: it
// reads and marks the Outbox's rows through the library's internal port of the Outbox
// given to create() (its relay turn, its read of pending rows, its marks and its wake-up
// on commit; src/outbox/relay_source.h).
//
// Design:
//  - Two kinds of connection, chosen by the create() used:
//      a Subscriber's (create(outbox, subscriber, options)): one connection per device,
//        which some brokers require (Azure IoT Hub) and every broker's connection limit
//        likes. The Subscriber keeps connecting, reconnecting and holding its session;
//        the relay publishes on it while it is up and starts over after its next CONNACK.
//        If the Subscriber's filters match the topics the relay publishes to, it
//        receives them too (No Local is not set). The MQTT version is the Subscriber's:
//        on MQTT 3.1.1 (SubscriberOptions' default) there is no "message-id" user
//        property and no PUBACK reason code, so create() logs a warning; use MQTT 5.
//        Once lent, the Subscriber makes its Paho client anew before every reconnect,
//        as the relay's own connection does: nothing Paho kept of the last connection's
//        publishes is sent again by Paho, and the relay's republish from the first pending
//        row, in enqueue order, on the one connection, keeps per-key order at any window,
//        whether or not the broker kept the session (tests/broker/relay_lent_test.cpp: 64 in
//        flight at a broker outage, session kept). Publishes made while disconnected
//        fail (send-while-disconnected is off) instead of waiting in Paho. (A reused
//        client was the cause of two faults found here: Paho C 1.3.12 resent its
//        in-flight publishes on the next connection, one of them malformed after a broker
//        restart with a full window, so mosquitto closed every reconnect; and, read in
//        Paho's source, with the session lost it would send its queued publishes ahead of
//        the relay's republish.)
//        (examples/ledger_consumer uses its own connection.)
//      its own (create(outbox, options)): a Paho client with client id
//        RelayOptions::client_id and a clean start (no session: the outbox table is its
//        only state), connected with the Subscriber's code and settings.
//    Either way, after every (re)connect the relay publishes all pending rows again from
//    the first, in enqueue order, with the same ids; the next hop's inbox drops what it
//    has already seen.
//  - Paho runs every client's callbacks on one process-wide thread, which the inbox's
//    commits hold while a message is processed (docs/guarantees.md sections 1 and 7). The
//    relay's callbacks only record an ack under a small mutex of its own and wake its
//    thread; every publish, every store access and every wait happens on that thread, so
//    the consumer's callback never waits for the relay. (The relay's publish() does wait
//    for Paho's lock while a consumer's callback commits: Paho holds it there.)
//  - The message id travels as the MQTT 5 user property "message-id" (what
//    MessageIdOptions reads by default). With MQTT 3.1.1 there are no properties: the
//    payload must carry the id (a JSON field the enqueuer wrote).
//  - In-flight window: at most min(max_inflight, the broker's Receive Maximum from CONNACK,
//    MQTT 5.0 section 3.2.2.3.3) publishes without PUBACK.
//  - Order: one connection, publishes in enqueue (seq) order and resends in the same order
//    after a reconnect, so rows of one ordering key reach the broker in FIFO order (MQTT 5.0
//    section 4.6; on a Subscriber's connection see above). Different keys share the window
//    and are published in parallel.
//  - Reads and marks: the relay reads pending rows (a read, no write lock) and writes only
//    its marks: PUBACKs are collected and marked sent in batches, one transaction each,
//    without fsync, once mark_batch of them wait or the first has waited mark_linger_ms
//    (a lost mark only causes a resend). It counts its publishes of each row in its
//    memory and adds them to the row's attempts in the transaction that marks it sent or
//    dead (OutboxRow::attempts says what is lost with a crash).
//  - Wake-up: a commit whose transaction enqueued a row wakes the relay after the commit
//    (with wake_on_commit), so the row goes out at once, on
//    every connection the library opened to the Inbox's file in this process: the
//    Inbox's (a handler's claim, a transaction in Inbox::with_connection or setup,
//    Outbox::replay_dead), a StoreThenProcess worker's, another Inbox's opened on the
//    same file. Rows committed on a connection the application opened itself, or by
//    another process (mqtt-inbox outbox replay), are found at the next poll
//    (poll_interval_ms) or after notify().
//  - The outcome of each publish (read in Paho C 1.3.12 and Paho C++ 1.2.0): a PUBACK
//    with a success code (0x00, 0x10 no matching subscribers) marks the row sent. Only an
//    MQTT 5 PUBACK with a reason code >= 0x80 (not authorized, topic name invalid, quota
//    exceeded, payload format invalid, ...; MQTT 5.0 section 3.4.2.1) is a refusal: the row
//    becomes an outbox dead letter (rejected_by_broker, with the code) and the stream goes
//    on. A publish that ended without a PUBACK (connection lost, client destroyed,
//    disconnect, a failed write; whatever reason code Paho reports with it, 255 for every
//    MQTT 3.1.1 failure) is published again after the rows before it. MQTT 3.1.1 has no
//    refusal: mosquitto acks a publish its ACL denies and drops it, so the row counts as
//    sent.
//  - Rows that can never be published become outbox dead letters, so they never block the
//    rows behind them:
//      expired: its MQTT 5 message expiry interval ran out while it waited in the outbox
//        (OutboxRow::waited_ms: the inbox's retention clock since the enqueue or the
//        replay, so an NTP step at boot expires nothing and time powered off does not
//        count; with either MQTT version). A row still in time is sent with what is left
//        of its expiry, as a server forwards it (MQTT 5.0 section 3.3.2.3.3). Not sent.
//      payload_too_large: its PUBLISH is larger than the Maximum Packet Size the broker
//        announced in CONNACK (MQTT 5.0 section 3.2.2.3.6; the client must not send it,
//        and mosquitto answers one with DISCONNECT 0x95, after which every reconnect would
//        resend it) or than RelayOptions::max_packet_size, the smaller. Not sent.
//      connection_dropped: the limit nobody stated. On MQTT 3.1.1 a broker cannot announce
//        its limit; mosquitto closes the connection of a client that sends a larger
//        PUBLISH, and every publish in flight fails with it. A row is blamed for the end
//        of a connection when it was the oldest publish without PUBACK, no PUBACK arrived
//        after it was sent, and the connection ended within kConnectionDropWindowMs of
//        its publish; blamed kConnectionDropsBeforeDeadLetter (3) times in a row, it alone
//        becomes a dead letter and the rows behind it are sent. A broker that dies right
//        after every reconnect three times in a row would cost the row at the head of the
//        queue the same way: replay it (Outbox::replay_dead, mqtt-inbox outbox replay).
//    Each is logged at warn and counted (counters(), the Prometheus textfile).
//  - What each MQTT version gives the relay:
//      behaviour                   MQTT 3.1.1 (the programs' default)   MQTT 5
//      message id to the next hop  in the payload only (a JSON field    user property
//                                  the enqueuer wrote)                  "message-id"
//      broker refuses a publish    not seen (acked and dropped: sent)   rejected_by_broker
//      publish without PUBACK      published again                      published again
//      packet size limit           max_packet_size, else found by       announced in CONNACK
//                                  dropped connections (3 in a row)     (or max_packet_size)
//      in-flight window            max_inflight                         also <= Receive Maximum
//      message expiry              expired rows dead; no expiry sent    expired rows dead; the
//                                                                       rest sent with what is left
//      wake-up on commit, per-key order, bounded stop: both versions alike.
//  - Reconnects back off exponentially, capped; nothing is ever dropped for having been
//    retried too often. A refused CONNECT (bad user name or password, not authorized,
//    ...) waits reconnect_backoff_max_ms at once, as the Subscriber's does.
//  - It connects exactly as the Subscriber does, with the same settings and the same code
//    (TLS, user name, password or password provider, client-id lock): TLS verifies the
//    broker's certificate chain and host name unless an INSECURE switch of tls.h says
//    otherwise (then a warning at every connect); a failed attempt is logged once with a
//    reason a person can act on (a CONNACK refusal by name and code, OpenSSL's reason, a
//    host name mismatch) and shown in health(). Secrets (password, the provider's output,
//    tls.key_password) never reach a log line, health(), counters() or a Status message.
//
// Thread safety: all methods are safe from any thread; start() and stop() must not race.
// Do not call stop() or destroy a Relay from a message handler or another Paho callback:
// the relay thread may be waiting in publish() for Paho's lock, which that callback holds,
// and stop() waits for it (up to stop_timeout_ms; the destructor without a limit).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "mqtt_inbox/connection.h"  // ConnectionOptions, ConnectionHealth
#include "mqtt_inbox/outbox.h"
#include "mqtt_inbox/service_notifier.h"  // HealthSource
#include "mqtt_inbox/status.h"
#include "mqtt_inbox/subscriber.h"  // Subscriber
#include "mqtt_inbox/tls.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox {

// A row is an outbox dead letter connection_dropped (OutboxDeadReason::kConnectionDropped)
// once the broker closed the relay's connection this many times in a row right after it
// was published: each time it was the oldest publish without PUBACK, no PUBACK arrived
// after it, and the connection ended within kConnectionDropWindowMs of its publish. See
// Design.
constexpr int kConnectionDropsBeforeDeadLetter = 3;
constexpr int kConnectionDropWindowMs = 5000;

// The relay's options: the connection of its own (ConnectionOptions, connection.h; the
// Subscriber's fields with the same meaning, checks and code) and the publishing settings
// below. With create(outbox, subscriber, options) the connection is the Subscriber's:
// leave broker_uri and client_id empty there (of the other connection fields only
// logger and the reconnect backoff are used; see that create()).
// For a connection of its own, client_id is required and must differ from every
// Subscriber's client id (the broker closes the older of two connections with one id; see
// client_id_lock_dir, which makes a second process relaying with the same id fail start()
// with kBusy on SQLite; on PostgreSQL, where relays take turns, the lock goes with the
// turn: a relay on the same host waits for it); the relay connects with a clean start, so no
// session is kept: the outbox table is its only state. mqtt_version defaults to kV5 here (PUBACK
// reason codes, user property "message-id").
struct RelayOptions : ConnectionOptions {
  // Sets mqtt_version to kV5. (Assigning a ConnectionOptions into a RelayOptions copies
  // its mqtt_version too, kV3_1_1 unless set.)
  RelayOptions() { mqtt_version = MqttVersion::kV5; }

  // Publishing.

  // Most publishes without PUBACK, further capped by the broker's Receive Maximum.
  // 1..65535. Default 64.
  int max_inflight = 64;
  // Most rows marked sent per transaction; as many PUBACKs waiting are marked at once.
  // Default 256.
  int mark_batch = 256;
  // Longest a PUBACK waits to be marked sent, ms (>= 0), so that the PUBACKs of a stream
  // or a burst share one transaction (each writes the pages of the outbox's table and
  // indexes to the WAL again). The marks are also written once mark_batch PUBACKs wait,
  // when the connection ends and at stop(); 0 = at once. A crash loses the marks not yet
  // written: those rows are published again with the same ids (the next hop drops them).
  // Until marked, a row counts as pending (Outbox::summary, the class bounds). Does not
  // delay any publish. Default 200.
  int mark_linger_ms = 200;
  // How often the relay looks for new rows when nothing woke it, ms. A commit that
  // enqueued on a connection the library opened wakes it at once (see notify()), so the
  // poll finds only rows committed on the application's own connections and by other
  // processes (the admin tool's replay). Default 1000.
  int poll_interval_ms = 1000;
  // The relay turn's lease, ms (docs/outbox.md#several-relays):
  // on PostgreSQL, where relays of one outbox may run in several processes (a fleet's
  // members, fleet.h), only the relay holding the turn connects and publishes; the others
  // stand by, disconnected, and one takes the turn about a lease after its holder died or
  // froze. The holder renews every lease / 5 and stops publishing half a lease after its
  // last renewal began. Ignored on SQLite. 1000..3600000. Default 10000.
  int turn_lease_ms = 10000;
  // Whether a commit that enqueued wakes the relay (see notify()). false: the relay finds
  // new rows at its poll only, so rows go out in bursts of up to poll_interval_ms (what
  // scripts/bench.sh compares the wake-up with). Default true.
  bool wake_on_commit = true;
  // Largest PUBLISH the relay sends, bytes (the whole packet, as MQTT 5.0 section
  // 3.2.2.3.6 counts it); 0 = no limit of its own. Used like the Maximum Packet Size an
  // MQTT 5 broker announces in CONNACK (the smaller of the two applies): a larger row
  // becomes an outbox dead letter payload_too_large before it is sent. Set it to the
  // broker's limit on MQTT 3.1.1, which cannot announce one (mosquitto max_packet_size).
  // >= 0. Default 0.
  int64_t max_packet_size = 0;
  // How long stop() waits for the relay thread, ms (>= 0). The thread may be inside a
  // store call (a locked or full store) or waiting for Paho's lock, which a message
  // callback waiting for the store holds; stop() does not wait longer than this. Default
  // 10000.
  int stop_timeout_ms = 10000;
  // If set, the relay thread writes prometheus_text(counters()) to this file every
  // metrics_period_ms and at stop(), atomically (a ".tmp" file renamed over it), for
  // node_exporter's textfile collector; a failed write is logged and tried again at the
  // next period. Use another file than the Pruner's PrunerOptions::prometheus_textfile
  // (both in the collector's folder, e.g. inbox.prom and relay.prom). Default "" (none).
  std::string prometheus_textfile;
  // ms, > 0. Default 10000.
  int metrics_period_ms = 10000;

  // Test hooks, called on the relay thread with the row's seq. after_publish: right after
  // publish() was handed the row (before its PUBACK can be marked). before_mark: with the
  // first row of a batch of PUBACKs about to be marked sent. Default empty.
  std::function<void(int64_t seq)> before_publish_hook;
  std::function<void(int64_t seq)> after_publish_hook;
  std::function<void(int64_t seq)> before_mark_hook;
};

// Counts of this Relay (this process). A snapshot; any thread.
struct RelayCounters {
  int64_t published = 0;            // publishes handed to Paho (resends included)
  int64_t acked = 0;                // PUBACKs with a success code
  int64_t rejected = 0;             // PUBACKs with a reason code >= 0x80 (rows made dead)
  int64_t connects = 0;             // connections made
  int64_t max_inflight_seen = 0;    // largest number of publishes without PUBACK seen
  int receive_maximum = 0;          // the broker's Receive Maximum at the last CONNACK (65535 if
                                    // none sent, as MQTT 5.0 section 3.2.2.3.3 says)
  int64_t maximum_packet_size = 0;  // the broker's Maximum Packet Size at the last CONNACK,
                                    // bytes; 0 = none announced (MQTT 3.1.1 never does)
  int64_t expired = 0;              // rows made dead because their expiry ran out (unsent)
  int64_t too_large = 0;            // rows made dead as larger than maximum_packet_size or
                                    // RelayOptions::max_packet_size (unsent)
  int64_t connection_dropped = 0;   // rows made dead for ending the connection (see Design)
  bool connected = false;           // has a connection to publish on now

  // PUBACKs by reason code (MQTT 5.0 section 3.4.2.1): 0x00 success, 0x10 no matching
  // subscribers (also a success), >= 0x80 a refusal (the row made dead, also in
  // `rejected`). MQTT 3.1.1 has no codes: every PUBACK counts as 0x00.
  std::map<int, int64_t> acks_by_reason;
  // Publish-to-PUBACK latency, ms: from the publish handed to Paho to its PUBACK, seen on
  // the relay's side (so it includes the wait for Paho's callback thread, which the
  // inbox's commits share, docs/guarantees.md section 1). p50/p99 are over the most recent
  // `puback_latency_samples` PUBACKs (at most 1024; nearest rank); 0 while there are none.
  // sum and count are over every PUBACK since start (a Prometheus summary's _sum, _count).
  double puback_latency_p50_ms = 0;
  double puback_latency_p99_ms = 0;
  int64_t puback_latency_samples = 0;
  double puback_latency_sum_ms = 0;
  int64_t puback_latency_count = 0;
  // Commit-to-PUBACK latency, ms: from the row's enqueue, inside the transaction whose
  // commit made it visible, to its PUBACK (so it also counts the rest of that transaction
  // and its commit, and the row's wait in the outbox: the relay's poll or wake-up, the
  // window, a reconnect). Over the same PUBACKs as puback_latency_p50/p99_ms; 0 while
  // there are none. Measured on the inbox's retention clock and the monotonic clock, so a
  // wall-clock step does not change it; the retention clock counts whole milliseconds, so
  // a figure under 1 ms may be up to 1 ms short.
  double commit_to_puback_p50_ms = 0;
  double commit_to_puback_p99_ms = 0;
  // Time without a connection to publish on while started, ms (the current outage
  // included; time stopped does not count): how long the outbox could only fill.
  int64_t offline_ms = 0;
};

// The counters in the Prometheus text exposition format (0.0.4), every name prefixed
// mqtt_inbox_relay_: connected, connects_total, offline_seconds_total, published_total,
// pubacks_total{reason_code="0x00"}, dead_lettered_total{reason="expired"|
// "payload_too_large"|"rejected_by_broker"|"connection_dropped"}, puback_latency_seconds
// (a summary: quantile 0.5 and 0.99, _sum, _count), commit_to_puback_seconds (a gauge per
// quantile 0.5 and 0.99), inflight_max, receive_maximum. The outbox's depth, bytes,
// drops and oldest row are the Pruner's (stats.h: prometheus_text(InboxStats)).
std::string prometheus_text(const RelayCounters& counters);

class Relay {
 public:
  // A relay with a connection of its own. Validates the options. `outbox` is not owned
  // and must outlive the Relay.
  // Errors: kInvalidArgument with the reason: a null outbox or one that Outbox::create did
  // not make, a missing broker_uri or client_id, a URI
  // scheme or TLS setting or file refused by check_tls_options() (the file named), a
  // password without a user name on MQTT 3.1.1, both password and password_provider set,
  // a count or interval out of range.
  static Status create(Outbox* outbox, const RelayOptions& options, std::unique_ptr<Relay>* out);
  // A relay that publishes on `subscriber`'s connection (see Design; the subscriber then
  // makes its Paho client anew at each reconnect). Only the publishing fields of `options`
  // are used (max_inflight, mark_batch, mark_linger_ms, poll_interval_ms, wake_on_commit,
  // max_packet_size, stop_timeout_ms, logger, prometheus_textfile, metrics_period_ms, the
  // hooks; reconnect_backoff_* pace a start over after a publish failed on a live
  // connection);
  // the MQTT version is the subscriber's. `outbox` and `subscriber` are not owned; destroy
  // the Relay before the Subscriber. One relay per subscriber. Errors: kInvalidArgument
  // for a null outbox (or one that Outbox::create did not make) or subscriber, broker_uri
  // or client_id set (they are the
  // subscriber's), a count or interval out of range.
  static Status create(Outbox* outbox, Subscriber* subscriber, const RelayOptions& options,
                       std::unique_ptr<Relay>* out);
  // Stops if running (see stop(); after a kBusy it waits for the thread).
  ~Relay();

  // Starts the relay thread and returns at once. Its own connection: takes the client-id
  // lock first; the thread connects (retrying with backoff) and publishes. A subscriber's:
  // the thread publishes whenever the subscriber is connected (before or after its
  // start()). Errors: kInvalidArgument if already started, or if another Relay uses the
  // subscriber's connection; kBusy if another process holds the client-id lock (an
  // outbox whose relays take turns, on PostgreSQL, takes it with the turn, in the thread,
  // and waits while it is held).
  Status start();
  // Stops the thread; its own connection: disconnects and releases the client-id lock (a
  // subscriber's stays up). Unacknowledged rows stay pending for the next run. Waits at
  // most stop_timeout_ms: if the thread is still inside a store call then (a locked or
  // full store) or waiting for Paho's lock (which a message callback that waits for the
  // store holds), returns kBusy and leaves it running, with the client-id lock held. The
  // process should then exit (std::_Exit, as after Subscriber::stop's kBusy): nothing is
  // lost, the rows it had not marked are published again by the next run. Destroying
  // the Relay instead waits for the thread, as long as the store takes.
  Status stop();
  // Wakes the relay to look for new rows now. Not needed after a commit that enqueued on
  // a connection the library opened to the Inbox's file in this process (the Inbox's, a
  // StoreThenProcess worker's, another Inbox's): that commit wakes every running relay of
  // the file. Call it after a commit on a connection the application opened itself, or
  // the relay finds the row at its next poll (poll_interval_ms).
  void notify();

  // Whether the relay has a connection to publish on now.
  bool is_connected() const;
  RelayCounters counters() const;
  // The connection's state, as Subscriber::health() reports its own (`connected` here
  // means connected; there is no SUBSCRIBE): attempts, the last failure's kind and reason
  // (e.g. kTls "certificate verify failed: hostname mismatch ..."), the last CONNACK
  // refusal. Never holds a secret. Cheap; any thread. On a subscriber's connection: the
  // subscriber's health().
  ConnectionHealth health() const;

 private:
  struct Impl;
  explicit Relay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A ServiceNotifier source (service_notifier.h) for a Relay: name "relay", connected from
// health(); while disconnected, a note with the last failed attempt's reason (TLS, CONNACK
// refusal, network), so `systemctl status` shows why events are not leaving; processed =
// PUBACKed events and dead_letters = rows it made dead (counters()). Never stuck: a relay
// that cannot publish keeps its rows pending and holds no message. Keeps a reference: the
// relay must outlive the notifier.
HealthSource health_source(const Relay& relay);

}  // namespace mqtt_inbox

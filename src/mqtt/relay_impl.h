// Internal (MQTT layer): the outbox Relay's state (relay.h), shared by mqtt/relay.cpp (the
// connection, its own or a Subscriber's, the thread's loops and the public API) and
// mqtt/relay_publish.cpp (publishing within the window, PUBACKs, marks and figures). Fields
// shared with Paho's callback thread are under `mu`, held only for a few instructions,
// never while calling Paho or the store.
#pragma once

#include <mqtt/async_client.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mqtt/connect.h"
#include "mqtt/lent_connection.h"
#include "mqtt/relay_drops.h"
#include "mqtt/relay_figures.h"
#include "mqtt_inbox/relay.h"
#include "outbox/relay_source.h"

namespace mqtt_inbox {

struct Relay::Impl {
  using Clock = std::chrono::steady_clock;

  // What Paho and a lending Subscriber call: the PUBACK listener of every publish and the
  // connection watcher. Outlives the Impl when the connection is lent (the Subscriber
  // keeps it until its client is gone, see SubscriberConnection::attach): detach() clears
  // `relay` first, under the link's own mutex, and a late PUBACK then finds nothing.
  struct Link : mqtt::iaction_listener, detail::ConnectionWatcher {
    std::mutex mu;
    Impl* relay = nullptr;
    void on_success(const mqtt::token& tok) override { forward(tok, false); }
    void on_failure(const mqtt::token& tok) override { forward(tok, true); }
    void forward(const mqtt::token& tok, bool failed) {
      std::lock_guard<std::mutex> lock(mu);
      if (relay) relay->complete(tok, failed);
    }
    void connection_up(const mqtt::properties& connack) override {
      std::lock_guard<std::mutex> lock(mu);
      if (relay) relay->lent_connection_up(connack);
    }
    void connection_down() override {
      std::lock_guard<std::mutex> lock(mu);
      if (relay) relay->lent_connection_down();
    }
  };

  // The relay side of the Outbox given to create() (outbox/relay_source.h): not owned.
  detail::RelaySource* outbox = nullptr;
  Subscriber* lender = nullptr;  // the Subscriber whose connection this relay uses, if any
  RelayOptions options;
  detail::BrokerAddress address;  // parsed broker_uri
  std::shared_ptr<spdlog::logger> log;
  // health() and the reports of failed attempts; made before the client, whose SSL error
  // handler points at it.
  std::unique_ptr<detail::HealthRecorder> conn;
  // Paho's TLS settings and the connect options, built once and kept for the Relay's
  // lifetime: Paho C++ 1.2.0 copies them without re-pointing the C structs (its bug #337,
  // see to_paho_ssl_options, and the properties, see mqtt/subscriber.cpp).
  mqtt::ssl_options paho_ssl;
  mqtt::connect_options conn_opts;
  std::shared_ptr<mqtt::async_client> client;  // its own connection's (null when lent one)
  std::shared_ptr<Link> link = std::make_shared<Link>();
  detail::RelayFigures figures;
  Clock::time_point next_metrics{};
  int client_lock_fd = -1;  // start()'s, or with turns the thread's (run_own)
  bool lock_wait_logged = false;
  std::string client_lock_path;
  std::thread thread;

  // Shared with Paho's callback thread: held only for a few instructions, never while
  // calling Paho or the store.
  std::mutex mu;
  std::condition_variable wake;
  bool stopping = false;
  bool woken = false;
  bool lost = false;  // the connection dropped since the thread looked
  struct InFlight {
    int64_t seq;
    Clock::time_point published_at;
    Clock::time_point enqueued_at;  // the row's enqueue, on this clock (commit-to-PUBACK)
    bool failed = false;            // its token failed without a PUBACK (kept: see drop_culprit)
  };
  // Publish number -> row, current connection: publishes without PUBACK, and those whose
  // token failed without one (until the connection is started over).
  std::map<uint64_t, InFlight> inflight;
  std::vector<int64_t> acked;       // seqs PUBACKed, not yet marked
  Clock::time_point acked_since{};  // when the first of `acked` came (mark_linger_ms)
  // After a mark failed, not tried again before this unless forced (relay thread only).
  Clock::time_point marks_retry_at{};
  // The last fetch filled the window, so rows may be left behind it: each PUBACK then
  // wakes the thread to publish more. Otherwise new rows come with a wake-up or a poll,
  // and a PUBACK wakes the thread only when marks are due.
  bool more_pending = false;
  // Rows to make dead letters after the publish: refused by a PUBACK, or blamed for
  // ending the connection (DropTracker).
  struct Rejection {
    int64_t seq;
    OutboxDeadReason reason;
    int code;
    std::string text;
  };
  std::vector<Rejection> rejections;  // not yet marked dead
  bool resend = false;  // a publish failed without a PUBACK: start over from the first row
  // The current connection's last PUBACK, and when it was found lost (drop_culprit).
  Clock::time_point last_puback_at{};
  Clock::time_point lost_at{};
  // A lent connection (lender): up since its latest CONNACK, numbered, and that CONNACK.
  bool lent_up = false;
  uint64_t lent_epoch = 0;
  mqtt::properties lent_connack;
  // Publishes of each row not yet marked sent or dead, counted here and added to its
  // attempts with the mark (OutboxMark): the fetch reads, so it cannot count them. Kept
  // across reconnects; rows that left the pending state otherwise are dropped at the next
  // connection's first fetch. Relay thread only.
  std::map<int64_t, int> publishes;
  // Row `seq` with its publishes counted so far, to mark (relay thread).
  OutboxMark mark_of(int64_t seq) const {
    const auto it = publishes.find(seq);
    return OutboxMark{seq, it == publishes.end() ? 0 : it->second};
  }
  // Numbers the publishes of this Relay (relay thread only), never reused, so a callback
  // of a publish made on an earlier connection finds nothing in `inflight`.
  uint64_t pubno = 0;

  std::atomic<bool> connected{false};
  bool was_connected = false;  // health() shows a connection (relay thread only)
  std::atomic<int64_t> published{0}, acked_count{0}, rejected_count{0}, connects{0},
      max_inflight_seen{0};
  std::atomic<int> receive_maximum{0};
  // The broker's Maximum Packet Size from the last CONNACK, bytes; 0 = none announced.
  std::atomic<int64_t> maximum_packet_size{0};
  std::atomic<int64_t> expired_count{0}, too_large_count{0}, connection_dropped_count{0};
  // Rows blamed for ending the connection, consecutively (relay thread only).
  detail::DropTracker drops{kConnectionDropsBeforeDeadLetter};
  // The relay thread has returned (stop() waits for it up to stop_timeout_ms); under mu.
  bool finished = false;
  // The registration of notify() with the outbox's commits (RelaySource::add_commit_waker);
  // 0 = none.
  uint64_t commit_waker = 0;

  // --- Paho callbacks (through `link`): record and wake, nothing else (Paho's one
  // callback thread; a lender's calls come from its supervisor thread; and complete()
  // also from whichever thread destroys an old client of a lender: its supervisor, or
  // this relay's thread when its copy was the last, under no mutex of ours) ---

  void complete(const mqtt::token& tok, bool failed) noexcept;

  void on_connection_lost();

  void lent_connection_up(const mqtt::properties& connack);

  void lent_connection_down();

  // --- the relay thread ---

  // Waits up to `ms` or until woken. Returns false when stopping.
  bool sleep_for(int ms) {
    std::unique_lock<std::mutex> lock(mu);
    wake.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stopping || woken; });
    woken = false;
    return !stopping;
  }
  // Backoff: waits `ms` whatever wakes the thread (notify(), a late PUBACK), writing the
  // metrics textfile when due meanwhile. Returns false when stopping.
  bool pause_for(int ms);
  // The relay turn (RelaySource::renew_relay_turn): renews it when due; true while it is held
  // and less than half a lease has passed since the last renewal began. Relay thread only.
  bool hold_turn();
  // With relays that take turns, the client-id lock goes with the turn (relay.cpp).
  bool lock_client_id_with_turn();
  bool turn_held = false;
  bool turn_lost = false;  // publish_more gave up the connection: the turn went elsewhere
  bool turn_state_logged = false;
  std::chrono::steady_clock::time_point turn_valid_until{}, turn_renew_at{};
  bool is_stopping() {
    std::lock_guard<std::mutex> lock(mu);
    return stopping;
  }

  // A new Paho client. No client-side persistence: the outbox table is the only record of
  // what to send. Made again before every reconnect, so nothing Paho kept of an earlier
  // connection (queued or in-flight publishes counted against its window) survives: under
  // load a reused client was seen to stall after a broker restart. Paho refuses a publish
  // beyond its buffer (MQTTASYNC_MAX_BUFFERED_MESSAGES, default 100) even while
  // connected: sized to the window.
  void new_client();

  // One connection attempt, as the Subscriber makes its own (mqtt/connect.h). A failed
  // one is reported through `conn` (logged, health()); *refused: a CONNACK refusal.
  bool connect(bool* refused);

  // The broker's limits from a CONNACK's MQTT 5 properties.
  void read_connack(const mqtt::properties& connack);

  // The client to publish on: a lender's is made anew at each of its reconnects, so this
  // is a copy to hold for one publish, taken before checking `lost` (see publish_more;
  // relay thread only, never under mu).
  std::shared_ptr<mqtt::async_client> publisher() {
    return lender ? detail::SubscriberConnection::client(*lender) : client;
  }

  int window() const { return std::min(options.max_inflight, receive_maximum.load()); }

  // Marks collected PUBACKs sent when they are due (mark_batch of them wait, or the
  // first has waited mark_linger_ms) or `force`, and refused rows dead at once. On a store
  // error they are kept and tried again.
  void flush_marks(bool force);
  // How long the thread may sleep before its next look, ms: the poll, cut to when the
  // waiting PUBACKs are due to be marked and to the next metrics write.
  int next_wait_ms();

  // Publishes pending rows after `*last_seq` while the window has room. Returns false if
  // the connection must be made again.
  bool publish_more(int64_t* last_seq);

  void disconnect_quietly();

  // The row the end of the current connection is blamed on, if any (drop_culprit), from
  // `inflight` before it is cleared. blame_locked: with `mu` held.
  std::optional<int64_t> blame_locked();
  std::optional<int64_t> blame() {
    std::lock_guard<std::mutex> lock(mu);
    return blame_locked();
  }
  // After a connection that was up has ended (not at stop()), blamed on `culprit`: after
  // kConnectionDropsBeforeDeadLetter consecutive ends blamed on the same row, queues it
  // as a dead letter connection_dropped, which the next flush_marks() writes before
  // anything is published again.
  void connection_ended(std::optional<int64_t> culprit);

  RelayCounters snapshot() const;

  // Writes the Prometheus textfile when its period is up, or now if `force`.
  void write_metrics(bool force);

  // Publishes on the connection just made, from the first pending row, until it is lost,
  // a publish must be made again, or stop(). The caller has cleared lost, resend and
  // inflight. Returns false if a publish failed locally.
  bool publish_on_connection();

  // Its own connection: connect with backoff, publish, reconnect with a new client.
  void run_own();

  // A lent connection: wait for the Subscriber to connect, publish until it is down, wait
  // for its next CONNACK. The Subscriber reconnects; the relay never disconnects it. A
  // publish that fails locally on a connection still up is started over from the first
  // row after a backoff.
  void run_lent();

  void run();
};

}  // namespace mqtt_inbox

// The outbox relay (relay.h): a thread that publishes pending rows in seq order within
// the in-flight window, and Paho callbacks that only record PUBACKs. It publishes either on
// a Paho client of its own, which it connects with the Subscriber's code
// (mqtt_connection.h), not a copy of it, or on a Subscriber's (subscriber_connection.h).
#include "mqtt_inbox/relay.h"

#include <mqtt/async_client.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "log.h"
#include "mqtt_connection.h"
#include "relay_figures.h"
#include "relay_message.h"
#include "subscriber_client_lock.h"
#include "subscriber_connection.h"
#include "textfile.h"

namespace mqtt_inbox {

namespace {

constexpr int kSuccessReasonLimit = 0x80;  // MQTT 5.0 section 2.4: >= 0x80 is a failure

// The relay's connection settings in the carrier the connection code reads
// (mqtt_connection.h): the fields of the same name.
SubscriberOptions connection_settings(const RelayOptions& o) {
  SubscriberOptions c;
  c.broker_uri = o.broker_uri;
  c.client_id = o.client_id;
  c.mqtt_version = o.mqtt_version;
  c.keep_alive_s = o.keep_alive_s;
  c.connect_timeout_ms = o.connect_timeout_ms;
  c.reconnect_backoff_initial_ms = o.reconnect_backoff_initial_ms;
  c.reconnect_backoff_max_ms = o.reconnect_backoff_max_ms;
  c.username = o.username;
  c.password = o.password;
  c.password_provider = o.password_provider;
  c.tls = o.tls;
  c.client_id_lock_dir = o.client_id_lock_dir;
  c.logger = o.logger;
  return c;
}

using Clock = std::chrono::steady_clock;

}  // namespace

struct Relay::Impl {
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

  Outbox* outbox = nullptr;
  Subscriber* lender = nullptr;  // the Subscriber whose connection this relay uses, if any
  RelayOptions options;
  SubscriberOptions settings;     // the connection part of `options` (connection_settings)
  detail::BrokerAddress address;  // parsed broker_uri
  std::shared_ptr<spdlog::logger> log;
  // health() and the reports of failed attempts; made before the client, whose SSL error
  // handler points at it.
  std::unique_ptr<detail::ConnectionHealth> conn;
  // Paho's TLS settings and the connect options, built once and kept for the Relay's
  // lifetime: Paho C++ 1.2.0 copies them without re-pointing the C structs (its bug #337,
  // see to_paho_ssl_options, and the properties, see subscriber.cpp).
  mqtt::ssl_options paho_ssl;
  mqtt::connect_options conn_opts;
  std::unique_ptr<mqtt::async_client> client;  // its own connection's (null when lent one)
  std::shared_ptr<Link> link = std::make_shared<Link>();
  detail::RelayFigures figures;
  Clock::time_point next_metrics{};
  int client_lock_fd = -1;
  std::string client_lock_path;
  std::thread thread;

  // Shared with Paho's callback thread: held only for a few instructions, never while
  // calling Paho or the store.
  std::mutex mu;
  std::condition_variable wake;
  bool stopping = false;
  bool woken = false;
  bool lost = false;                     // the connection dropped since the thread looked
  struct InFlight {
    int64_t seq;
    Clock::time_point published_at;
  };
  std::map<uint64_t, InFlight> inflight;  // publish number -> row, current connection
  std::vector<int64_t> acked;            // seqs PUBACKed, not yet marked
  struct Rejection {
    int64_t seq;
    int code;
    std::string text;
  };
  std::vector<Rejection> rejections;  // PUBACKs >= 0x80, not yet marked dead
  bool resend = false;                // a publish failed locally on a live connection: start over
  // A lent connection (lender): up since its latest CONNACK, numbered, and that CONNACK.
  bool lent_up = false;
  uint64_t lent_epoch = 0;
  mqtt::properties lent_connack;
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
  std::atomic<int64_t> expired_count{0}, too_large_count{0};

  // --- Paho callbacks (through `link`): record and wake, nothing else (Paho's one
  // callback thread; a lender's calls come from its supervisor thread) ---

  void complete(const mqtt::token& tok, bool failed) noexcept {
    try {
      const auto n = reinterpret_cast<uintptr_t>(tok.get_user_context());
      const int reason = static_cast<int>(tok.get_reason_code());
      const auto now = Clock::now();
      std::lock_guard<std::mutex> lock(mu);
      auto it = inflight.find(n);
      if (it == inflight.end()) return;  // a publish of an earlier connection
      const int64_t seq = it->second.seq;
      if (!failed || reason >= kSuccessReasonLimit)
        figures.acked(reason, now - it->second.published_at);
      inflight.erase(it);
      if (reason >= kSuccessReasonLimit) {
        rejections.push_back({seq, reason, mqtt::exception::reason_code_str(reason)});
        ++rejected_count;
      } else if (failed) {
        resend = true;  // not acked: publish it again, after everything before it
      } else {
        acked.push_back(seq);
        ++acked_count;
      }
      woken = true;
      wake.notify_all();
    } catch (...) {
      // Nothing may escape into Paho; an unrecorded ack only causes a resend.
    }
  }

  void on_connection_lost() {
    connected = false;
    std::lock_guard<std::mutex> lock(mu);
    lost = true;
    woken = true;
    wake.notify_all();
  }

  void lent_connection_up(const mqtt::properties& connack) {
    std::lock_guard<std::mutex> lock(mu);
    lent_up = true;
    ++lent_epoch;
    lent_connack = connack;
    woken = true;
    wake.notify_all();
  }

  void lent_connection_down() {
    {
      std::lock_guard<std::mutex> lock(mu);
      lent_up = false;
    }
    on_connection_lost();
  }

  // --- the relay thread ---

  // Waits up to `ms` or until woken. Returns false when stopping.
  bool sleep_for(int ms) {
    std::unique_lock<std::mutex> lock(mu);
    wake.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stopping || woken; });
    woken = false;
    return !stopping;
  }
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
  void new_client() {
    client.reset();
    const int version =
        options.mqtt_version == MqttVersion::kV5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1;
    client = std::make_unique<mqtt::async_client>(
        options.broker_uri, options.client_id, mqtt::create_options(version, options.max_inflight),
        nullptr);
    client->set_connection_lost_handler([this](const std::string&) { on_connection_lost(); });
  }

  // One connection attempt, as the Subscriber makes its own (mqtt_connection.h). A failed
  // one is reported through `conn` (logged, health()); *refused: a CONNACK refusal.
  bool connect(bool* refused) {
    *refused = false;
    if (!detail::prepare_attempt(settings, address, conn.get(), *log, &conn_opts)) return false;
    const detail::ConnectOutcome outcome =
        detail::connect_and_wait(*client, conn_opts, settings, *log);
    if (!outcome.connected) {
      conn->connect_failed(outcome.rc, outcome.message);
      *refused = conn->attempt_refused();
      return false;
    }
    read_connack(outcome.properties);
    conn->set_connected(true);
    was_connected = true;
    log->info("outbox relay: connected to {} as '{}' (receive maximum {})", options.broker_uri,
              detail::printable(options.client_id), receive_maximum.load());
    return true;
  }

  // The broker's limits from a CONNACK's MQTT 5 properties.
  void read_connack(const mqtt::properties& connack) {
    const bool v5 = options.mqtt_version == MqttVersion::kV5;
    int window = 65535;
    if (v5 && connack.contains(mqtt::property::RECEIVE_MAXIMUM))
      window = mqtt::get<uint16_t>(connack, mqtt::property::RECEIVE_MAXIMUM);
    receive_maximum = window;
    // MQTT 5.0 section 3.2.2.3.6: the client MUST NOT send a packet larger than the
    // Maximum Packet Size the server announces (absent: only the protocol's limit).
    int64_t max_packet = 0;
    if (v5 && connack.contains(mqtt::property::MAXIMUM_PACKET_SIZE))
      max_packet = mqtt::get<int>(connack, mqtt::property::MAXIMUM_PACKET_SIZE);
    maximum_packet_size = max_packet;
  }

  mqtt::async_client& publisher() {
    return lender ? detail::SubscriberConnection::client(*lender) : *client;
  }

  int window() const { return std::min(options.max_inflight, receive_maximum.load()); }

  // Marks collected PUBACKs. On a store error they are kept and tried again.
  void flush_marks() {
    std::vector<int64_t> sent;
    std::vector<Rejection> dead;
    {
      std::lock_guard<std::mutex> lock(mu);
      sent.swap(acked);
      dead.swap(rejections);
    }
    for (size_t i = 0; i < sent.size(); i += static_cast<size_t>(options.mark_batch)) {
      std::vector<int64_t> batch(
          sent.begin() + static_cast<std::ptrdiff_t>(i),
          sent.begin() + static_cast<std::ptrdiff_t>(
                             std::min(sent.size(), i + static_cast<size_t>(options.mark_batch))));
      if (options.before_mark_hook) options.before_mark_hook(batch.front());
      const Status s = outbox->mark_sent(batch);
      if (!s.ok()) {
        log->warn("outbox relay: marking {} row(s) sent failed, retrying: {}", batch.size(),
                  s.to_string());
        std::lock_guard<std::mutex> lock(mu);
        acked.insert(acked.end(), sent.begin() + static_cast<std::ptrdiff_t>(i), sent.end());
        break;
      }
    }
    for (size_t i = 0; i < dead.size(); ++i) {
      const auto& r = dead[i];
      const Status s = outbox->mark_dead(
          r.seq, OutboxDeadReason::kRejectedByBroker, r.code,
          "PUBACK reason code " + std::to_string(r.code) + (r.text.empty() ? "" : ": " + r.text));
      if (!s.ok()) {
        log->warn("outbox relay: marking row {} dead failed, retrying: {}", r.seq, s.to_string());
        std::lock_guard<std::mutex> lock(mu);
        rejections.insert(rejections.end(), dead.begin() + static_cast<std::ptrdiff_t>(i),
                          dead.end());
        break;
      }
    }
  }

  // Publishes pending rows after `*last_seq` while the window has room. Returns false if
  // the connection must be made again.
  bool publish_more(int64_t* last_seq) {
    size_t in_flight;
    {
      std::lock_guard<std::mutex> lock(mu);
      in_flight = inflight.size();
    }
    const int room = window() - static_cast<int>(in_flight);
    if (room <= 0) return true;
    const bool v5 = options.mqtt_version == MqttVersion::kV5;
    std::vector<OutboxRow> rows;
    const Status s = outbox->fetch_pending(*last_seq, room, &rows);
    if (!s.ok()) {
      log->warn("outbox relay: reading pending rows failed, retrying: {}", s.to_string());
      return true;
    }
    for (const auto& row : rows) {
      std::string why;
      if (const auto reason = detail::unpublishable(row, v5, maximum_packet_size.load(), &why)) {
        const Status d = outbox->mark_dead(row.seq, *reason, 0, why);
        if (!d.ok()) {  // read again from this row at the next poll
          log->warn("outbox relay: marking row {} dead failed, retrying: {}", row.seq,
                    d.to_string());
          return true;
        }
        ++(*reason == OutboxDeadReason::kExpired ? expired_count : too_large_count);
        *last_seq = row.seq;
        continue;
      }
      if (options.before_publish_hook) options.before_publish_hook(row.seq);
      const uint64_t n = ++pubno;
      {
        std::lock_guard<std::mutex> lock(mu);
        inflight[n] = InFlight{row.seq, Clock::now()};
        max_inflight_seen =
            std::max<int64_t>(max_inflight_seen.load(), static_cast<int64_t>(inflight.size()));
      }
      try {
        publisher().publish(detail::to_paho_message(row, v5),
                            reinterpret_cast<void*>(static_cast<uintptr_t>(n)), *link);
      } catch (const mqtt::exception& e) {
        log->warn("outbox relay: publish of row {} failed, reconnecting: {}", row.seq, e.what());
        return false;
      }
      ++published;
      *last_seq = row.seq;
      if (options.after_publish_hook) options.after_publish_hook(row.seq);
    }
    return true;
  }

  void disconnect_quietly() {
    try {
      if (client->is_connected())
        client->disconnect(std::chrono::milliseconds(0))->wait_for(std::chrono::seconds(5));
    } catch (const mqtt::exception&) {
    }
    connected = false;
    if (was_connected) conn->set_connected(false);  // health(): no longer
    was_connected = false;
  }

  RelayCounters snapshot() const {
    RelayCounters c;
    c.published = published.load();
    c.acked = acked_count.load();
    c.rejected = rejected_count.load();
    c.connects = connects.load();
    c.max_inflight_seen = max_inflight_seen.load();
    c.receive_maximum = receive_maximum.load();
    c.maximum_packet_size = maximum_packet_size.load();
    c.expired = expired_count.load();
    c.too_large = too_large_count.load();
    c.connected = connected.load();
    figures.fill(&c, Clock::now());
    return c;
  }

  // Writes the Prometheus textfile when its period is up, or now if `force`.
  void write_metrics(bool force) {
    if (options.prometheus_textfile.empty()) return;
    const auto now = Clock::now();
    if (!force && now < next_metrics) return;
    next_metrics = now + std::chrono::milliseconds(options.metrics_period_ms);
    std::string error;
    if (!detail::write_textfile(options.prometheus_textfile, prometheus_text(snapshot()), &error))
      log->warn("outbox relay: {}", error);
  }

  // Publishes on the connection just made, from the first pending row, until it is lost,
  // a publish must be made again, or stop(). The caller has cleared lost, resend and
  // inflight. Returns false if a publish failed locally.
  bool publish_on_connection() {
    ++connects;
    connected = true;
    figures.connected(Clock::now());
    // Everything still pending goes out again from the first row, in order.
    flush_marks();
    int64_t last_seq = 0;
    bool ok = true;
    while (ok && !is_stopping()) {
      flush_marks();
      write_metrics(false);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (lost || resend) break;
      }
      ok = publish_more(&last_seq);
      if (ok) sleep_for(options.poll_interval_ms);
    }
    connected = false;
    figures.disconnected(Clock::now());
    return ok;
  }

  // Its own connection: connect with backoff, publish, reconnect with a new client.
  void run_own() {
    int backoff = options.reconnect_backoff_initial_ms;
    while (!is_stopping()) {
      write_metrics(false);
      bool refused = false;
      if (!connect(&refused)) {
        // A refused CONNECT will not be accepted sooner for asking again: wait the longest.
        const int wait_ms = refused ? options.reconnect_backoff_max_ms : backoff;
        log->info("outbox relay: next connection attempt in {} ms", wait_ms);
        if (!sleep_for(wait_ms)) break;
        backoff = std::min(backoff * 2, options.reconnect_backoff_max_ms);
        continue;
      }
      backoff = options.reconnect_backoff_initial_ms;
      {
        std::lock_guard<std::mutex> lock(mu);
        lost = false;
        resend = false;
        inflight.clear();
      }
      publish_on_connection();
      if (is_stopping()) break;
      log->warn(
          "outbox relay: connection to {} lost; publishing pending rows again after "
          "reconnecting",
          options.broker_uri);
      disconnect_quietly();
      try {
        new_client();
      } catch (const mqtt::exception& e) {
        log->error("outbox relay: cannot make a new MQTT client: {}", e.what());
      }
      if (!sleep_for(backoff)) break;
    }
    flush_marks();
    disconnect_quietly();
    flush_marks();
  }

  // A lent connection: wait for the Subscriber to connect, publish until it is down, wait
  // for its next CONNACK. The Subscriber reconnects; the relay never disconnects it. A
  // publish that fails locally on a connection still up is started over from the first
  // row after a backoff.
  void run_lent() {
    uint64_t seen = 0;
    bool again = false;  // publish again on the connection of epoch `seen`
    int backoff = options.reconnect_backoff_initial_ms;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait_for(lock, std::chrono::milliseconds(options.metrics_period_ms), [&] {
          return stopping || (lent_up && (lent_epoch != seen || again));
        });
        woken = false;
        if (stopping) break;
        if (!lent_up || (lent_epoch == seen && !again)) {
          lock.unlock();
          write_metrics(false);
          continue;
        }
        if (lent_epoch != seen) backoff = options.reconnect_backoff_initial_ms;
        seen = lent_epoch;
        lost = false;
        resend = false;
        inflight.clear();
        read_connack(lent_connack);
      }
      log->info("outbox relay: publishing on the subscriber's connection (receive maximum {})",
                receive_maximum.load());
      publish_on_connection();
      if (is_stopping()) break;
      {
        std::lock_guard<std::mutex> lock(mu);
        again = lent_up && lent_epoch == seen;
      }
      if (again) {
        log->warn("outbox relay: a publish failed on the subscriber's live connection; "
                  "publishing pending rows again in {} ms", backoff);
        if (!sleep_for(backoff)) break;
        backoff = std::min(backoff * 2, options.reconnect_backoff_max_ms);
      } else {
        log->warn("outbox relay: the subscriber's connection is down; publishing pending rows "
                  "again when it is back");
      }
    }
    flush_marks();
  }

  void run() {
    if (lender) run_lent(); else run_own();
    write_metrics(true);
  }
};

namespace {

// The checks of the publishing options, which both kinds of Relay use.
Status check_publishing(const Outbox* outbox, const RelayOptions& options) {
  if (!outbox) return Status::InvalidArgument("Relay::create: outbox is null");
  if (options.max_inflight < 1 || options.max_inflight > 65535)
    return Status::InvalidArgument("relay max_inflight must be 1..65535");
  if (options.mark_batch < 1) return Status::InvalidArgument("relay mark_batch must be >= 1");
  if (options.poll_interval_ms < 1 || options.metrics_period_ms < 1 ||
      options.reconnect_backoff_initial_ms < 1 ||
      options.reconnect_backoff_max_ms < options.reconnect_backoff_initial_ms)
    return Status::InvalidArgument("relay intervals must be positive, backoff max >= initial");
  return Status::Ok();
}

}  // namespace

Status Relay::create(Outbox* outbox, const RelayOptions& options, std::unique_ptr<Relay>* out) {
  if (Status s = check_publishing(outbox, options); !s.ok()) return s;
  if (options.broker_uri.empty()) return Status::InvalidArgument("relay broker_uri is empty");
  if (options.client_id.empty()) return Status::InvalidArgument("relay client_id is required");
  if (options.keep_alive_s < 1 || options.keep_alive_s > 65535)
    return Status::InvalidArgument("relay keep_alive_s must be 1..65535");
  if (options.connect_timeout_ms < 1)
    return Status::InvalidArgument("relay intervals must be positive, backoff max >= initial");
  auto impl = std::make_unique<Impl>();
  impl->settings = connection_settings(options);
  if (Status s = detail::check_connection_settings(impl->settings, &impl->address); !s.ok())
    return Status(s.code(), "relay: " + s.message());
  impl->outbox = outbox;
  impl->options = options;
  impl->log = detail::logger_or_default(options.logger);
  impl->conn = std::make_unique<detail::ConnectionHealth>(impl->settings, impl->address, impl->log);
  try {
    impl->new_client();
    auto b = detail::connect_options_builder(impl->settings, /*clean=*/true);
    b.max_inflight(options.max_inflight);
    impl->conn_opts = b.finalize();
    // Set on the member itself, after the builder (see paho_ssl and conn_opts).
    detail::set_up_tls(impl->settings, impl->address, impl->conn.get(), *impl->log, &impl->paho_ssl,
                       &impl->conn_opts);
  } catch (const mqtt::exception& e) {
    return Status::InvalidArgument(std::string("cannot create the relay's MQTT client: ") +
                                   e.what());
  }
  impl->link->relay = impl.get();
  out->reset(new Relay(std::move(impl)));
  return Status::Ok();
}

Status Relay::create(Outbox* outbox, Subscriber* subscriber, const RelayOptions& options,
                     std::unique_ptr<Relay>* out) {
  if (!subscriber) return Status::InvalidArgument("Relay::create: subscriber is null");
  if (Status s = check_publishing(outbox, options); !s.ok()) return s;
  if (!options.broker_uri.empty() || !options.client_id.empty())
    return Status::InvalidArgument(
        "relay on a subscriber's connection: leave broker_uri and client_id empty (the "
        "connection, its client id and its settings are the subscriber's)");
  auto impl = std::make_unique<Impl>();
  impl->outbox = outbox;
  impl->lender = subscriber;
  impl->options = options;
  impl->options.mqtt_version = detail::SubscriberConnection::version(*subscriber);
  impl->log = detail::logger_or_default(options.logger);
  impl->link->relay = impl.get();
  out->reset(new Relay(std::move(impl)));
  return Status::Ok();
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Relay::~Relay() {
  (void)stop();
  // Its own client first: its callbacks use the mutex and maps declared after it. A
  // lender's client lives on; the link it keeps then forwards nothing.
  impl_->client.reset();
  std::lock_guard<std::mutex> lock(impl_->link->mu);
  impl_->link->relay = nullptr;
}

Status Relay::start() {
  Impl& m = *impl_;
  if (m.thread.joinable()) return Status::InvalidArgument("relay already started");
  if (m.lender) {
    if (Status s = detail::SubscriberConnection::attach(*m.lender, m.link); !s.ok()) return s;
  } else {
    if (Status s = detail::take_client_id_lock(m.options.client_id_lock_dir, m.options.client_id,
                                               &m.client_lock_fd, &m.client_lock_path);
        !s.ok())
      return s;
    m.conn->started();
  }
  m.figures.started(Clock::now());
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = false;
  }
  impl_->thread = std::thread([this] { impl_->run(); });
  return Status::Ok();
}

Status Relay::stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->wake.notify_all();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  if (impl_->lender) {
    detail::SubscriberConnection::detach(*impl_->lender, impl_->link.get());
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->lent_up = false;
  }
  impl_->figures.stopped(Clock::now());
  detail::release_client_id_lock(&impl_->client_lock_fd, impl_->client_lock_path);
  return Status::Ok();
}

void Relay::notify() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->woken = true;
  impl_->wake.notify_all();
}

bool Relay::is_connected() const { return impl_->connected.load(); }

SubscriberHealth Relay::health() const {
  return impl_->lender ? impl_->lender->health() : impl_->conn->snapshot();
}

RelayCounters Relay::counters() const { return impl_->snapshot(); }

}  // namespace mqtt_inbox

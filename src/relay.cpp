// The outbox relay (relay.h): its own Paho client, a thread that publishes pending rows in
// seq order within the in-flight window, and Paho callbacks that only record PUBACKs. It
// connects with the Subscriber's code (mqtt_connection.h), not a copy of it.
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
#include "publish_size.h"
#include "subscriber_client_lock.h"

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

}  // namespace

struct Relay::Impl : public mqtt::iaction_listener {
  Outbox* outbox = nullptr;
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
  std::unique_ptr<mqtt::async_client> client;
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
  std::map<uint64_t, int64_t> inflight;  // publish number -> seq, current connection
  std::vector<int64_t> acked;            // seqs PUBACKed, not yet marked
  struct Rejection {
    int64_t seq;
    int code;
    std::string text;
  };
  std::vector<Rejection> rejections;  // PUBACKs >= 0x80, not yet marked dead
  bool resend = false;                // a publish failed locally on a live connection: start over
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

  // --- Paho callbacks: record and wake, nothing else (Paho's one callback thread) ---

  void on_success(const mqtt::token& tok) override { complete(tok, false); }
  void on_failure(const mqtt::token& tok) override { complete(tok, true); }

  void complete(const mqtt::token& tok, bool failed) noexcept {
    try {
      const auto n = reinterpret_cast<uintptr_t>(tok.get_user_context());
      const int reason = static_cast<int>(tok.get_reason_code());
      std::lock_guard<std::mutex> lock(mu);
      auto it = inflight.find(n);
      if (it == inflight.end()) return;  // a publish of an earlier connection
      const int64_t seq = it->second;
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
    int window = 65535;
    if (options.mqtt_version == MqttVersion::kV5 &&
        outcome.properties.contains(mqtt::property::RECEIVE_MAXIMUM))
      window = mqtt::get<uint16_t>(outcome.properties, mqtt::property::RECEIVE_MAXIMUM);
    receive_maximum = window;
    // MQTT 5.0 section 3.2.2.3.6: the client MUST NOT send a packet larger than the
    // Maximum Packet Size the server announces (absent: only the protocol's limit).
    int64_t max_packet = 0;
    if (options.mqtt_version == MqttVersion::kV5 &&
        outcome.properties.contains(mqtt::property::MAXIMUM_PACKET_SIZE))
      max_packet = mqtt::get<int>(outcome.properties, mqtt::property::MAXIMUM_PACKET_SIZE);
    maximum_packet_size = max_packet;
    ++connects;
    conn->set_connected(true);
    was_connected = true;
    log->info("outbox relay: connected to {} as '{}' (receive maximum {})", options.broker_uri,
              detail::printable(options.client_id), window);
    return true;
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

  mqtt::message_ptr to_paho(const OutboxRow& row) const {
    auto msg = mqtt::make_message(row.topic, row.payload, 1, false);
    if (options.mqtt_version == MqttVersion::kV5) {
      mqtt::properties props;
      props.add({mqtt::property::USER_PROPERTY, "message-id", row.message_id});
      const OutgoingMessage& p = row.properties;
      for (const auto& up : p.user_properties)
        props.add({mqtt::property::USER_PROPERTY, up.first, up.second});
      if (p.content_type)
        props.add({mqtt::property::CONTENT_TYPE, mqtt::string_ref(*p.content_type)});
      if (p.response_topic)
        props.add({mqtt::property::RESPONSE_TOPIC, mqtt::string_ref(*p.response_topic)});
      if (p.correlation_data)
        props.add({mqtt::property::CORRELATION_DATA, mqtt::string_ref(*p.correlation_data)});
      if (p.payload_format_indicator)
        props.add({mqtt::property::PAYLOAD_FORMAT_INDICATOR,
                   static_cast<int32_t>(*p.payload_format_indicator)});
      // What is left of the expiry after the wait in the outbox, as a server forwards it
      // (MQTT 5.0 section 3.3.2.3.3); a row that ran out never gets here (unpublishable).
      if (p.message_expiry_interval_s)
        props.add({mqtt::property::MESSAGE_EXPIRY_INTERVAL,
                   static_cast<int32_t>(detail::remaining_expiry_s(row))});
      msg->set_properties(props);
    }
    return msg;
  }

  // A row that can never be published: its message expiry ran out while it waited, or
  // its PUBLISH is larger than the broker's Maximum Packet Size (mosquitto answers one with
  // DISCONNECT 0x95, and the resend after every reconnect would block the stream forever).
  // Returns the reason and fills *text, or nullopt.
  std::optional<OutboxDeadReason> unpublishable(const OutboxRow& row, std::string* text) const {
    if (detail::expired(row)) {
      *text = "message expiry interval of " +
              std::to_string(*row.properties.message_expiry_interval_s) + " s ran out after " +
              std::to_string(row.waited_ms / 1000) + " s in the outbox";
      return OutboxDeadReason::kExpired;
    }
    const int64_t limit = maximum_packet_size.load();
    const int64_t size = detail::publish_packet_size(row, options.mqtt_version == MqttVersion::kV5);
    if (limit > 0 && size > limit) {
      *text = "PUBLISH of " + std::to_string(size) + " bytes is larger than the broker's " +
              "Maximum Packet Size of " + std::to_string(limit) + " bytes (CONNACK)";
      return OutboxDeadReason::kPayloadTooLarge;
    }
    return std::nullopt;
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
    std::vector<OutboxRow> rows;
    const Status s = outbox->fetch_pending(*last_seq, room, &rows);
    if (!s.ok()) {
      log->warn("outbox relay: reading pending rows failed, retrying: {}", s.to_string());
      return true;
    }
    for (const auto& row : rows) {
      std::string why;
      if (const auto reason = unpublishable(row, &why)) {
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
        inflight[n] = row.seq;
        max_inflight_seen =
            std::max<int64_t>(max_inflight_seen.load(), static_cast<int64_t>(inflight.size()));
      }
      try {
        client->publish(to_paho(row), reinterpret_cast<void*>(static_cast<uintptr_t>(n)), *this);
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

  void run() {
    int backoff = options.reconnect_backoff_initial_ms;
    while (!is_stopping()) {
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
      connected = true;
      // Everything still pending goes out again from the first row, in order.
      flush_marks();
      int64_t last_seq = 0;
      bool ok = true;
      while (ok && !is_stopping()) {
        flush_marks();
        {
          std::lock_guard<std::mutex> lock(mu);
          if (lost || resend) break;
        }
        ok = publish_more(&last_seq);
        if (ok) sleep_for(options.poll_interval_ms);
      }
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
};

Status Relay::create(Outbox* outbox, const RelayOptions& options, std::unique_ptr<Relay>* out) {
  if (!outbox) return Status::InvalidArgument("Relay::create: outbox is null");
  if (options.broker_uri.empty()) return Status::InvalidArgument("relay broker_uri is empty");
  if (options.client_id.empty()) return Status::InvalidArgument("relay client_id is required");
  if (options.max_inflight < 1 || options.max_inflight > 65535)
    return Status::InvalidArgument("relay max_inflight must be 1..65535");
  if (options.mark_batch < 1) return Status::InvalidArgument("relay mark_batch must be >= 1");
  if (options.keep_alive_s < 1 || options.keep_alive_s > 65535)
    return Status::InvalidArgument("relay keep_alive_s must be 1..65535");
  if (options.poll_interval_ms < 1 || options.connect_timeout_ms < 1 ||
      options.reconnect_backoff_initial_ms < 1 ||
      options.reconnect_backoff_max_ms < options.reconnect_backoff_initial_ms)
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
  out->reset(new Relay(std::move(impl)));
  return Status::Ok();
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Relay::~Relay() {
  (void)stop();
  // The client first: its callbacks use the mutex and maps declared after it.
  impl_->client.reset();
}

Status Relay::start() {
  Impl& m = *impl_;
  if (m.thread.joinable()) return Status::InvalidArgument("relay already started");
  if (Status s = detail::take_client_id_lock(m.options.client_id_lock_dir, m.options.client_id,
                                             &m.client_lock_fd, &m.client_lock_path);
      !s.ok())
    return s;
  m.conn->started();
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
  detail::release_client_id_lock(&impl_->client_lock_fd, impl_->client_lock_path);
  return Status::Ok();
}

void Relay::notify() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->woken = true;
  impl_->wake.notify_all();
}

bool Relay::is_connected() const { return impl_->connected.load(); }

SubscriberHealth Relay::health() const { return impl_->conn->snapshot(); }

RelayCounters Relay::counters() const {
  RelayCounters c;
  c.published = impl_->published.load();
  c.acked = impl_->acked_count.load();
  c.rejected = impl_->rejected_count.load();
  c.connects = impl_->connects.load();
  c.max_inflight_seen = impl_->max_inflight_seen.load();
  c.receive_maximum = impl_->receive_maximum.load();
  c.maximum_packet_size = impl_->maximum_packet_size.load();
  c.expired = impl_->expired_count.load();
  c.too_large = impl_->too_large_count.load();
  return c;
}

}  // namespace mqtt_inbox

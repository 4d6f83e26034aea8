// The outbox relay (relay.h): its connection, either a Paho client of its own, which it
// connects with the Subscriber's code (mqtt/connect.h), not a copy of it, or a
// Subscriber's (mqtt/lent_connection.h); the relay thread's loops over connections; the
// public API. Publishing within a connection is mqtt/relay_publish.cpp's.
#include "mqtt_inbox/relay.h"

#include <algorithm>

#include "mqtt/client_lock.h"
#include "mqtt/relay_impl.h"
#include "util/log.h"

namespace mqtt_inbox {

// A new Paho client (mqtt/connect.h make_paho_client): the outbox table is the only
// record of what to send. Made again before every reconnect, so nothing Paho kept of an
// earlier connection (queued or in-flight publishes counted against its window)
// survives: under load a reused client was seen to stall after a broker restart. Paho's
// buffer is sized to the window.
void Relay::Impl::new_client() {
  client.reset();
  client = detail::make_paho_client(options, options.max_inflight);
  client->set_connection_lost_handler([this](const std::string&) { on_connection_lost(); });
}

// One connection attempt, as the Subscriber makes its own (mqtt/connect.h). A failed
// one is reported through `conn` (logged, health()); *refused: a CONNACK refusal.
bool Relay::Impl::connect(bool* refused) {
  *refused = false;
  if (!detail::prepare_attempt(options, address, conn.get(), *log, &conn_opts)) return false;
  const detail::ConnectOutcome outcome =
      detail::connect_and_wait(*client, conn_opts, options, *log);
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
void Relay::Impl::read_connack(const mqtt::properties& connack) {
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

void Relay::Impl::disconnect_quietly() {
  try {
    if (client->is_connected())
      client->disconnect(std::chrono::milliseconds(0))->wait_for(std::chrono::seconds(5));
  } catch (const mqtt::exception&) {
  }
  connected = false;
  if (was_connected) conn->set_connected(false);  // health(): no longer
  was_connected = false;
}

// With relays that take turns: the client-id lock, taken once the turn is held (start()
// took it otherwise). false while another process on this host holds it (a relay whose
// turn just ended, still disconnecting), said once per wait.
bool Relay::Impl::lock_client_id_with_turn() {
  if (!outbox->relays_take_turns() || client_lock_fd >= 0) return true;
  const Status s = detail::take_client_id_lock(options.client_id_lock_dir, options.client_id,
                                               &client_lock_fd, &client_lock_path);
  if (s.ok()) {
    lock_wait_logged = false;
    return true;
  }
  if (!lock_wait_logged)
    log->warn("outbox relay: holds the turn, but {}; waiting for it", s.message());
  lock_wait_logged = true;
  return false;
}

// Its own connection: connect with backoff, publish, reconnect with a new client.
void Relay::Impl::run_own() {
  int backoff = options.reconnect_backoff_initial_ms;
  while (!is_stopping()) {
    write_metrics(false);
    if (!hold_turn()) {
      // Another relay of this outbox publishes: stand by, disconnected. With turns the
      // client-id lock goes with the turn however it was lost (while connected, or in a
      // backoff, a failed connect, a failed renewal), so a relay on this host can take both.
      if (outbox->relays_take_turns())
        detail::release_client_id_lock(&client_lock_fd, client_lock_path);
      if (!pause_for(std::max(100, options.turn_lease_ms / 5))) break;
      continue;
    }
    if (!lock_client_id_with_turn()) {  // a relay on this host still disconnecting
      if (!pause_for(std::max(100, options.turn_lease_ms / 5))) break;
      continue;
    }
    bool refused = false;
    if (!connect(&refused)) {
      // A refused CONNECT will not be accepted sooner for asking again: wait the longest.
      const int wait_ms = refused ? options.reconnect_backoff_max_ms : backoff;
      log->info("outbox relay: next connection attempt in {} ms", wait_ms);
      if (!pause_for(wait_ms)) break;
      backoff = std::min(backoff * 2, options.reconnect_backoff_max_ms);
      continue;
    }
    backoff = options.reconnect_backoff_initial_ms;
    {
      std::lock_guard<std::mutex> lock(mu);
      lost = false;
      resend = false;
      inflight.clear();
      last_puback_at = {};
    }
    ++connects;
    figures.connected(Clock::now());
    turn_lost = false;
    publish_on_connection();
    connected = false;
    figures.disconnected(Clock::now());
    if (is_stopping()) break;
    if (turn_lost) {
      // Not the connection's fault: no row is blamed. What is in flight may go out again
      // from the relay that holds the turn now (the next hop's inbox drops the copy).
      log->warn(
          "outbox relay: lost the outbox's relay turn; disconnecting, the relay that holds "
          "it publishes");
      disconnect_quietly();
      if (outbox->relays_take_turns())  // the lock goes with the turn
        detail::release_client_id_lock(&client_lock_fd, client_lock_path);
      try {
        new_client();
      } catch (const mqtt::exception& e) {
        log->error("outbox relay: cannot make a new MQTT client: {}", e.what());
      }
      continue;
    }
    connection_ended(blame());
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
    if (!pause_for(backoff)) break;
  }
  flush_marks(/*force=*/true);
  disconnect_quietly();
  flush_marks(/*force=*/true);
}

// A lent connection: wait for the Subscriber to connect, publish until it is down, wait
// for its next CONNACK. The Subscriber reconnects; the relay never disconnects it. A
// publish that fails locally on a connection still up is started over from the first
// row after a backoff.
void Relay::Impl::run_lent() {
  uint64_t seen = 0;
  bool again = false;  // publish again on the connection of epoch `seen`
  bool ended = true;   // the end of the connection of epoch `seen` was looked at
  int backoff = options.reconnect_backoff_initial_ms;
  for (;;) {
    // The connection of epoch `seen` went down while the relay was pausing after a
    // failed publish (so it never saw it down): blamed now, before `inflight` is cleared.
    std::optional<int64_t> late_culprit;
    bool late_end = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      wake.wait_for(lock, std::chrono::milliseconds(options.metrics_period_ms),
                    [&] { return stopping || (lent_up && (lent_epoch != seen || again)); });
      woken = false;
      if (stopping) break;
      // Down, perhaps during a retry pause: the offline clock runs (a no-op if it does).
      if (!lent_up) figures.disconnected(Clock::now());
      if (!lent_up || (lent_epoch == seen && !again)) {
        lock.unlock();
        write_metrics(false);
        continue;
      }
      if (lent_epoch != seen) {
        backoff = options.reconnect_backoff_initial_ms;
        ++connects;  // a connection of the Subscriber's that this relay published on
        figures.connected(Clock::now());
        if (!ended) {
          late_culprit = blame_locked();
          late_end = true;
        }
        ended = false;
      }
      seen = lent_epoch;
      lost = false;
      resend = false;
      inflight.clear();
      last_puback_at = {};
      read_connack(lent_connack);
    }
    if (late_end) connection_ended(late_culprit);
    log->info("outbox relay: publishing on the subscriber's connection (receive maximum {})",
              receive_maximum.load());
    publish_on_connection();
    if (is_stopping()) break;
    {
      std::lock_guard<std::mutex> lock(mu);
      again = lent_up && lent_epoch == seen;
    }
    if (again) {
      log->warn(
          "outbox relay: a publish failed on the subscriber's live connection; "
          "publishing pending rows again in {} ms",
          backoff);
      if (!pause_for(backoff)) break;
      backoff = std::min(backoff * 2, options.reconnect_backoff_max_ms);
    } else {
      connected = false;
      figures.disconnected(Clock::now());
      log->warn(
          "outbox relay: the subscriber's connection is down; publishing pending rows "
          "again when it is back");
      connection_ended(blame());
      ended = true;
    }
  }
  connected = false;
  flush_marks(/*force=*/true);
}

void Relay::Impl::run() {
  if (lender)
    run_lent();
  else
    run_own();
  write_metrics(true);
  std::lock_guard<std::mutex> lock(mu);
  finished = true;
  wake.notify_all();
}

namespace {

// The checks of the publishing options, which both kinds of Relay use, and the relay side
// of `outbox` into *source.
Status check_publishing(Outbox* outbox, const RelayOptions& options, detail::RelaySource** source) {
  if (!outbox) return Status::InvalidArgument("Relay::create: outbox is null");
  *source = detail::RelaySource::of(outbox);
  if (!*source)
    return Status::InvalidArgument("Relay::create: outbox is not one Outbox::create made");
  if (options.max_inflight < 1 || options.max_inflight > 65535)
    return Status::InvalidArgument("relay max_inflight must be 1..65535");
  if (options.mark_batch < 1) return Status::InvalidArgument("relay mark_batch must be >= 1");
  if (options.mark_linger_ms < 0)
    return Status::InvalidArgument("relay mark_linger_ms must be >= 0");
  if (options.turn_lease_ms < 1000 || options.turn_lease_ms > 3600000)
    return Status::InvalidArgument("RelayOptions::turn_lease_ms must be 1000..3600000, got " +
                                   std::to_string(options.turn_lease_ms));
  if (options.poll_interval_ms < 1 || options.metrics_period_ms < 1 ||
      options.reconnect_backoff_initial_ms < 1 ||
      options.reconnect_backoff_max_ms < options.reconnect_backoff_initial_ms)
    return Status::InvalidArgument("relay intervals must be positive, backoff max >= initial");
  if (options.max_packet_size < 0)
    return Status::InvalidArgument("relay max_packet_size must be >= 0 (0 = no limit)");
  if (options.stop_timeout_ms < 0)
    return Status::InvalidArgument("relay stop_timeout_ms must be >= 0");
  return Status::Ok();
}

}  // namespace

Status Relay::create(Outbox* outbox, const RelayOptions& options, std::unique_ptr<Relay>* out) {
  detail::RelaySource* source = nullptr;
  if (Status s = check_publishing(outbox, options, &source); !s.ok()) return s;
  if (options.client_id.empty()) return Status::InvalidArgument("relay client_id is required");
  auto impl = std::make_unique<Impl>();
  if (Status s = detail::check_connection_settings(options, &impl->address); !s.ok())
    return Status(s.code(), "relay: " + s.message());
  impl->outbox = source;
  impl->options = options;
  impl->log = detail::logger_or_default(options.logger);
  impl->conn = std::make_unique<detail::HealthRecorder>(impl->options, impl->address, impl->log);
  try {
    impl->new_client();
    auto b = detail::connect_options_builder(impl->options, /*clean=*/true);
    b.max_inflight(options.max_inflight);
    impl->conn_opts = b.finalize();
    // Set on the member itself, after the builder (see paho_ssl and conn_opts).
    detail::set_up_tls(impl->options, impl->address, impl->conn.get(), *impl->log, &impl->paho_ssl,
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
  detail::RelaySource* source = nullptr;
  if (Status s = check_publishing(outbox, options, &source); !s.ok()) return s;
  if (!options.broker_uri.empty() || !options.client_id.empty())
    return Status::InvalidArgument(
        "relay on a subscriber's connection: leave broker_uri and client_id empty (the "
        "connection, its client id and its settings are the subscriber's)");
  auto impl = std::make_unique<Impl>();
  impl->outbox = source;
  impl->lender = subscriber;
  impl->options = options;
  impl->options.mqtt_version = detail::SubscriberConnection::version(*subscriber);
  impl->log = detail::logger_or_default(options.logger);
  if (impl->options.mqtt_version == MqttVersion::kV3_1_1)
    impl->log->warn(
        "outbox relay on an MQTT 3.1.1 subscriber's connection: no user property "
        "\"message-id\" and no PUBACK reason codes (a publish the broker refuses counts as "
        "sent); the next hop must read the id from the payload. Use MQTT 5 for the subscriber");
  impl->link->relay = impl.get();
  out->reset(new Relay(std::move(impl)));
  return Status::Ok();
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Relay::~Relay() {
  // After a stop() that timed out the thread may still be inside a store call or Paho:
  // it is waited for here (relay.h: exit the process instead).
  if (!stop().ok() && impl_->thread.joinable()) {
    impl_->thread.join();
    impl_->outbox->give_back_relay_turn();
    detail::release_client_id_lock(&impl_->client_lock_fd, impl_->client_lock_path);
  }
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
    // Relays that take turns (PostgreSQL) lock the client id with the turn (run_own), so
    // that a relay standing by on the same host is not refused here: a busy lock is
    // fine, any other failure (an unusable lock folder) is the caller's to fix now.
    Status s = detail::take_client_id_lock(m.options.client_id_lock_dir, m.options.client_id,
                                           &m.client_lock_fd, &m.client_lock_path);
    if (m.outbox->relays_take_turns()) {
      detail::release_client_id_lock(&m.client_lock_fd, m.client_lock_path);
      if (s.code() == Status::Code::kBusy) s = Status::Ok();
    }
    if (!s.ok()) return s;
    m.conn->started();
  }
  m.figures.started(Relay::Impl::Clock::now());
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = false;
    impl_->finished = false;
  }
  // Woken after each commit that enqueued (RelaySource::add_commit_waker).
  if (m.options.wake_on_commit)
    m.commit_waker = m.outbox->add_commit_waker([&m] {
      std::lock_guard<std::mutex> lock(m.mu);
      m.woken = true;
      m.wake.notify_all();
    });
  impl_->thread = std::thread([this] { impl_->run(); });
  return Status::Ok();
}

Status Relay::stop() {
  Impl& m = *impl_;
  if (m.commit_waker) {
    m.outbox->remove_commit_waker(m.commit_waker);
    m.commit_waker = 0;
  }
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.stopping = true;
    m.wake.notify_all();
    // The thread may be inside a store call that waits for a locked or full store, or in
    // a Paho call that waits for Paho's lock, which a message callback waiting for the
    // store holds: neither can be interrupted, so stop() waits at most stop_timeout_ms.
    if (m.thread.joinable() &&
        !m.wake.wait_for(lock, std::chrono::milliseconds(m.options.stop_timeout_ms),
                         [&] { return m.finished; })) {
      lock.unlock();
      m.log->error(
          "outbox relay: stop: the relay thread is still waiting for the store (or for "
          "Paho's lock, held by a message callback that waits for the store) after {} ms; "
          "rows not yet marked sent stay pending and are published again by the next run. "
          "Exit the process.",
          m.options.stop_timeout_ms);
      return Status(Status::Code::kBusy, "the outbox relay is still waiting for the store");
    }
  }
  if (m.thread.joinable()) m.thread.join();
  m.outbox->give_back_relay_turn();  // a standing-by relay takes it at its next renewal
  if (impl_->lender) {
    detail::SubscriberConnection::detach(*impl_->lender, impl_->link.get());
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->lent_up = false;
  }
  impl_->figures.stopped(Relay::Impl::Clock::now());
  detail::release_client_id_lock(&impl_->client_lock_fd, impl_->client_lock_path);
  return Status::Ok();
}

void Relay::notify() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->woken = true;
  impl_->wake.notify_all();
}

bool Relay::is_connected() const { return impl_->connected.load(); }

ConnectionHealth Relay::health() const {
  return impl_->lender ? impl_->lender->health() : impl_->conn->snapshot();
}

RelayCounters Relay::counters() const { return impl_->snapshot(); }

}  // namespace mqtt_inbox

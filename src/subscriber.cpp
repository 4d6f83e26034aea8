// The MQTT layer: the session, the connection loop and the message callback. Paho C++ is
// included only in src/subscriber*.cpp: TLS settings in subscriber_tls.cpp, the probe
// handshake in subscriber_probe.cpp, health() and failure reports in
// subscriber_health.cpp, refusals and passwords in subscriber_auth.cpp.
#include "mqtt_inbox/subscriber.h"

#include <mqtt/async_client.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "log.h"
#include "subscriber_health.h"
#include "subscriber_probe.h"
#include "subscriber_tls.h"

namespace mqtt_inbox {

bool topic_matches(const std::string& filter_in, const std::string& topic) {
  std::string filter = filter_in;
  if (filter.rfind("$share/", 0) == 0) {  // $share/{group}/{filter}, MQTT 5.0 4.8.2
    const size_t slash = filter.find('/', 7);
    if (slash == std::string::npos) return false;
    filter = filter.substr(slash + 1);
  }
  if (!topic.empty() && topic[0] == '$' && !filter.empty() && (filter[0] == '+' || filter[0] == '#'))
    return false;  // MQTT 3.1.1 section 4.7.2
  size_t f = 0, t = 0;
  for (;;) {
    const size_t fe = filter.find('/', f);
    const std::string level = filter.substr(f, fe == std::string::npos ? std::string::npos : fe - f);
    if (level == "#") return true;  // matches the parent level too ("a/#" matches "a")
    if (t > topic.size()) return false;
    const size_t te = topic.find('/', t);
    const std::string tlevel = topic.substr(t, te == std::string::npos ? std::string::npos : te - t);
    if (level != "+" && level != tlevel) return false;
    if (fe == std::string::npos) return te == std::string::npos;
    if (te == std::string::npos) {
      // Topic ended; only a trailing "#" level can still match.
      return filter.compare(fe + 1, std::string::npos, "#") == 0;
    }
    f = fe + 1;
    t = te + 1;
  }
}

namespace {

Message to_message(const mqtt::message& pm) {
  Message m;
  m.topic = pm.get_topic();
  m.payload = pm.get_payload();
  m.qos = pm.get_qos();
  m.dup = pm.is_duplicate();
  const mqtt::properties& props = pm.get_properties();
  if (props.size() == 0) return m;
  const size_t n = props.count(mqtt::property::USER_PROPERTY);
  for (size_t i = 0; i < n; ++i) {
    auto pair = mqtt::get<mqtt::string_pair>(props, mqtt::property::USER_PROPERTY, i);
    m.user_properties.emplace_back(std::get<0>(pair), std::get<1>(pair));
  }
  if (props.contains(mqtt::property::CONTENT_TYPE))
    m.content_type = mqtt::get<std::string>(props, mqtt::property::CONTENT_TYPE);
  if (props.contains(mqtt::property::RESPONSE_TOPIC))
    m.response_topic = mqtt::get<std::string>(props, mqtt::property::RESPONSE_TOPIC);
  if (props.contains(mqtt::property::CORRELATION_DATA))
    m.correlation_data = mqtt::get<std::string>(props, mqtt::property::CORRELATION_DATA);
  if (props.contains(mqtt::property::PAYLOAD_FORMAT_INDICATOR))
    m.payload_format_indicator =
        mqtt::get<uint8_t>(props, mqtt::property::PAYLOAD_FORMAT_INDICATOR);
  if (props.contains(mqtt::property::MESSAGE_EXPIRY_INTERVAL))
    m.message_expiry_interval_s =
        mqtt::get<uint32_t>(props, mqtt::property::MESSAGE_EXPIRY_INTERVAL);
  return m;
}

}  // namespace

struct Subscriber::Impl {
  SubscriberOptions options;
  detail::BrokerAddress address;  // parsed broker_uri
  std::shared_ptr<spdlog::logger> log;
  std::vector<std::pair<std::string, MessageSink*>> routes;
  std::unique_ptr<mqtt::async_client> client;

  std::mutex mu;  // guards the fields below and pairs with cv; never held across Paho calls
  std::condition_variable cv;
  bool started = false;
  bool stopping = false;
  bool connection_lost = false;
  std::thread supervisor;

  int client_lock_fd = -1;
  std::atomic<bool> connected{false};
  std::atomic<int> in_callback{0};
  std::atomic<int64_t> received{0}, connect_count{0}, lost_sessions{0};

  // health() and the reports of failed attempts (subscriber_health.h).
  std::unique_ptr<detail::ConnectionHealth> conn;

  // Paho's message callback: runs on Paho's receive thread with Paho's lock held, and the
  // PUBACK leaves when it returns. So: return only after the consumer has a durable outcome.
  void on_message(const mqtt::const_message_ptr& pm) {
    in_callback.fetch_add(1);
    try {
      ++received;
      const Message m = to_message(*pm);
      MessageSink* target = nullptr;
      for (const auto& r : routes)
        if (topic_matches(r.first, m.topic)) {
          target = r.second;
          break;
        }
      if (target) {
        target->handle(m);
      } else {
        // The persistent session can hold subscriptions from an earlier configuration.
        // Neither drop it silently nor run a handler meant for another topic: record it
        // as a dead letter of the first sink, then ack.
        const std::string why = "topic '" + detail::printable(m.topic) +
                                "' matches no subscription of this client (a stale "
                                "subscription kept by the persistent session?); not processed";
        log->error("{}", why);
        routes.front().second->reject(m, why);
      }
    } catch (const std::exception& e) {
      // Consumer::handle never throws; reaching here means the library itself failed (e.g.
      // out of memory) before the message had a durable outcome. Returning would send the
      // PUBACK for an unrecorded message, so end the process: the broker redelivers.
      log->critical("internal failure in the message callback: {}; aborting so the message "
                    "is not acked",
                    e.what());
      log->flush();
      std::abort();
    } catch (...) {
      log->critical("internal failure in the message callback; aborting so the message is "
                    "not acked");
      log->flush();
      std::abort();
    }
    in_callback.fetch_sub(1);
  }

  // Paho's TLS settings, set once in start() and kept for the client's lifetime: the CA
  // folder of every copy points here (Paho C++ 1.2.0 bug #337, see to_paho_ssl_options).
  mqtt::ssl_options paho_ssl;

  // Built once and kept for the client's lifetime. Paho C++ 1.2.0 copies connect_options
  // without re-pointing the C struct at the copy's properties, so the copy passed to
  // connect() points at *these* properties, which must outlive every connect().
  mqtt::connect_options conn_opts;

  mqtt::connect_options make_connect_options() const {
    mqtt::connect_options_builder b;
    if (options.mqtt_version == MqttVersion::kV5) {
      b.mqtt_version(MQTTVERSION_5);
      b.clean_start(false);
    } else {
      b.mqtt_version(MQTTVERSION_3_1_1);
      b.clean_session(false);
    }
    b.keep_alive_interval(std::chrono::seconds(options.keep_alive_s));
    b.connect_timeout(std::chrono::milliseconds(options.connect_timeout_ms));
    b.automatic_reconnect(false);  // ours: we need CONNACK's session-present flag
    if (!options.username.empty()) b.user_name(options.username);
    if (!options.password.empty()) b.password(options.password);
    return b.finalize();
  }

  // Before each CONNECT: the insecure warnings, the password, and the tls.version check.
  bool prepare_attempt() {
    conn->begin_attempt();
    const TlsOptions& tls = options.tls;
    if (address.tls && tls.insecure_skip_certificate_check)
      log->warn("INSECURE: the certificate of {} is not verified "
                "(tls.insecure_skip_certificate_check): anyone on the network path can read "
                "and change this connection",
                address.host_port());
    else if (address.tls && tls.insecure_skip_hostname_check)
      log->warn("INSECURE: the host name of {} is not checked against its certificate "
                "(tls.insecure_skip_hostname_check, --insecure): any certificate from a "
                "trusted CA is accepted for it",
                address.host_port());
    if (options.password_provider) {
      std::string pw;
      Status s;
      try {
        s = options.password_provider(&pw);
      } catch (...) {
        s = Status::Internal("the password provider threw an exception");
      }
      if (!s.ok()) {
        conn->fail(SubscriberHealth::Failure::kCredentials, "password provider: " + s.to_string());
        return false;
      }
      conn->remember_secret(pw);
      conn_opts.set_password(pw);
    }
    if (address.tls && tls.version != TlsVersion::kDefault) {
      const detail::ProbeResult p = detail::probe(address, tls, options.connect_timeout_ms);
      if (!p.ok) {
        conn->fail(p.failure, p.reason + " (in the check of tls.version before connecting)");
        return false;
      }
      log->debug("{} negotiated {} in the check of tls.version", address.host_port(), p.tls_version);
    }
    return true;
  }

  struct ConnectOutcome {
    bool connected = false;
    bool session_present = false;
    int rc = 0;           // Paho's code: < 0 an error of its own, > 0 a CONNACK refusal
    std::string message;  // Paho's text for rc
  };

  // Waits until Paho has ended the connection attempt `tok`, successful or not. It does
  // not give up earlier: see the note on Paho C++ bug #325 where it is called.
  ConnectOutcome await_connect(const mqtt::token_ptr& tok) {
    ConnectOutcome o;
    for (;;) {
      try {
        if (tok->wait_for(std::chrono::milliseconds(options.connect_timeout_ms + 1000))) {
          o.connected = true;
          o.session_present = tok->get_connect_response().is_session_present();
          return o;
        }
      } catch (const mqtt::exception& e) {
        o.rc = e.get_return_code();
        o.message = e.get_message();
        return o;
      }
      log->warn("connect to {}: Paho has not ended the attempt after {} ms; waiting for its "
                "connect timeout",
                options.broker_uri, options.connect_timeout_ms + 1000);
    }
  }

  // One connection attempt: CONNECT, then SUBSCRIBE if the broker has no session for us.
  bool connect_once() {
    try {
      if (!prepare_attempt()) return false;
      ConnectOutcome outcome;
      try {
        // Paho C++ 1.2.0 bug #325 (fixed in 1.3.0 by caching the options in the client):
        // connect() takes the options by value and gives Paho C a pointer into that copy
        // as the context of the SSL error callback, which Paho C calls during the TLS
        // handshake, after connect() has returned. The copy is destroyed at the end of
        // the full expression that contains the call (GCC and Clang, Itanium C++ ABI;
        // C++17 [expr.call]/4 leaves it to the implementation), so the wait for the end
        // of the attempt happens inside the same expression: the callback's context is
        // alive whenever Paho C can call it. Paho C takes a fresh copy at each connect.
        outcome = await_connect(client->connect(conn_opts));
      } catch (const mqtt::exception& e) {  // MQTTAsync_connect refused at once
        outcome.rc = e.get_return_code();
        outcome.message = e.get_message();
      }
      if (!outcome.connected) {
        conn->connect_failed(outcome.rc, outcome.message);
        return false;
      }
      const bool session_present = outcome.session_present;
      const int64_t n = ++connect_count;
      {
        if (!session_present && n > 1) {
          ++lost_sessions;
          log->warn("broker {} reports no session for client '{}' on reconnect: messages "
                    "published while disconnected may have been missed (session expired or "
                    "broker without persistence); subscribing again",
                    options.broker_uri, options.client_id);
        } else if (!session_present) {
          log->info("broker {} has no session for client '{}' (first connection, or the "
                    "session expired); subscribing",
                    options.broker_uri, options.client_id);
        } else {
          log->info("connected to {} with session present (client '{}')", options.broker_uri,
                    options.client_id);
        }
        // Subscribe on every CONNACK, session or not: the configured filters may have
        // changed since the session was made (a SUBSCRIBE for an existing filter replaces
        // it and keeps its queue, MQTT 3.1.1 section 3.8.4).
        for (const auto& r : routes) {
          mqtt::token_ptr st = client->subscribe(r.first, 1);
          if (!st->wait_for(std::chrono::milliseconds(options.connect_timeout_ms))) {
            log->warn("subscribe to '{}' timed out", r.first);
            client->disconnect();
            return false;
          }
          const auto codes = st->get_subscribe_response().get_reason_codes();
          // The granted QoS (or a failure code >= 0x80). QoS 0 means no redelivery: as
          // bad as a refusal for an inbox (e.g. a broker max_qos or an ACL).
          if (!codes.empty() && (codes.front() >= 0x80 || codes.front() < 1)) {
            log->error("broker did not grant QoS 1 for subscription '{}' (reason code {}); "
                       "without QoS 1 nothing is redelivered",
                       r.first, static_cast<int>(codes.front()));
            client->disconnect();
            return false;
          }
        }
      }
      return true;
    } catch (const mqtt::exception& e) {
      conn->fail(SubscriberHealth::Failure::kSubscribe,
                 std::string("connected, then Paho failed: ") + e.what());
      return false;
    }
  }

  void supervise() {
    int backoff = options.reconnect_backoff_initial_ms;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (stopping) return;
      }
      {
        // Cleared before connecting: a loss reported while connect_once() runs must wake
        // the wait below, not be forgotten.
        std::lock_guard<std::mutex> lock(mu);
        connection_lost = false;
      }
      if (connect_once()) {
        const auto since = std::chrono::steady_clock::now();
        conn->set_connected(true);
        {
          std::unique_lock<std::mutex> lock(mu);
          connected = true;
          cv.notify_all();
          cv.wait(lock, [&] { return stopping || connection_lost; });
          connected = false;
        }
        conn->set_connected(false);
        {
          std::unique_lock<std::mutex> lock(mu);
          if (stopping) return;
        }
        const auto lived = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - since)
                               .count();
        if (lived >= options.unstable_connection_ms) {
          backoff = options.reconnect_backoff_initial_ms;
          continue;  // a stable connection was lost: reconnect at once
        }
        log->warn("connection lost {} ms after it was made; backing off {} ms before "
                  "reconnecting (is another client using client id '{}'?)",
                  lived, backoff, options.client_id);
      } else if (!conn->attempt_failed()) {
        conn->fail(SubscriberHealth::Failure::kSubscribe,
                   "connected, but subscribing failed (see the log above)");
      }
      // A refused CONNECT will not be accepted sooner for asking again: wait the longest.
      const int wait_ms = conn->attempt_refused() ? options.reconnect_backoff_max_ms : backoff;
      if (conn->attempt_failed()) log->info("next connection attempt in {} ms", wait_ms);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return stopping; });
      backoff = std::min(backoff * 2, options.reconnect_backoff_max_ms);
    }
  }
};

Subscriber::Subscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Subscriber::~Subscriber() {
  if (!stop().ok()) {
    // The callback is still blocked on the store: destroying the client would hang.
    (void)impl_->client.release();
    return;  // and the client-id lock stays held while that client lives
  }
  if (impl_->client_lock_fd >= 0) ::close(impl_->client_lock_fd);
}

namespace {

// Paho C sends the PUBACK after the message callback returns only from 1.3.10 on (its
// change "ack after processing incoming message"); older versions ack before the
// callback runs, which voids the guarantee.
Status check_paho_version() {
  for (MQTTAsync_nameValue* nv = MQTTAsync_getVersionInfo(); nv && nv->name; ++nv) {
    if (std::strcmp(nv->name, "Version") != 0 && std::strcmp(nv->name, "Product version") != 0)
      continue;
    int major = 0, minor = 0, patch = 0;
    if (std::sscanf(nv->value, "%d.%d.%d", &major, &minor, &patch) >= 2) {
      if (std::make_tuple(major, minor, patch) < std::make_tuple(1, 3, 10))
        return Status::InvalidArgument(std::string("Paho MQTT C ") + nv->value +
                                       " acknowledges QoS 1 messages before the message "
                                       "callback runs; mqtt-inbox needs 1.3.10 or later");
      return Status::Ok();
    }
  }
  return Status::Ok();  // no version reported: nothing to check against
}

}  // namespace

Status Subscriber::create(const SubscriberOptions& options, std::unique_ptr<Subscriber>* out) {
  if (Status s = check_paho_version(); !s.ok()) return s;
  if (options.broker_uri.empty()) return Status::InvalidArgument("broker_uri is empty");
  if (options.client_id.empty())
    return Status::InvalidArgument(
        "client_id is empty: the broker keeps the session (and the unacknowledged messages) "
        "under a stable client id");
  if (options.clean_session)
    return Status::InvalidArgument(
        "clean_session/clean_start=true would void redelivery: the broker would discard "
        "unacknowledged messages on reconnect (MQTT 3.1.1 section 3.1.2.4)");
  if (options.mqtt_version == MqttVersion::kV5 && options.session_expiry_s == 0)
    return Status::InvalidArgument(
        "session_expiry_s=0 would void redelivery: with MQTT 5 the session ends at "
        "disconnect and unacknowledged messages are lost (MQTT 5.0 section 3.1.2.11.2)");
  if (options.keep_alive_s <= 0 || options.keep_alive_s > 65535)
    return Status::InvalidArgument("keep_alive_s must be 1..65535");
  if (options.connect_timeout_ms <= 0 || options.reconnect_backoff_initial_ms <= 0 ||
      options.reconnect_backoff_max_ms < options.reconnect_backoff_initial_ms ||
      options.stop_timeout_ms < 0)
    return Status::InvalidArgument("timeouts must be > 0 and backoff initial <= max");
  detail::BrokerAddress address;
  if (Status s = detail::parse_broker_uri(options.broker_uri, &address); !s.ok()) return s;
  if (Status s = check_tls_options(options.broker_uri, options.tls); !s.ok()) return s;
  if (!options.password.empty() && options.password_provider)
    return Status::InvalidArgument("both password and password_provider are set; give one");
  if (options.mqtt_version == MqttVersion::kV3_1_1 && options.username.empty() &&
      (!options.password.empty() || options.password_provider))
    return Status::InvalidArgument(
        "a password without a user name is not allowed in MQTT 3.1.1 (section 3.1.2.9); set "
        "username, or use MQTT 5");

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->address = address;
  impl->log = detail::logger_or_default(options.logger);
  impl->conn = std::make_unique<detail::ConnectionHealth>(impl->options, address, impl->log);
  try {
    mqtt::create_options co(options.mqtt_version == MqttVersion::kV5 ? MQTTVERSION_5
                                                                     : MQTTVERSION_3_1_1);
    // No client-side persistence: inbound QoS 1 state lives on the broker, and the
    // inbox's SQLite file is the only local record that matters.
    impl->client = std::make_unique<mqtt::async_client>(options.broker_uri, options.client_id,
                                                        co, nullptr);
  } catch (const mqtt::exception& e) {
    return Status::InvalidArgument(std::string("cannot create MQTT client: ") + e.what());
  }
  out->reset(new Subscriber(std::move(impl)));
  return Status::Ok();
}

Status Subscriber::subscribe(const std::string& topic_filter, MessageSink* consumer) {
  if (!consumer) return Status::InvalidArgument("sink is null");
  if (topic_filter.empty()) return Status::InvalidArgument("topic filter is empty");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->started) return Status::InvalidArgument("subscribe() must be called before start()");
  for (const auto& r : impl_->routes)
    if (r.first == topic_filter)
      return Status::InvalidArgument("topic filter '" + topic_filter + "' already has a consumer");
  impl_->routes.emplace_back(topic_filter, consumer);
  return Status::Ok();
}

Status Subscriber::start() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.started) return Status::InvalidArgument("already started");
    if (m.routes.empty()) return Status::InvalidArgument("no subscriptions: call subscribe() first");
    if (!m.options.client_id_lock_dir.empty()) {
      std::string name;  // the client id, made safe for a file name
      for (unsigned char c : m.options.client_id) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
          name.push_back(static_cast<char>(c));
        } else {
          char hex[4];
          std::snprintf(hex, sizeof hex, "%%%02x", c);
          name += hex;
        }
      }
      const std::string path = m.options.client_id_lock_dir + "/mqtt-inbox-client-" + name + ".lock";
      m.client_lock_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (m.client_lock_fd < 0)
        return Status(Status::Code::kIoError, "cannot open " + path + ": " + std::strerror(errno));
      if (::flock(m.client_lock_fd, LOCK_EX | LOCK_NB) != 0) {
        ::close(m.client_lock_fd);
        m.client_lock_fd = -1;
        return Status(Status::Code::kBusy,
                      "client id '" + m.options.client_id + "' is in use by another process on "
                      "this host (" + path + " is locked); two clients with one id take the "
                      "session from each other");
      }
    }
    m.started = true;
  }
  // Everything that handles messages is in place before the first CONNECT, because
  // redeliveries arrive right after CONNACK.
  m.client->set_message_callback([&m](mqtt::const_message_ptr pm) { m.on_message(pm); });
  m.client->set_connection_lost_handler([&m](const std::string& cause) {
    m.log->warn("connection to {} lost: {}", m.options.broker_uri,
                cause.empty() ? "no reason given" : cause);
    std::lock_guard<std::mutex> lock(m.mu);
    m.connection_lost = true;
    m.cv.notify_all();
  });
  m.client->set_disconnected_handler([&m](const mqtt::properties&, mqtt::ReasonCode rc) {
    if (rc == mqtt::ReasonCode::SESSION_TAKEN_OVER)
      m.log->error("broker {} disconnected us: session taken over by another client with "
                   "client id '{}' (MQTT 5 reason code 0x8E)",
                   m.options.broker_uri, m.options.client_id);
    else
      m.log->warn("broker {} disconnected us (reason code {})", m.options.broker_uri,
                  static_cast<int>(rc));
    std::lock_guard<std::mutex> lock(m.mu);
    m.connection_lost = true;
    m.cv.notify_all();
  });
  m.conn_opts = m.make_connect_options();
  if (m.address.tls) {
    m.log->info("TLS to {}: {}", m.address.host_port(), detail::describe_tls(m.options.tls));
    to_paho_ssl_options(m.options.tls, &m.paho_ssl);
    m.paho_ssl.set_error_handler([&m](const std::string& line) { m.conn->on_ssl_error(line); });
    // Set on the member itself, after make_connect_options (see paho_ssl and conn_opts).
    m.conn_opts.set_ssl(m.paho_ssl);
  } else if (!m.options.password.empty() || m.options.password_provider) {
    m.log->warn("the password for {} travels in clear text ({}://): anyone on the network "
                "path can read it; use ssl:// or mqtts://",
                m.address.host_port(), m.address.scheme);
  }
  m.conn->started();
  if (m.options.mqtt_version == MqttVersion::kV5) {
    // Set on the member itself, not through the builder (see conn_opts).
    m.conn_opts.set_properties({{mqtt::property::SESSION_EXPIRY_INTERVAL,
                                 static_cast<int>(m.options.session_expiry_s)}});
  }
  m.supervisor = std::thread([&m] { m.supervise(); });
  return Status::Ok();
}

bool Subscriber::wait_connected(int timeout_ms) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                            [&] { return impl_->connected.load() || impl_->stopping; }) &&
         impl_->connected.load();
}

bool Subscriber::is_connected() const { return impl_->connected.load(); }

Status Subscriber::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.started || m.stopping) {
      m.stopping = true;
      return m.in_callback.load() == 0 ? Status::Ok()
                                       : Status(Status::Code::kBusy, "message still in callback");
    }
    m.stopping = true;
    m.cv.notify_all();
  }
  if (m.supervisor.joinable()) m.supervisor.join();

  // Wait for a message in the callback to reach its durable outcome.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(m.options.stop_timeout_ms);
  while (m.in_callback.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (m.in_callback.load() > 0) {
    m.log->error("stop: a message is still waiting for the store after {} ms; it will not be "
                 "acked before it commits. Exit the process; the broker redelivers it.",
                 m.options.stop_timeout_ms);
    return Status(Status::Code::kBusy, "a message is still waiting for the store");
  }
  try {
    if (m.client->is_connected())
      m.client->disconnect()->wait_for(std::chrono::milliseconds(m.options.stop_timeout_ms));
  } catch (const mqtt::exception& e) {
    m.log->info("disconnect: {}", e.what());
  }
  m.connected = false;
  return Status::Ok();
}

SubscriberHealth Subscriber::health() const { return impl_->conn->snapshot(); }

int64_t Subscriber::messages_received() const { return impl_->received.load(); }
int64_t Subscriber::connects() const { return impl_->connect_count.load(); }
int64_t Subscriber::sessions_lost() const { return impl_->lost_sessions.load(); }

}  // namespace mqtt_inbox

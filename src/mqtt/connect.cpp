// How every client of the library connects to a broker (mqtt/connect.h): the
// Subscriber's and the outbox Relay's connections are made here, the same way.
#include "mqtt/connect.h"

#include <openssl/opensslv.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "mqtt/probe.h"

namespace mqtt_inbox::detail {

void paho_process_setup() {
#if OPENSSL_VERSION_NUMBER >= 0x10100000L
  // Paho C initialises OpenSSL at its first client, for OpenSSL before 1.1: it loads
  // every error string, every algorithm and the configuration file, also for a tcp://
  // broker (about 90 KiB of heap and 1.4 MiB of mapped pages that stay resident; the
  // idle C consumer's footprint, docs/packaging.md#footprint). OpenSSL 1.1 and later
  // initialise themselves when first used, and a TLS connection loads the error strings
  // the library reports (check_tls_options, tls.cpp).
  MQTTAsync_init_options init = MQTTAsync_init_options_initializer;
  init.do_openssl_init = 0;
  MQTTAsync_global_init(&init);
#endif
  // Either variable is the user asking Paho for its trace: MQTT_C_CLIENT_TRACE names a
  // destination, MQTT_C_CLIENT_TRACE_LEVEL alone selects what a trace callback gets.
  for (const char* name : {"MQTT_C_CLIENT_TRACE", "MQTT_C_CLIENT_TRACE_LEVEL"}) {
    const char* asked = std::getenv(name);
    if (asked != nullptr && *asked != '\0') return;
  }
  MQTTAsync_setTraceLevel(MQTTASYNC_TRACE_ERROR);
}

namespace {
// Done while this library is loaded (before main, or in dlopen), when no Paho client can
// exist yet: MQTTAsync_global_init re-initialises Paho C's global mutexes
// (MQTTAsync_init), which is undefined behaviour once any client's threads use them. It
// used to run at the library's first client, and ThreadSanitizer caught it racing with a
// client the process had made itself before (PgRelay in pg_outbox_test: its watcher's
// receive thread held the mutex being initialised).
[[maybe_unused]] const bool paho_set_up = (paho_process_setup(), true);
}  // namespace

std::shared_ptr<mqtt::async_client> make_paho_client(const ConnectionOptions& o, int max_buffered) {
  mqtt::create_options co(o.mqtt_version == MqttVersion::kV5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1,
                          max_buffered);
  co.set_send_while_disconnected(false);
  return std::make_shared<mqtt::async_client>(o.broker_uri, o.client_id, co, nullptr);
}

Status check_connection_settings(const ConnectionOptions& o, BrokerAddress* address) {
  if (o.broker_uri.empty()) return Status::InvalidArgument("broker_uri is empty");
  if (Status s = parse_broker_uri(o.broker_uri, address); !s.ok()) return s;
  if (o.keep_alive_s <= 0 || o.keep_alive_s > 65535)
    return Status::InvalidArgument("keep_alive_s must be 1..65535 (MQTT 3.1.1 section 3.1.2.10)");
  if (o.connect_timeout_ms <= 0 || o.reconnect_backoff_initial_ms <= 0 ||
      o.reconnect_backoff_max_ms < o.reconnect_backoff_initial_ms)
    return Status::InvalidArgument(
        "connect_timeout_ms and reconnect_backoff_initial_ms must be > 0 and "
        "reconnect_backoff_max_ms >= reconnect_backoff_initial_ms");
  if (Status s = check_tls_options(o.broker_uri, o.tls); !s.ok()) return s;
  if (!o.password.empty() && o.password_provider)
    return Status::InvalidArgument("both password and password_provider are set; give one");
  if (o.mqtt_version == MqttVersion::kV3_1_1 && o.username.empty() &&
      (!o.password.empty() || o.password_provider))
    return Status::InvalidArgument(
        "a password without a user name is not allowed in MQTT 3.1.1 (section 3.1.2.9); set "
        "username, or use MQTT 5");
  return Status::Ok();
}

mqtt::connect_options_builder connect_options_builder(const ConnectionOptions& o, bool clean) {
  mqtt::connect_options_builder b;
  if (o.mqtt_version == MqttVersion::kV5) {
    b.mqtt_version(MQTTVERSION_5);
    b.clean_start(clean);
  } else {
    b.mqtt_version(MQTTVERSION_3_1_1);
    b.clean_session(clean);
  }
  b.keep_alive_interval(std::chrono::seconds(o.keep_alive_s));
  b.connect_timeout(std::chrono::milliseconds(o.connect_timeout_ms));
  b.automatic_reconnect(false);  // each client reconnects itself
  if (!o.username.empty()) b.user_name(o.username);
  if (!o.password.empty()) b.password(o.password);
  return b;
}

void set_up_tls(const ConnectionOptions& o, const BrokerAddress& address, HealthRecorder* health,
                spdlog::logger& log, mqtt::ssl_options* ssl, mqtt::connect_options* opts) {
  if (address.tls) {
    log.info("TLS to {}: {}", address.host_port(), describe_tls(o.tls));
    to_paho_ssl_options(o.tls, ssl);
    ssl->set_error_handler([health](const std::string& line) { health->on_ssl_error(line); });
    // Set on the caller's member itself, after the builder (see to_paho_ssl_options).
    opts->set_ssl(*ssl);
  } else if (!o.password.empty() || o.password_provider) {
    log.warn(
        "the password for {} travels in clear text ({}://): anyone on the network path "
        "can read it; use ssl:// or mqtts://",
        address.host_port(), address.scheme);
  }
}

bool prepare_attempt(const ConnectionOptions& o, const BrokerAddress& address,
                     HealthRecorder* health, spdlog::logger& log, mqtt::connect_options* opts) {
  health->begin_attempt();
  const TlsOptions& tls = o.tls;
  if (address.tls && tls.insecure_skip_certificate_check)
    log.warn(
        "INSECURE: the certificate of {} is not verified "
        "(tls.insecure_skip_certificate_check): anyone on the network path can read "
        "and change this connection",
        address.host_port());
  else if (address.tls && tls.insecure_skip_hostname_check)
    log.warn(
        "INSECURE: the host name of {} is not checked against its certificate "
        "(tls.insecure_skip_hostname_check, --insecure): any certificate from a "
        "trusted CA is accepted for it",
        address.host_port());
  if (o.password_provider) {
    std::string pw;
    Status s;
    try {
      s = o.password_provider(&pw);
    } catch (...) {
      s = Status::Internal("the password provider threw an exception");
    }
    if (!s.ok()) {
      health->fail(ConnectionHealth::Failure::kCredentials, "password provider: " + s.to_string());
      return false;
    }
    health->remember_secret(pw);
    opts->set_password(pw);
  }
  if (address.tls && tls.version != TlsVersion::kDefault) {
    const ProbeResult p = probe(address, tls, o.connect_timeout_ms);
    if (!p.ok) {
      health->fail(p.failure, p.reason + " (in the check of tls.version before connecting)");
      return false;
    }
    log.debug("{} negotiated {} in the check of tls.version", address.host_port(), p.tls_version);
  }
  return true;
}

namespace {

// Waits until Paho has ended the connection attempt `tok`, successful or not.
ConnectOutcome await_connect(const mqtt::token_ptr& tok, const ConnectionOptions& o,
                             spdlog::logger& log) {
  ConnectOutcome out;
  for (;;) {
    try {
      if (tok->wait_for(std::chrono::milliseconds(o.connect_timeout_ms + 1000))) {
        const mqtt::connect_response r = tok->get_connect_response();
        out.connected = true;
        out.session_present = r.is_session_present();
        out.properties = r.get_properties();
        return out;
      }
    } catch (const mqtt::exception& e) {
      out.rc = e.get_return_code();
      out.message = e.get_message();
      return out;
    }
    log.warn(
        "connect to {}: Paho has not ended the attempt after {} ms; waiting for its "
        "connect timeout",
        o.broker_uri, o.connect_timeout_ms + 1000);
  }
}

}  // namespace

ConnectOutcome connect_and_wait(mqtt::async_client& client, const mqtt::connect_options& opts,
                                const ConnectionOptions& o, spdlog::logger& log) {
  try {
    // Paho C++ 1.2.0 bug #325 (fixed in 1.3.0 by caching the options in the client):
    // connect() takes the options by value and gives Paho C a pointer into that copy as
    // the context of the SSL error callback, which Paho C calls during the TLS handshake,
    // after connect() has returned. The copy is destroyed at the end of the full
    // expression that contains the call (GCC and Clang, Itanium C++ ABI; C++17
    // [expr.call]/4 leaves it to the implementation), so the wait for the end of the
    // attempt happens inside the same expression: the callback's context is alive
    // whenever Paho C can call it. Paho C takes a fresh copy at each connect.
    return await_connect(client.connect(opts), o, log);
  } catch (const mqtt::exception& e) {  // MQTTAsync_connect refused at once
    ConnectOutcome out;
    out.rc = e.get_return_code();
    out.message = e.get_message();
    return out;
  }
}

}  // namespace mqtt_inbox::detail

// Internal (MQTT layer): how every client of the library connects to a broker, the
// Subscriber and the outbox Relay alike, so that they connect the same way: the checks of
// the connection settings, Paho's connect options built from them (user name, password,
// TLS as tls.h promises), the steps before each CONNECT (the INSECURE warnings, the
// password provider, the tls.version check), and the CONNECT itself with the report of a
// failed one (HealthRecorder: CONNACK refusals named, OpenSSL's reasons, secrets
// redacted).
//
// The settings are a ConnectionOptions (connection.h), the base of SubscriberOptions and
// RelayOptions: one definition of the connection fields, read here for both.
#pragma once

#include <mqtt/async_client.h>

#include <memory>
#include <string>

#include "mqtt/connection_health.h"
#include "mqtt/tls.h"
#include "mqtt_inbox/status.h"
#include "mqtt_inbox/subscriber.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox::detail {

// The checks create() makes on the connection settings: the URI (parsed into *address),
// keep_alive_s 1..65535, connect_timeout_ms > 0, the backoff > 0 with max >= initial, the
// TLS settings (check_tls_options), password and password_provider not both set, no
// password without a user name on MQTT 3.1.1 (section 3.1.2.9). client_id is the caller's
// to check (its rules differ: a Subscriber's keeps a session). Errors: kInvalidArgument with the
// reason; never a secret.
Status check_connection_settings(const ConnectionOptions& settings, BrokerAddress* address);

// The connect options every client starts from: the MQTT version, clean session/start as
// `clean` says, keep-alive, connect timeout, Paho's automatic reconnect off (each client
// reconnects itself), the user name and a fixed password. Add what is the client's own,
// then finalize(); then set_up_tls() on the result.
mqtt::connect_options_builder connect_options_builder(const ConnectionOptions& settings,
                                                      bool clean);

// TLS for a TLS URI: logs what the broker is checked against (describe_tls), fills `*ssl`
// (to_paho_ssl_options) with an SSL error handler that hands OpenSSL's reasons to
// `health`, and sets it on `*opts`. `*ssl` and `health` must outlive every connect made
// with `*opts` (Paho C++ 1.2.0 bug #337). For a plaintext URI with a password: a warning
// that it travels in clear text.
void set_up_tls(const ConnectionOptions& settings, const BrokerAddress& address,
                HealthRecorder* health, spdlog::logger& log, mqtt::ssl_options* ssl,
                mqtt::connect_options* opts);

// Before each CONNECT: counts the attempt, logs the INSECURE warnings, asks the password
// provider (the password goes into *opts), and checks tls.version with a handshake of the
// library's own. false: the attempt failed, already reported through `health`.
bool prepare_attempt(const ConnectionOptions& settings, const BrokerAddress& address,
                     HealthRecorder* health, spdlog::logger& log, mqtt::connect_options* opts);

struct ConnectOutcome {
  bool connected = false;
  bool session_present = false;
  mqtt::properties properties;  // the CONNACK's (MQTT 5)
  int rc = 0;                   // Paho's code: < 0 an error of its own, > 0 a CONNACK refusal
  std::string message;          // Paho's text for rc
};

// A new Paho client for `settings` (broker_uri, client_id, mqtt_version), the one way the
// library makes them. No client-side persistence: inbound QoS 1 state lives on the broker
// until the PUBACK (MQTT 5.0 section 4.4), and the inbox's and the outbox's tables are the
// only local record that matters. Sending while disconnected is off (the create_options
// constructor that sets the buffer turns it on): a publish between a drop and its
// owner hearing of it fails instead of waiting in Paho for the next connection.
// `max_buffered`: Paho refuses a publish beyond it (MQTTASYNC_MAX_BUFFERED_MESSAGES, 100
// by default) even while connected. Throws mqtt::exception.
std::shared_ptr<mqtt::async_client> make_paho_client(const ConnectionOptions& settings,
                                                     int max_buffered);

// Paho C records a trace entry for every function entry and exit and every packet in an
// in-memory ring of 400 entries at its default level, TRACE_MINIMUM (Log.c,
// trace_settings): a mutex, a clock reading and a string copy each time, and a
// vsnprintf for each protocol line, about 24,000 instructions per QoS 1 message on the
// receive thread that holds the message and its PUBACK (docs/benchmarks.md, "Paho's trace
// ring"). Nothing reads that ring (Log_dumpTrace has no caller in Paho C 1.3.12); Paho
// prints it only when MQTT_C_CLIENT_TRACE names a destination, or hands it to a callback
// set with MQTTAsync_setTraceCallback. So, once per process, when the library is loaded
// (connect.cpp), before any Paho client can exist: the level goes to
// MQTTASYNC_TRACE_ERROR, unless MQTT_C_CLIENT_TRACE or MQTT_C_CLIENT_TRACE_LEVEL is set
// (then Paho's own settings stay as the user asked). Also tells Paho not to initialise
// OpenSSL, which initialises itself (docs/design.md, "Paho does not initialise OpenSSL").
// Calling it again once a client exists is undefined behaviour (it re-initialises Paho's
// global mutexes).
void paho_process_setup();

// CONNECT with `opts`, waiting until Paho ends the attempt (never earlier: Paho C++ 1.2.0
// bug #325, see the .cpp). A failed attempt is not reported here: pass rc and message
// to HealthRecorder::connect_failed, which names a refusal or finds the reason.
ConnectOutcome connect_and_wait(mqtt::async_client& client, const mqtt::connect_options& opts,
                                const ConnectionOptions& settings, spdlog::logger& log);

}  // namespace mqtt_inbox::detail

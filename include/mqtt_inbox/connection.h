// How a client of the library connects to an MQTT broker: the settings that the
// Subscriber (subscriber.h) and the outbox Relay (relay.h) share, with one definition and
// one set of checks, and the state of the connection that both report (ConnectionHealth:
// Subscriber::health(), Relay::health()). SubscriberOptions and RelayOptions derive from
// ConnectionOptions and add what is their own; both are connected by the same code
// (src/mqtt/connect.cpp), so a field means the same thing, is checked the same way and
// fails with the same message in either.
//
// Security by default: TLS verifies the broker's certificate chain and host name unless an
// INSECURE switch of tls.h says otherwise (then a warning at every connect); secrets
// (password, the provider's output, tls.key_password) never reach a log line, health(),
// counters or a Status message. Plain data: no thread safety of its own.
//
// Paho's trace, process-wide: when libmqtt_inbox is loaded (before main), it sets
// Paho C's trace level to MQTTASYNC_TRACE_ERROR (MQTTAsync_setTraceLevel). At Paho's
// default level every function entry and exit and every packet is written to an
// in-memory ring that nothing reads, about a sixth of the instructions a QoS 1 message
// costs on the receive thread (docs/benchmarks.md). Set MQTT_C_CLIENT_TRACE or
// MQTT_C_CLIENT_TRACE_LEVEL (Paho's own switches) to keep Paho's levels and get its
// trace; an application with its own MQTTAsync_setTraceCallback and no such variable
// sets its level itself, in main. The same load-time step tells Paho C not to initialise
// OpenSSL (MQTTAsync_global_init), which is safe only while no Paho client exists: an
// application that dlopen()s the library after making Paho clients of its own must not.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "mqtt_inbox/status.h"
#include "mqtt_inbox/tls.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox {

enum class MqttVersion { kV3_1_1, kV5 };

// Supplies the password for the next CONNECT: called on the client's connection thread
// before every connection attempt (never inside a Paho callback), so a token that expires
// (an Azure IoT Hub SAS token, a JWT) is renewed at each reconnect, and a password file is
// read again each time. Write the password into *password and return OK; a non-OK Status
// fails this attempt (its message is logged and shown in health(), so it must not contain
// the secret; ConnectionHealth::Failure::kCredentials) and the client retries after the
// usual backoff. Must be thread-safe with respect to the application, must not block for
// long (it delays the reconnect), and must not throw.
using PasswordProvider = std::function<Status(std::string* password)>;

// A PasswordProvider that reads `path` at every connect: the whole file, one trailing
// "\n" or "\r\n" removed. Errors name the file, never its content: kIoError if it cannot
// be read, kInvalidArgument if it is empty.
PasswordProvider password_from_file(const std::string& path);

// The connection settings. Checked by the create() of the client that takes them
// (Subscriber::create, Relay::create); every error is kInvalidArgument with the reason and
// never holds a secret.
struct ConnectionOptions {
  // Broker address, scheme://host[:port][/path]. Plaintext: tcp:// or mqtt:// (port 1883
  // by default), ws:// (WebSocket, 80). TLS: ssl:// or mqtts:// (8883), wss:// (443); see
  // `tls`. IPv6 hosts in brackets ("ssl://[::1]:8883"). Required. Other schemes are
  // refused.
  std::string broker_uri;
  // MQTT client id. Required. Two connections with one id push each other off the broker
  // (it closes the older one, MQTT 3.1.1 section 3.1.4): see client_id_lock_dir.
  std::string client_id;
  // The protocol version. Default: the deriving struct's (SubscriberOptions kV3_1_1,
  // RelayOptions kV5).
  MqttVersion mqtt_version = MqttVersion::kV3_1_1;
  // Keep-alive in seconds, 1..65535 (MQTT 3.1.1 section 3.1.2.10). Default 30. A callback
  // that blocks longer than 1.5 times this makes the broker drop the connection.
  int keep_alive_s = 30;
  // Timeout of one connection attempt, ms, > 0. Default 10000. It also bounds the
  // library's own TCP/TLS handshake that explains a failed attempt, and the check of
  // tls.version before each attempt, so one attempt can take up to about twice this.
  int connect_timeout_ms = 10000;
  // Reconnect backoff, ms: first wait, doubled each failure, capped; > 0, max >= initial.
  // Defaults 500, 30000. After a CONNACK refusal (bad credentials, not authorized,
  // banned, ...) the next attempt waits the maximum at once: asking again sooner does not
  // help, and brokers throttle or ban clients that retry refused connects in a loop.
  int reconnect_backoff_initial_ms = 500;
  int reconnect_backoff_max_ms = 30000;
  // User name of the CONNECT packet (MQTT 3.1.1 section 3.1.3.4); empty means none.
  // Not a secret: it is logged. Default "".
  std::string username;
  // Password of the CONNECT packet (MQTT 3.1.1 section 3.1.3.5). A secret: never logged.
  // MQTT 3.1.1 allows a password only together with a user name (section 3.1.2.9), so
  // create() refuses a password without one on 3.1.1. Prefer password_provider or a
  // password file (password_from_file) to a value compiled in or taken from the command
  // line, where `ps` shows it. Over a plaintext URI it travels in clear text; the client
  // logs a warning then. Default "" (none).
  std::string password;
  // Called before every CONNECT for the password (see PasswordProvider); its output is
  // handled as `password` is. Setting both `password` and `password_provider` is refused.
  // Default empty (none).
  PasswordProvider password_provider;
  // TLS settings, used with an ssl://, mqtts:// or wss:// broker_uri; any of them with a
  // plaintext URI is refused. Checked by create() with check_tls_options() (tls.h; files
  // read with OpenSSL, each error names its file). Default: verify the broker against the
  // system trust store and its host name; no client certificate.
  TlsOptions tls;
  // Folder for the client-id lock: start() takes an exclusive flock(2) on
  // "<dir>/mqtt-inbox-client-<id>.lock", so a second process on this host with the same
  // client id fails with kBusy instead of taking the connection over (the broker closes
  // the older connection whenever a client with the same id connects, MQTT 3.1.1 section
  // 3.1.4, and two such clients can push each other off forever). Default "auto", chosen
  // at start(): $RUNTIME_DIRECTORY (systemd sets it for a unit with RuntimeDirectory=; the
  // first folder if it lists several), else /run/mqtt-inbox if this process can write it,
  // else /tmp. Processes that pick different folders cannot see each other's lock, so run
  // a second instance beside a service as the service's user
  // (docs/operations.md#the-admin-tool-beside-the-running-service). "" disables the lock.
  // A clean stop() (and the destructor after one) removes the file; start() checks that
  // the file it locked is still the one at the path, so removing it can never let two
  // processes hold the lock at once. After a crash the file stays, unlocked, and the next
  // start() takes it.
  std::string client_id_lock_dir = "auto";
  // Logger; default nullptr = the "mqtt_inbox" logger (see options.h).
  std::shared_ptr<spdlog::logger> logger;
};

// A snapshot of a client's connection (Subscriber::health(), Relay::health(), a Fleet's
// serving_health): attempts, the last failure and its reason, the last CONNACK refusal,
// and for a Subscriber the sessions the broker lost. Times are wall-clock Unix ms (UTC); 0
// means never. No field ever holds a secret. Plain data: no thread safety of its own.
struct ConnectionHealth {
  // Why the last connection attempt failed.
  enum class Failure {
    kNone,         // no attempt has failed yet
    kNetwork,      // no TCP connection (refused, unreachable, name not resolved, timeout)
    kTls,          // TLS handshake or certificate verification failed, or tls.version not met
    kRefused,      // the broker answered CONNACK with a refusal (see connack_code)
    kCredentials,  // the password provider failed
    kSubscribe,    // connected, but a SUBSCRIBE was refused or timed out
    kOther,        // anything else Paho reported
  };
  bool connected = false;            // connected (a Subscriber: and subscribed) now
  int64_t since_ms = 0;              // when `connected` last changed (start() counts as a change)
  int64_t connect_attempts = 0;      // attempts started, this process
  int64_t connects = 0;              // attempts that connected (a Subscriber: and subscribed)
  int64_t consecutive_failures = 0;  // failed attempts since the last success
  Failure last_failure = Failure::kNone;
  // The last failed attempt's reason, as logged, e.g. "TLS: certificate verify failed:
  // certificate has expired (depth 0, subject CN=broker, notAfter=...)". Kept after a
  // later success, so the last problem stays visible; "" if none.
  std::string last_error;
  int64_t last_error_ms = 0;
  // The broker's refusal in the last refused CONNACK: MQTT 3.1.1 return code 1..5
  // (section 3.2.2.3) or MQTT 5 reason code >= 0x80 (section 3.2.2.2.3); 0 if none yet.
  int connack_code = 0;
  std::string connack_reason;  // its meaning, e.g. "not authorized"
  // Sessions the broker lost, this process (Subscriber::sessions_lost()): a CONNACK with
  // session present = 0 although the inbox recorded a session holding topic filters. A
  // Relay keeps no session: 0 on its own connection.
  int64_t sessions_lost = 0;
  int64_t session_lost_ms = 0;  // when the last one was found; 0 if never
  // The last loss as logged: which filters, since when, the likely causes; "" if none.
  std::string session_lost;
};

// Name of a ConnectionHealth::Failure, e.g. "tls". Never fails; a static string.
const char* to_string(ConnectionHealth::Failure failure);

// The meaning of a CONNACK refusal code and what to do about it, e.g. for 3.1.1 code 4:
// "bad user name or password". `code` is a 3.1.1 return code (1..5) or an MQTT 5 reason
// code (0x80..0xFF) as `version` says. Unknown codes get "unknown CONNACK code N".
std::string connack_meaning(MqttVersion version, int code);

}  // namespace mqtt_inbox

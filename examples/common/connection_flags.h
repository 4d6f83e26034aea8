// connection_flags: the broker connection flags of every program that connects
// (ledger_consumer, sensor_gateway, publisher, mqtt-inbox probe-broker), named as the
// mosquitto clients name them, and their translation into mqtt_inbox::SubscriberOptions
// (and RelayOptions, for an outbox relay beside the subscriber) or, for a program that
// drives Paho itself, Paho connect options. One helper that each program calls, so that
// no program copies it.
//
//   --broker URI            tcp://, mqtt://, ws:// (plaintext) or ssl://, mqtts://, wss:// (TLS)
//   --client-id ID          stable MQTT client id
//   --mqtt-version V        3.1.1 or 5
//   --cafile PATH           CA certificate(s) that sign the broker's certificate (PEM);
//                           without it and --capath: the system trust store
//   --capath DIR            folder of CA certificates in OpenSSL's hashed form
//   --cert PATH             client certificate (PEM), for brokers that require one
//   --key PATH              its private key (PEM); default: read from --cert
//   --key-password-file PATH  password of an encrypted --key
//   --tls-version 1.2|1.3   lowest TLS version (default: the highest both sides speak)
//   --alpn PROTO            ALPN protocol, repeatable (AWS IoT on 443: x-amzn-mqtt-ca)
//   --ciphers LIST          OpenSSL cipher list for TLS 1.2
//   --insecure              do not check the broker's host name against its certificate
//   --username NAME         MQTT user name
//   --password-file PATH    file holding the MQTT password, read again at every connect
//
// There is deliberately no --password VALUE: a command line shows in `ps` and in shell
// history. Secrets come from files only.
#pragma once

#include <string>
#include <vector>

#include <mqtt_inbox/relay.h>
#include <mqtt_inbox/status.h>
#include <mqtt_inbox/subscriber.h>

namespace CLI {
class App;
}
namespace mqtt {
class connect_options;
class ssl_options;
}  // namespace mqtt

namespace connection_flags {

struct Flags {
  // Initial values are the program's defaults (shown in --help).
  std::string broker;
  std::string client_id;
  std::string mqtt_version = "3.1.1";
  // Subscribers only. Default the library's ("auto": $RUNTIME_DIRECTORY under systemd,
  // else /run/mqtt-inbox if writable, else /tmp; subscriber.h).
  std::string client_id_lock_dir = mqtt_inbox::SubscriberOptions{}.client_id_lock_dir;
  std::string cafile, capath, cert, key, key_password_file;
  std::string tls_version;  // "", "1.2", "1.3" (also "tlsv1.2", "tlsv1.3")
  std::vector<std::string> alpn;
  std::string ciphers;
  bool insecure = false;
  std::string username, password_file;
};

enum class Role {
  kSubscriber,  // --client-id required, --client-id-lock-dir offered
  kPublisher,   // --client-id optional (the Flags default is used)
  kProbe,       // --client-id optional, default "" (mqtt-inbox probe-broker makes one up)
};

// Adds the flags to `app`, parsed into `*flags` (which must outlive app.parse()). --broker
// is required.
void add(CLI::App& app, Flags* flags, Role role);

// The TLS settings the flags ask for. Reads --key-password-file once. Errors name the flag
// and the file.
mqtt_inbox::Status tls_options(const Flags& flags, mqtt_inbox::TlsOptions* out);

// Fills broker_uri, client_id, mqtt_version, client_id_lock_dir, username,
// password_provider (--password-file, read at every connect) and tls of `*out`, and runs
// the checks Subscriber::create makes on them, so a bad file is reported at once with its
// name. Errors: kInvalidArgument or kIoError naming the flag and file.
mqtt_inbox::Status to_subscriber_options(const Flags& flags, mqtt_inbox::SubscriberOptions* out);

// The same connection settings for an outbox relay of the same program, so that it
// connects exactly as the subscriber does (TLS, user name, --password-file read at every
// connect, client-id lock folder), with client id --client-id + `client_id_suffix` (the
// broker allows one connection per client id). Errors: as to_subscriber_options().
mqtt_inbox::Status to_relay_options(const Flags& flags, const std::string& client_id_suffix,
                                    mqtt_inbox::RelayOptions* out);

// For a program that connects with Paho directly (examples/publisher): applies the same
// connection settings to `*opts`: the user name, the password read from --password-file
// now, and TLS as the Subscriber uses it (for a TLS --broker). `*ssl` receives the TLS settings and
// must stay alive, not copied or moved, while `*opts` is used (Paho C++ 1.2.0 bug #337).
mqtt_inbox::Status to_paho_options(const Flags& flags, mqtt::ssl_options* ssl,
                                   mqtt::connect_options* opts);

// Why a connection with these flags fails, when Paho said only "TCP/TLS connect
// failure": mqtt_inbox::diagnose_connection() with the flags' TLS settings. "" if a
// TCP/TLS handshake of its own succeeds.
std::string diagnose(const Flags& flags, int timeout_ms);

}  // namespace connection_flags

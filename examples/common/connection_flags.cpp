#include "connection_flags.h"

#include <mqtt/connect_options.h>
#include <mqtt/ssl_options.h>
#include <CLI/CLI.hpp>

#include <mqtt_inbox/tls.h>

namespace connection_flags {

void add(CLI::App& app, Flags* f, Role role) {
  app.add_option("--broker", f->broker,
                 "Broker URI: tcp://host:1883, mqtt://, ws:// (plaintext) or ssl://host:8883, "
                 "mqtts://, wss:// (TLS)")
      ->required();
  auto* id = app.add_option(
      "--client-id", f->client_id,
      role == Role::kProbe ? "MQTT client id (default: a new one each run; a broker policy may "
                             "ask for a given one)"
                           : "MQTT client id (stable across restarts)");
  if (role == Role::kSubscriber) {
    id->required();
    app.add_option("--client-id-lock-dir", f->client_id_lock_dir,
                   "Folder of the client-id lock file (\"auto\" = $RUNTIME_DIRECTORY, else "
                   "/run/mqtt-inbox if writable, else /tmp; \"\" = no lock)")
        ->capture_default_str();
  } else if (role == Role::kPublisher) {
    id->capture_default_str();
  }
  app.add_option("--mqtt-version", f->mqtt_version, "3.1.1 or 5")
      ->check(CLI::IsMember({"3.1.1", "5"}))
      ->capture_default_str();
  app.add_option("--cafile", f->cafile,
                 "PEM file of the CA certificate(s) that sign the broker's certificate "
                 "(default: the system trust store)");
  app.add_option("--capath", f->capath, "Folder of CA certificates in OpenSSL's hashed form");
  app.add_option("--cert", f->cert, "PEM client certificate, for brokers that require one");
  app.add_option("--key", f->key, "PEM private key of --cert (default: read from --cert)");
  app.add_option("--key-password-file", f->key_password_file,
                 "File holding the password of an encrypted --key");
  app.add_option("--tls-version", f->tls_version,
                 "Lowest TLS version: 1.2 or 1.3 (default: the highest both sides speak)")
      ->check(CLI::IsMember({"1.2", "1.3", "tlsv1.2", "tlsv1.3"}));
  app.add_option("--alpn", f->alpn,
                 "ALPN protocol to offer; repeatable (AWS IoT on 443: x-amzn-mqtt-ca)")
      ->delimiter(',')
      ->default_str("");  // an empty list, not "[]" (the examples capture defaults)
  app.add_option("--ciphers", f->ciphers, "OpenSSL cipher list for TLS 1.2");
  app.add_flag("--insecure", f->insecure,
               "INSECURE: do not check the broker's host name against its certificate");
  app.add_option("--username", f->username, "MQTT user name");
  app.add_option("--password-file", f->password_file,
                 "File holding the MQTT password (read again at every connect; there is no "
                 "--password flag, a command line shows in ps)");
}

mqtt_inbox::Status tls_options(const Flags& f, mqtt_inbox::TlsOptions* out) {
  mqtt_inbox::TlsOptions t;
  t.ca_file = f.cafile;
  t.ca_dir = f.capath;
  t.cert_file = f.cert;
  t.key_file = f.key;
  if (f.tls_version == "1.2" || f.tls_version == "tlsv1.2")
    t.version = mqtt_inbox::TlsVersion::kTls1_2;
  if (f.tls_version == "1.3" || f.tls_version == "tlsv1.3")
    t.version = mqtt_inbox::TlsVersion::kTls1_3;
  t.alpn = f.alpn;
  t.ciphers = f.ciphers;
  t.insecure_skip_hostname_check = f.insecure;
  if (!f.key_password_file.empty()) {
    mqtt_inbox::Status s = mqtt_inbox::password_from_file(f.key_password_file)(&t.key_password);
    if (!s.ok()) return {s.code(), "--key-password-file: " + s.message()};
  }
  *out = std::move(t);
  return mqtt_inbox::Status::Ok();
}

namespace {

// --password-file, read now: a missing or empty file is reported at start, not at the
// first connect.
mqtt_inbox::Status read_password(const Flags& f, std::string* password) {
  mqtt_inbox::Status s = mqtt_inbox::password_from_file(f.password_file)(password);
  if (!s.ok()) return {s.code(), "--password-file: " + s.message()};
  return s;
}

// The connection fields, which SubscriberOptions and RelayOptions share.
mqtt_inbox::Status fill_connection(const Flags& f, mqtt_inbox::ConnectionOptions* out) {
  out->broker_uri = f.broker;
  out->client_id = f.client_id;
  out->client_id_lock_dir = f.client_id_lock_dir;
  out->mqtt_version =
      f.mqtt_version == "5" ? mqtt_inbox::MqttVersion::kV5 : mqtt_inbox::MqttVersion::kV3_1_1;
  out->username = f.username;
  if (!f.password_file.empty()) {
    std::string unused;
    if (mqtt_inbox::Status s = read_password(f, &unused); !s.ok()) return s;
    out->password_provider = mqtt_inbox::password_from_file(f.password_file);
  }
  if (mqtt_inbox::Status s = tls_options(f, &out->tls); !s.ok()) return s;
  return mqtt_inbox::check_tls_options(f.broker, out->tls);
}

}  // namespace

mqtt_inbox::Status to_subscriber_options(const Flags& f, mqtt_inbox::SubscriberOptions* out) {
  return fill_connection(f, out);
}

mqtt_inbox::Status to_relay_options(const Flags& f, const std::string& client_id_suffix,
                                    mqtt_inbox::RelayOptions* out) {
  if (mqtt_inbox::Status s = fill_connection(f, out); !s.ok()) return s;
  out->client_id += client_id_suffix;
  return mqtt_inbox::Status::Ok();
}

mqtt_inbox::Status to_paho_options(const Flags& f, mqtt::ssl_options* ssl,
                                   mqtt::connect_options* opts) {
  mqtt_inbox::TlsOptions tls;
  if (mqtt_inbox::Status s = tls_options(f, &tls); !s.ok()) return s;
  if (mqtt_inbox::Status s = mqtt_inbox::check_tls_options(f.broker, tls); !s.ok()) return s;
  if (!f.username.empty()) opts->set_user_name(f.username);
  if (!f.password_file.empty()) {
    std::string password;
    if (mqtt_inbox::Status s = read_password(f, &password); !s.ok()) return s;
    opts->set_password(password);
  }
  if (mqtt_inbox::is_tls_uri(f.broker)) {
    mqtt_inbox::to_paho_ssl_options(tls, ssl);
    opts->set_ssl(*ssl);
  }
  return mqtt_inbox::Status::Ok();
}

std::string diagnose(const Flags& f, int timeout_ms) {
  mqtt_inbox::TlsOptions tls;
  if (mqtt_inbox::Status s = tls_options(f, &tls); !s.ok()) return s.message();
  return mqtt_inbox::diagnose_connection(f.broker, tls, timeout_ms);
}

}  // namespace connection_flags

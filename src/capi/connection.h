// The connection settings of c.h's MQTT option structs (subscriber, relay) made into the
// C++ ConnectionOptions (connection.h): one place that reads secrets from their files and
// checks them before anything connects.
#pragma once

#include <cstddef>
#include <string>

#include "mqtt_inbox/connection.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::capi {

// The fields c.h's option structs share, as the caller gave them (NULL = not set).
struct CConnection {
  const char* broker_uri = nullptr;
  const char* client_id = nullptr;
  int mqtt_version = 0;
  int keep_alive_s = 30;
  int connect_timeout_ms = 10000;
  int reconnect_backoff_initial_ms = 500;
  int reconnect_backoff_max_ms = 30000;
  int tls_version = 0;
  int tls_insecure_skip_hostname_check = 0;
  const char* username = nullptr;
  const char* password_file = nullptr;
  const char* tls_ca_file = nullptr;
  const char* tls_ca_dir = nullptr;
  const char* tls_cert_file = nullptr;
  const char* tls_key_file = nullptr;
  const char* tls_key_password_file = nullptr;
  const char* client_id_lock_dir = nullptr;
  const char* tls_ciphers = nullptr;
  const char* const* tls_alpn = nullptr;
  size_t tls_alpn_count = 0;
  int tls_insecure_skip_certificate_check = 0;
};

// The connection fields of a C options struct (mqtt_inbox_subscriber_options_t and
// mqtt_inbox_relay_options_t carry the same names), so each create reads them alike.
template <typename COptions>
CConnection connection_of(const COptions& o) {
  CConnection c;
  c.broker_uri = o.broker_uri;
  c.client_id = o.client_id;
  c.mqtt_version = o.mqtt_version;
  c.keep_alive_s = o.keep_alive_s;
  c.connect_timeout_ms = o.connect_timeout_ms;
  c.reconnect_backoff_initial_ms = o.reconnect_backoff_initial_ms;
  c.reconnect_backoff_max_ms = o.reconnect_backoff_max_ms;
  c.tls_version = o.tls_version;
  c.tls_insecure_skip_hostname_check = o.tls_insecure_skip_hostname_check;
  c.username = o.username;
  c.password_file = o.password_file;
  c.tls_ca_file = o.tls_ca_file;
  c.tls_ca_dir = o.tls_ca_dir;
  c.tls_cert_file = o.tls_cert_file;
  c.tls_key_file = o.tls_key_file;
  c.tls_key_password_file = o.tls_key_password_file;
  c.client_id_lock_dir = o.client_id_lock_dir;
  c.tls_ciphers = o.tls_ciphers;
  c.tls_alpn = o.tls_alpn;
  c.tls_alpn_count = o.tls_alpn_count;
  c.tls_insecure_skip_certificate_check = o.tls_insecure_skip_certificate_check;
  return c;
}

// Fills *out from `in`. The password file is read once here, so that a missing or empty
// file fails now rather than at the first connect, and then at every connect
// (password_from_file); the key's password is read once. Errors name the field or the
// file, never a secret: kInvalidArgument, kIoError. The INSECURE switches are copied as
// given; the connecting code logs a warning for them at every connect (connection.h).
Status to_connection_options(const CConnection& in, ConnectionOptions* out);

// True if `in` sets any field of the connection itself (URI, client id, credentials, TLS,
// the client-id lock): what a relay lent a subscriber's connection must leave alone.
// *field names the first one set.
bool sets_connection(const CConnection& in, const char** field);

}  // namespace mqtt_inbox::capi

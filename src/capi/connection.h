// The connection settings of c.h's MQTT option structs (subscriber, relay) made into the
// C++ ConnectionOptions (connection.h): one place that reads secrets from their files and
// checks them before anything connects.
#pragma once

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
};

// Fills *out from `in`. The password file is read once here, so that a missing or empty
// file fails now rather than at the first connect, and then at every connect
// (password_from_file); the key's password is read once. Errors name the field or the
// file, never a secret: kInvalidArgument, kIoError.
Status to_connection_options(const CConnection& in, ConnectionOptions* out);

}  // namespace mqtt_inbox::capi

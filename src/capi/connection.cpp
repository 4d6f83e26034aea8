// C connection settings to ConnectionOptions (capi/connection.h).
#include "capi/connection.h"

#include <utility>

#include "mqtt_inbox/c.h"

namespace mqtt_inbox::capi {

Status to_connection_options(const CConnection& in, ConnectionOptions* out) {
  if (!in.broker_uri) return Status::InvalidArgument("broker_uri is required");
  if (!in.client_id) return Status::InvalidArgument("client_id is required");
  out->broker_uri = in.broker_uri;
  out->client_id = in.client_id;
  switch (in.mqtt_version) {
    case MQTT_INBOX_MQTT_3_1_1:
      out->mqtt_version = MqttVersion::kV3_1_1;
      break;
    case MQTT_INBOX_MQTT_5:
      out->mqtt_version = MqttVersion::kV5;
      break;
    default:
      return Status::InvalidArgument("mqtt_version is " + std::to_string(in.mqtt_version) +
                                     ": it must be MQTT_INBOX_MQTT_3_1_1 or MQTT_INBOX_MQTT_5");
  }
  out->keep_alive_s = in.keep_alive_s;
  out->connect_timeout_ms = in.connect_timeout_ms;
  out->reconnect_backoff_initial_ms = in.reconnect_backoff_initial_ms;
  out->reconnect_backoff_max_ms = in.reconnect_backoff_max_ms;
  if (in.username) out->username = in.username;
  if (in.password_file) {
    out->password_provider = password_from_file(in.password_file);
    std::string probe;
    if (Status s = out->password_provider(&probe); !s.ok()) return s;
  }
  TlsOptions& tls = out->tls;
  switch (in.tls_version) {
    case MQTT_INBOX_TLS_DEFAULT:
      tls.version = TlsVersion::kDefault;
      break;
    case MQTT_INBOX_TLS_1_2:
      tls.version = TlsVersion::kTls1_2;
      break;
    case MQTT_INBOX_TLS_1_3:
      tls.version = TlsVersion::kTls1_3;
      break;
    default:
      return Status::InvalidArgument("tls_version is " + std::to_string(in.tls_version) +
                                     ": it must be MQTT_INBOX_TLS_DEFAULT, _1_2 or _1_3");
  }
  // A switch is 0 or 1: a garbage value must not turn verification off.
  for (const auto& [value, name] :
       {std::pair<int, const char*>{in.tls_insecure_skip_hostname_check,
                                    "tls_insecure_skip_hostname_check"},
        std::pair<int, const char*>{in.tls_insecure_skip_certificate_check,
                                    "tls_insecure_skip_certificate_check"}}) {
    if (value != 0 && value != 1)
      return Status::InvalidArgument(std::string(name) + " is " + std::to_string(value) +
                                     ": it must be 0 or 1");
  }
  tls.insecure_skip_hostname_check = in.tls_insecure_skip_hostname_check == 1;
  tls.insecure_skip_certificate_check = in.tls_insecure_skip_certificate_check == 1;
  if (in.tls_ciphers) tls.ciphers = in.tls_ciphers;
  if (!in.tls_alpn && in.tls_alpn_count)
    return Status::InvalidArgument("tls_alpn is NULL with tls_alpn_count " +
                                   std::to_string(in.tls_alpn_count));
  for (size_t i = 0; i < in.tls_alpn_count; ++i) {
    if (!in.tls_alpn[i])
      return Status::InvalidArgument("tls_alpn[" + std::to_string(i) + "] is NULL");
    tls.alpn.emplace_back(in.tls_alpn[i]);
  }
  if (in.tls_ca_file) tls.ca_file = in.tls_ca_file;
  if (in.tls_ca_dir) tls.ca_dir = in.tls_ca_dir;
  if (in.tls_cert_file) tls.cert_file = in.tls_cert_file;
  if (in.tls_key_file) tls.key_file = in.tls_key_file;
  if (in.tls_key_password_file) {
    if (Status s = password_from_file(in.tls_key_password_file)(&tls.key_password); !s.ok())
      return s;
  }
  if (in.client_id_lock_dir) out->client_id_lock_dir = in.client_id_lock_dir;
  return Status::Ok();
}

bool sets_connection(const CConnection& in, const char** field) {
  const std::pair<bool, const char*> fields[] = {
      {in.broker_uri != nullptr, "broker_uri"},
      {in.client_id != nullptr, "client_id"},
      {in.username != nullptr, "username"},
      {in.password_file != nullptr, "password_file"},
      {in.tls_version != MQTT_INBOX_TLS_DEFAULT, "tls_version"},
      {in.tls_insecure_skip_hostname_check != 0, "tls_insecure_skip_hostname_check"},
      {in.tls_insecure_skip_certificate_check != 0, "tls_insecure_skip_certificate_check"},
      {in.tls_ca_file != nullptr, "tls_ca_file"},
      {in.tls_ca_dir != nullptr, "tls_ca_dir"},
      {in.tls_cert_file != nullptr, "tls_cert_file"},
      {in.tls_key_file != nullptr, "tls_key_file"},
      {in.tls_key_password_file != nullptr, "tls_key_password_file"},
      {in.tls_ciphers != nullptr, "tls_ciphers"},
      {in.tls_alpn != nullptr || in.tls_alpn_count != 0, "tls_alpn"},
      {in.client_id_lock_dir != nullptr, "client_id_lock_dir"},
  };
  for (const auto& f : fields) {
    if (f.first) {
      *field = f.second;
      return true;
    }
  }
  return false;
}

}  // namespace mqtt_inbox::capi

#include "mqtt/connection_health.h"

#include <mqtt/exception.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "mqtt/probe.h"
#include "mqtt_inbox/clock.h"

namespace mqtt_inbox::detail {

HealthRecorder::HealthRecorder(const ConnectionOptions& options, BrokerAddress address,
                               std::shared_ptr<spdlog::logger> log)
    : options_(options), address_(std::move(address)), log_(std::move(log)) {}

void HealthRecorder::started() {
  std::lock_guard<std::mutex> g(mu_);
  health_.since_ms = Clock::system()->wall_ms();
}

void HealthRecorder::begin_attempt() {
  attempt_failed_ = attempt_refused_ = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    ++health_.connect_attempts;
  }
  std::lock_guard<std::mutex> g(ssl_errors_mu_);
  ssl_errors_.clear();
}

void HealthRecorder::set_connected(bool connected) {
  std::lock_guard<std::mutex> g(mu_);
  health_.connected = connected;
  health_.since_ms = Clock::system()->wall_ms();
  if (connected) {
    ++health_.connects;
    health_.consecutive_failures = 0;
  }
}

void HealthRecorder::session_lost(const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  ++health_.sessions_lost;
  health_.session_lost_ms = Clock::system()->wall_ms();
  health_.session_lost = redact(why);
}

void HealthRecorder::remember_secret(const std::string& secret) { provided_password_ = secret; }

ConnectionHealth HealthRecorder::snapshot() const {
  std::lock_guard<std::mutex> g(mu_);
  return health_;
}

std::string HealthRecorder::redact(std::string text) const {
  for (const std::string* secret :
       {&options_.password, &options_.tls.key_password, &provided_password_}) {
    if (secret->size() < 3) continue;  // too short to tell from ordinary text
    for (size_t at = text.find(*secret); at != std::string::npos; at = text.find(*secret, at))
      text.replace(at, secret->size(), "<secret>");
  }
  return text;
}

void HealthRecorder::fail(ConnectionHealth::Failure kind, const std::string& why) {
  const std::string reason = redact(why);
  attempt_failed_ = true;
  int64_t failures = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    health_.last_failure = kind;
    health_.last_error = reason;
    health_.last_error_ms = Clock::system()->wall_ms();
    failures = ++health_.consecutive_failures;
  }
  const auto level =
      kind == ConnectionHealth::Failure::kRefused || kind == ConnectionHealth::Failure::kTls
          ? spdlog::level::err
          : spdlog::level::warn;
  log_->log(level, "connect to {} failed ({}, attempt {} in a row): {}", options_.broker_uri,
            to_string(kind), failures, reason);
}

void HealthRecorder::on_ssl_error(const std::string& line) noexcept {
  try {
    const std::string reason = openssl_reason(line);
    std::lock_guard<std::mutex> g(ssl_errors_mu_);
    if (ssl_errors_.size() < 8 &&
        std::find(ssl_errors_.begin(), ssl_errors_.end(), reason) == ssl_errors_.end())
      ssl_errors_.push_back(reason);
  } catch (...) {
  }
}

// A refusal carries its code. For everything else Paho says only "TCP/TLS connect
// failure", and OpenSSL's reason (when its callback gave one) lacks the detail that
// matters (which certificate, expired when, valid for which names), and is absent for a
// host name mismatch or a broker that wants a client certificate. So the library
// connects once more itself, with the same settings, and reports what it found.
void HealthRecorder::connect_failed(int rc, const std::string& paho_message) {
  if (rc > 0) {
    const std::string meaning = connack_meaning(options_.mqtt_version, rc);
    attempt_refused_ = true;
    {
      std::lock_guard<std::mutex> g(mu_);
      health_.connack_code = rc;
      health_.connack_reason = meaning;
    }
    fail(ConnectionHealth::Failure::kRefused, "the broker refused the connection: " + meaning);
    return;
  }
  std::string paho =
      "Paho: " + (paho_message.empty() ? mqtt::exception::error_str(rc) : paho_message) + " (" +
      std::to_string(rc) + ")";
  {
    std::lock_guard<std::mutex> g(ssl_errors_mu_);
    for (size_t i = 0; i < ssl_errors_.size(); ++i)
      paho += (i == 0 ? "; OpenSSL in Paho: " : ", ") + ssl_errors_[i];
  }
  // Options Paho refused before any network traffic: a bug or a build without TLS, not
  // something a handshake can explain.
  if (rc == MQTTASYNC_NULL_PARAMETER || rc == MQTTASYNC_BAD_STRUCTURE ||
      rc == MQTTASYNC_SSL_NOT_SUPPORTED || rc == MQTTASYNC_BAD_PROTOCOL ||
      rc == MQTTASYNC_BAD_MQTT_OPTION || rc == MQTTASYNC_WRONG_MQTT_VERSION ||
      rc == MQTTASYNC_BAD_UTF8_STRING) {
    fail(ConnectionHealth::Failure::kOther,
         "Paho refused the connect options before connecting: " + paho);
    return;
  }
  const ProbeResult p = probe(address_, options_.tls, options_.connect_timeout_ms);
  if (!p.ok) {
    fail(p.failure, p.reason + " [" + paho + "]");
    return;
  }
  fail(ConnectionHealth::Failure::kOther,
       paho + "; a " + (address_.tls ? p.tls_version + " handshake" : "TCP connection") +
           " of the library's own to " + address_.host_port() +
           " right after succeeded, so the cause was passing or inside MQTT");
}

}  // namespace mqtt_inbox::detail

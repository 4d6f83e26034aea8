// Internal: HealthRecorder, a client's connection as its health() shows it
// (ConnectionHealth, connection.h), and the report of each failed connection attempt:
// logged once with the broker and a reason a person can act on, recorded for health(),
// secrets redacted.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mqtt/tls.h"
#include "mqtt_inbox/connection.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox::detail {

// Used by every client that connects (mqtt/connect.h): the Subscriber and the outbox
// Relay each keep one. Thread safety: snapshot() and on_ssl_error() from any thread;
// everything else from the client's connection thread only (the subscriber's supervisor,
// the relay's thread). Its mutexes are never held across a Paho call.
class HealthRecorder {
 public:
  HealthRecorder(const ConnectionOptions& options, BrokerAddress address,
                 std::shared_ptr<spdlog::logger> log);

  void started();                      // start(): health's since_ms
  void begin_attempt();                // counts the attempt, forgets the last one's details
  void set_connected(bool connected);  // connected and subscribed, or no longer
  // The password provider's output, to redact it should it show up in a message.
  void remember_secret(const std::string& secret);

  // The attempt failed: logged ("connect to URI failed (kind, attempt N in a row): why")
  // and kept for health().
  void fail(ConnectionHealth::Failure kind, const std::string& why);
  // Paho ended the CONNECT with `rc` (> 0: a CONNACK refusal code; < 0: Paho's error)
  // and `paho_message`. Finds the reason (the refusal's meaning, or a probe) and fails.
  void connect_failed(int rc, const std::string& paho_message);

  // The broker lost the session (mqtt/subscriber.cpp): counted and kept for health(). `why`
  // is the warning as logged.
  void session_lost(const std::string& why);

  // Paho's SSL error callback (a Paho thread, during the handshake): keeps OpenSSL's reason.
  void on_ssl_error(const std::string& line) noexcept;

  bool attempt_failed() const { return attempt_failed_; }
  bool attempt_refused() const { return attempt_refused_; }  // wait the longest backoff
  ConnectionHealth snapshot() const;

 private:
  std::string redact(std::string text) const;

  const ConnectionOptions& options_;  // its owner's (Subscriber or Relay), which outlives this
  const BrokerAddress address_;
  const std::shared_ptr<spdlog::logger> log_;
  std::string provided_password_;
  bool attempt_failed_ = false;
  bool attempt_refused_ = false;

  mutable std::mutex mu_;  // guards health_
  ConnectionHealth health_;
  std::mutex ssl_errors_mu_;  // guards ssl_errors_
  std::vector<std::string> ssl_errors_;
};

}  // namespace mqtt_inbox::detail

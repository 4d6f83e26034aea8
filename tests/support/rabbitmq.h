// Test support: a private RabbitMQ node with the MQTT plugin (rabbitmq_mqtt, MQTT 3.1.1
// only in RabbitMQ 3.10), the second broker the integration suite's core cases run
// against. Debian 12's rabbitmq-server package, started without systemd on free
// 127.0.0.1 ports, with its data, logs and Erlang cookie in a temporary folder, so that
// several test processes (and other people's nodes) can run side by side.
//
// A node takes 10-50 s to start (Erlang boot; more on a loaded machine): start one per
// test process (SetUpTestSuite), not one per test.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "support/process.h"

namespace mqtt_inbox::test {

class RabbitMq {
 public:
  // The rabbitmq-server start script, or "" if RabbitMQ is not installed
  // (MQTT_INBOX_RABBITMQ_SERVER overrides the path).
  static std::string server_script();

  // Starts the node and waits until its MQTT port accepts connections. Throws
  // std::runtime_error with the end of the node's log if it does not within 180 s.
  RabbitMq();
  // Stops the node and the epmd it started.
  ~RabbitMq();
  RabbitMq(const RabbitMq&) = delete;
  RabbitMq& operator=(const RabbitMq&) = delete;

  std::string uri() const { return "tcp://127.0.0.1:" + std::to_string(mqtt_port_); }
  // Stops the node gracefully (SIGTERM: durable queues, which hold the MQTT persistent
  // sessions, are kept) / starts it again with the same name, ports and data.
  void stop();
  void start();
  // Runs rabbitmqctl against the node (its name, Erlang cookie and epmd port) with `args`,
  // e.g. {"set_policy", ...}, and returns its output. Throws std::runtime_error with the
  // output if it fails. Each call starts an Erlang VM: about 1-3 s.
  std::string ctl(const std::vector<std::string>& args) const;
  // Seconds the last start() took until the MQTT port accepted connections.
  double last_start_seconds() const { return last_start_s_; }
  const std::string& log_dir() const { return log_dir_; }

 private:
  void write_config();
  std::string log_tail() const;

  TempDir dir_;
  std::string node_name_, log_dir_;
  int amqp_port_ = 0, mqtt_port_ = 0, dist_port_ = 0, epmd_port_ = 0;
  pid_t script_pid_ = -1;  // the rabbitmq-server shell script, our child
  double last_start_s_ = 0;
};

}  // namespace mqtt_inbox::test

// ledger_consumer: applies JSON credits from an MQTT topic to account balances, exactly
// once, through mqtt-inbox.
//
//   ledger_consumer --broker tcp://127.0.0.1:1883 --client-id ledger-1
//                   --topic credits/# --db ledger.db [--mqtt-version 3.1.1|5]
//
// SIGINT/SIGTERM stop it cleanly; it then prints one summary line.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>

#include <mqtt_inbox/mqtt_inbox.h>

#include "ledger.h"

int main(int argc, char** argv) {
  CLI::App app{"Apply JSON credits from MQTT exactly once (mqtt-inbox example)"};
  mqtt_inbox::SubscriberOptions mqtt;
  std::string topic, db_path, version = "3.1.1", consumer_name = "ledger", log_level = "info";
  bool normal_sync = false;
  app.add_option("--broker", mqtt.broker_uri, "Broker URI, e.g. tcp://127.0.0.1:1883")->required();
  app.add_option("--client-id", mqtt.client_id, "Stable MQTT client id")->required();
  app.add_option("--topic", topic, "Topic filter to consume")->required();
  app.add_option("--db", db_path, "SQLite database file")->required();
  app.add_option("--mqtt-version", version, "3.1.1 or 5")->check(CLI::IsMember({"3.1.1", "5"}));
  app.add_option("--consumer", consumer_name, "Consumer name recorded with each message id");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_flag("--synchronous-normal", normal_sync,
               "Use PRAGMA synchronous=NORMAL (faster; loses the last commits on power loss)");
  CLI11_PARSE(app, argc, argv);
  mqtt.mqtt_version = version == "5" ? mqtt_inbox::MqttVersion::kV5 : mqtt_inbox::MqttVersion::kV3_1_1;

  auto log = spdlog::stderr_color_mt("ledger");
  log->set_level(spdlog::level::from_str(log_level));
  mqtt.logger = log;

  // Block the stop signals before any thread starts, so only sigwait() below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // 1. The store, with the business tables, before anything connects.
  mqtt_inbox::InboxOptions store;
  store.logger = log;
  if (normal_sync) store.synchronous = mqtt_inbox::Synchronous::kNormal;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(db_path, store, &inbox); !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
  inbox->with_connection([](SQLite::Database& db) { ledger::create_tables(db); });

  // 2. The consumer: the handler runs inside the claim transaction.
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  if (auto s = mqtt_inbox::Consumer::create(inbox.get(), consumer_name, ledger::CreditHandler{}, {},
                                            &consumer);
      !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }

  // 3. Retention: forget ids once the broker can no longer redeliver them. The window
  //    must cover the session expiry the subscriber asks for (checked by Pruner::create).
  mqtt_inbox::RetentionOptions retention;
  retention.broker_session_expiry = std::chrono::seconds(mqtt.session_expiry_s);
  retention.window = retention.broker_session_expiry + std::chrono::hours(24);
  std::unique_ptr<mqtt_inbox::Pruner> pruner;
  if (auto s = mqtt_inbox::Pruner::create(inbox.get(), retention, &pruner); !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
  (void)pruner->start();

  // 4. The subscriber: redeliveries can arrive as soon as it connects.
  std::unique_ptr<mqtt_inbox::Subscriber> subscriber;
  if (auto s = mqtt_inbox::Subscriber::create(mqtt, &subscriber); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }
  if (auto s = subscriber->subscribe(topic, consumer.get()); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }
  if (auto s = subscriber->start(); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }

  int sig = 0;
  sigwait(&stop_signals, &sig);
  log->info("signal {}: stopping", sig);
  const mqtt_inbox::Status stopped = subscriber->stop();
  pruner->stop();
  const auto c = consumer->counters();
  std::printf("ledger_consumer: processed=%lld duplicates=%lld dead_lettered=%lld "
              "already_dead_lettered=%lld handler_failures=%lld store_retries=%lld\n",
              static_cast<long long>(c.processed), static_cast<long long>(c.duplicates),
              static_cast<long long>(c.dead_lettered),
              static_cast<long long>(c.already_dead_lettered),
              static_cast<long long>(c.handler_failures),
              static_cast<long long>(c.store_retries));
  std::fflush(stdout);
  if (!stopped.ok()) {
    log->error("{}", stopped.to_string());
    std::_Exit(3);  // the unacked message is redelivered to the next run
  }
  return 0;
}

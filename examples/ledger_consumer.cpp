// ledger_consumer: applies JSON credits from an MQTT topic to account balances, exactly
// once, through mqtt-inbox.
//
//   ledger_consumer --broker tcp://127.0.0.1:1883 --client-id ledger-1
//                   --topic credits/# --db ledger.db [--mqtt-version 3.1.1|5]
//                   [--startup-deadline-ms 0] [--stop-timeout-ms 10000]
//
#include "connection_flags.h"
#include "exit_codes.h"
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>

#include <mqtt_inbox/mqtt_inbox.h>

#include "connection_flags.h"
#include "exit_codes.h"
#include "ledger.h"

int main(int argc, char** argv) {
  CLI::App app{"Apply JSON credits from MQTT exactly once (mqtt-inbox example)"};
  connection_flags::Flags connection;
  connection_flags::add(app, &connection, connection_flags::Role::kSubscriber);
  std::string topic, db_path, consumer_name = "ledger", log_level = "info";
  bool normal_sync = false;
  int64_t startup_deadline_ms = 0;
  int stop_timeout_ms = mqtt_inbox::SubscriberOptions{}.stop_timeout_ms;
  app.add_option("--topic", topic, "Topic filter to consume")->required();
  app.add_option("--db", db_path, "SQLite database file")->required();
  app.add_option("--consumer", consumer_name, "Consumer name recorded with each message id");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  int64_t stuck_limit_ms = mqtt_inbox::ServiceNotifierOptions{}.stuck_limit_ms;
  app.add_option("--stuck-limit-ms", stuck_limit_ms,
                 "Under systemd: stop watchdog pings once the store is stuck this long (ms)");
  app.add_flag("--synchronous-normal", normal_sync,
               "Use PRAGMA synchronous=NORMAL (faster; loses the last commits on power loss)");
  app.add_option("--startup-deadline-ms", startup_deadline_ms,
                 "Give up (exit 4) if the store is not ready after this long; 0 = wait");
  app.add_option("--stop-timeout-ms", stop_timeout_ms,
                 "On SIGTERM, how long a message may still wait for the store (then exit 3)");
  CLI11_PARSE(app, argc, argv);

  // To the journal (with priorities and CONSUMER=/INBOX_MESSAGE_ID=) under systemd,
  // else to stderr.
  std::shared_ptr<spdlog::logger> log;
  if (auto s = mqtt_inbox::make_service_logger("ledger", {log_level, ""}, &log); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  mqtt_inbox::SubscriberOptions mqtt;
  if (auto s = connection_flags::to_subscriber_options(connection, &mqtt); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }
  mqtt.logger = log;
  mqtt.stop_timeout_ms = stop_timeout_ms;

  // Block the stop signals before any thread starts, so only sigwait() below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // 1. The store, with the business tables, before anything connects. Both calls wait
  //    while the store is locked or full (up to --startup-deadline-ms).
  mqtt_inbox::InboxOptions store;
  store.logger = log;
  store.startup_deadline_ms = startup_deadline_ms;
  if (normal_sync) store.synchronous = mqtt_inbox::Synchronous::kNormal;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(db_path, store, &inbox); !s.ok()) {
    log->error("{}", s.to_string());
    return examples::startup_exit_code(s);
  }
  if (auto s = inbox->setup(ledger::create_tables); !s.ok()) {
    log->error("{}", s.to_string());
    return examples::startup_exit_code(s);
  }

  // 2. The consumer: the handler runs inside the claim transaction.
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  if (auto s = mqtt_inbox::Consumer::create(inbox.get(), consumer_name, ledger::CreditHandler{}, {},
                                            &consumer);
      !s.ok()) {
    log->error("{}", s.to_string());
    return examples::kExitFailed;
  }

  // 3. Retention: forget ids once the broker can no longer redeliver them. The window
  //    must cover the session expiry the subscriber asks for. The subscriber records that
  //    expiry in the inbox when it connects (Inbox::record_session), and the Pruner checks
  //    the window against it at create (the record of the last run) and again before
  //    every pass (this run's): a window that does not cover it deletes nothing.
  mqtt_inbox::RetentionOptions retention;
  retention.broker_session_expiry = std::chrono::seconds(mqtt.session_expiry_s);
  retention.window = retention.broker_session_expiry + std::chrono::hours(24);
  std::unique_ptr<mqtt_inbox::Pruner> pruner;
  if (auto s = mqtt_inbox::Pruner::create(inbox.get(), retention, &pruner); !s.ok()) {
    log->error("{}", s.to_string());
    return examples::startup_exit_code(s);
  }
  (void)pruner->start();

  // 4. The subscriber: redeliveries can arrive as soon as it connects.
  std::unique_ptr<mqtt_inbox::Subscriber> subscriber;
  if (auto s = mqtt_inbox::Subscriber::create(mqtt, &subscriber); !s.ok()) {
    log->error("{}", s.to_string());
    return examples::kExitSubscriber;
  }
  if (auto s = subscriber->subscribe(topic, consumer.get()); !s.ok()) {
    log->error("{}", s.to_string());
    return examples::kExitSubscriber;
  }
  if (auto s = subscriber->start(); !s.ok()) {
    log->error("{}", s.to_string());
    return examples::kExitSubscriber;
  }

  // Under systemd (Type=notify): READY=1 now (not after CONNACK: the network may come
  // later), then watchdog pings while healthy and a STATUS line; a no-op otherwise.
  mqtt_inbox::ServiceNotifierOptions service;
  service.stuck_limit_ms = stuck_limit_ms;
  service.logger = log;
  std::unique_ptr<mqtt_inbox::ServiceNotifier> notifier;
  if (auto s = mqtt_inbox::ServiceNotifier::create(service, &notifier); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }
  (void)notifier->add_source(mqtt_inbox::health_source(*subscriber));
  (void)notifier->add_source(mqtt_inbox::health_source(*consumer));
  (void)notifier->ready();

  int sig = 0;
  sigwait(&stop_signals, &sig);
  log->info("signal {}: stopping", sig);
  (void)notifier->stopping();
  const mqtt_inbox::Status stopped = subscriber->stop();
  if (stopped.ok()) pruner->stop();  // else exit now: the pruner may be waiting for the store
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
    log->flush();
    std::_Exit(examples::kExitStoppedWhileStuck);  // the unacked message is redelivered
  }
  return examples::kExitOk;
}

// sensor_gateway: keeps the latest reading and a reading count per device, with
// mqtt-inbox in store-then-process mode. Each reading is stored (and acked) on receipt;
// workers apply them later, one device's readings in the order they arrived, several
// devices in parallel.
//
//   sensor_gateway --broker tcp://127.0.0.1:1883 --client-id gw-1 --db sensors.db
//                  [--topic sensors/+/reading] [--workers 2] [--mqtt-version 3.1.1|5]
//                  [TLS and credential flags: connection_flags.h]
//
// Topic: sensors/<device>/reading. Payload: {"message_id": "...", "value": 21.5}
// (the id may also come in the MQTT 5 user property "message-id").
// SIGINT/SIGTERM stop it cleanly; it then prints one summary line.
#include <CLI/CLI.hpp>
#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>

#include <mqtt_inbox/mqtt_inbox.h>
#include <mqtt_inbox/store_then_process.h>

#include "connection_flags.h"

// The business change: runs in the worker's transaction, together with marking the
// reading done, so a reading is counted exactly once.
static void apply_reading(SQLite::Database& db, const mqtt_inbox::StoredDelivery& d) {
  const auto j = nlohmann::json::parse(d.message.payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("value") || !j["value"].is_number())
    throw mqtt_inbox::UndecodablePayload("reading without a numeric 'value'");
  SQLite::Statement q(db,
                      "INSERT INTO devices (device, latest_value, latest_message_id, readings)"
                      " VALUES (?1, ?2, ?3, 1)"
                      " ON CONFLICT (device) DO UPDATE SET latest_value = ?2,"
                      "   latest_message_id = ?3, readings = readings + 1");
  q.bind(1, d.aggregate_key);  // the device, from the topic
  q.bind(2, j["value"].get<double>());
  q.bind(3, d.message_id);
  q.exec();
}

int main(int argc, char** argv) {
  CLI::App app{"Latest reading per device, in order per device (mqtt-inbox store-then-process)"};
  connection_flags::Flags connection;
  connection_flags::add(app, &connection, connection_flags::Role::kSubscriber);
  std::string topic = "sensors/+/reading", db_path, log_level = "info";
  int workers = 2;
  app.add_option("--db", db_path, "SQLite database file")->required();
  app.add_option("--topic", topic, "Topic filter; the device is the second level");
  app.add_option("--workers", workers, "Worker threads")->check(CLI::Range(1, 64));
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  CLI11_PARSE(app, argc, argv);

  auto log = spdlog::stderr_color_mt("sensors");
  log->set_level(spdlog::level::from_str(log_level));
  mqtt_inbox::SubscriberOptions mqtt;
  if (auto s = connection_flags::to_subscriber_options(connection, &mqtt); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }
  mqtt.logger = log;

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // 1. The store and the business table, before anything connects.
  mqtt_inbox::InboxOptions store;
  store.logger = log;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(db_path, store, &inbox); !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
  inbox->with_connection([](SQLite::Database& db) {
    db.exec("CREATE TABLE IF NOT EXISTS devices (device TEXT PRIMARY KEY,"
            " latest_value REAL NOT NULL, latest_message_id TEXT NOT NULL,"
            " readings INTEGER NOT NULL)");
  });

  // 2. Store-then-process: the device (topic level 1) is the aggregate key, so each
  //    device's readings are applied in arrival order.
  mqtt_inbox::StoreThenProcessOptions o;
  o.aggregate_key = mqtt_inbox::aggregate_key_from_topic_level(1);
  o.workers = workers;
  std::unique_ptr<mqtt_inbox::StoreThenProcess> stp;
  if (auto s = mqtt_inbox::StoreThenProcess::create(inbox.get(), "sensors", apply_reading, o, &stp);
      !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
  if (auto s = stp->start(); !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }

  // 3. The subscriber: the PUBACK follows the commit of receipt.
  std::unique_ptr<mqtt_inbox::Subscriber> subscriber;
  if (auto s = mqtt_inbox::Subscriber::create(mqtt, &subscriber); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }
  if (auto s = subscriber->subscribe(topic, stp.get()); !s.ok()) {
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
  (void)stp->stop();  // unprocessed rows stay stored; the next run processes them
  const auto c = stp->counters();
  std::printf("sensor_gateway: stored=%lld duplicates=%lld processed=%lld dead_lettered=%lld\n",
              static_cast<long long>(c.stored), static_cast<long long>(c.duplicates),
              static_cast<long long>(c.processed), static_cast<long long>(c.dead_lettered));
  std::fflush(stdout);
  if (!stopped.ok()) {
    log->error("{}", stopped.to_string());
    std::_Exit(3);  // the unacked message is redelivered to the next run
  }
  return 0;
}

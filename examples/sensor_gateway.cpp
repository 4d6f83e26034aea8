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
// It connects only once the store is ready (start-up waits while the database is locked
// or the disk is full, up to --startup-deadline-ms; under systemd STATUS= says so, see
// service_frame.h). SIGINT/SIGTERM stop it cleanly; it then prints one summary line. A
// broker that refuses it for --refused-limit-ms (10 min) ends it with exit 7. Exit codes:
// exit_codes.h.
#include <SQLiteCpp/SQLiteCpp.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>

#include <mqtt_inbox/mqtt_inbox.h>
#include <mqtt_inbox/store_then_process.h>

#include "command_line.h"
#include "connection_flags.h"
#include "exit_codes.h"
#include "service_frame.h"

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
  app.option_defaults()->always_capture_default();  // --help shows every default
  connection_flags::Flags connection;
  connection_flags::add(app, &connection, connection_flags::Role::kSubscriber);
  std::string topic = "sensors/+/reading", db_path, log_level = "info";
  int workers = 2;
  int64_t startup_deadline_ms = 0;
  int stop_timeout_ms = mqtt_inbox::SubscriberOptions{}.stop_timeout_ms;
  app.add_option("--db", db_path, "SQLite database file")->required();
  app.add_option("--topic", topic, "Topic filter; the device is the second level")
      ->check(command_line::topic_filter());
  app.add_option("--workers", workers, "Worker threads")->check(CLI::Range(1, 64));
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_option("--startup-deadline-ms", startup_deadline_ms,
                 "Give up (exit 4) if the store is not ready after this long; 0 = wait");
  app.add_option("--stop-timeout-ms", stop_timeout_ms,
                 "On SIGTERM, how long a message may still wait for the store (then exit 3)");
  service_frame::Options frame_options;
  frame_options.log_name = "sensors";
  app.add_option("--stuck-limit-ms", frame_options.stuck_limit_ms,
                 "Under systemd: stop watchdog pings once the store is stuck this long (ms)");
  app.add_option("--refused-limit-ms", frame_options.refused_limit_ms,
                 "Exit 7 once the broker has refused this client (credentials, CA, client "
                 "id) this long without a success (ms); 0 = retry for ever");
  if (int rc = command_line::parse(app, argc, argv, "sensor_gateway"); rc >= 0) return rc;
  frame_options.log_level = log_level;

  // The log, the stop signals and systemd's notifier in its start-up phase, before the
  // store is opened: while it is locked or full, STATUS= says so and the start timeout
  // is extended (service_frame.h).
  service_frame::Frame frame;
  if (int rc = frame.begin(frame_options); rc != examples::kExitOk) return rc;
  const auto& log = frame.log();
  mqtt_inbox::SubscriberOptions mqtt;
  if (auto s = connection_flags::to_subscriber_options(connection, &mqtt); !s.ok())
    return frame.fail(examples::kExitSubscriber, s);
  mqtt.logger = log;
  mqtt.stop_timeout_ms = stop_timeout_ms;

  // 1. The store and the business table, before anything connects.
  mqtt_inbox::InboxOptions store;
  frame.store(&store);
  store.startup_deadline_ms = startup_deadline_ms;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(db_path, store, &inbox); !s.ok())
    return frame.fail(examples::startup_exit_code(s), s);
  if (auto s = inbox->setup([](SQLite::Database& db) {
        db.exec(
            "CREATE TABLE IF NOT EXISTS devices (device TEXT PRIMARY KEY,"
            " latest_value REAL NOT NULL, latest_message_id TEXT NOT NULL,"
            " readings INTEGER NOT NULL)");
      });
      !s.ok())
    return frame.fail(examples::startup_exit_code(s), s);

  // 2. Store-then-process: the device (topic level 1) is the aggregate key, so each
  //    device's readings are applied in arrival order.
  mqtt_inbox::StoreThenProcessOptions o;
  o.aggregate_key = mqtt_inbox::aggregate_key_from_topic_level(1);
  o.workers = workers;
  std::unique_ptr<mqtt_inbox::StoreThenProcess> stp;
  if (auto s = mqtt_inbox::StoreThenProcess::create(inbox.get(), "sensors", apply_reading, o, &stp);
      !s.ok())
    return frame.fail(examples::startup_exit_code(s), s);
  if (auto s = stp->start(); !s.ok()) return frame.fail(examples::startup_exit_code(s), s);

  // 3. The subscriber: the PUBACK follows the commit of receipt.
  std::unique_ptr<mqtt_inbox::Subscriber> subscriber;
  if (auto s = mqtt_inbox::Subscriber::create(mqtt, &subscriber); !s.ok())
    return frame.fail(examples::subscriber_exit_code(s), s);
  if (auto s = subscriber->subscribe(topic, stp.get()); !s.ok())
    return frame.fail(examples::subscriber_exit_code(s), s);
  if (auto s = subscriber->start(); !s.ok())
    return frame.fail(examples::subscriber_exit_code(s), s);

  // READY=1 now (not after CONNACK: the network may come later), then watchdog pings
  // while healthy and a STATUS line; no-ops without systemd. The notifier reads the
  // subscriber and the store-then-process until frame.end(), which comes before they go.
  (void)frame.notifier().add_source(mqtt_inbox::health_source(*subscriber));
  (void)frame.notifier().add_source(mqtt_inbox::health_source(*stp));
  struct EndFrame {
    service_frame::Frame& f;
    ~EndFrame() { f.end(); }
  } end_frame{frame};
  frame.ready(subscriber.get());

  const int why = frame.wait();  // a stop signal, or the broker refusing us too long
  frame.stopping();
  const mqtt_inbox::Status stopped = subscriber->stop();
  // Unprocessed rows stay stored; the next run processes them. If a message is still
  // waiting for the store, exit now: the workers may be waiting for it too.
  if (stopped.ok()) (void)stp->stop();
  const auto c = stp->counters();
  std::printf("sensor_gateway: stored=%lld duplicates=%lld processed=%lld dead_lettered=%lld\n",
              static_cast<long long>(c.stored), static_cast<long long>(c.duplicates),
              static_cast<long long>(c.processed), static_cast<long long>(c.dead_lettered));
  std::fflush(stdout);
  if (!stopped.ok()) {
    log->error("{}", stopped.to_string());
    log->flush();
    std::_Exit(examples::kExitStoppedWhileStuck);  // the unacked message is redelivered
  }
  if (why == examples::kExitRefused) return frame.refused_exit();
  return examples::kExitOk;
}

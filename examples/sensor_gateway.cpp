// sensor_gateway: keeps the latest reading and a reading count per device, with
// mqtt-inbox in store-then-process mode. Each reading is stored (and acked) on receipt;
// workers apply them later, one device's readings in the order they arrived, several
// devices in parallel.
//
//   sensor_gateway --broker tcp://127.0.0.1:1883 --client-id gw-1 --db sensors.db
//                  [--topic sensors/+/reading] [--workers 2] [--mqtt-version 3.1.1|5]
//                  [--db-password-file PATH] [--lease-ms 60000]
//                  [TLS and credential flags: connection_flags.h]
//
// Topic: sensors/<device>/reading. Payload: {"message_id": "...", "value": 21.5}
// (the id may also come in the MQTT 5 user property "message-id").
// It connects only once the store is ready (start-up waits while the database is locked
// or the disk is full, up to --startup-deadline-ms; under systemd STATUS= says so, see
// service_frame.h). SIGINT/SIGTERM stop it cleanly; it then prints one summary line. A
// broker that refuses it for --refused-limit-ms (10 min) ends it with exit 7. Exit codes:
// exit_codes.h.
//
// --db postgresql:///sensors?host=/run/postgresql keeps the inbox and the business table
// (devices) in PostgreSQL instead (docs/postgres.md#the-sensor-gateway-on-postgresql): the
// same reading, applied by a PgStoredHandler in the worker's transaction. The URI holds no
// password: it comes from a password file (--db-password-file, or libpq's PGPASSFILE,
// ~/.pgpass); one with a password is refused (exit 1). The store is opened as the
// consumers open it (service_frame.h: Frame::open_inbox). One difference after a crash:
// the readings a killed gateway had claimed come back at once on restart on SQLite (its
// exclusive lock proves the old process gone), but on PostgreSQL only once the reaper has
// seen them make no progress for --lease-ms (it cannot tell a dead process from a slow
// one), so those devices (only those) wait one to one and a half --lease-ms.
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
#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
#include <mqtt_inbox/postgres.h>

#include <pqxx/pqxx>
#endif

namespace {

// A reading's value. Bad input is UndecodablePayload: a dead letter at once, on either
// store.
double decode_reading(const mqtt_inbox::StoredDelivery& d) {
  const auto j = nlohmann::json::parse(d.message.payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("value") || !j["value"].is_number())
    throw mqtt_inbox::UndecodablePayload("reading without a numeric 'value'");
  return j["value"].get<double>();
}

// The business change: runs in the worker's transaction, together with marking the
// reading done, so a reading is counted exactly once.
void apply_reading(SQLite::Database& db, const mqtt_inbox::StoredDelivery& d) {
  const double value = decode_reading(d);
  SQLite::Statement q(db,
                      "INSERT INTO devices (device, latest_value, latest_message_id, readings)"
                      " VALUES (?1, ?2, ?3, 1)"
                      " ON CONFLICT (device) DO UPDATE SET latest_value = ?2,"
                      "   latest_message_id = ?3, readings = readings + 1");
  q.bind(1, d.aggregate_key);  // the device, from the topic
  q.bind(2, value);
  q.bind(3, d.message_id);
  q.exec();
}

#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
// The same table on PostgreSQL, in the connection's default schema (public), beside the
// inbox's own schema; created at start-up by Inbox::setup_sql, looking first, so that a
// runtime role without CREATE starts (docs/postgres.md#privileges, ledger_postgres.h).
constexpr const char* kCreateTablePostgres =
    "DO $$ BEGIN"
    "  IF to_regclass('devices') IS NULL THEN"
    "    CREATE TABLE devices (device text PRIMARY KEY, latest_value double precision NOT NULL,"
    "      latest_message_id text NOT NULL, readings bigint NOT NULL);"
    "  END IF;"
    " END $$";

// The same change as a PgStoredHandler, in the worker's libpqxx transaction: it commits
// with the row's mark 'done', or not at all.
void apply_reading_postgres(pqxx::transaction_base& txn, const mqtt_inbox::StoredDelivery& d) {
  const double value = decode_reading(d);
  txn.exec_params0(
      "INSERT INTO devices (device, latest_value, latest_message_id, readings)"
      " VALUES ($1, $2, $3, 1) ON CONFLICT (device) DO UPDATE SET"
      " latest_value = excluded.latest_value, latest_message_id = excluded.latest_message_id,"
      " readings = devices.readings + 1",
      d.aggregate_key, value, d.message_id);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Latest reading per device, in order per device (mqtt-inbox store-then-process)"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  connection_flags::Flags connection;
  connection_flags::add(app, &connection, connection_flags::Role::kSubscriber);
  std::string topic = "sensors/+/reading", db_path, db_password_file, log_level = "info";
  int workers = 2;
  int64_t startup_deadline_ms = 0;
  int stop_timeout_ms = mqtt_inbox::SubscriberOptions{}.stop_timeout_ms;
  app.add_option("--db", db_path,
                 "SQLite database file, or a PostgreSQL URI (postgresql://..., no password)")
      ->required();
  app.add_option("--db-password-file", db_password_file,
                 "PostgreSQL: libpq password file (default: PGPASSFILE, ~/.pgpass)");
  app.add_option("--topic", topic, "Topic filter; the device is the second level")
      ->check(command_line::topic_filter());
  app.add_option("--workers", workers, "Worker threads")->check(CLI::Range(1, 64));
  int64_t lease_ms = mqtt_inbox::StoreThenProcessOptions{}.lease_ms;
  app.add_option("--lease-ms", lease_ms,
                 "A claim whose reading makes no progress this long is returned to pending "
                 "(ms); on PostgreSQL also how long a killed gateway's claimed devices wait "
                 "after its restart")
      ->check(CLI::PositiveNumber);
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
  const bool postgres = service_frame::is_postgres_location(db_path);
#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
  if (postgres) mqtt_inbox::enable_postgres_store();  // the store lives in mqtt_inbox::postgres
#endif
  // In a build without the PostgreSQL store, Inbox::open refuses such a location, saying so.
  mqtt_inbox::InboxOptions store;
  store.startup_deadline_ms = startup_deadline_ms;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (int rc = frame.open_inbox(db_path, store, db_password_file, /*normal_sync=*/false, &inbox);
      rc != examples::kExitOk)
    return rc;
  mqtt_inbox::Status tables;
  if (!postgres) {
    tables = inbox->setup([](SQLite::Database& db) {
      db.exec(
          "CREATE TABLE IF NOT EXISTS devices (device TEXT PRIMARY KEY,"
          " latest_value REAL NOT NULL, latest_message_id TEXT NOT NULL,"
          " readings INTEGER NOT NULL)");
    });
  } else {
#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
    tables = inbox->setup_sql(kCreateTablePostgres);
#else
    tables = mqtt_inbox::Status::InvalidArgument("this build has no PostgreSQL store");
#endif
  }
  if (!tables.ok()) return frame.fail(examples::startup_exit_code(tables), tables);

  // 2. Store-then-process: the device (topic level 1) is the aggregate key, so each
  //    device's readings are applied in arrival order. The handler is the store's: a
  //    StoredHandler on SQLite, a PgStoredHandler on PostgreSQL.
  mqtt_inbox::StoreThenProcessOptions o;
  o.aggregate_key = mqtt_inbox::aggregate_key_from_topic_level(1);
  o.workers = workers;
  o.lease_ms = lease_ms;
  std::unique_ptr<mqtt_inbox::StoreThenProcess> stp;
  mqtt_inbox::Status created;
  if (!postgres) {
    created = mqtt_inbox::StoreThenProcess::create(
        inbox.get(), "sensors", mqtt_inbox::StoredHandler(apply_reading), o, &stp);
  } else {
#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
    created = mqtt_inbox::StoreThenProcess::create(
        inbox.get(), "sensors", mqtt_inbox::PgStoredHandler(apply_reading_postgres), o, &stp);
#endif
  }
  if (!created.ok()) return frame.fail(examples::startup_exit_code(created), created);
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

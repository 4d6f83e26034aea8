// crash_consumer: the ledger consumer with fault switches, run as a child process by the
// crash tests. It dies exactly where a test asks, so a test can check what the broker
// redelivers and what the database holds afterwards.
//
//   crash_consumer BROKER CLIENT_ID TOPIC DB [--crash-after-commit ID] [--crash-in-handler ID]
//                  [--fail-attempts N] [--fail-handler ID] [--max-attempts N]
//                  [--max-payload BYTES] [--mqtt-version 3.1.1|5] [--requeue-poll-ms MS]
//
// --crash-after-commit ID  SIGKILL itself after ID's commit, before the callback returns
//                          (so before the PUBACK).
// --crash-in-handler ID    SIGKILL itself inside the handler whenever ID is processed
//                          (logging the attempt number and the delivery's DUP flag).
// --fail-attempts N        with --crash-in-handler: attempts 1..N of ID throw instead (a
//                          handler that fails, then kills the process).
// --fail-handler ID        the handler throws whenever ID is processed (a poison message).
// --lock-dir DIR           the client-id lock's folder (default: DB's folder).
// DB may be a PostgreSQL URI (postgresql://..., in builds with the PostgreSQL store): the
// ledger's tables and the credit are then examples/ledger_postgres.h's, the same switches
// apply (the core cases on PostgreSQL, tests/postgres/core_pg_test.cpp).
// SIGTERM: stops and prints the consumer's counters as "key=value" words on one line.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include <mqtt_inbox/mqtt_inbox.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "ledger.h"
#if MQTT_INBOX_TEST_WITH_POSTGRES
#include "ledger_postgres.h"
#endif

namespace {

bool is_postgres_uri(const std::string& db) {
  return db.rfind("postgresql://", 0) == 0 || db.rfind("postgres://", 0) == 0;
}

// What ledger_consumer runs, on either store (`sqlite`: its statements prepared once).
void apply_credit(const ledger::CreditHandler& sqlite, SQLite::Database& db,
                  const mqtt_inbox::Delivery& d) {
  sqlite(db, d);
}
#if MQTT_INBOX_TEST_WITH_POSTGRES
void apply_credit(const ledger::CreditHandler&, pqxx::transaction_base& txn,
                  const mqtt_inbox::Delivery& d) {
  ledger::postgres::apply_credit(txn, d);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: crash_consumer BROKER CLIENT_ID TOPIC DB [options]\n");
    return 64;
  }
  mqtt_inbox::SubscriberOptions mqtt;
  mqtt.broker_uri = argv[1];
  mqtt.client_id = argv[2];
  // Tests run in parallel with the same client id against different brokers: keep the
  // client-id lock next to the test's database.
  mqtt.client_id_lock_dir = std::string(argv[4]).substr(0, std::string(argv[4]).rfind('/'));
  const std::string topic = argv[3], db_path = argv[4];
  std::string crash_after_commit, crash_in_handler, fail_handler;
  int fail_attempts = 0;
  mqtt_inbox::ConsumerOptions copts;
  copts.retry_backoff_initial = std::chrono::milliseconds(10);
  copts.retry_backoff_max = std::chrono::milliseconds(20);
  for (int i = 5; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--crash-after-commit")
      crash_after_commit = value;
    else if (flag == "--crash-in-handler")
      crash_in_handler = value;
    else if (flag == "--fail-handler")
      fail_handler = value;
    else if (flag == "--fail-attempts")
      fail_attempts = std::stoi(value);
    else if (flag == "--max-attempts")
      copts.max_attempts = std::stoi(value);
    else if (flag == "--max-payload")
      copts.max_payload_bytes = std::stoul(value);
    else if (flag == "--lock-dir")
      mqtt.client_id_lock_dir = value;
    else if (flag == "--requeue-poll-ms")
      copts.requeue_poll_ms = std::stoll(value);
    else if (flag == "--mqtt-version")
      mqtt.mqtt_version =
          value == "5" ? mqtt_inbox::MqttVersion::kV5 : mqtt_inbox::MqttVersion::kV3_1_1;
    else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 64;
    }
  }
  auto log = spdlog::stdout_logger_mt("crash_consumer");
  log->set_level(spdlog::level::debug);
  log->flush_on(spdlog::level::debug);
  mqtt.logger = log;

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  mqtt_inbox::InboxOptions iopts;
  iopts.logger = log;
  iopts.after_commit_hook = [&](const std::string&, const std::string& id) {
    if (id == crash_after_commit) {
      log->info("crash after commit of {}", id);
      raise(SIGKILL);
    }
  };
  const bool postgres = is_postgres_uri(db_path);
#if MQTT_INBOX_TEST_WITH_POSTGRES
  if (postgres) mqtt_inbox::enable_postgres_store();
#endif
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(db_path, iopts, &inbox); !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
#if MQTT_INBOX_TEST_WITH_POSTGRES
  if (postgres) {
    if (auto s = inbox->setup_sql(ledger::postgres::kCreateTables); !s.ok()) {
      log->error("{}", s.to_string());
      return 1;
    }
  }
#endif
  if (!postgres) inbox->with_connection([](SQLite::Database& db) { ledger::create_tables(db); });

  // The handler for either store's transaction (SQLite::Database& or pqxx's).
  const ledger::CreditHandler credit;  // what ledger_consumer runs on SQLite
  auto handler = [&](auto& db, const mqtt_inbox::Delivery& d) {
    if (d.message_id == crash_in_handler) {
      if (d.attempt <= fail_attempts) {
        log->info("failure inside the handler on {} (attempt {}, dup {})", d.message_id, d.attempt,
                  d.message.dup ? 1 : 0);
        throw std::runtime_error("failing before the crash: " + d.message_id);
      }
      log->info("crash inside the handler on {} (attempt {}, dup {})", d.message_id, d.attempt,
                d.message.dup ? 1 : 0);
      raise(SIGKILL);
    }
    if (d.message_id == fail_handler) throw std::runtime_error("poison: " + d.message_id);
    apply_credit(credit, db, d);
  };
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  mqtt_inbox::Status created;
#if MQTT_INBOX_TEST_WITH_POSTGRES
  if (postgres)
    created = mqtt_inbox::Consumer::create(inbox.get(), "ledger", mqtt_inbox::PgHandler(handler),
                                           copts, &consumer);
  else
#endif
    created = mqtt_inbox::Consumer::create(inbox.get(), "ledger", mqtt_inbox::Handler(handler),
                                           copts, &consumer);
  if (auto s = created; !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
  std::unique_ptr<mqtt_inbox::Subscriber> sub;
  if (auto s = mqtt_inbox::Subscriber::create(mqtt, &sub); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }
  (void)sub->subscribe(topic, consumer.get());
  (void)sub->start();
  int sig = 0;
  sigwait(&stop, &sig);
  (void)sub->stop();
  const auto c = consumer->counters();
  std::printf(
      "counters: processed=%lld duplicates=%lld dead_lettered=%lld already_dead_lettered=%lld\n",
      static_cast<long long>(c.processed), static_cast<long long>(c.duplicates),
      static_cast<long long>(c.dead_lettered), static_cast<long long>(c.already_dead_lettered));
  std::fflush(stdout);
  return 0;
}

// walkthrough: the README's API walk-through as a whole program (the README includes this
// file verbatim; the ctest readme_walkthrough fails when the two differ). It applies JSON
// credits {"message_id": "c-1", "account": "alice", "amount": 5} from MQTT to account
// balances, exactly once, checks every Status, and stops cleanly on SIGINT or SIGTERM.
//
//   walkthrough [BROKER_URI [DATABASE]]      default: tcp://127.0.0.1:1883 ledger.db
//
// examples/ledger_consumer.cpp adds flags, TLS, a logger and a Pruner (retention).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>
#include <mqtt_inbox/mqtt_inbox.h>

namespace {

// Library calls return a Status and never throw: check every one.
void check(const mqtt_inbox::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "walkthrough: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

// The handler runs inside the claim transaction, on the inbox's connection. Throw to fail
// (rolled back, retried, then dead-lettered); throw UndecodablePayload for input that can
// never succeed (dead-lettered at once). `d` and what it refers to are valid only during
// the call: copy what you keep. payload_json() hands over the parse the consumer made
// while it read the message id from the payload (parsing it only if there is none).
void apply_credit(SQLite::Database& db, const mqtt_inbox::Delivery& d) {
  nlohmann::json parsed;
  const nlohmann::json& j = mqtt_inbox::payload_json(d, &parsed);
  if (!j.is_object() || !j.contains("account") || !j["account"].is_string() ||
      !j.contains("amount") || !j["amount"].is_number_integer())
    throw mqtt_inbox::UndecodablePayload("not a credit");  // no retries: it never will be
  SQLite::Statement credit(db, "INSERT INTO accounts (account, balance) VALUES (?1, ?2)"
                               " ON CONFLICT (account) DO UPDATE SET balance = balance + ?2");
  credit.bind(1, j.at("account").get<std::string>());
  credit.bind(2, j.at("amount").get<int64_t>());
  credit.exec();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string broker = argc > 1 ? argv[1] : "tcp://127.0.0.1:1883";
  const std::string path = argc > 2 ? argv[2] : "ledger.db";

  // 0. Block SIGINT and SIGTERM before any thread exists. Threads inherit the mask, so
  //    Paho's threads never take the signal; only sigwait() below receives it.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  if (pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr) != 0) return 1;

  // 1. The store, with your business tables, before anything connects: the broker
  //    redelivers unacked messages right after CONNACK.
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  check(mqtt_inbox::Inbox::open(path, {}, &inbox), "opening the inbox");
  try {  // with_connection passes on what its callback throws
    inbox->with_connection([](SQLite::Database& db) {
      db.exec("CREATE TABLE IF NOT EXISTS accounts"
              " (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)");
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "walkthrough: creating tables: %s\n", e.what());
    return 1;
  }

  // 2. The consumer: claim, handler and dead letters, one transaction per message.
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  check(mqtt_inbox::Consumer::create(inbox.get(), "ledger", apply_credit, {}, &consumer),
        "creating the consumer");

  // 3. The subscriber: persistent session, QoS 1, commit before PUBACK.
  mqtt_inbox::SubscriberOptions mqtt;
  mqtt.broker_uri = broker;
  mqtt.client_id = "ledger-gw-17";  // stable: the broker keeps the session under it
  mqtt.mqtt_version = mqtt_inbox::MqttVersion::kV5;
  std::unique_ptr<mqtt_inbox::Subscriber> sub;
  check(mqtt_inbox::Subscriber::create(mqtt, &sub), "creating the subscriber");
  check(sub->subscribe("credits/#", consumer.get()), "subscribing");
  check(sub->start(), "starting");  // connects in the background, reconnects itself

  // 4. Run until SIGINT or SIGTERM, then stop: a message in the handler is let finish.
  int sig = 0;
  sigwait(&stop_signals, &sig);
  const mqtt_inbox::Status stopped = sub->stop();
  if (!stopped.ok()) {  // kBusy: a message is still waiting for a failing store
    std::fprintf(stderr, "walkthrough: stopping: %s\n", stopped.to_string().c_str());
    std::_Exit(3);  // no destructors; the unacked message is redelivered to the next run
  }
  std::printf("processed %lld\n", static_cast<long long>(consumer->counters().processed));
  return 0;
}

// walkthrough [BROKER_URI [DATABASE]]: the README's minimal program (ctest readme_walkthrough).
// Applies JSON credits {"message_id": "c-1", "account": "alice", "amount": 5} from MQTT to
// account balances exactly once, until SIGINT or SIGTERM.
#include <SQLiteCpp/SQLiteCpp.h>
#include <mqtt_inbox/mqtt_inbox.h>
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace {

// Library calls return a Status and never throw: check every one.
void check(const mqtt_inbox::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "walkthrough: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

// Your tables; Inbox::setup() runs this in one transaction at start-up.
void create_tables(SQLite::Database& db) {
  db.exec(
      "CREATE TABLE IF NOT EXISTS accounts"
      " (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)");
}

// Runs inside the claim's transaction. Throw to fail: rolled back, retried, then
// dead-lettered; UndecodablePayload dead-letters at once. `d` is valid during the call only.
void apply_credit(SQLite::Database& db, const mqtt_inbox::Delivery& d) {
  nlohmann::json parsed;
  const nlohmann::json& j = mqtt_inbox::payload_json(d, &parsed);  // the id's parse, reused
  if (!j.is_object() || !j.contains("account") || !j["account"].is_string() ||
      !j.contains("amount") || !j["amount"].is_number_integer())
    throw mqtt_inbox::UndecodablePayload("not a credit");
  SQLite::Statement credit(db,
                           "INSERT INTO accounts (account, balance) VALUES (?1, ?2)"
                           " ON CONFLICT (account) DO UPDATE SET balance = balance + ?2");
  credit.bind(1, j.at("account").get<std::string>());
  credit.bind(2, j.at("amount").get<int64_t>());
  credit.exec();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string broker = argc > 1 ? argv[1] : "tcp://127.0.0.1:1883";
  const std::string path = argc > 2 ? argv[2] : "ledger.db";

  // Block SIGINT and SIGTERM before any thread exists: Paho's threads inherit the mask, so
  // only sigwait() below takes them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  if (pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr) != 0) return 1;

  // 1. The store and your tables before anything connects: the broker redelivers unacked
  //    messages right after CONNACK. setup() waits out a store another process holds.
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  check(mqtt_inbox::Inbox::open(path, {}, &inbox), "opening the inbox");
  check(inbox->setup(create_tables), "creating tables");

  // 2. The consumer: claim, handler and dead letters, one transaction per message.
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  check(mqtt_inbox::Consumer::create(inbox.get(), "ledger", apply_credit, {}, &consumer),
        "creating the consumer");

  // 3. The subscriber: persistent session, QoS 1, the PUBACK after the commit.
  mqtt_inbox::SubscriberOptions mqtt;
  mqtt.broker_uri = broker;
  mqtt.client_id = "ledger-gw-17";  // stable: the broker keeps the session under it
  std::unique_ptr<mqtt_inbox::Subscriber> sub;
  check(mqtt_inbox::Subscriber::create(mqtt, &sub), "creating the subscriber");
  check(sub->subscribe("credits/#", consumer.get()), "subscribing");
  check(sub->start(), "starting");  // connects in the background, reconnects by itself

  // 4. Run until SIGINT or SIGTERM; stop() lets a message in the handler commit first.
  int sig = 0;
  sigwait(&stop_signals, &sig);
  if (!sub->stop().ok()) std::_Exit(3);  // kBusy: stuck on the store; redelivered next run
  return 0;
}

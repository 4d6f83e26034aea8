// A tiny program that uses the installed/added mqtt_inbox the way an application does:
// opens an inbox, applies one message exactly once (a duplicate is skipped), and creates
// (without starting) a subscriber, so both libraries must link. Exit code 0 = OK.
#include <mqtt_inbox/mqtt_inbox.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

int main(int argc, char** argv) {
  const std::string db_path = argc > 1 ? argv[1] : "package_consumer.db";
  std::remove(db_path.c_str());

  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  mqtt_inbox::Status s = mqtt_inbox::Inbox::open(db_path, {}, &inbox);
  if (!s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.to_string().c_str());
    return 1;
  }
  inbox->with_connection([](SQLite::Database& db) {
    db.exec("CREATE TABLE IF NOT EXISTS hits (n INTEGER NOT NULL)");
  });

  auto handler = [](SQLite::Database& db, const mqtt_inbox::Delivery&) {
    db.exec("INSERT INTO hits (n) VALUES (1)");
  };
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  s = mqtt_inbox::Consumer::create(inbox.get(), "package-test", handler, {}, &consumer);
  if (!s.ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.to_string().c_str());
    return 1;
  }

  mqtt_inbox::Message m;
  m.topic = "t/1";
  m.payload = R"({"message_id":"m-1"})";
  const mqtt_inbox::Outcome first = consumer->handle(m);
  const mqtt_inbox::Outcome second = consumer->handle(m);

  int hits = -1;
  inbox->with_connection(
      [&](SQLite::Database& db) { hits = db.execAndGet("SELECT count(*) FROM hits").getInt(); });

  mqtt_inbox::SubscriberOptions opts;
  opts.broker_uri = "tcp://127.0.0.1:1";
  opts.client_id = "package-test";
  std::unique_ptr<mqtt_inbox::Subscriber> sub;
  s = mqtt_inbox::Subscriber::create(opts, &sub);
  if (!s.ok()) {
    std::fprintf(stderr, "subscriber: %s\n", s.to_string().c_str());
    return 1;
  }

  std::printf("mqtt_inbox %s: first=%s second=%s hits=%d\n", MQTT_INBOX_VERSION_STRING,
              mqtt_inbox::to_string(first), mqtt_inbox::to_string(second), hits);
  consumer.reset();
  inbox.reset();
  std::remove(db_path.c_str());
  const bool ok = first == mqtt_inbox::Outcome::kProcessed &&
                  second == mqtt_inbox::Outcome::kDuplicate && hits == 1;
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}

// Links only mqtt_inbox::postgres (find_package COMPONENTS postgres; no Paho): a
// postgresql:// location is refused until enable_postgres_store(), then reaches the
// PostgreSQL store, whose refusal of a password in the URI shows it (no server needed).
// The first argument (a database path, run_consumer.cmake's convention) is not used.
#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/postgres.h>

#include <cstdio>
#include <memory>
#include <string>

int main() {
  const std::string uri = "postgresql://user:secret@db.invalid/ledger";
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  const mqtt_inbox::Status before = mqtt_inbox::Inbox::open(uri, {}, &inbox);
  mqtt_inbox::enable_postgres_store();
  const mqtt_inbox::Status after = mqtt_inbox::Inbox::open(uri, {}, &inbox);
  std::printf("postgres only: before: %s\nafter: %s\n", before.to_string().c_str(),
              after.to_string().c_str());
  const bool ok = before.message().find("enable_postgres_store") != std::string::npos &&
                  after.message().find("holds a password") != std::string::npos;
  return ok ? 0 : 1;
}

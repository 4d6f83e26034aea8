// Links only mqtt_inbox::core (no Paho): opens an inbox and closes it.
#include <mqtt_inbox/inbox.h>

#include <cstdio>
#include <memory>

int main() {
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  mqtt_inbox::Status s = mqtt_inbox::Inbox::open("core_only.db", {}, &inbox);
  inbox.reset();
  std::remove("core_only.db");
  std::remove("core_only.db-wal");
  std::remove("core_only.db-shm");
  std::printf("core only: %s\n", s.to_string().c_str());
  return s.ok() ? 0 : 1;
}

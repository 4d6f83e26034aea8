// Links only mqtt_inbox::core (no Paho): opens an inbox and closes it.
// The database path is the first argument (run_consumer.cmake passes one inside the
// project's own build folder): the static, shared and .deb package tests run it at the
// same time under ctest -j, and a name relative to their shared working folder made them
// meet on one file's consumer lock.
#include <mqtt_inbox/inbox.h>

#include <cstdio>
#include <memory>
#include <string>

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "core_only.db";
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  mqtt_inbox::Status s = mqtt_inbox::Inbox::open(path, {}, &inbox);
  inbox.reset();
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
  std::printf("core only: %s\n", s.to_string().c_str());
  return s.ok() ? 0 : 1;
}

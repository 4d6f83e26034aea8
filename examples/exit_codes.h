// Exit codes of the example consumers (ledger_consumer, sensor_gateway), so a
// supervisor (systemd's RestartPreventExitStatus=, a shell loop) can tell the cases apart.
//
//   0  stopped cleanly
//   1  bad configuration, or another start-up failure
//   2  the MQTT subscriber could not be created or started
//   3  stopped while a message was still waiting for the store: it was not acked and
//      the broker redelivers it to the next run (README "Stopping while the store is stuck");
//      or while the outbox relay was: the rows it had not marked sent are published by the
//      next run
//   4  the store was not available at start-up: still locked, full or failing when
//      --startup-deadline-ms ran out, or another consumer process holds the database.
//      Nothing was connected; restarting later is safe
//   5  the database is corrupt (or not a database): nothing was acked, the file was left
//      untouched; recover it by hand (README "Recovering a corrupt database"). Restarting
//      does not help
//   6  a file of the database belongs to another user and cannot be written (README
//      "Files created under another user"); fix the owner, then restart
#pragma once

#include <mqtt_inbox/status.h>

namespace examples {

enum ExitCode {
  kExitOk = 0,
  kExitFailed = 1,
  kExitSubscriber = 2,
  kExitStoppedWhileStuck = 3,
  kExitStoreNotReady = 4,
  kExitCorrupt = 5,
  kExitPermission = 6,
};

// The exit code for a failed start-up call (Inbox::open, Inbox::setup, Pruner::create,
// StoreThenProcess::create/start).
inline int startup_exit_code(const mqtt_inbox::Status& s) {
  if (s.is_transient_store_error()) return kExitStoreNotReady;
  if (s.is_fatal_store_error()) return kExitCorrupt;
  if (s.code() == mqtt_inbox::Status::Code::kPermissionDenied) return kExitPermission;
  return kExitFailed;
}

}  // namespace examples

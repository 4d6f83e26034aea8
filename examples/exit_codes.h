// Exit codes of the example consumers (ledger_consumer, event_consumer, sensor_gateway),
// so a supervisor (systemd's RestartPreventExitStatus=, a shell loop) can tell the cases
// apart. "Restart: no" marks the codes a restart cannot fix: the shipped units list them
// in RestartPreventExitStatus=, so the unit shows "failed" instead of restarting every
// RestartSec= for ever. Before exiting with any code but 0, a program under systemd says
// why in STATUS= ("failed: ...", ServiceNotifier::failed).
//
//   0  stopped cleanly (also a stop requested during the start-up, before READY=1)
//   1  bad configuration: a command line the program cannot use (an unknown option, a
//      value that fails its check, a missing option; examples/common/command_line.h), a topic
//      option MQTT refuses; or another start-up failure. Restart: no. (--help: 0)
//   2  the MQTT subscriber could not be created or started: a bad connection flag, a
//      CA, certificate, key or password file missing or unreadable. Restart: no
//   3  stopped while a message was still waiting for the store: it was not acked and
//      the broker redelivers it to the next run
//      (docs/operations.md#stopping-while-the-store-is-stuck);
//      or while the outbox relay was: the rows it had not marked sent are published by the
//      next run
//   4  something another process holds was not available at start-up: the store still
//      locked, full or failing when --startup-deadline-ms ran out, another consumer
//      process holding the database, or another process on this host holding the MQTT
//      client id. Nothing was connected; restarting later is safe
//   5  the database is corrupt (or not a database): nothing was acked, the file was left
//      untouched; recover it by hand (docs/operations.md#recovering-a-corrupt-database).
//      Restart: no
//   6  a file of the database belongs to another user and cannot be written
//      (docs/operations.md#files-created-under-another-user); fix the owner, then
//      restart. Restart: no
//   7  the broker refused this client for longer than --refused-limit-ms (10 min by
//      default) without a single successful connection: bad user name or password, not
//      authorized, client id refused, banned, or the broker's certificate failed
//      verification against --cafile. Restart: no (fix the credentials or the CA;
//      docs/operations.md#installing-and-starting-a-unit shows how a device that must
//      heal by itself keeps retrying)
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
  kExitRefused = 7,
};

// The exit code for a failed start-up call (Inbox::open, Inbox::setup, Pruner::create,
// StoreThenProcess::create/start).
inline int startup_exit_code(const mqtt_inbox::Status& s) {
  if (s.is_transient_store_error()) return kExitStoreNotReady;
  if (s.is_fatal_store_error()) return kExitCorrupt;
  if (s.code() == mqtt_inbox::Status::Code::kPermissionDenied) return kExitPermission;
  return kExitFailed;
}

// The exit code for a failed Subscriber::create/subscribe/start: kBusy is the client-id
// lock held by another process (it goes away with that process), anything else is
// configuration.
inline int subscriber_exit_code(const mqtt_inbox::Status& s) {
  return s.code() == mqtt_inbox::Status::Code::kBusy ? kExitStoreNotReady : kExitSubscriber;
}

}  // namespace examples

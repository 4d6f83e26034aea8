// Internal (SQLite core): the outbox relay's registration for the wake-up after a commit
// that enqueued (store/sqlite/commit_wake.h), so that a Relay (MQTT layer) can be woken without
// reaching into the Outbox's or the Inbox's internals.
#pragma once

#include <cstdint>
#include <functional>

#include "mqtt_inbox/outbox.h"

namespace mqtt_inbox::detail {

struct OutboxAccess {
  // Calls `wake` after each commit on the connection of `outbox`'s Inbox whose
  // transaction enqueued a row (of this or another Outbox of that Inbox). `wake` runs on
  // the committing thread: it must only signal. Returns the id for remove_commit_waker.
  static uint64_t add_commit_waker(Outbox& outbox, std::function<void()> wake);
  // After it returns, the waker is not running and is never called again.
  static void remove_commit_waker(Outbox& outbox, uint64_t id);
};

}  // namespace mqtt_inbox::detail

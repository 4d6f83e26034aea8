// Health: what the code that waits for the store sees, as a snapshot that any thread can
// take at any time without waiting for the store (or for Paho's lock).
//
// Three levels (level() below):
//   green  the store answers.
//   amber  `stuck`: an operation waits for the store (locked by another process, disk
//          full, I/O failing, read-only) and retries with capped backoff. On the message
//          path nothing is acknowledged meanwhile; at start-up (`starting`) nothing has
//          connected to the broker yet. It clears by itself when the store recovers.
//   red    `fatal`: the store is unusable (SQLITE_CORRUPT, SQLITE_NOTADB). No message is
//          taken or acknowledged any more, and the library never writes, deletes or
//          recreates the file. Stop the application and recover the file
//          (docs/operations.md#recovering-a-corrupt-database); a restart on the same file
//          does not help.
//
// Where it comes from: Consumer::health() and StoreThenProcess::health() (their message
// path), Inbox::health() (the inbox's own start-up and maintenance waits, and the fatal
// state of the file for everyone), and InboxOptions::startup_progress (called while
// Inbox::open waits, when there is no object to ask yet). A supervisor or a systemd
// watchdog helper reads it to report "waiting for the store at start-up" or to stop
// pinging when the consumer has been stuck too long.
#pragma once

#include <cstdint>
#include <string>

namespace mqtt_inbox {

// A message held on purpose: its handler said "not yet" (RetryLater, handler.h; C:
// MQTT_INBOX_HANDLER_NOT_YET) because something it needs is down, and it is run again on
// the dependency schedule (ConsumerOptions::dependency_*). Not a wait for the store: the
// level stays what the store makes it (green), `stuck` stays false, and a systemd
// watchdog goes on pinging unless the wait passes
// ServiceNotifierOptions::dependency_wait_limit_ms.
struct DependencyWait {
  bool waiting = false;
  int64_t waited_ms = 0;       // since the message's first "not yet", monotonic
  std::string message_id;      // the message held
  int attempt = 0;             // runs of its handler since the wait began (1: the first "not yet")
  std::string reason;          // what the last "not yet" said (RetryLater::what())
  int64_t next_run_in_ms = 0;  // until its next run, when this snapshot was taken
};

// "waiting for a dependency: 42 s, message 'c-7', attempt 6: <reason>" (without ": <reason>"
// when it is empty); "" when not waiting. What health sources and STATUS= show.
inline std::string to_string(const DependencyWait& wait) {
  if (!wait.waiting) return std::string();
  std::string s = "waiting for a dependency: " + std::to_string(wait.waited_ms / 1000) +
                  " s, message '" + wait.message_id + "', attempt " + std::to_string(wait.attempt);
  if (!wait.reason.empty()) s += ": " + wait.reason;
  return s;
}

struct Health {
  bool stuck = false;              // an operation is waiting for the store right now (amber)
  int64_t stuck_since_ms = 0;      // wall-clock ms when the current wait began (0 if not)
  int64_t stuck_for_ms = 0;        // how long the current wait has lasted when this snapshot
                                   // was taken, ms, on a monotonic clock (0 if not stuck)
  int64_t retries = 0;             // store retries since the current wait began
  int64_t total_store_errors = 0;  // store failures seen since the object was made
  std::string last_error;          // text of the most recent store failure ("" if none)
  bool starting = false;           // the current wait is at start-up: the application has
                                   // not connected to the broker yet
  std::string operation;           // what is waiting, e.g. "recording an attempt",
                                   // "applying the schema" ("" when not stuck)
  bool fatal = false;              // the store is unusable (red); see the header comment
  std::string database;            // path of the database file this is about
  // Consumer::health() only: the message its handler held for a dependency, the longest
  // such wait if several threads feed it. Independent of the fields above.
  DependencyWait dependency;
};

enum class HealthLevel { kGreen, kAmber, kRed };

inline HealthLevel level(const Health& h) {
  if (h.fatal) return HealthLevel::kRed;
  return h.stuck ? HealthLevel::kAmber : HealthLevel::kGreen;
}

// "green", "amber", "red".
inline const char* to_string(HealthLevel l) {
  switch (l) {
    case HealthLevel::kGreen:
      return "green";
    case HealthLevel::kAmber:
      return "amber";
    case HealthLevel::kRed:
      return "red";
  }
  return "unknown";
}

}  // namespace mqtt_inbox

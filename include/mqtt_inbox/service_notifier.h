// ServiceNotifier: tells a service manager (systemd, through sd_notify(3)) that the
// application is ready, alive and healthy, and what it is doing, in the protocol a unit
// with Type=notify and WatchdogSec= expects (systemd.service(5), sd_notify(3)):
//
//   READY=1      ready(): once the store is open and the subscriber started. It does not
//                wait for the first CONNACK: a device boots before its network, and the
//                subscriber connects (and reconnects) in the background.
//   WATCHDOG=1   every WATCHDOG_USEC / 3 while no health source has been stuck longer
//                than stuck_limit_ms (nor waited for a dependency longer than
//                dependency_wait_limit_ms, when set). Past that limit the pings stop, so systemd's
//                watchdog (WatchdogSec=) kills and, with Restart=on-failure, restarts the
//                service. That is safe: a stuck message was never acked (its PUBACK
//                leaves only after its commit), so the broker redelivers it to the next
//                run, and the claim makes the redelivery apply at most once. Pings
//                resume if the sources recover before systemd acts.
//   STATUS=...   one line, refreshed when it changes (`systemctl status` shows it):
//                "connected; processed 1200; dead letters 3" or, while stuck,
//                "not connected; processed 1200; dead letters 3; stuck 42 s: ledger:
//                store failed while committing (busy: database is locked)", or while a
//                handler holds a message for a dependency, "connected; processed 1200;
//                ledger: waiting for a dependency: 42 s, message 'c-7', attempt 6: ...".
//   STOPPING=1   stopping(): on shutdown, before the subscriber stops.
//   EXTEND_TIMEOUT_USEC=...  during start-up (after start(), before ready()) every tick
//                while a source reports a known wait (stuck, e.g. the store is locked;
//                startup_health_source() below) that is still within stuck_limit_ms, by
//                three ticks, so TimeoutStartSec= does not end a wait the application
//                chose; past the limit the start timeout applies again.
//   STATUS=failed: ...  failed(): the reason a start-up or a run ends with an error.
//
// What it reports comes from health sources: small functions, each returning a
// ServiceHealth snapshot of one part of the application. health_source() adapts a
// Consumer, a StoreThenProcess, a Subscriber, a Relay and a Fleet (their health() and
// counters(), which never wait for the store or for Paho's lock; each declared beside its
// class: consumer.h, store_then_process.h, subscriber.h, relay.h, fleet.h),
// startup_health_source() the store's start-up waits; an application adds its own for
// anything else it waits on (a serial link).
//
// Stuck time is measured by the notifier on the monotonic clock, from the first tick that
// saw a source stuck until the first tick that sees it not stuck, so a wall-clock jump
// (NTP at boot) neither fires nor hides the watchdog. Resolution: one tick.
//
// Without systemd: the notifier reads NOTIFY_SOCKET and WATCHDOG_USEC (sd_watchdog_enabled)
// once, in create(). Without NOTIFY_SOCKET (started by hand, by another supervisor, in a
// test) every call does nothing and returns OK. When the library was built without
// libsystemd (MQTT_INBOX_WITH_SYSTEMD=OFF, or libsystemd-dev absent at configure time, as
// in a firmware build), supported() is false and every call does nothing and returns OK;
// create() then logs an error if NOTIFY_SOCKET is set, because a Type=notify unit will
// wait for a READY=1 that never comes.
//
// Thread safety: every method is safe from any thread. Health sources are called on the
// notifier's own thread (and in ready()/stopping()/status_line()), never concurrently with
// each other; they must return quickly and must not block on the store.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "mqtt_inbox/health.h"
#include "mqtt_inbox/status.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox {

// One part of the application as the service manager should see it. Unset optionals are
// left out of STATUS (a Consumer knows nothing of the connection). No field may hold a
// secret: STATUS is readable by every local user (`systemctl status`).
struct ServiceHealth {
  std::string name;                     // the part: a consumer name, "mqtt"; "" = unnamed
  std::optional<bool> connected;        // a transport's connection; nullopt = not a transport
  std::optional<int64_t> processed;     // effects committed by this part, this process
  std::optional<int64_t> dead_letters;  // dead letters written by this part, this process
  bool stuck = false;                   // cannot make progress now (a message waits for the store)
  std::string stuck_reason;             // why, one line (e.g. Health::last_error); "" if not stuck
  int64_t stuck_for_ms = 0;             // how long it has been stuck, ms, if it knows (Health::
                                        // stuck_for_ms); 0: counted from the tick that first saw it
  std::string note;                     // other state worth a word in STATUS; "" if none
  // Waiting for a dependency on purpose (a handler's RetryLater: Health::dependency): not
  // stuck. The STATUS text ("waiting for a dependency: 42 s, message 'c-7', attempt 6")
  // and how long the wait has lasted, ms; "" and 0 when not waiting. Counts against the
  // watchdog only past ServiceNotifierOptions::dependency_wait_limit_ms.
  std::string dependency_wait;
  int64_t dependency_wait_ms = 0;
};

// A snapshot function. Called on the notifier's thread every tick; see the thread-safety
// note above. An exception it throws is caught and shown in STATUS as a note.
using HealthSource = std::function<ServiceHealth()>;

// The adapters of the library's parts, health_source(), are declared beside their classes
// (consumer.h, store_then_process.h, subscriber.h, relay.h, fleet.h). Each keeps a
// reference: the object must outlive the notifier (declare the notifier after it, or
// destroy it first).

// The store's start-up waits (Inbox::open, Inbox::setup, Pruner::create,
// StoreThenProcess::create and start(): a locked store, a full disk, failing I/O), which
// run before there is an object to ask. Sets *progress to the callback to put in
// InboxOptions::startup_progress, and returns the source it feeds: name "store", stuck
// while a start-up call waits, with the operation and the last error ("waiting at
// start-up while opening the database: busy: database is locked"). Create the notifier
// and call start() before Inbox::open, so systemd sees the wait (STATUS=, and
// EXTEND_TIMEOUT_USEC= within stuck_limit_ms). The callback and the source share their
// state: either may outlive the other. `progress` may be null (the source then never
// reports a wait). With `notifier`, the callback also calls notifier->refresh(), so the
// first STATUS= of a wait leaves when the first attempt fails (about 1 s into the wait:
// Inbox::open cuts the first attempt's busy timeout to 1 s) and not at the next tick;
// `notifier` must then outlive the start-up calls.
class ServiceNotifier;
HealthSource startup_health_source(std::function<void(const Health&)>* progress,
                                   ServiceNotifier* notifier = nullptr);

struct ServiceNotifierOptions {
  // Watchdog pings stop once any source has been stuck continuously for longer than this,
  // ms. Size it above the longest wait you accept before a restart (a backup holding the
  // write lock, a disk being cleaned). 0 = never withhold pings. Default 300000 (5 min).
  int64_t stuck_limit_ms = 300000;
  // A source waiting for a dependency (ServiceHealth::dependency_wait: a handler said
  // "not yet", RetryLater) is not stuck: the wait is on purpose and bounded by the
  // consumer's dependency_wait_max, and a restart would only begin it again. Pings go on
  // and STATUS shows the wait. Once one such wait has lasted longer than this, ms, the
  // pings stop as for a stuck source, so systemd restarts the service: set it when a
  // restart mends the dependency (a client library of the handler's that only reconnects
  // at start). 0 = never. Default 0.
  int64_t dependency_wait_limit_ms = 0;
  // How often the sources are read and STATUS refreshed, ms. With a watchdog
  // (WATCHDOG_USEC set) the tick is the shorter of this and WATCHDOG_USEC / 3, so a ping
  // is never late (systemd recommends at most half the interval). >= 10. Default 5000.
  int64_t status_interval_ms = 5000;
  // Where the notifier logs (watchdog pings withheld and resumed, a source that threw).
  // Default nullptr = the "mqtt_inbox" logger (see options.h).
  std::shared_ptr<spdlog::logger> logger;
};

class ServiceNotifier {
 public:
  // True if this build of the library can notify (it was built with libsystemd).
  static bool supported();

  // Reads NOTIFY_SOCKET and the watchdog interval (sd_watchdog_enabled(3): WATCHDOG_USEC,
  // checked against WATCHDOG_PID) once. Starts no thread. Errors: kInvalidArgument for a
  // stuck_limit_ms < 0 or status_interval_ms < 10.
  static Status create(const ServiceNotifierOptions& options,
                       std::unique_ptr<ServiceNotifier>* out);
  // Stops the notifier's thread (sends nothing more). Call it before destroying what the
  // sources read.
  ~ServiceNotifier();
  ServiceNotifier(const ServiceNotifier&) = delete;
  ServiceNotifier& operator=(const ServiceNotifier&) = delete;

  // Adds a source; it is read from the next tick on. Errors: kInvalidArgument if empty.
  Status add_source(HealthSource source);

  // True if notifications go anywhere: supported() and NOTIFY_SOCKET was set at create().
  bool enabled() const;
  // The watchdog interval the service manager asked for, µs (WATCHDOG_USEC); 0 if none or
  // not enabled().
  int64_t watchdog_interval_us() const;

  // Optional start-up phase: starts the notifier's thread before ready(), which then
  // refreshes STATUS ("starting; ...") and sends EXTEND_TIMEOUT_USEC while a source is
  // stuck within stuck_limit_ms (see the header comment). Idempotent.
  Status start();
  // READY=1 with the first STATUS (and WATCHDOG=1 if a watchdog is set), then the thread
  // pings the watchdog and refreshes STATUS every tick. Starts the thread if start() did
  // not. Idempotent: a second call sends nothing.
  Status ready();
  // STATUS "failed: <reason>" (one line, at most 400 bytes; no secret: every local user
  // can read it), with STOPPING=1 if READY=1 was sent. For a service about to exit with
  // an error (a corrupt database, a bad option, a start-up deadline), so `systemctl
  // status` says why; the ticks no longer replace that STATUS. Idempotent: only the
  // first call sends.
  Status failed(const std::string& reason);
  // STOPPING=1 and STATUS "stopping; ...". The thread goes on pinging the watchdog (under
  // the same stuck rule) until the notifier is destroyed, because systemd keeps the
  // watchdog armed while the service stops and Subscriber::stop() may wait up to its
  // stop_timeout_ms for a message in the callback.
  Status stopping();

  // Reads the sources and refreshes STATUS (and EXTEND_TIMEOUT_USEC while starting) now,
  // on the notifier's thread, instead of at the next tick: for a source whose state just
  // changed, such as the start-up wait's (startup_health_source's callback calls it when
  // given the notifier). Returns at once; a no-op before start() or ready(). Thread-safe.
  void refresh();

  // The STATUS line for the sources' state now, as it would be sent. Reads the sources.
  std::string status_line() const;
  // True while watchdog pings are withheld (a source stuck past stuck_limit_ms).
  bool watchdog_withheld() const;

 private:
  struct Impl;
  explicit ServiceNotifier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mqtt_inbox

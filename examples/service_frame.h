// service_frame: what every example service (ledger_consumer, event_consumer,
// sensor_gateway) does around its own work, so each behaves the same under systemd:
//
//   begin()   the log; SIGINT/SIGTERM blocked and read by one thread; the ServiceNotifier
//             created and its start-up phase begun BEFORE the store is opened, so every
//             wait before READY=1 (the store locked, the disk full, I/O failing) shows in
//             STATUS= and extends the start timeout (EXTEND_TIMEOUT_USEC=) while it lasts
//             (up to --stuck-limit-ms).
//   store()   InboxOptions wired to that: the logger and startup_progress.
//   open_inbox()  the store at --db, an SQLite file or a PostgreSQL URI
//             (is_postgres_location()), opened with those options; what does not apply to
//             a PostgreSQL location refused, the password file passed on.
//   fail()    a start-up (or run) that ends with an error: logged, STATUS=failed: ...,
//             the exit code of exit_codes.h returned.
//   ready()   READY=1 once the store is open and the subscriber started (not after the
//             first CONNACK: a device boots before its network).
//   wait()    until SIGINT/SIGTERM, or until the broker has refused this client for
//             --refused-limit-ms (exit 7).
//   end()     stops the notifier, before the objects its sources read are destroyed.
//
// A stop signal before ready() ends the process at once (exit 0): a start-up may be
// waiting for the store for minutes, and systemd's stop (or its start timeout) must not
// wait TimeoutStopSec= for it. That is as safe as SIGKILL, which the guarantee covers:
// nothing is acked before its commit.
#pragma once

#include <mqtt_inbox/mqtt_inbox.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "exit_codes.h"

namespace service_frame {

// True for a PostgreSQL location: a libpq URI ("postgresql://..." or "postgres://..."),
// which Inbox::open gives to the PostgreSQL store (mqtt_inbox/postgres.h); anything else is
// an SQLite file. A program that offers PostgreSQL calls mqtt_inbox::enable_postgres_store()
// before opening such a location.
inline bool is_postgres_location(const std::string& db) {
  return db.rfind("postgresql://", 0) == 0 || db.rfind("postgres://", 0) == 0;
}

struct Options {
  std::string log_name;            // the logger's name (journal SYSLOG_IDENTIFIER)
  std::string log_level = "info";  // trace|debug|info|warn|error
  int64_t stuck_limit_ms = mqtt_inbox::ServiceNotifierOptions{}.stuck_limit_ms;
  int64_t refused_limit_ms = 600000;  // --refused-limit-ms; 0 = retry for ever
};

// True for a failed connection attempt that only a change of configuration (here or at
// the broker) can cure: a CONNACK refusal other than "server unavailable/busy, quota or
// rate exceeded", a TLS handshake or certificate failure, an unreadable password file.
inline bool refused(const mqtt_inbox::ConnectionHealth& h) {
  using F = mqtt_inbox::ConnectionHealth::Failure;
  if (h.last_failure == F::kTls || h.last_failure == F::kCredentials) return true;
  if (h.last_failure != F::kRefused) return false;
  switch (h.connack_code) {
    case 3:     // 3.1.1 server unavailable
    case 0x88:  // server unavailable
    case 0x89:  // server busy
    case 0x97:  // quota exceeded
    case 0x9F:  // connection rate exceeded
      return false;
    default:
      return true;
  }
}

class Frame {
 public:
  Frame() = default;
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;
  ~Frame() {
    end();
    if (signals_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        quit_ = true;
      }
      // The signal thread waits in sigwait(); wake it with a signal that only it takes.
      pthread_kill(signals_.native_handle(), SIGTERM);
      signals_.join();
    }
  }

  // Returns kExitOk, or the exit code for main() to return. Call first, before any other
  // thread starts (the stop signals are blocked for every thread made afterwards).
  int begin(const Options& o) {
    options_ = o;
    // To the journal (with priorities and CONSUMER=/INBOX_MESSAGE_ID=) under systemd,
    // else to stderr.
    if (auto s = mqtt_inbox::make_service_logger(o.log_name, {o.log_level, ""}, &log_); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return examples::kExitFailed;
    }
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);

    mqtt_inbox::ServiceNotifierOptions service;
    service.stuck_limit_ms = o.stuck_limit_ms;
    service.logger = log_;
    if (auto s = mqtt_inbox::ServiceNotifier::create(service, &notifier_); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::kExitFailed;
    }
    // After notifier_ is set: the signal thread reads it.
    signals_ = std::thread([this, stop] { read_signals(stop); });
    // With the notifier: the first failed attempt of a start-up wait refreshes STATUS=
    // at once, not at the next tick (up to 5 s later).
    (void)notifier_->add_source(
        mqtt_inbox::startup_health_source(&startup_progress_, notifier_.get()));
    (void)notifier_->start();  // STATUS=starting, and the start-up waits from here on
    return examples::kExitOk;
  }

  const std::shared_ptr<spdlog::logger>& log() const { return log_; }
  mqtt_inbox::ServiceNotifier& notifier() { return *notifier_; }

  // The logger and the start-up reporting for the program's InboxOptions.
  void store(mqtt_inbox::InboxOptions* o) const {
    o->logger = log_;
    o->startup_progress = startup_progress_;
  }

  // Opens the store at `db` into `*out`, with `o` wired as store() does. `password_file`
  // (--db-password-file; empty: libpq's PGPASSFILE, ~/.pgpass) becomes
  // InboxOptions::postgres_password_file. `normal_sync` (--synchronous-normal) sets
  // Synchronous::kNormal on SQLite; on a PostgreSQL location, where durability is the
  // server's synchronous_commit, it is refused (exit 1), not silently ignored. A URI that
  // holds a password is refused by Inbox::open (exit 1, the password not repeated).
  // Returns kExitOk, or the exit code for main() to return (STATUS= says why).
  int open_inbox(const std::string& db, mqtt_inbox::InboxOptions o,
                 const std::string& password_file, bool normal_sync,
                 std::unique_ptr<mqtt_inbox::Inbox>* out) {
    store(&o);
    if (is_postgres_location(db) && normal_sync)
      return fail(examples::kExitFailed,
                  mqtt_inbox::Status::InvalidArgument(
                      "--synchronous-normal is SQLite's PRAGMA synchronous and does not "
                      "apply to a PostgreSQL location: durability there is the server's "
                      "synchronous_commit (docs/postgres.md#what-is-supported)"));
    if (normal_sync) o.synchronous = mqtt_inbox::Synchronous::kNormal;
    o.postgres_password_file = password_file;
    if (auto s = mqtt_inbox::Inbox::open(db, o, out); !s.ok())
      return fail(examples::startup_exit_code(s), s);
    return examples::kExitOk;
  }

  // Logs `s`, tells systemd why the program ends (STATUS=failed: ...) and returns `code`.
  int fail(int code, const mqtt_inbox::Status& s) {
    log_->error("{}", s.to_string());
    if (notifier_)
      (void)notifier_->failed("exit " + std::to_string(code) + ": " + s.to_string() +
                              (no_restart(code) ? " (a restart does not help)" : ""));
    log_->flush();
    return code;
  }

  // READY=1; from now on a stop signal is handed to wait(). `subscriber`, `relay` and
  // `fleet`, if given, are watched by wait() for refusals: the relay and the fleet's slots
  // connect with the same flags, so a broker that refuses them (credentials, client id,
  // CA) is the same configuration error. A fleet counts as refused when every slot it
  // serves is.
  void ready(const mqtt_inbox::Subscriber* subscriber, const mqtt_inbox::Relay* relay = nullptr,
             const mqtt_inbox::Fleet* fleet = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      watched_.clear();
      if (subscriber) watched_.push_back({"client", [subscriber] { return subscriber->health(); }});
      if (relay) watched_.push_back({"relay", [relay] { return relay->health(); }});
      // A fleet member: refused when the broker refuses every slot it serves (the flags
      // are one configuration). Not for one slot alone: a refusal tied to one client id
      // (an ACL) would end each member in turn as the slot moved on.
      if (fleet)
        watched_.push_back({"member's slots", [fleet] {
                              const mqtt_inbox::FleetHealth f = fleet->health();
                              for (const mqtt_inbox::ConnectionHealth& h : f.serving_health)
                                if (h.connected || !refused(h))
                                  return mqtt_inbox::ConnectionHealth{};
                              return f.serving_health.empty() ? mqtt_inbox::ConnectionHealth{}
                                                              : f.serving_health.front();
                            }});
      running_ = true;
    }
    (void)notifier_->ready();
  }

  // Blocks until a stop signal (returns kExitOk) or until the broker has refused a watched
  // connection for refused_limit_ms on end (returns kExitRefused, STATUS says why).
  int wait() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (signal_ != 0) {
        log_->info("signal {}: stopping", signal_);
        return examples::kExitOk;
      }
      for (Watched& w : options_.refused_limit_ms > 0 ? watched_ : none_) {
        const mqtt_inbox::ConnectionHealth h = w.health();
        const auto now = std::chrono::steady_clock::now();
        if (h.connected || !refused(h) || h.consecutive_failures == 0) {
          w.refusing = false;
        } else if (!w.refusing) {
          w.refusing = true;
          w.refused_since = now;
        } else if (now - w.refused_since >= std::chrono::milliseconds(options_.refused_limit_ms)) {
          refusal_ = "the broker refused this " + w.what + " for " +
                     std::to_string(options_.refused_limit_ms / 1000) +
                     " s, every attempt: " + h.last_error;
          log_->critical(
              "{}; giving up (exit {}): fix the credentials, the client id or "
              "the CA, then start the service again",
              refusal_, static_cast<int>(examples::kExitRefused));
          return examples::kExitRefused;
        }
      }
      cv_.wait_for(lock, std::chrono::seconds(1));
    }
  }

  // After wait() returned kExitRefused and the program stopped: STATUS says why.
  int refused_exit() {
    (void)notifier_->failed("exit 7: " + refusal_ + " (a restart does not help)");
    log_->flush();
    return examples::kExitRefused;
  }

  // STOPPING=1 and STATUS=stopping; ...
  void stopping() { (void)notifier_->stopping(); }

  // Stops the notifier's thread. Call before the objects of its sources go.
  void end() {
    std::lock_guard<std::mutex> lock(mu_);
    notifier_.reset();
  }

 private:
  static bool no_restart(int code) {
    return code == examples::kExitFailed || code == examples::kExitSubscriber ||
           code == examples::kExitCorrupt || code == examples::kExitPermission ||
           code == examples::kExitRefused;
  }

  void read_signals(sigset_t stop) {
    for (;;) {
      int sig = 0;
      if (sigwait(&stop, &sig) != 0) continue;
      std::unique_lock<std::mutex> lock(mu_);
      if (quit_) return;
      if (!running_) {
        // Before READY=1 the main thread may wait for the store for minutes.
        log_->info("signal {} during start-up: exiting now (nothing was acked)", sig);
        if (notifier_) (void)notifier_->stopping();
        log_->flush();
        std::_Exit(examples::kExitOk);
      }
      signal_ = sig;
      cv_.notify_all();
    }
  }

  Options options_;
  std::shared_ptr<spdlog::logger> log_;
  std::function<void(const mqtt_inbox::Health&)> startup_progress_;
  std::unique_ptr<mqtt_inbox::ServiceNotifier> notifier_;
  std::thread signals_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false, quit_ = false;
  int signal_ = 0;
  // A connection wait() watches for refusals, and since when every attempt was refused.
  struct Watched {
    std::string what;  // "client" (the subscriber) or "relay"
    std::function<mqtt_inbox::ConnectionHealth()> health;
    bool refusing = false;
    std::chrono::steady_clock::time_point refused_since{};
  };
  std::vector<Watched> watched_;
  std::vector<Watched> none_;
  std::string refusal_;
};

}  // namespace service_frame

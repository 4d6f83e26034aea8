// ServiceNotifier: readiness, watchdog and status for a service manager (sd_notify(3)),
// fed by health sources (service_notifier.h), and the source of the store's start-up
// waits. The library's parts' sources sit beside their classes (inbox/, stp/, mqtt/ and
// fleet/ health_source.cpp).
//
// Built with libsystemd when MQTT_INBOX_HAVE_LIBSYSTEMD is 1 (CMake: MQTT_INBOX_WITH_SYSTEMD);
// otherwise every notification is a no-op (supported() == false).
#include "mqtt_inbox/service_notifier.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#if MQTT_INBOX_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "util/log.h"

namespace mqtt_inbox {

namespace {

using SteadyClock = std::chrono::steady_clock;

// STATUS is one line of printable text: systemctl shows it, and a reason may hold bytes
// from anywhere (an SQLite message, a file name).
std::string one_line(const std::string& text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  for (char c : text) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    out.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? ' ' : c);
  }
  return out;
}

std::string with_name(const ServiceHealth& h, const std::string& text) {
  return h.name.empty() ? text : h.name + ": " + text;
}

}  // namespace

HealthSource startup_health_source(std::function<void(const Health&)>* progress,
                                   ServiceNotifier* notifier) {
  struct State {
    std::mutex mu;
    Health health;
    SteadyClock::time_point began;  // when the wait began: stuck_for_ms before the report
  };
  auto state = std::make_shared<State>();
  if (progress)
    *progress = [state, notifier](const Health& h) {
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->health = h;
        state->began = SteadyClock::now() - std::chrono::milliseconds(h.stuck_for_ms);
      }
      if (notifier) notifier->refresh();
    };
  return [state] {
    Health health;
    SteadyClock::time_point began;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      health = state->health;
      began = state->began;
    }
    ServiceHealth h;
    h.name = "store";
    h.stuck = health.stuck;
    if (health.stuck)
      h.stuck_for_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - began).count();
    if (health.stuck)
      h.stuck_reason = "waiting at start-up while " +
                       (health.operation.empty() ? std::string("opening") : health.operation) +
                       ": " + health.last_error;
    return h;
  };
}

struct ServiceNotifier::Impl {
  enum class Phase { kIdle, kStarting, kRunning, kStopping };

  ServiceNotifierOptions options;
  std::shared_ptr<spdlog::logger> log;
  bool enabled = false;
  int64_t watchdog_us = 0;
  std::chrono::milliseconds tick{0};

  // Held from reading the state to sending it, by ready(), stopping() and each tick, so
  // datagrams leave in the order of the state changes: a tick woken by ready() cannot
  // send WATCHDOG=1 (or a newer STATUS) before ready()'s READY=1. Taken before `mu`.
  std::mutex send_mu;

  // Guards everything below; never held while a source runs or a datagram is sent.
  mutable std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kIdle;
  bool ready_sent = false;
  bool quit = false;
  bool refresh_now = false;  // refresh(): tick at once
  bool withheld = false;
  bool failed = false;  // failed() sent its STATUS: the ticks no longer replace it
  std::string last_status;
  std::thread thread;

  // Sources, and per source when the notifier first saw it stuck (monotonic). Sources
  // are called under sources_mu only, so they never run concurrently.
  mutable std::mutex sources_mu;
  std::vector<HealthSource> sources;
  mutable std::vector<std::optional<SteadyClock::time_point>> stuck_seen;

  struct Snapshot {
    std::string status;    // without the phase prefix
    bool stuck = false;    // some source is stuck (seen by this tick or earlier)
    int64_t stuck_ms = 0;  // longest continuous stuck time of any source
    bool over_limit = false;
    std::string over_why;  // which limit, for the log: "stuck for N ms, over the M ms limit"
  };

  // Reads every source once and composes the STATUS text (for `phase`: what being over
  // the limit means differs before READY=1).
  Snapshot read_sources(Phase for_phase) const {
    std::lock_guard<std::mutex> lock(sources_mu);
    const auto now = SteadyClock::now();
    std::vector<ServiceHealth> hs;
    hs.reserve(sources.size());
    for (size_t i = 0; i < sources.size(); ++i) {
      ServiceHealth h;
      try {
        h = sources[i]();
      } catch (const std::exception& e) {
        h = ServiceHealth{};
        h.note = std::string("health source failed: ") + e.what();
      } catch (...) {
        h = ServiceHealth{};
        h.note = "health source failed";
      }
      if (!h.stuck) {
        stuck_seen[i].reset();
      } else {
        // A source that knows when its wait began (a first attempt that took the busy
        // timeout before it failed) is believed: the figure is the wait's, not the ticks'.
        const auto began = now - std::chrono::milliseconds(std::max<int64_t>(0, h.stuck_for_ms));
        if (!stuck_seen[i] || began < *stuck_seen[i]) stuck_seen[i] = began;
      }
      hs.push_back(std::move(h));
    }

    Snapshot snap;
    std::vector<std::string> parts;
    int transports = 0, connected = 0;
    bool any_processed = false, any_dead = false;
    int64_t processed = 0, dead = 0;
    for (const auto& h : hs) {
      if (h.connected) {
        ++transports;
        if (*h.connected) ++connected;
      }
      if (h.processed) {
        any_processed = true;
        processed += *h.processed;
      }
      if (h.dead_letters) {
        any_dead = true;
        dead += *h.dead_letters;
      }
    }
    if (transports > 0)
      parts.push_back(connected == transports ? "connected"
                      : connected == 0        ? "not connected"
                                              : std::to_string(connected) + " of " +
                                             std::to_string(transports) + " connected");
    if (any_processed) parts.push_back("processed " + std::to_string(processed));
    if (any_dead) parts.push_back("dead letters " + std::to_string(dead));

    const ServiceHealth* worst = nullptr;
    for (size_t i = 0; i < hs.size(); ++i) {
      if (!stuck_seen[i]) continue;
      const int64_t ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - *stuck_seen[i]).count();
      if (!worst || ms > snap.stuck_ms) {
        worst = &hs[i];
        snap.stuck_ms = ms;
      }
    }
    if (worst) {
      snap.stuck = true;
      snap.over_limit = options.stuck_limit_ms > 0 && snap.stuck_ms >= options.stuck_limit_ms;
      if (snap.over_limit)
        snap.over_why = "stuck for " + std::to_string(snap.stuck_ms) + " ms, over the " +
                        std::to_string(options.stuck_limit_ms) + " ms limit";
      std::string s =
          "stuck " + std::to_string(snap.stuck_ms / 1000) + " s: " +
          with_name(*worst, worst->stuck_reason.empty() ? "no reason given" : worst->stuck_reason);
      if (snap.over_limit)
        s += " (over the " + std::to_string(options.stuck_limit_ms / 1000) + " s limit: " +
             (for_phase == Phase::kStarting ? "start timeout no longer extended"
                                            : "watchdog pings stopped") +
             ")";
      parts.push_back(std::move(s));
    }
    // Waits for a dependency (a handler's "not yet"): shown, not stuck; past the limit the
    // user set, they stop the pings as a stuck source does.
    for (const auto& h : hs) {
      if (h.dependency_wait.empty()) continue;
      std::string s = with_name(h, h.dependency_wait);
      if (options.dependency_wait_limit_ms > 0 &&
          h.dependency_wait_ms >= options.dependency_wait_limit_ms) {
        if (!snap.over_limit)
          snap.over_why = "waiting for a dependency for " + std::to_string(h.dependency_wait_ms) +
                          " ms, over the " + std::to_string(options.dependency_wait_limit_ms) +
                          " ms dependency limit";
        snap.over_limit = true;
        s += " (over the " + std::to_string(options.dependency_wait_limit_ms / 1000) +
             " s dependency limit: " +
             (for_phase == Phase::kStarting ? "start timeout no longer extended"
                                            : "watchdog pings stopped") +
             ")";
      }
      parts.push_back(std::move(s));
    }
    for (const auto& h : hs)
      if (!h.note.empty()) parts.push_back(with_name(h, h.note));

    std::string status;
    for (const auto& p : parts) {
      if (!status.empty()) status += "; ";
      status += p;
    }
    snap.status = one_line(status, 400);
    return snap;
  }

  static std::string prefixed(Phase in_phase, const std::string& status) {
    const char* prefix = in_phase == Phase::kStarting   ? "starting"
                         : in_phase == Phase::kStopping ? "stopping"
                                                        : nullptr;
    if (prefix) return status.empty() ? prefix : std::string(prefix) + "; " + status;
    return status.empty() && in_phase == Phase::kRunning ? "running" : status;
  }

  void send(const std::string& state) const {
#if MQTT_INBOX_HAVE_LIBSYSTEMD
    if (!enabled || state.empty()) return;
    const int r = sd_notify(0, state.c_str());
    if (r < 0) log->warn("sd_notify failed: {}", std::strerror(-r));
#else
    (void)state;
#endif
  }

  // One tick: read the sources, decide on the watchdog ping, send what changed.
  Phase current_phase() const {
    std::lock_guard<std::mutex> lock(mu);
    return phase;
  }

  void tick_once() {
    std::lock_guard<std::mutex> order(send_mu);
    const Snapshot snap = read_sources(current_phase());
    std::string msg;
    bool log_withheld = false, log_resumed = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (phase == Phase::kStarting) {
        // From the first tick that sees the wait: TimeoutStartSec= may be close.
        if (snap.stuck && !snap.over_limit)
          msg += "EXTEND_TIMEOUT_USEC=" +
                 std::to_string(
                     3 * std::chrono::duration_cast<std::chrono::microseconds>(tick).count()) +
                 "\n";
      } else if (watchdog_us > 0) {
        if (!snap.over_limit) msg += "WATCHDOG=1\n";
      }
      if (snap.over_limit != withheld) {
        withheld = snap.over_limit;
        (withheld ? log_withheld : log_resumed) = phase != Phase::kStarting;
      }
      const std::string status = prefixed(phase, snap.status);
      if (!failed && status != last_status) {
        last_status = status;
        msg += "STATUS=" + status + "\n";
      }
    }
    if (log_withheld)
      log->error(
          "service watchdog: {}; watchdog pings stop, so the service manager restarts the "
          "service. Safe: the message held was never acked and the broker redelivers it. ({})",
          snap.over_why, snap.status);
    if (log_resumed) log->info("service watchdog: no longer stuck; watchdog pings resume");
    send(msg);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!quit) {
      lock.unlock();
      tick_once();
      lock.lock();
      cv.wait_for(lock, tick, [&] { return quit || refresh_now; });
      refresh_now = false;
    }
  }

  void start_thread_locked() {
    if (!thread.joinable() && enabled) thread = std::thread([this] { run(); });
  }
};

ServiceNotifier::ServiceNotifier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ServiceNotifier::~ServiceNotifier() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->quit = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void ServiceNotifier::refresh() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->refresh_now = true;
  }
  impl_->cv.notify_all();
}

bool ServiceNotifier::supported() { return MQTT_INBOX_HAVE_LIBSYSTEMD != 0; }

Status ServiceNotifier::create(const ServiceNotifierOptions& options,
                               std::unique_ptr<ServiceNotifier>* out) {
  if (!out) return Status::InvalidArgument("out is null");
  if (options.stuck_limit_ms < 0) return Status::InvalidArgument("stuck_limit_ms must be >= 0");
  if (options.dependency_wait_limit_ms < 0)
    return Status::InvalidArgument("dependency_wait_limit_ms must be >= 0");
  if (options.status_interval_ms < 10)
    return Status::InvalidArgument("status_interval_ms must be >= 10");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->log = detail::logger_or_default(options.logger);
  const char* socket = std::getenv("NOTIFY_SOCKET");
  const bool under_manager = socket && *socket;
#if MQTT_INBOX_HAVE_LIBSYSTEMD
  impl->enabled = under_manager;
  uint64_t usec = 0;
  if (impl->enabled && sd_watchdog_enabled(0, &usec) > 0)
    impl->watchdog_us = static_cast<int64_t>(usec);
#else
  if (under_manager)
    impl->log->error(
        "NOTIFY_SOCKET is set, but this mqtt-inbox was built without libsystemd: "
        "no READY=1, watchdog ping or status will be sent, and a Type=notify unit "
        "waits for READY=1 until it times out. Rebuild with libsystemd-dev "
        "installed, or run it with Type=exec.");
#endif
  impl->tick = std::chrono::milliseconds(options.status_interval_ms);
  if (impl->watchdog_us > 0)
    impl->tick = std::min(
        impl->tick, std::chrono::milliseconds(std::max<int64_t>(1, impl->watchdog_us / 3000)));
  out->reset(new ServiceNotifier(std::move(impl)));
  return Status::Ok();
}

Status ServiceNotifier::add_source(HealthSource source) {
  if (!source) return Status::InvalidArgument("health source is empty");
  std::lock_guard<std::mutex> lock(impl_->sources_mu);
  impl_->sources.push_back(std::move(source));
  impl_->stuck_seen.emplace_back();
  return Status::Ok();
}

bool ServiceNotifier::enabled() const { return impl_->enabled; }
int64_t ServiceNotifier::watchdog_interval_us() const { return impl_->watchdog_us; }

Status ServiceNotifier::start() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->phase == Impl::Phase::kIdle) impl_->phase = Impl::Phase::kStarting;
  impl_->start_thread_locked();
  return Status::Ok();
}

Status ServiceNotifier::ready() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> order(m.send_mu);
  const Impl::Snapshot snap = m.read_sources(Impl::Phase::kRunning);
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.ready_sent) return Status::Ok();
    m.ready_sent = true;
    if (m.phase != Impl::Phase::kStopping) m.phase = Impl::Phase::kRunning;
    m.withheld = snap.over_limit;
    m.last_status = Impl::prefixed(m.phase, snap.status);
    msg = "READY=1\nSTATUS=" + m.last_status + "\n";
    if (m.watchdog_us > 0 && !snap.over_limit) msg += "WATCHDOG=1\n";
    m.start_thread_locked();
  }
  m.cv.notify_all();  // the thread, if it ran the start-up phase, switches to pinging now
  m.send(msg);
  return Status::Ok();
}

Status ServiceNotifier::stopping() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> order(m.send_mu);
  const Impl::Snapshot snap = m.read_sources(Impl::Phase::kStopping);
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.phase == Impl::Phase::kStopping) return Status::Ok();
    m.phase = Impl::Phase::kStopping;
    m.last_status = Impl::prefixed(m.phase, snap.status);
    msg = "STOPPING=1\nSTATUS=" + m.last_status + "\n";
  }
  m.send(msg);
  return Status::Ok();
}

Status ServiceNotifier::failed(const std::string& reason) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> order(m.send_mu);
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.failed) return Status::Ok();
    m.failed = true;
    if (m.ready_sent && m.phase != Impl::Phase::kStopping) msg = "STOPPING=1\n";
    m.phase = Impl::Phase::kStopping;
    m.last_status = "failed: " + one_line(reason, 400);
    msg += "STATUS=" + m.last_status + "\n";
  }
  m.send(msg);
  return Status::Ok();
}

std::string ServiceNotifier::status_line() const {
  const Impl::Snapshot snap = impl_->read_sources(impl_->current_phase());
  std::lock_guard<std::mutex> lock(impl_->mu);
  return Impl::prefixed(impl_->phase, snap.status);
}

bool ServiceNotifier::watchdog_withheld() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->withheld;
}

}  // namespace mqtt_inbox

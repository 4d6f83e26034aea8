// Internal: "wait until the store answers", the one mechanism behind every wait for the
// store: the message paths of Consumer and StoreThenProcess (inside Paho's message
// callback, whose return releases the PUBACK: docs/guarantees.md section 1) and the
// start-up of Inbox::open, Inbox::setup, Pruner::create and StoreThenProcess::create and
// start(). Same capped backoff, same log rate limit, same Health snapshot everywhere.
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/health.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// Runs store operations until they succeed and publishes the state meanwhile through a
// Health snapshot that other threads read without waiting for the store.
class StoreRetry {
 public:
  // `who` prefixes log lines (e.g. "consumer 'ledger'"), `database` is the file the
  // Health names. Backoff: `initial_ms`, doubled per failure, capped at `max_ms`; at most
  // one log line per `log_interval_ms` while a wait lasts.
  StoreRetry(std::string who, std::string database, int64_t initial_ms, int64_t max_ms,
             int64_t log_interval_ms, Clock* clock, std::shared_ptr<spdlog::logger> log)
      : who_(std::move(who)),
        initial_ms_(std::max<int64_t>(1, initial_ms)),
        max_ms_(std::max(initial_ms_, max_ms)),
        log_interval_ms_(log_interval_ms),
        clock_(clock),
        log_(std::move(log)) {
    health_.database = std::move(database);
  }
  // The message path's settings: ConsumerOptions::store_backoff_*, store_error_log_interval_ms.
  StoreRetry(std::string who, std::string database, const ConsumerOptions& o, Clock* clock,
             std::shared_ptr<spdlog::logger> log)
      : StoreRetry(std::move(who), std::move(database), o.store_backoff_initial.count(),
                   o.store_backoff_max.count(), o.store_error_log_interval_ms, clock,
                   std::move(log)) {}
  StoreRetry(std::string who, const ConsumerOptions& o, Clock* clock,
             std::shared_ptr<spdlog::logger> log)
      : StoreRetry(std::move(who), std::string(), o, clock, std::move(log)) {}

  // Thrown by until_stored() when its `stop` flag is set while the store fails.
  struct Stopped {};

  // The message path: runs `op` until it returns OK and never gives up, because the
  // caller may not return before the message has a durable outcome. Any failure is
  // retried with capped backoff. A fatal one (Status::is_fatal_store_error: the file is
  // corrupt) turns the health red and logs what to do; the wait then goes on at the
  // maximum backoff (the Inbox no longer touches a fatal file, so a retry costs nothing)
  // and the message is never acknowledged. With `stop`, gives up by throwing Stopped once
  // *stop is true after a failure (for a caller that is not a transport callback and so
  // may leave a message without an outcome, to try later: the Consumer's requeue thread).
  template <typename Op>
  void until_stored(const char* what, Op&& op, const std::atomic<bool>* stop = nullptr) {
    Status s = op();
    if (s.ok()) return;
    int64_t backoff = initial_ms_;
    Wait w{what, clock_->wall_ms(), clock_->steady_ms(), 0, false};
    while (!s.ok()) {
      if (stop && stop->load()) {
        settle(w);
        throw Stopped{};
      }
      const bool log_now = failed(w, s);
      if (s.is_fatal_store_error()) {
        if (log_now) log_fatal(what, s);
        backoff = max_ms_;
      } else if (log_now) {
        log_->warn("{}: store failed while {} ({}); message not acked, retry {} in {} ms", who_,
                   what, s.to_string(), w.retries, backoff);
      }
      clock_->sleep_ms(backoff);
      backoff = std::min<int64_t>(backoff * 2, max_ms_);
      s = op();
    }
    recovered(w);
  }

  // Start-up: runs `op` until it returns OK. Transient failures
  // (Status::is_transient_store_error) are waited out with capped backoff; any other
  // failure (fatal, permission, invalid, internal) comes back at once. With
  // `deadline_ms` > 0 the wait ends after that long: the last transient failure comes
  // back, its message saying so. `progress`, if set, is called on this thread with the
  // Health after every failed attempt and once when the store answers again.
  template <typename Op>
  Status until_ready(const char* what, Op&& op, int64_t deadline_ms,
                     const std::function<void(const Health&)>& progress) {
    const int64_t started = clock_->steady_ms();
    const int64_t since = clock_->wall_ms();
    Status s = op();
    if (s.ok() || !s.is_transient_store_error()) return s;
    int64_t backoff = initial_ms_;
    Wait w{what, since, started, 0, true};
    for (;;) {
      const bool log_now = failed(w, s);
      const int64_t waited = clock_->steady_ms() - started;
      if (deadline_ms > 0 && waited >= deadline_ms) {
        log_->error(
            "{}: the store is still unavailable after {} ms at start-up while {} ({}); "
            "giving up (start-up deadline {} ms)",
            who_, waited, what, s.to_string(), deadline_ms);
        settle(w);
        if (progress) progress(health());
        return Status(s.code(), "the store was not ready after " + std::to_string(waited) +
                                    " ms at start-up (deadline " + std::to_string(deadline_ms) +
                                    " ms) while " + what + ": " + s.message());
      }
      if (log_now)
        log_->warn(
            "{}: store failed while {} at start-up ({}); waiting before connecting, "
            "retry {} in {} ms",
            who_, what, s.to_string(), w.retries, backoff);
      if (progress) progress(health());
      const int64_t sleep = deadline_ms > 0 ? std::min(backoff, deadline_ms - waited) : backoff;
      clock_->sleep_ms(std::max<int64_t>(1, sleep));
      backoff = std::min<int64_t>(backoff * 2, max_ms_);
      s = op();
      if (s.ok()) {
        recovered(w);
        if (progress) progress(health());
        return s;
      }
      if (!s.is_transient_store_error()) {
        settle(w);
        return s;
      }
    }
  }

  // Marks the store unusable (red) without a wait, e.g. when another component found
  // the file corrupt.
  void set_fatal(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    health_.fatal = true;
    health_.last_error = s.to_string();
  }

  Health health() const {
    std::lock_guard<std::mutex> lock(mu_);
    Health h = health_;
    if (h.stuck)
      h.stuck_for_ms = std::max<int64_t>(0, clock_->steady_ms() - stuck_since_steady_ms_);
    return h;
  }
  // Store operations retried after a failure, since creation.
  int64_t store_retries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return store_retries_;
  }
  const std::string& database() const { return health_.database; }  // fixed at creation

 private:
  struct Wait {
    const char* what;
    int64_t since_ms;         // wall clock, for Health::stuck_since_ms (people read it)
    int64_t since_steady_ms;  // what durations are measured from: no clock step moves it
    int64_t retries;
    bool starting;
  };

  // Records one failure in the Health; returns whether to log it (the first failure of a
  // wait, then at most once per log interval).
  bool failed(Wait& w, const Status& s) {
    ++w.retries;
    std::lock_guard<std::mutex> lock(mu_);
    if (!health_.stuck) {
      health_.stuck = true;
      health_.stuck_since_ms = w.since_ms;
      stuck_since_steady_ms_ = w.since_steady_ms;
    }
    health_.retries = w.retries;
    health_.starting = w.starting;
    health_.operation = w.what;
    ++health_.total_store_errors;
    health_.last_error = s.to_string();
    if (s.is_fatal_store_error()) health_.fatal = true;
    ++store_retries_;
    // Monotonic: with the wall clock the warnings would stop for as long as the clock was
    // set back.
    const int64_t now = clock_->steady_ms();
    const bool log_now = w.retries == 1 || now - last_log_ms_ >= log_interval_ms_;
    if (log_now) last_log_ms_ = now;
    return log_now;
  }

  // The wait is over without the store answering (start-up gave up).
  void settle(const Wait&) {
    std::lock_guard<std::mutex> lock(mu_);
    health_.stuck = false;
    health_.stuck_since_ms = 0;
    health_.retries = 0;
    health_.starting = false;
    health_.operation.clear();
  }

  void recovered(const Wait& w) {
    settle(w);
    log_->info("{}: store recovered after {} retries ({} ms){}", who_, w.retries,
               clock_->steady_ms() - w.since_steady_ms, w.starting ? " at start-up" : "");
  }

  void log_fatal(const char* what, const Status& s) {
    const std::string& db = health_.database;  // fixed at creation
    log_->critical(
        "{}: the database {} is unusable ({}) while {}. No message is taken or acknowledged "
        "any more, and the file is left as it is (never deleted or rewritten). Stop the "
        "application, copy what can be read into a new file (`sqlite3 {} .recover`, or "
        "`.dump` where sqlite3 lacks .recover), verify it with `mqtt-inbox check`, then put "
        "it in place of the original (docs/operations.md#recovering-a-corrupt-database has "
        "the commands and says what can be lost).",
        who_, db, s.to_string(), what, db);
  }

  const std::string who_;
  const int64_t initial_ms_, max_ms_, log_interval_ms_;
  Clock* const clock_;
  const std::shared_ptr<spdlog::logger> log_;
  mutable std::mutex mu_;  // never held across I/O
  Health health_;
  int64_t store_retries_ = 0;
  int64_t last_log_ms_ = 0;
  int64_t stuck_since_steady_ms_ = 0;  // when the current wait began, steady clock
};

}  // namespace mqtt_inbox::detail

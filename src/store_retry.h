// Internal: "do not return until the store has a durable record", shared by Consumer and
// StoreThenProcess (both sit inside Paho's message callback, whose return releases the
// PUBACK: docs/guarantees.md section 1).
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/consumer.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// Runs store operations until they succeed and publishes the state meanwhile through a
// Health snapshot that other threads read without waiting for the store.
class StoreRetry {
 public:
  // `who` prefixes log lines (e.g. "consumer 'ledger'"); backoff and log rate come from
  // `options` (store_backoff_initial/max, store_error_log_interval_ms), copied here.
  StoreRetry(std::string who, const ConsumerOptions& options, Clock* clock,
             std::shared_ptr<spdlog::logger> log)
      : who_(std::move(who)),
        initial_ms_(options.store_backoff_initial.count()),
        max_ms_(options.store_backoff_max.count()),
        log_interval_ms_(options.store_error_log_interval_ms),
        clock_(clock),
        log_(std::move(log)) {}

  // Thrown by until_stored() when its `stop` flag is set while the store fails.
  struct Stopped {};

  // Runs `op` until it returns OK, with capped exponential backoff; logs the first
  // failure, then at most once per log interval, and the recovery. With `stop`, gives up
  // by throwing Stopped once *stop is true after a failure (for a caller that is not a
  // transport callback and so may leave a message without an outcome, to try later).
  template <typename Op>
  void until_stored(const char* what, Op&& op, const std::atomic<bool>* stop = nullptr) {
    Status s = op();
    if (s.ok()) return;
    int64_t backoff = initial_ms_;
    int64_t retries = 0;
    const int64_t since = clock_->wall_ms();
    while (!s.ok()) {
      if (stop && stop->load()) {
        set_not_stuck();
        throw Stopped{};
      }
      ++retries;
      bool log_now;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!health_.stuck) {
          health_.stuck = true;
          health_.stuck_since_ms = since;
        }
        health_.retries = retries;
        ++health_.total_store_errors;
        health_.last_error = s.to_string();
        ++store_retries_;
        const int64_t now = clock_->wall_ms();
        log_now = retries == 1 || now - last_log_ms_ >= log_interval_ms_;
        if (log_now) last_log_ms_ = now;
      }
      if (log_now)
        log_->warn("{}: store failed while {} ({}); message not acked, retry {} in {} ms", who_,
                   what, s.to_string(), retries, backoff);
      clock_->sleep_ms(backoff);
      backoff = std::min<int64_t>(backoff * 2, max_ms_);
      s = op();
    }
    set_not_stuck();
    log_->info("{}: store recovered after {} retries ({} ms)", who_, retries,
               clock_->wall_ms() - since);
  }

  Health health() const {
    std::lock_guard<std::mutex> lock(mu_);
    return health_;
  }
  // Store operations retried after a failure, since creation.
  int64_t store_retries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return store_retries_;
  }

 private:
  void set_not_stuck() {
    std::lock_guard<std::mutex> lock(mu_);
    health_.stuck = false;
    health_.stuck_since_ms = 0;
    health_.retries = 0;
  }

  const std::string who_;
  const int64_t initial_ms_, max_ms_, log_interval_ms_;
  Clock* const clock_;
  const std::shared_ptr<spdlog::logger> log_;
  mutable std::mutex mu_;  // never held across I/O
  Health health_;
  int64_t store_retries_ = 0;
  int64_t last_log_ms_ = 0;
};

}  // namespace mqtt_inbox::detail

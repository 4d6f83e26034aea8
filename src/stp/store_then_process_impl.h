// StoreThenProcess::Impl: the state that the receipt, the worker pool and the maintenance
// thread of one store-then-process consumer share, and the declarations of each part's
// code. The parts are policy only: every read and write of the stored rows goes through
// the store's interface (store/stp_rows.h), whose SQLite implementation is
// store/sqlite/stp_rows.cpp.
//   stp/receipt.cpp      receipt: store before PUBACK, or dead-letter
//   stp/workers.cpp      the worker pool: claim, lease, run, retry
//   stp/maintenance.cpp  reaper, replay, compaction and stats
//   stp/store_then_process.cpp              create, options checks, counters, health
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mqtt_inbox/store_then_process.h"
#include "store/lifetime.h"
#include "store/retry.h"
#include "store/store.h"
#include "store/stp_rows.h"

namespace mqtt_inbox {

namespace detail {

// last_error of a row whose claim expired: the reaper counted an attempt for it. A row
// dead-lettered after such an attempt is reported as handler_crashed.
inline constexpr const char* kExpiredClaimError = "claim expired: the worker died or hung";

// The instance part of a claimant ("<instance>/w<worker>/<claim>").
inline std::string claimant_instance(const std::string& claimant) {
  return claimant.substr(0, claimant.find('/'));
}

}  // namespace detail

struct StoreThenProcess::Impl {
  Inbox* inbox = nullptr;
  detail::Store* store = nullptr;  // inbox->store()
  std::string name;
  detail::StoredStoreHandler handler;
  StoreThenProcessOptions options;
  Clock* clock = nullptr;
  std::shared_ptr<spdlog::logger> log;
  std::string token;  // random, per object
  uint64_t runs = 0;  // start() calls, under run_mu
  // "<token>.<run>", set by start() before the workers exist: the first part of every
  // claimant. A new one per run, so claims left by an earlier run of this object (stop()
  // could not release them) are orphans too.
  std::string instance;
  std::atomic<uint64_t> next_claim{0};

  // This consumer's rows in the store. Receipt calls are safe from any thread; its
  // maintenance calls (reaper, replay, prune, stats) are made under maint_mu.
  std::unique_ptr<detail::StpConsumerRows> rows;
  std::mutex maint_mu;

  mutable std::mutex state_mu;  // guards counters; never held across I/O
  StoreThenProcessCounters counters;
  std::unique_ptr<detail::StoreRetry> retry;  // the receipt's health (health())

  std::mutex run_mu;  // guards started/threads and the wake-up generation
  std::condition_variable wake;
  uint64_t wake_gen = 0;
  std::atomic<bool> stopping{false};
  bool started = false;
  std::vector<std::thread> threads;

  // ---------------------------------------------------------------- shared
  // (stp/store_then_process.cpp)

  // The retention clock (received_at, done_at): the store's, which wall-clock jumps
  // cannot move, so retention and replay ranges are measured like inbox_processed's.
  int64_t retention_now() { return store->retention_clock(); }

  void count(int64_t StoreThenProcessCounters::*field, int64_t n = 1);
  // Counts a worker or maintenance failure. A fatal one (the store is unusable: a
  // corrupt file) latches the store (Store::latch_fatal: nothing reads or writes it
  // again, receipt acks nothing) and turns health() red.
  void worker_error(const Status& s);
  // The store has latched a fatal error (found by any part using it): workers and
  // maintenance neither claim nor write again.
  bool store_unusable() const { return store->unusable(); }
  Status unusable_status() const { return store->fatal_status(); }  // kCorruption, naming it
  void notify_workers();

  // Sleeps up to `ms`, or until stop() or a wake-up. Returns false when stopping.
  bool idle(int64_t ms, uint64_t* seen_gen);

  // ---------------------------------------------------------------- receipt
  // (stp/receipt.cpp)

  // While the store fails, the message has no durable outcome, so the caller must not
  // return (that would release the PUBACK): see detail::StoreRetry.
  template <typename Op>
  void until_stored(const char* what, Op&& op) {
    retry->until_stored(what, std::forward<Op>(op));
  }

  Outcome receipt_dead_letter(const Message& m, const std::optional<std::string>& id,
                              DeadLetterReason reason, const std::string& text);
  Outcome receive(const Message& m);
  // A retained message under RetainedPolicy kSkip or kDeadLetter (receipt.cpp).
  Outcome receive_retained(const Message& m);

  // ---------------------------------------------------------------- workers
  // (stp/workers.cpp)

  struct Row {
    int64_t seq = 0;
    int64_t claim_token = 0;  // the fencing token this claim got (schema.sql version 11)
    std::string message_id, aggregate_key;
    Message message;
    int64_t received_at = 0;
    int attempts = 0;
    std::string last_error;
    std::optional<int64_t> expires_at;  // the message's expiry deadline (retention clock)
    detail::RowWait wait;               // its wait for a dependency, as the row keeps it
    detail::RowClaim claim() const { return {seq, claim_token}; }
    // Its expiry (store/lifetime.h), unless it has none or the policy applies it anyway.
    std::optional<detail::Expiry> expiry(ExpiredPolicy policy) const;
  };

  // One worker's session with the store and its current batch.
  struct Worker {
    int index = 0;
    std::unique_ptr<detail::StpWorkerSession> session;
    std::vector<Row> batch;  // the rows of the current claim, in seq order
  };

  enum class RunResult { kDone, kFailed, kDead, kLost, kStopped };

  // Rows this process's workers rescheduled for a dependency (RetryLater), by seq: what
  // health().dependency shows (the longest wait). Under state_mu; retention clock. An
  // entry goes when its row is finished or fails here, or once it is older than a lease
  // past its next run (the row was taken by another process).
  struct Held {
    std::string message_id;
    int runs = 0;
    int64_t since = 0, next_run = 0;
    std::string reason;
  };
  std::map<int64_t, Held> held;
  void hold(const Row& r, const detail::RowWait& wait, int64_t next_run, const std::string& why);
  void release_hold(int64_t seq);

  template <typename Op>
  bool worker_retry(const char* what, Op&& op);
  // Inside the claim's transaction: which of the offered rows to claim, in claim order
  // (the ordering rule; see workers.cpp).
  void choose_claim(int64_t now, const std::vector<detail::ClaimCandidate>& offered,
                    std::vector<int64_t>* take) const;
  // Claims a batch into w.batch.
  Status claim(Worker& w, const std::string& claimant);
  // The claims of w.batch's rows; with `aggregate`, only that aggregate's.
  static std::vector<detail::RowClaim> claims_of(const Worker& w, const std::string* aggregate);
  // Each writes the row only while it still carries r.claim_token (kLost otherwise).
  RunResult dead_letter_row(Worker& w, const Row& r, DeadLetterReason reason,
                            const std::string& text, int attempts);
  RunResult fail_row(Worker& w, const Row& r, int attempt, const std::string& error);
  // Puts the row back to 'pending' with `attempts` recorded and its next try after
  // `delay_ms`; the later rows of its aggregate in the batch are released to wait behind
  // it. fail_row after a failure; directly for a full outbox (no attempt counted).
  RunResult retry_row_later(Worker& w, const Row& r, int attempts, const std::string& error,
                            int64_t delay_ms, const detail::RowWait& wait = {});
  // The row's handler or PrepareFn said "not yet": rescheduled on the dependency schedule
  // with no attempt counted, or dead-lettered as dependency_unavailable once it is over.
  RunResult not_yet_row(Worker& w, const Row& r, const std::string& why);
  // The row's expiry ran out: dead-lettered as expired, never applied.
  RunResult expired_row(Worker& w, const Row& r, const detail::Expiry& e, const char* where);
  RunResult run_row(Worker& w, const Row& r, const std::string& claimant);
  void worker_loop(Worker& w);

  // ---------------------------------------------------------------- maintenance
  // (stp/maintenance.cpp)

  void maintenance_loop();
  // Returns orphaned claims and claims whose running row showed no progress for lease_ms
  // on this process's monotonic clock to 'pending' (see StoreThenProcess::reap).
  Status reap_now(int64_t* reaped);
  // What the reaper saw of a claim: its running row (the lowest seq still 'processing'),
  // and since when (steady ms) it has seen that row running. Under maint_mu.
  struct Watched {
    int64_t running_seq = 0;
    int64_t since_ms = 0;
  };
  std::map<std::string, Watched> watched;  // by claimant

  // The instances of this process whose workers run (start() to the end of stop()): under
  // the Inbox's exclusive lock, a claim of any other instance is an orphan.
  void set_running(bool running);
  static bool instance_running(const std::string& instance);
  Status prune_now(StoredPruneResult* out);
  // Refuses (kInvalidArgument) a dedup_retention_ms below the longest session expiry
  // recorded in the Inbox, unless overridden (maintenance.cpp). Under maint_mu.
  Status check_dedup_window();
  int64_t dedup_override_warned_ms = -1;  // the requirement last warned about
};

}  // namespace mqtt_inbox

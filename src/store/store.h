// Store: the store layer's front, what every part above it holds of the one database
// they share (the per-message policy in inbox/, the outbox, store-then-process,
// retention, the fleet). It is concrete and the same for every kind of store: it does,
// once, what every store must do alike, and asks its StoreBackend (store/backend.h) for
// the rows and the SQL:
//  - the guard against re-entry from a handler (store/reentry.h) and the fatal latch: a
//    store found unusable (corrupt) is never read or written again;
//  - the connection's lock, the classification and counting of store errors, and the
//    start-up wait for a store that is transiently unavailable (StoreRetry);
//  - the claim decision of one delivery (duplicate, dead-lettered, attempts exhausted,
//    or the handler's outcome) and the handler's contract (store/contract.h), in
//    store/claims.cpp; the dead letters' and the session records' rules;
//  - the counters behind InboxStats, the commit latency, the retention clock.
// docs/design.md#the-store-seam says what is the front's and what a backend's.
//
// Thread safety: every method is safe from any thread. Calls that use the connection are
// serialised on it; the counters, health(), stats() and retention_clock() never wait.
#pragma once

#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/health.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"
#include "store/backend.h"
#include "store/claims.h"
#include "store/lifetime.h"
#include "store/retry.h"
#include "store/sessions.h"
#include "util/function_ref.h"

namespace mqtt_inbox {
class Inbox;
}

namespace mqtt_inbox::detail {

class OutboxStore;
class StpRows;

class Store final {
 public:
  // Opens the store at `location` (Inbox::open): checks the options every store takes,
  // chooses the backend (a PostgreSQL connection URI, "postgresql://" or "postgres://",
  // or an SQLite file; store/open.cpp), and waits out a store that is transiently
  // unavailable (InboxOptions::startup_*). Errors: as Inbox::open.
  static Status open(const std::string& location, const InboxOptions& options,
                     std::unique_ptr<Store>* out);
  // Made by open(); public for std::make_unique.
  Store(const std::string& location, const InboxOptions& options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // --- what it is ---
  const std::string& location() const { return location_; }
  const InboxOptions& options() const { return options_; }
  Clock* clock() const { return clock_; }
  const std::shared_ptr<spdlog::logger>& log() const { return log_; }
  // The public Inbox this store is behind: the key of the re-entry checks.
  const Inbox* owner() const { return owner_; }
  void set_owner(const Inbox* owner) { owner_ = owner; }
  // A Consumer or StoreThenProcess of this name works on the store (its server's view of
  // the connections names it). Never fails.
  void name_user(const std::string& consumer);
  // OK if a handler whose transaction parameter has type `type` runs on this store; else
  // kInvalidArgument naming both (`what`: "a Consumer's handler").
  Status check_handler_type(const std::type_info* type, const char* what) const;

  // --- the claims (store/claims.h; the decision is in store/claims.cpp) ---
  // One delivery in one transaction, what the Consumer calls for every message. Claims
  // (consumer, message_id) unless something is recorded for the id; if something is, it
  // reads what in the same transaction: a claim (kDuplicate), a dead letter (kDeadLettered,
  // unless `replayed_dead_letter` is set) or `max_attempts` attempts (kAttemptsExhausted),
  // all without running the handler. Otherwise runs `handler` inside the transaction as
  // attempt report->attempt, under the handler's contract (store/contract.h), clears the
  // id's attempts, marks `replayed_dead_letter` (if set) replayed, and commits. A first
  // delivery costs one transaction and one durable commit. A failed attempt is counted
  // before this returns; one that kills the process is counted at the next open (SQLite's
  // marker) or at its redelivery. `payload_json`: the payload's parse if the caller made
  // one (Delivery::payload_json); may be null. `expiry`: the message's (store/lifetime.h),
  // or null for none: once it has run out, at the decision before the handler or right
  // before COMMIT, the transaction rolls back as kExpired. A handler that throws
  // RetryLater is kNotYet: rolled back, no attempt recorded. Errors: the store's (nothing
  // committed).
  Status process(const std::string& consumer, const Message& message, const std::string& message_id,
                 const TransactionHandler& handler, int max_attempts,
                 std::optional<int64_t> replayed_dead_letter, const nlohmann::json* payload_json,
                 const Expiry* expiry, ProcessReport* report);
  // Reads what is recorded for (consumer, message_id). A processed id counts as a
  // duplicate (InboxStats::duplicates): the caller skips it.
  Status lookup(const std::string& consumer, const std::string& message_id, MessageState* out);

  // --- dead letters (dead_letter.h; the rules are in store/dead_letters.cpp) ---
  // Writes `dl` and clears the attempts of its (consumer, message id), in one committed
  // transaction; *id receives the row's id. A redelivery of a message that has a dead
  // letter ('dead' or 'requeued', dl.message_id set) only counts on that row: a lost
  // PUBACK after dead-lettering must not make a second row. With `replace_id` (a failed
  // replay), that row is rewritten in place, or written anew if it was purged meanwhile,
  // so the message is never lost. A new or rewritten row gets status 'requeued' if
  // dl.requeued (a message parked by a full outbox), else 'dead'.
  Status add_dead_letter(const DeadLetter& dl, std::optional<int64_t> replace_id, int64_t* id);
  // Rows matching `filter`, newest first, payloads included.
  Status list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out);
  // Row `id`; kNotFound if absent.
  Status get_dead_letter(int64_t id, DeadLetter* out);
  // Deletes the rows matching `filter` (its limit is ignored); *removed gets their count.
  Status purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed);
  // Marks row `id` 'requeued' for the running Consumer of its consumer name to replay.
  // kNotFound; kInvalidArgument if the row is not 'dead', its payload was cut, or it
  // belongs to a store-then-process consumer.
  Status requeue_dead_letter(int64_t id);
  // Ids of `consumer`'s 'requeued' rows, oldest first, at most `limit` (> 0).
  Status requeued_dead_letters(const std::string& consumer, int64_t limit,
                               std::vector<int64_t>* ids);

  // --- session records (session_record.h; the rules are in store/sessions.cpp) ---
  SessionRecords& sessions() { return sessions_; }

  // --- the application's set-up and connection (Inbox::setup, setup_sql, with_connection) ---
  // Runs `fn` with the store's transaction (a TxnRef of the handler type) in one write
  // transaction, or `sql`, with the start-up waits. Errors: as Inbox::setup.
  Status setup(const std::type_info* type, const std::function<void(const TxnRef&)>& fn);
  Status setup_sql(const std::string& sql);
  // Inbox::with_connection: throws what `fn` throws; std::logic_error for a type that is
  // not this store's connection, a call from inside a handler, or an unusable store.
  void with_connection(const std::type_info* type, FunctionRef<void(const TxnRef&)> fn);

  // --- waits, errors and the latch ---
  // A start-up wait: runs `op(lock_wait_ms)` until it succeeds, waiting out a transiently
  // unavailable store with capped backoff (InboxOptions::startup_*), reporting progress
  // through startup_progress and health(). `lock_wait_ms` is how long one attempt may
  // wait for a lock: the configured busy timeout (at most 1 s on the first attempt, so a
  // wait is reported promptly), cut to what is left of the start-up deadline. `op` takes
  // the connection itself if it needs it, so the sleeps hold no lock. Returns the store's
  // fatal status once it is latched.
  Status wait_at_startup(const char* what, const std::function<Status(int)>& op);
  // Runs `fn` on the main connection: refuses a call from inside a handler of this
  // inbox, returns fatal_status() once latched, takes the connection's lock, makes sure
  // the connection is there (StoreBackend::ready), and turns what `fn` throws into a
  // classified, counted Status (what = the context of its message). An open transaction
  // is rolled back on failure.
  Status on_connection(const char* what, FunctionRef<void()> fn);
  // The same with the lock already held (a caller that runs several steps under it).
  Status locked(const char* what, FunctionRef<void()> fn);
  // on_connection() around one write transaction (StoreBackend::begin ... commit) or one
  // consistent read (begin_read ... end_read).
  Status write_txn(const char* what, FunctionRef<void(StoreBackend&)> fn);
  Status read_txn(const char* what, FunctionRef<void(StoreBackend&)> fn);
  // Counts a failed store operation and passes the Status through. A fatal one latches
  // the store. `holding_connection`: the caller holds the connection's lock, so the store
  // may use it to react (SQLite gives the WAL's space back on kFull).
  Status store_error(Status s, bool holding_connection = true);
  // Once the store is found unusable (a corrupt file, a server reporting corruption), it is
  // never read or written again: every operation returns fatal_status() without touching
  // it, and the error is logged once with what to do.
  void latch_fatal(const Status& s);
  Status fatal_status() const;
  bool unusable() const { return fatal_.load(); }
  // The store's own waits (start-up, maintenance) and, for every user of it, whether it is
  // unusable. Cheap; any thread.
  Health health() const;

  // --- counters and statistics ---
  void count_processed() { ++processed_; }
  void count_dead_lettered() { ++dead_lettered_; }
  void count_retry() { ++retries_; }
  void count_pruned(int64_t claims, int64_t dead_letters) {
    pruned_ += claims;
    dead_letters_pruned_ += dead_letters;
  }
  void count_session_lost() { ++sessions_lost_; }
  // A commit of the main connection took `us` microseconds (the claim transaction).
  void record_commit(int64_t us);
  // The steady-clock time of the last commit on the main connection (0 if none): a store
  // idle since then may be tidied (retention's checkpoints).
  int64_t last_commit_steady_ms() const { return last_commit_steady_ms_.load(); }
  void note_commit();
  InboxStats stats() const;
  // Measures rows per consumer and the outbox's now (the backend's measure_rows).
  Status refresh_row_stats();
  // Stores a row measurement for stats() (the backend, after measuring).
  void set_row_stats(std::map<std::string, ConsumerRows> rows, OutboxRows outbox);

  // --- the retention clock (docs/operations.md#clock-safety) ---
  // ms: received_at of new claims and everything retention compares with it. Advances
  // only with the monotonic clock from the base the backend set at open (SQLite: its
  // persisted value; PostgreSQL: the server's clock at connect), and never goes back.
  int64_t retention_clock() const;
  // Sets the clock's base: `base_ms` now. It never moves the clock back.
  void set_retention_clock_base(int64_t base_ms);
  // Stores the clock so that the next open continues from it (retention_rows().persist_clock).
  Status persist_retention_clock();

  // --- the other parts ---
  OutboxStore& outbox() { return backend_->outbox(); }
  StpRows& stp_rows() { return backend_->stp_rows(); }
  RetentionRows& retention_rows() { return backend_->retention_rows(); }
  Status open_slot_leases(const SlotLeaseOptions& options, std::unique_ptr<SlotLeases>* out) {
    return backend_->open_slot_leases(options, out);
  }
  bool shared_by_processes() const { return backend_->shared_by_processes(); }
  StoreBackend& backend() { return *backend_; }

 private:
  // The claim transaction's steps (store/claims.cpp).
  Status run_claim(const ClaimKey& key, const Message& message, int attempt,
                   const TransactionHandler& handler, bool delete_attempts,
                   std::optional<int64_t> replayed_dead_letter, const nlohmann::json* payload_json,
                   const Expiry* expiry, ProcessReport* report);
  Status count_failed_attempt(const ClaimKey& key, bool counted, ProcessReport* report);

  const std::string location_;
  const InboxOptions options_;
  Clock* const clock_;
  const std::shared_ptr<spdlog::logger> log_;
  const Inbox* owner_ = nullptr;
  std::unique_ptr<StoreBackend> backend_;
  SessionStore sessions_;
  StoreRetry startup_;

  // The fatal latch and its first error (guarded by stats_mu_).
  std::atomic<bool> fatal_{false};
  std::string fatal_error_;

  // Counters and latency, readable from any thread without the connection.
  std::atomic<int64_t> processed_{0}, duplicates_{0}, dead_lettered_{0}, retries_{0},
      store_errors_{0}, pruned_{0}, dead_letters_pruned_{0}, commit_max_us_{0}, sessions_lost_{0};
  std::atomic<int64_t> last_commit_steady_ms_{0};
  static constexpr size_t kLatencySamples = 4096;
  std::array<std::atomic<int32_t>, kLatencySamples> latency_us_{};
  std::atomic<uint64_t> latency_next_{0};

  // The retention clock: clock_base_ms_ at steady time steady_base_ms_; clock_high_ is the
  // highest value reported, so it never goes back.
  std::atomic<int64_t> clock_base_ms_{0}, steady_base_ms_{0};
  mutable std::atomic<int64_t> clock_high_{0};

  // Row statistics from the last measurement; never held across I/O.
  mutable std::mutex stats_mu_;
  std::map<std::string, ConsumerRows> consumer_rows_;
  OutboxRows outbox_rows_;
  int64_t rows_measured_at_ = 0;

  friend class SessionStore;
};

// True for a location that names a PostgreSQL server.
bool is_postgres_location(const std::string& location);

// Each store's backend (store/sqlite/open.cpp, store/postgres/open.cpp): checks the
// options only that store takes and makes the backend for `front`, unopened.
Status make_sqlite_backend(Store& front, std::unique_ptr<StoreBackend>* out);
Status make_postgres_backend(Store& front, std::unique_ptr<StoreBackend>* out);

// The registry of the PostgreSQL backend (store/open.cpp): enable_postgres_store()
// (postgres.h, in mqtt_inbox_postgres) registers make_postgres_backend; until then a
// PostgreSQL location is refused, saying what to link and call. Idempotent; any thread.
using BackendMaker = Status (*)(Store& front, std::unique_ptr<StoreBackend>* out);
void register_postgres_backend(BackendMaker maker);

}  // namespace mqtt_inbox::detail

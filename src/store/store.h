// The store layer's seam: what every part above it (the per-message policy in inbox/, the
// outbox, store-then-process, retention) holds of the one database they share. A Store
// owns the connection(s) to that database, serialises their use, waits out a store that
// is transiently unavailable (start-up waits, StoreRetry), and latches a store found
// unusable (corrupt) so that nothing reads or writes it again. It also keeps the counters
// that InboxStats reports, so that every part counts in one place.
//
// store/sqlite/ is the SQLite implementation (SqliteStore, behind the public Inbox).
// What the base class holds is what any store has: a clock, a logger, the counters, the
// fatal latch and the start-up wait; what a store does with its database is virtual, one
// interface per concept: the claims and attempts (store/claims.h), the dead letters
// (store/dead_letters.h), the session records (store/sessions.h), the outbox's rows
// (store/outbox_rows.h), store-then-process's (store/stp_rows.h) and retention's
// (store/retention_rows.h).
//
// Thread safety: the counters, the latch and health() are safe from any thread without
// waiting for the store; the rest is each implementation's to say.
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/health.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/postgres.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"
#include "mqtt_inbox/store_then_process.h"
#include "store/retention_rows.h"
#include "store/retry.h"
#include "store/slot_leases.h"
#include "store/txn.h"

namespace mqtt_inbox {

class Inbox;

namespace detail {

class StpRows;
class ClaimStore;
class DeadLetterStore;
class SessionStore;
class OutboxStore;

// The kinds of store (Store::kind()).
enum class StoreKind { kSqlite, kPostgres };

class Store {
 public:
  virtual ~Store() = default;

  // Which store this is, and the options it was opened with.
  virtual StoreKind kind() const = 0;
  virtual const InboxOptions& inbox_options() const = 0;

  // The application's handler, bound for this store's transaction (store/txn.h): an
  // SQLite Handler on the SQLite store, a PgHandler on the PostgreSQL store. A handler
  // for the other store is refused with kInvalidArgument naming both.
  virtual Status bind_consumer_handler(Handler handler, StoreHandler* out) {
    (void)handler;
    (void)out;
    return Status::InvalidArgument(
        "an SQLite handler (Handler, taking SQLite::Database&) was given to an inbox on " +
        location() + ", which is not an SQLite store: write a PgHandler (postgres.h)");
  }
  virtual Status bind_consumer_handler(PgHandler handler, StoreHandler* out) {
    (void)handler;
    (void)out;
    return Status::InvalidArgument(
        "a PostgreSQL handler (PgHandler, postgres.h) was given to the "
        "SQLite inbox " +
        location() + ": write a Handler (handler.h)");
  }

  // The same for a store-then-process handler: an SQLite StoredHandler on the SQLite
  // store, a PgStoredHandler on the PostgreSQL store; the other is refused likewise.
  virtual Status bind_stored_handler(StoredHandler handler, StoreHandlerOf<StoredDelivery>* out) {
    (void)handler;
    (void)out;
    return Status::InvalidArgument(
        "an SQLite stored handler (StoredHandler, taking SQLite::Database&) was given to an "
        "inbox on " +
        location() + ", which is not an SQLite store: write a PgStoredHandler (postgres.h)");
  }
  virtual Status bind_stored_handler(PgStoredHandler handler, StoreHandlerOf<StoredDelivery>* out) {
    (void)handler;
    (void)out;
    return Status::InvalidArgument(
        "a PostgreSQL stored handler (PgStoredHandler, postgres.h) was given to the SQLite "
        "inbox " +
        location() + ": write a StoredHandler (store_then_process.h)");
  }

  // OK if this store has `what` (e.g. "the outbox"); else kInvalidArgument saying so.
  virtual Status supports(const std::string& what) const {
    (void)what;
    return Status::Ok();
  }

  // A fleet member's slot leases (store/slot_leases.h, fleet.h), on a connection of their
  // own. Only a store that every member of a fleet reaches can hold them: the SQLite
  // store refuses with kInvalidArgument.
  virtual Status open_slot_leases(const SlotLeaseOptions& options,
                                  std::unique_ptr<SlotLeases>* out) {
    (void)options;
    (void)out;
    return Status::InvalidArgument(
        "a fleet's slot leases need a store that every member reaches: " + location() +
        " is an SQLite file; open the inbox on PostgreSQL (docs/fleet.md)");
  }
  // Inbox::setup_sql: runs `sql` (statements separated by ';') in one transaction, with
  // the start-up waits. Errors: as Inbox::setup_sql.
  virtual Status setup_sql(const std::string& sql) = 0;

  // The store's parts, one per concept; each lives as long as the store.
  virtual ClaimStore& claims() = 0;
  virtual DeadLetterStore& dead_letters() = 0;
  virtual SessionStore& sessions() = 0;

  // Where the data lives, for messages and Health::database: a file path, or a URI
  // without its password.
  virtual const std::string& location() const = 0;

  // The retention clock, ms: received_at of new claims and everything retention compares
  // with it (docs/design.md). Never goes back while the store is open.
  virtual int64_t retention_clock() const = 0;
  // Stores the retention clock, so that the next open continues from it (the Pruner does
  // it every pass, and the store once as it closes). Errors: store codes.
  virtual Status persist_retention_clock() = 0;

  // Measures rows per consumer (and the outbox's) now, on the store's connection, for
  // InboxStats (consumer_rows, outbox_rows, rows_measured_at). Errors: store codes.
  virtual Status refresh_row_stats() = 0;
  // Sets what InboxStats says of the store's files: db_bytes, wal_bytes (0 for a file the
  // store does not have) and schema_version. Cheap; any thread; never waits for the store.
  virtual void file_stats(InboxStats* out) const = 0;

  // Counts a failed store operation and passes the Status through. A fatal one (the
  // store is unusable) latches it: see latch_fatal(). `holding_connection`: the caller
  // holds the store's connection, so the store may use it to give space back at once
  // (SQLite: the WAL on SQLITE_FULL); false from a thread that does not.
  virtual Status store_error(Status s, bool holding_connection = true) = 0;

  // A start-up wait: runs `op(budget_ms)` until it succeeds, waiting out a transiently
  // unavailable store with capped backoff (InboxOptions::startup_*), reporting progress
  // through startup_progress and health(). `budget_ms` is how long one attempt may wait
  // for a lock: the configured wait, cut to what is left of the start-up deadline. `op`
  // takes the store's connection itself if it needs it, so the sleeps hold no lock.
  // Returns the store's fatal status once it is latched.
  virtual Status wait_at_startup(const char* what, const std::function<Status(int)>& op) = 0;

  // Retention's records in the store and its sweeps (store/retention_rows.h).
  virtual RetentionRows& retention_rows() = 0;

  // Store-then-process's rows: receipt, the workers' claims, maintenance
  // (store/stp_rows.h).
  virtual StpRows& stp_rows() = 0;

  // The outbox's rows: the enqueue in the caller's transaction, the relays' fetch, marks
  // and wake-up, inspection and repair (store/outbox_rows.h).
  virtual OutboxStore& outbox() = 0;

  // Once the store is found unusable (a corrupt SQLite file), it is never read or written
  // again: every operation returns fatal_status() without touching it, and the error is
  // logged once with the recovery procedure.
  virtual void latch_fatal(const Status& s) = 0;
  virtual Status fatal_status() const = 0;
  bool unusable() const { return fatal.load(); }

  // The store's own waits (start-up, maintenance) and, for every user of it, whether it
  // is unusable. Cheap; any thread.
  Health health() const {
    Health h = startup->health();
    if (fatal.load()) {
      h.fatal = true;
      std::lock_guard<std::mutex> lock(stats_mu);
      h.last_error = fatal_error;
    }
    return h;
  }

  // The public Inbox this store is behind: the key of the handler re-entry checks
  // (store/reentry.h).
  const Inbox* owner = nullptr;
  Clock* clock = nullptr;
  std::shared_ptr<spdlog::logger> log;

  // Counters and latency, readable from any thread without the connection.
  std::atomic<int64_t> processed{0}, duplicates{0}, dead_lettered{0}, retries{0}, store_errors{0},
      pruned{0}, dead_letters_pruned{0}, commit_max_us{0}, sessions_lost{0};
  std::atomic<int64_t> last_commit_steady_ms{0};
  static constexpr size_t kLatencySamples = 4096;
  std::array<std::atomic<int32_t>, kLatencySamples> latency_us{};
  std::atomic<uint64_t> latency_next{0};
  void record_latency(int64_t us) {
    const auto v = static_cast<int32_t>(std::min<int64_t>(us, INT32_MAX));
    latency_us[latency_next.fetch_add(1, std::memory_order_relaxed) % kLatencySamples].store(
        v, std::memory_order_relaxed);
    int64_t seen = commit_max_us.load(std::memory_order_relaxed);
    while (us > seen && !commit_max_us.compare_exchange_weak(seen, us)) {
    }
  }

  // Row statistics from the last measurement (guarded by stats_mu, never held across I/O).
  mutable std::mutex stats_mu;
  std::map<std::string, ConsumerRows> consumer_rows;
  OutboxRows outbox_rows;
  int64_t rows_measured_at = 0;

  // The fatal latch (see latch_fatal) and its first error (guarded by stats_mu).
  std::atomic<bool> fatal{false};
  std::string fatal_error;

  // The start-up waits' state (wait_at_startup) and Health.
  std::unique_ptr<StoreRetry> startup;
};

// Opens the store at `location` (Inbox::open): a PostgreSQL connection URI
// ("postgresql://", "postgres://") opens the PostgreSQL store, anything else the SQLite
// file (store/open.cpp).
Status open_store(const std::string& location, const InboxOptions& options,
                  std::unique_ptr<Store>* out);
// True for a location that names a PostgreSQL server.
bool is_postgres_location(const std::string& location);
// Each store's open (store/sqlite/open.cpp, store/postgres/open.cpp). The PostgreSQL
// store is a library of its own (mqtt_inbox_postgres): the core has no PostgreSQL code
// and reaches open_postgres_store only through the opener that library registers.
Status open_sqlite_store(const std::string& path, const InboxOptions& options,
                         std::unique_ptr<Store>* out);
Status open_postgres_store(const std::string& uri, const InboxOptions& options,
                           std::unique_ptr<Store>* out);

// The registry of the PostgreSQL opener (store/open.cpp): enable_postgres_store()
// (postgres.h, in mqtt_inbox_postgres) registers open_postgres_store; until then
// open_store refuses a PostgreSQL location, saying what to link and call. Registering is
// idempotent; any thread (an atomic pointer, constant-initialised: no start-up order).
using StoreOpener = Status (*)(const std::string& location, const InboxOptions& options,
                               std::unique_ptr<Store>* out);
void register_postgres_opener(StoreOpener opener);

}  // namespace detail
}  // namespace mqtt_inbox

// SqliteStore: the SQLite store (store/store.h) behind the public Inbox: one connection to
// one database file in WAL mode, its mutex, the lock file, the cached statements of the
// per-message path, the attempt marker, the WAL guard and the retention clock. Its code is
// in this folder: open.cpp (open, schema, start-up waits, the fatal latch), claim.cpp
// (SqliteClaims: the per-message path), dead_letters.cpp (SqliteDeadLetters), sessions.cpp
// (SqliteSessions), retention_rows.cpp (the Pruner's deletes and checkpoints), stp_rows.cpp
// (store-then-process's rows and its workers' connections), outbox_rows.cpp (the outbox's
// rows) and inbox.cpp (the SQLite-typed calls of the public Inbox, stats and the
// retention clock).
#pragma once

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/health.h"
#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/stats.h"
#include "store/claims.h"
#include "store/dead_letters.h"
#include "store/outbox_rows.h"
#include "store/retry.h"
#include "store/sessions.h"
#include "store/sqlite/attempt_marker.h"
#include "store/sqlite/util.h"
#include "store/sqlite/wal_guard.h"
#include "store/store.h"
#include "store/stp_rows.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

struct SqliteStore;
// The SQLite store's retention (store/sqlite/retention_rows.cpp).
std::unique_ptr<RetentionRows> make_sqlite_retention_rows(SqliteStore& store);
// The SQLite store's store-then-process rows (store/sqlite/stp_rows.cpp).
std::unique_ptr<StpRows> make_sqlite_stp_rows(SqliteStore& store);
// The SQLite store's outbox rows (store/sqlite/outbox_rows.cpp).
std::unique_ptr<OutboxStore> make_sqlite_outbox(SqliteStore& store);

// The claim transaction and the attempts (store/claims.h) on the SQLite store
// (store/sqlite/claim.cpp).
class SqliteClaims final : public ClaimStore {
 public:
  explicit SqliteClaims(SqliteStore& store) : s_(store) {}
  Status process(const std::string& consumer, const Message& message, const std::string& message_id,
                 const StoreHandler& handler, int max_attempts,
                 std::optional<int64_t> replayed_dead_letter, const nlohmann::json* payload_json,
                 ProcessReport* report) override;
  Status lookup(const std::string& consumer, const std::string& message_id,
                MessageState* out) override;
  Status claim(const std::string& consumer, const Message& message, const std::string& message_id,
               int attempt, const StoreHandler& handler,
               std::optional<int64_t> replayed_dead_letter, ClaimResult* result,
               std::string* handler_error) override;
  Status begin_attempt(const std::string& consumer, const std::string& message_id,
                       int* attempt) override;
  Status record_attempt_failure(const std::string& consumer, const std::string& message_id,
                                const std::string& error) override;
  Status count_claims(const std::string& consumer, int64_t* rows) override;

 private:
  SqliteStore& s_;
};

// The dead letters (store/dead_letters.h) on the SQLite store (store/sqlite/dead_letters.cpp).
class SqliteDeadLetters final : public DeadLetterStore {
 public:
  explicit SqliteDeadLetters(SqliteStore& store) : s_(store) {}
  Status add(const DeadLetter& dl, std::optional<int64_t> replace_id, int64_t* id) override;
  Status list(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) override;
  Status get(int64_t id, DeadLetter* out) override;
  Status purge(const DeadLetterFilter& filter, int64_t* removed) override;
  Status requeue(int64_t id) override;
  Status requeued(const std::string& consumer, int64_t limit, std::vector<int64_t>* ids) override;

 private:
  SqliteStore& s_;
};

// The session records' rows (store/sessions.h) on the SQLite store
// (store/sqlite/sessions.cpp).
class SqliteSessions final : public SessionStore {
 public:
  explicit SqliteSessions(SqliteStore& store);

 protected:
  Status write(const SessionRecord& record) override;
  Status read(const std::string* client_id, std::vector<SessionRecord>* out) override;
  Status remove(const std::string& client_id, bool* removed) override;
  Status add_lost(const std::string& client_id, int64_t at_ms) override;

 private:
  SqliteStore& s_;
};

struct SqliteStore final : Store {
  SqliteStore() : claims_(*this), dead_letters_(*this), sessions_(*this) {}
  // Persists the retention clock, clears the attempt marker and closes the connection,
  // then the lock file (store/sqlite/inbox.cpp).
  ~SqliteStore() override;

  StoreKind kind() const override { return StoreKind::kSqlite; }
  const InboxOptions& inbox_options() const override { return options; }
  Status bind_consumer_handler(Handler handler, StoreHandler* out) override {
    *out = bind_sqlite_handler(std::move(handler));
    return Status::Ok();
  }
  using Store::bind_consumer_handler;
  Status bind_stored_handler(StoredHandler handler, StoreHandlerOf<StoredDelivery>* out) override;
  using Store::bind_stored_handler;
  Status setup_sql(const std::string& sql) override;
  // Inbox::setup on this store (store/sqlite/open.cpp).
  Status setup(const std::function<void(SQLite::Database&)>& fn);
  ClaimStore& claims() override { return claims_; }
  DeadLetterStore& dead_letters() override { return dead_letters_; }
  SessionStore& sessions() override { return sessions_; }
  Status persist_retention_clock() override;
  Status refresh_row_stats() override { return measure_rows(nullptr); }
  void file_stats(InboxStats* out) const override;

  std::string path;
  InboxOptions options;
  int lock_fd = -1;  // flock'ed "<path>.lock" while exclusive; closed (unlocked) last
  std::mutex mu;     // serialises use of `db`, the cached statements and the marker
  std::unique_ptr<SQLite::Database> db;
  // The per-message path's statements, prepared once (store/sqlite/claim.cpp).
  std::unique_ptr<SQLite::Statement> begin_immediate, commit, lookup, begin_attempt, attempt_failed,
      attempt_failed_counted, claim, claim_if_nothing_recorded, delete_attempts, mark_replayed;
  // Which handler is running, outside the database (store/sqlite/attempt_marker.h). Null without
  // the lock file (exclusive = false): attempts are then committed before each handler run.
  std::unique_ptr<AttemptMarker> marker;
  void prepare_statements();  // on a connection just opened (open_connection)
  // Turns a marker left by a process that died inside a handler into a 'running' attempt
  // (one committed transaction), then clears it. Throws SQLite::Exception.
  void recover_marked_attempt();
  // Adds one attempt to (consumer, id) and returns the count: 'running' before a handler
  // run (error null), or 'failed' with *error after one. Commits on its own without fsync
  // (RelaxedSync). Under `mu`. Throws SQLite::Exception.
  int count_attempt(const std::string& consumer, const std::string& id, const std::string* error);
  // Inside the open transaction (store/sqlite/claim.cpp), under `mu`; throw SQLite::Exception.
  // The claim insert: true if this delivery claimed the id. With
  // only_if_nothing_recorded, also false when the id has attempts or a dead letter.
  bool insert_claim(const std::string& consumer, const Message& message,
                    const std::string& message_id, bool only_if_nothing_recorded);
  // Everything recorded for the id (claim, dead letter, attempts); returns processed.
  // Also outside a transaction.
  bool read_lookup(const std::string& consumer, const std::string& message_id, MessageState* out);
  void delete_attempt_row(const std::string& consumer, const std::string& id);
  // Marks a dead letter 'replayed' (its message's effect is committed), in the open
  // transaction.
  void mark_replayed_row(int64_t dead_letter_id);
  // The rest of the claim transaction, with the claim inserted: the handler, then COMMIT,
  // or ROLLBACK on any failure (store/sqlite/claim.cpp). Under `mu`.
  Status claim_locked(const std::string& consumer, const Message& message,
                      const std::string& message_id, int attempt, const StoreHandler& handler,
                      bool delete_attempt_row, std::optional<int64_t> replayed_dead_letter,
                      ClaimResult* result, std::string* handler_error,
                      const nlohmann::json* payload_json = nullptr);
  // Wakes the outbox relays after a commit that enqueued on any connection the library
  // opened to this file in this process (store/sqlite/commit_wake.h): the file's one CommitWake,
  // taken when the first connection is open and kept across reopened ones, whose WAL guards watch
  // them.
  std::shared_ptr<CommitWake> commit_wake;
  // Adaptive checkpoints and the checkpoint on SQLITE_FULL (store/sqlite/wal_guard.h). Declared
  // after `db` and the statements: it removes its hook before the connection closes.
  std::unique_ptr<WalGuard> wal_guard;
  // Drops the connection and everything prepared on it (statements, WAL guard): before
  // each start-up attempt, and when open fails. The marker stays (it is the lock file's).
  void close_connection();

  // Retention clock (docs/operations.md#clock-safety): clock_base_ms at steady time
  // steady_base_ms; advances only with the monotonic clock. Both are fixed after open.
  int64_t clock_base_ms = 0;
  int64_t steady_base_ms = 0;
  mutable std::atomic<int64_t> clock_high{0};  // never report less than before
  const std::string& location() const override { return path; }
  int64_t retention_clock() const override {
    int64_t t = clock_base_ms + (clock->steady_ms() - steady_base_ms);
    int64_t seen = clock_high.load(std::memory_order_relaxed);
    while (t > seen && !clock_high.compare_exchange_weak(seen, t)) {
    }
    return std::max(t, seen);
  }

  std::unique_ptr<RetentionRows> retention = make_sqlite_retention_rows(*this);
  RetentionRows& retention_rows() override { return *retention; }
  std::unique_ptr<StpRows> stp = make_sqlite_stp_rows(*this);
  StpRows& stp_rows() override { return *stp; }
  std::unique_ptr<OutboxStore> outbox_store = make_sqlite_outbox(*this);
  OutboxStore& outbox() override { return *outbox_store; }

  // Measures rows per consumer (a scan of inbox_processed) and stores the result for
  // stats(). On `reader`, a second connection, the scan reads a WAL snapshot and blocks
  // no commit; with nullptr it runs on `db` under `mu`.
  Status measure_rows(SQLite::Database* reader);

  // Counts a failed store operation and passes the Status through. A fatal one (the
  // file is corrupt) latches the inbox: see latch_fatal(). On SQLITE_FULL the WAL gives
  // its space back at once (WalGuard::on_full), which needs the connection: callers hold
  // `mu` (or, in open, are its only user) unless they pass holding_connection = false.
  Status store_error(Status s, bool holding_connection = true) override {
    if (s.is_transient_store_error()) ++store_errors;
    if (s.is_fatal_store_error()) latch_fatal(s);
    if (s.code() == Status::Code::kFull && holding_connection && wal_guard) wal_guard->on_full();
    return s;
  }

  // --- start-up waits and the fatal latch (store/sqlite/open.cpp) ---

  // Opens the connection and brings the file to the current schema: one attempt of
  // Inbox::open, repeated by wait_at_startup() while the store is transiently unavailable.
  // `busy_timeout_ms`: this attempt's (see wait_at_startup); open() sets the configured
  // one afterwards.
  Status open_connection(int busy_timeout_ms);

  // Inbox::open's, Inbox::setup's, Pruner::create's and StoreThenProcess::create's and
  // start()'s wait for a transiently unavailable store (InboxOptions::startup_*).
  // `op(busy_timeout_ms)` is one attempt; its busy timeout is busy_timeout_ms, cut to
  // what is left of the start-up deadline (BusyTimeout applies it to a connection). `op`
  // takes `mu` itself if it needs the connection, so the sleeps between attempts hold no
  // lock.
  static constexpr int64_t kFirstStartupAttemptMs = 1000;
  Status wait_at_startup(const char* what, const std::function<Status(int)>& op) override {
    const int64_t deadline = options.startup_deadline_ms;
    const int64_t t0 = clock->steady_ms();
    bool first = true;
    return startup->until_ready(
        what,
        [&]() -> Status {
          if (fatal.load()) return fatal_status();
          int64_t busy = options.busy_timeout_ms;
          // The first attempt waits at most kFirstStartupAttemptMs for a lock, so that a
          // wait is reported (startup_progress, systemd's STATUS=) about 1 s after it
          // begins, not a whole busy timeout later; the attempts after it wait the full one.
          if (first) busy = std::min<int64_t>(busy, kFirstStartupAttemptMs);
          first = false;
          if (deadline > 0)
            busy = std::clamp<int64_t>(deadline - (clock->steady_ms() - t0), 0, busy);
          return op(static_cast<int>(busy));
        },
        deadline, options.startup_progress);
  }

  // Sets a connection's busy timeout for one start-up attempt, back to busy_timeout_ms
  // at the end of the scope.
  struct BusyTimeout {
    sqlite3* db;
    int normal_ms;
    BusyTimeout(sqlite3* d, int attempt_ms, int normal) : db(d), normal_ms(normal) {
      sqlite3_busy_timeout(db, attempt_ms);
    }
    ~BusyTimeout() { sqlite3_busy_timeout(db, normal_ms); }
    BusyTimeout(const BusyTimeout&) = delete;
    BusyTimeout& operator=(const BusyTimeout&) = delete;
  };

  // Once the file is found corrupt (SQLITE_CORRUPT/NOTADB), the inbox never reads or
  // writes it again: every method returns fatal_status() without touching SQLite, the
  // connection's closing checkpoint is switched off, and the error is logged with the
  // recovery procedure. The file stays exactly as the corruption left it.
  void latch_fatal(const Status& s) override;
  Status fatal_status() const override;

  // Runs `fn` inside BEGIN IMMEDIATE ... COMMIT; rolls back on any exception and
  // rethrows it. COMMIT failing leaves nothing committed.
  template <typename Fn>
  void write_transaction(Fn&& fn) {
    db->exec("BEGIN IMMEDIATE");
    try {
      fn();
      db->exec("COMMIT");
    } catch (...) {
      rollback_quietly(*db);
      throw;
    }
  }

  // Commits the next autocommit statement without fsync, when the inbox runs FULL: enough
  // for attempt counting (docs/design.md#attempts-and-crash-loops).
  struct RelaxedSync {
    SqliteStore& impl;
    explicit RelaxedSync(SqliteStore& i) : impl(i) {
      if (impl.options.synchronous == Synchronous::kFull)
        impl.db->exec("PRAGMA synchronous = NORMAL");
    }
    ~RelaxedSync() {
      if (impl.options.synchronous == Synchronous::kFull) {
        try {
          impl.db->exec("PRAGMA synchronous = FULL");
        } catch (...) {
          // Setting a pragma outside a transaction does no I/O; if it ever fails, the
          // connection is unusable and the next statement reports it.
        }
      }
    }
  };

 private:
  SqliteClaims claims_;
  SqliteDeadLetters dead_letters_;
  SqliteSessions sessions_;
};

inline SqliteSessions::SqliteSessions(SqliteStore& store) : SessionStore(store), s_(store) {}

}  // namespace mqtt_inbox::detail

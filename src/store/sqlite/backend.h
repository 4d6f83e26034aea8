// SqliteBackend: the SQLite store beneath the Store front (store/backend.h): one
// connection to one database file in WAL mode, the lock file, the cached statements of
// the per-message path, the running-attempt marker, the WAL guard. Its code is in this
// folder: open.cpp (opening: lock file, pragmas, schema and migrations, the retention
// clock's base; the application's set-up; errors and the fatal latch), claim.cpp (the
// claim transaction's statements, attempts and the marker, the handler's run under the
// transaction fence), dead_letters.cpp and sessions.cpp (their rows), backend.cpp
// (closing, statistics, the connection lent to the application), retention_rows.cpp (the
// Pruner's deletes and checkpoints), stp_rows.cpp (store-then-process's rows and its
// workers' connections) and outbox_rows.cpp (the outbox's rows).
//
// Thread safety: the front serialises use of `db`, the statements and the marker with
// `mu` (StoreBackend::mu); the row interfaces take it themselves.
#pragma once

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <memory>
#include <mutex>
#include <string>

#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/options.h"
#include "store/backend.h"
#include "store/outbox_rows.h"
#include "store/retention_rows.h"
#include "store/sqlite/attempt_marker.h"
#include "store/sqlite/commit_wake.h"
#include "store/sqlite/util.h"
#include "store/sqlite/wal_guard.h"
#include "store/store.h"
#include "store/stp_rows.h"

namespace mqtt_inbox::detail {

class SqliteBackend;
// The SQLite store's retention (store/sqlite/retention_rows.cpp).
std::unique_ptr<RetentionRows> make_sqlite_retention_rows(SqliteBackend& store);
// The SQLite store's store-then-process rows (store/sqlite/stp_rows.cpp).
std::unique_ptr<StpRows> make_sqlite_stp_rows(SqliteBackend& store);
// The SQLite store's outbox rows (store/sqlite/outbox_rows.cpp).
std::unique_ptr<OutboxStore> make_sqlite_outbox(SqliteBackend& store);

class SqliteBackend final : public StoreBackend {
 public:
  explicit SqliteBackend(Store& front);
  // Persists the retention clock, clears the attempt marker and closes the connection,
  // then the lock file (store/sqlite/backend.cpp).
  ~SqliteBackend() override;

  // --- StoreBackend ---
  const std::string& location() const override { return path; }
  const std::type_info& handler_type() const override { return typeid(SQLite::Database*); }
  const char* handler_type_name() const override {
    return "SQLite::Database& (mqtt_inbox/sqlite.h)";
  }
  void file_stats(InboxStats* out) const override;
  Status open(int lock_wait_ms) override;
  Status failed_open(Status s) override;
  Status ready() override;
  Status classify_current(const std::string& context) override;
  void on_store_error(const Status& s) override;
  void on_fatal() override;
  std::string fatal_text(const std::string& error) const override;
  std::string fatal_advice(const std::string& error) const override;
  void begin(bool for_handler) override;
  CommitOutcome commit(const ClaimKey* claim, std::string* why) override;
  void rollback() noexcept override;
  void begin_read() override {}
  void end_read() noexcept override {}
  bool insert_claim(const ClaimKey& key, const Message& message,
                    bool only_if_nothing_recorded) override;
  bool read_state(const ClaimKey& key, MessageState* out) override;
  void delete_attempts(const ClaimKey& key) override;
  void mark_replayed(int64_t dead_letter_id) override;
  void run_handler(const Inbox* owner, FunctionRef<void(const TxnRef&)> call,
                   HandlerRun* out) override;
  int count_attempt(const ClaimKey& key, const std::string* error) override;
  void mark_attempt_failed(const ClaimKey& key, const std::string& error) override;
  void uncount_attempt(const ClaimKey& key) override;
  bool mark_running(const ClaimKey& key) override;
  void clear_running() noexcept override;
  std::optional<int64_t> open_dead_letter(const ClaimKey& key) override;
  void count_redelivery(int64_t dead_letter_id) override;
  bool rewrite_dead_letter(int64_t id, const DeadLetter& dl, int64_t now_ms) override;
  int64_t insert_dead_letter(const DeadLetter& dl, int64_t now_ms) override;
  void list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) override;
  bool get_dead_letter(int64_t id, DeadLetter* out) override;
  int64_t purge_dead_letters(const DeadLetterFilter& filter) override;
  RequeueFacts requeue_facts(int64_t id) override;
  void set_requeued(int64_t id) override;
  void requeued_dead_letters(const std::string& consumer, int64_t limit,
                             std::vector<int64_t>* ids) override;
  void write_session(const SessionRecord& record) override;
  void read_sessions(const std::string* client_id, std::vector<SessionRecord>* out) override;
  bool remove_session(const std::string& client_id) override;
  void add_lost_session(const std::string& client_id, int64_t at_ms) override;
  void setup(int lock_wait_ms, FunctionRef<void(const TxnRef&)> fn) override;
  void setup_sql(int lock_wait_ms, const std::string& sql) override;
  const std::type_info& connection_type() const override { return typeid(SQLite::Database*); }
  void with_connection(FunctionRef<void(const TxnRef&)> fn) override;
  Status measure_rows() override;
  OutboxStore& outbox() override { return *outbox_store; }
  StpRows& stp_rows() override { return *stp; }
  RetentionRows& retention_rows() override { return *retention; }
  Status open_slot_leases(const SlotLeaseOptions& options,
                          std::unique_ptr<SlotLeases>* out) override;
  bool shared_by_processes() const override { return false; }

  // --- what the row interfaces of this folder use ---
  // The front's, for the row interfaces of this folder.
  bool unusable() const { return front().unusable(); }
  Status fatal_status() const { return front().fatal_status(); }
  Status store_error(Status s, bool holding_connection = true) {
    return front().store_error(std::move(s), holding_connection);
  }
  const Inbox* owner() const { return front().owner(); }
  int64_t retention_clock() const { return front().retention_clock(); }

  const std::string path;
  int lock_fd = -1;  // flock'ed "<path>.lock" while exclusive; closed (unlocked) last
  std::unique_ptr<SQLite::Database> db;
  // The per-message path's statements, prepared once (store/sqlite/claim.cpp).
  std::unique_ptr<SQLite::Statement> begin_immediate, commit_stmt, rollback_stmt, lookup,
      begin_attempt, attempt_failed, attempt_failed_counted, claim, claim_if_nothing_recorded,
      delete_attempts_stmt, mark_replayed_stmt;
  // Which handler is running, outside the database (store/sqlite/attempt_marker.h). Null
  // without the lock file (exclusive = false): attempts are then committed before a
  // redelivery's handler runs.
  std::unique_ptr<AttemptMarker> marker;
  // Wakes the outbox relays after a commit that enqueued on any connection the library
  // opened to this file in this process (store/sqlite/commit_wake.h): the file's one
  // CommitWake, taken when the first connection is open and kept across reopened ones,
  // whose WAL guards watch them.
  std::shared_ptr<CommitWake> commit_wake;
  // Adaptive checkpoints and the checkpoint on SQLITE_FULL (store/sqlite/wal_guard.h).
  // Declared after `db` and the statements: it removes its hook before the connection
  // closes.
  std::unique_ptr<WalGuard> wal_guard;

  // Takes the lock file and checks the files can be written: once, before the first
  // open attempt (make_sqlite_backend).
  Status prepare_files();
  // Opens the connection and brings the file to the current schema: one attempt of
  // open(). `busy_timeout_ms`: this attempt's.
  Status open_connection(int busy_timeout_ms);
  // Drops the connection and everything prepared on it (statements, WAL guard): before
  // each start-up attempt, and when open fails. A connection the application's handler
  // closed or left statements on is let go without SQLiteCpp's close (which asserts):
  // sqlite3_close_v2 frees it once the last statement is finalized.
  void close_connection();
  void prepare_statements();  // on a connection just opened (open_connection)
  // Turns a marker left by a process that died inside a handler into a 'running' attempt
  // (one committed transaction), then clears it. Throws SQLite::Exception.
  void recover_marked_attempt();
  // Measures rows per consumer (a scan of inbox_processed) and hands them to the front.
  // On `reader`, a second connection, the scan reads a WAL snapshot and blocks no
  // commit; with nullptr it runs on `db` under `mu`.
  Status measure_rows(SQLite::Database* reader);

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

  // Commits the next autocommit statement without fsync, when the inbox runs FULL: enough
  // for attempt counting (docs/design.md#attempts-and-crash-loops).
  struct RelaxedSync {
    SqliteBackend& impl;
    explicit RelaxedSync(SqliteBackend& i) : impl(i) {
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
  bool opened_ = false;         // an open attempt succeeded: the destructor persists and clears
  bool existed_ = false;        // the database file was there before this open
  bool lock_existed_ = false;   // and its lock file
  bool new_file_full_ = false;  // a new database did not fit (open, failed_open)
  // A handler closed the connection (sqlite3_close*): close_connection lets it go.
  bool connection_closed_by_handler_ = false;
  std::unique_ptr<RetentionRows> retention;
  std::unique_ptr<StpRows> stp;
  std::unique_ptr<OutboxStore> outbox_store;
};

}  // namespace mqtt_inbox::detail

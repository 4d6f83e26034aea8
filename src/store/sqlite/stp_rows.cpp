// The SQLite store's store-then-process rows (store/stp_rows.h): inbox_messages. Receipt
// runs one autocommit INSERT on the Inbox's connection (under its mutex); each worker and
// each consumer's maintenance have a connection of their own to the same file, and every
// write is a short BEGIN IMMEDIATE transaction, so SQLite's single write lock serialises
// claims, handler transactions and the reaper: a claim token checked inside a transaction
// cannot change before its COMMIT. docs/store-then-process.md has the steps.
#include "store/stp_rows.h"

#include "mqtt_inbox/sqlite.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mqtt_inbox/handler.h"
#include "store/contract.h"
#include "store/sqlite/backend.h"
#include "store/sqlite/errors.h"
#include "store/sqlite/txn_fence.h"
#include "store/sqlite/unclosed.h"
#include "store/sqlite/util.h"
#include "store/sqlite/wal_guard.h"
#include "store/verdict.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

namespace {

constexpr const char* kInsertSql =
    "INSERT INTO inbox_messages (consumer_name, message_id, aggregate_key, topic, payload,"
    "                            properties, qos, received_at, expires_at)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
    " ON CONFLICT (consumer_name, message_id) DO NOTHING";

constexpr const char* kExistsSql =
    "SELECT EXISTS(SELECT 1 FROM inbox_messages WHERE consumer_name = ?1 AND message_id = ?2)";

// Claim candidates, found with index seeks on inbox_messages_work (consumer_name,
// status, aggregate_key, seq) rather than a scan of the backlog: the aggregates with
// pending rows one by one (skip-scan), aggregates with a 'processing' row, and the first
// pending rows of one aggregate in seq order.
constexpr const char* kFirstAggregateSql =
    "SELECT min(aggregate_key) FROM inbox_messages WHERE consumer_name = ?1 AND status = 'pending'";
constexpr const char* kNextAggregateSql =
    "SELECT min(aggregate_key) FROM inbox_messages"
    " WHERE consumer_name = ?1 AND status = 'pending' AND aggregate_key > ?2";
constexpr const char* kBusyAggregatesSql =
    "SELECT DISTINCT aggregate_key FROM inbox_messages"
    " WHERE consumer_name = ?1 AND status = 'processing'";
constexpr const char* kAggregateHeadSql =
    "SELECT seq, next_attempt_at FROM inbox_messages"
    " WHERE consumer_name = ?1 AND status = 'pending' AND aggregate_key = ?2"
    " ORDER BY seq LIMIT ?3";

// A claim takes the row's next fencing token (claim_token): every later write of the
// worker to the row requires it, so a worker whose claim was reaped (and perhaps claimed
// again by another) changes nothing. claimed_at is wall-clock time for people only; the
// lease is timed in the reaper's memory (stp/maintenance.cpp). The row is then read in the
// same transaction rather than with RETURNING: RETURNING makes the UPDATE open a statement
// journal (SQLite allocates and frees 64 KiB for it per row claimed).
constexpr const char* kClaimRowSql =
    "UPDATE inbox_messages SET status = 'processing', claimed_at = ?2, claimant = ?3,"
    "       claim_token = claim_token + 1"
    " WHERE seq = ?1 AND status = 'pending'";
constexpr const char* kClaimedRowSql =
    "SELECT message_id, aggregate_key, topic, payload, properties, qos, received_at,"
    "       attempts, last_error, claim_token, expires_at, not_yet, waiting_since"
    " FROM inbox_messages WHERE seq = ?1";

constexpr const char* kOwnedSql =
    "SELECT EXISTS(SELECT 1 FROM inbox_messages"
    "              WHERE seq = ?1 AND status = 'processing' AND claim_token = ?2)";

constexpr const char* kDoneSql =
    "UPDATE inbox_messages SET status = 'done', attempts = ?2, done_at = ?3,"
    "       last_error = NULL, next_attempt_at = 0, not_yet = 0, waiting_since = NULL"
    " WHERE seq = ?1 AND status = 'processing' AND claim_token = ?4";

// A successful run of a message that had been dead-lettered (and replayed) closes its
// dead letter in the same transaction. Usually matches nothing (an index probe).
constexpr const char* kCloseDeadLetterSql =
    "UPDATE inbox_dead_letters SET status = 'replayed', replayed_at = ?3"
    " WHERE consumer_name = ?1 AND message_id = ?2 AND status = 'dead'";

// Only what people see (`mqtt-inbox check`, SELECTs): when the batch last made progress.
constexpr const char* kRenewLeaseSql =
    "UPDATE inbox_messages SET claimed_at = ?3"
    " WHERE consumer_name = ?1 AND status = 'processing' AND claimant = ?2";

// next_attempt_at is on the retention clock (the policy's claim chooser reads it), and so
// is waiting_since (the dependency schedule's start; NULL with not_yet 0).
constexpr const char* kFailedSql =
    "UPDATE inbox_messages SET status = 'pending', attempts = ?2, last_error = ?3,"
    "       next_attempt_at = ?4, claimant = NULL, claimed_at = NULL, not_yet = ?6,"
    "       waiting_since = CASE WHEN ?6 > 0 THEN ?7 END"
    " WHERE seq = ?1 AND status = 'processing' AND claim_token = ?5";

// Releases a claimed row without counting an attempt (stop, or a row of an aggregate whose
// earlier row just failed).
constexpr const char* kReleaseSql =
    "UPDATE inbox_messages SET status = 'pending', claimant = NULL, claimed_at = NULL"
    " WHERE seq = ?1 AND status = 'processing' AND claim_token = ?2";

constexpr const char* kDeadSql =
    "UPDATE inbox_messages SET status = 'dead', attempts = ?2, last_error = ?3, done_at = ?4"
    " WHERE seq = ?1 AND status = 'processing' AND claim_token = ?5";

// Runs `fn` in BEGIN IMMEDIATE ... COMMIT on `db`. Store errors come back as Status.
template <typename Fn>
Status transaction(SQLite::Database& db, const char* what, Fn&& fn) {
  try {
    db.exec("BEGIN IMMEDIATE");
  } catch (const SQLite::Exception& e) {
    return to_status(e, std::string(what) + ": BEGIN IMMEDIATE");
  }
  try {
    fn();
    db.exec("COMMIT");
  } catch (const SQLite::Exception& e) {
    rollback_quietly(db);
    return to_status(e, what);
  } catch (const std::exception& e) {
    rollback_quietly(db);
    return Status::Internal(std::string(what) + ": " + e.what());
  }
  return Status::Ok();
}

// A connection to the Inbox's file with its settings; `sync` overrides synchronous.
// Throws SQLite::Exception.
std::unique_ptr<SQLite::Database> open_connection(const SqliteBackend& store,
                                                  std::optional<Synchronous> sync) {
  const InboxOptions& io = store.options;
  auto db = std::make_unique<SQLite::Database>(
      store.path, SQLite::OPEN_READWRITE | SQLite::OPEN_URI, io.busy_timeout_ms, io.vfs);
  const Synchronous s = sync ? *sync : io.synchronous;
  db->exec(s == Synchronous::kFull ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
  db->exec("PRAGMA foreign_keys = ON");
  db->exec("PRAGMA cache_size = -" + std::to_string(io.cache_size_kib));
  TxnFence::install(db->getHandle());  // a worker's handler runs on it (txn_fence.h)
  return db;
}

// Once the file is unusable (the store latched a fatal error), closing `db` must not
// checkpoint the WAL into it.
void close_quietly_if_unusable(const SqliteBackend& store, SQLite::Database* db) {
  if (db && store.unusable())
    sqlite3_db_config(db->getHandle(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
}

class SqliteStpWorkerSession final : public StpWorkerSession {
 public:
  SqliteStpWorkerSession(SqliteBackend& store, std::string consumer, Synchronous handler_sync)
      : store_(store), consumer_(std::move(consumer)), handler_sync_(handler_sync) {}

  ~SqliteStpWorkerSession() override {
    // The statements go before the connection (members are destroyed in reverse order).
    close_quietly_if_unusable(store_, db_.get());
  }

  // Drops the statements and lets a connection its handler closed go without SQLiteCpp's
  // close (which would assert on it): SQLite frees it once its statements are finalized.
  void let_go() {
    wal_guard_.reset();
    for (auto* q : {&first_agg_, &next_agg_, &busy_aggs_, &agg_head_, &claim_row_, &claimed_row_,
                    &owned_, &done_, &close_dl_, &renew_, &failed_, &release_, &dead_})
      q->reset();
    keep_unclosed(std::move(db_));
  }

  // Opens the connection and prepares the statements. Throws SQLite::Exception.
  void open() {
    db_ = open_connection(store_, std::nullopt);
    SQLite::Database& db = *db_;
    const int page_size = db.execAndGet("PRAGMA page_size").getInt();
    wal_guard_ = std::make_unique<WalGuard>(db.getHandle(), store_.path, page_size,
                                            store_.options.wal_autocheckpoint_pages, store_.log,
                                            store_.commit_wake);
    first_agg_ = std::make_unique<SQLite::Statement>(db, kFirstAggregateSql);
    next_agg_ = std::make_unique<SQLite::Statement>(db, kNextAggregateSql);
    busy_aggs_ = std::make_unique<SQLite::Statement>(db, kBusyAggregatesSql);
    agg_head_ = std::make_unique<SQLite::Statement>(db, kAggregateHeadSql);
    claim_row_ = std::make_unique<SQLite::Statement>(db, kClaimRowSql);
    claimed_row_ = std::make_unique<SQLite::Statement>(db, kClaimedRowSql);
    owned_ = std::make_unique<SQLite::Statement>(db, kOwnedSql);
    done_ = std::make_unique<SQLite::Statement>(db, kDoneSql);
    close_dl_ = std::make_unique<SQLite::Statement>(db, kCloseDeadLetterSql);
    renew_ = std::make_unique<SQLite::Statement>(db, kRenewLeaseSql);
    failed_ = std::make_unique<SQLite::Statement>(db, kFailedSql);
    release_ = std::make_unique<SQLite::Statement>(db, kReleaseSql);
    dead_ = std::make_unique<SQLite::Statement>(db, kDeadSql);
  }

  Status claim(const std::string& claimant, int max_rows, const ClaimChooser& choose,
               std::vector<StoredRow>* batch) override {
    batch->clear();
    // Read before the transaction, as the due times it is compared with were written.
    const int64_t now = store_.retention_clock();
    set_sync(Synchronous::kNormal);
    std::vector<ClaimCandidate> offered;
    std::vector<int64_t> take;
    const Status s = transaction(*db_, "claiming rows", [&] {
      batch->clear();  // a retried transaction starts afresh
      offered.clear();
      take.clear();
      candidates(max_rows, &offered);
      if (offered.empty()) return;
      choose(now, offered, &take);
      for (const int64_t seq : take) {
        if (batch->size() >= static_cast<size_t>(max_rows)) break;
        {
          SQLite::Statement& u = *claim_row_;
          StatementReset reset(u);
          u.bind(1, seq);
          u.bind(2, store_.clock->wall_ms());
          u.bind(3, claimant);
          if (u.exec() == 0) continue;  // no longer pending
        }
        SQLite::Statement& q = *claimed_row_;
        StatementReset reset(q);
        q.bind(1, seq);
        if (!q.executeStep()) continue;
        StoredRow r;
        r.claim.seq = seq;
        r.message_id = q.getColumn(0).getString();
        r.aggregate_key = q.getColumn(1).getString();
        r.topic = q.getColumn(2).getString();
        r.payload = q.getColumn(3).getString();
        r.properties_json = q.getColumn(4).isNull() ? "{}" : q.getColumn(4).getString();
        r.qos = q.getColumn(5).getInt();
        r.received_at = q.getColumn(6).getInt64();
        r.attempts = q.getColumn(7).getInt();
        r.last_error = q.getColumn(8).isNull() ? "" : q.getColumn(8).getString();
        r.claim.token = q.getColumn(9).getInt64();
        if (!q.getColumn(10).isNull()) r.expires_at = q.getColumn(10).getInt64();
        r.wait.runs = q.getColumn(11).getInt();
        r.wait.since = q.getColumn(12).isNull() ? 0 : q.getColumn(12).getInt64();
        batch->push_back(std::move(r));
      }
    });
    if (!s.ok()) batch->clear();  // rolled back: nothing is claimed
    return s;
  }

  Status holds(const RowClaim& c, bool* held) override {
    try {
      *held = owned(c);
    } catch (const SQLite::Exception& e) {
      return to_status(e, "checking a claim");
    }
    return Status::Ok();
  }

  Status process(const RowClaim& c, const std::string& claimant, const StoredStoreHandler& handler,
                 const StoredDelivery& d, FunctionRef<bool()> expired,
                 StoredRunResult* out) override {
    *out = StoredRunResult{};
    set_sync(handler_sync_);
    SQLite::Database& db = *db_;
    try {
      db.exec("BEGIN IMMEDIATE");
    } catch (const SQLite::Exception& e) {
      return to_status(e, "handler transaction: BEGIN IMMEDIATE");
    }
    const int64_t began = store_.clock->steady_ms();
    try {
      // The fence: the row must still carry this claim's token. Checked under the write
      // lock that the commit below keeps, so no reaper can come between.
      if (!owned(c)) {
        rollback_quietly(db);
        out->kind = StoredRunResult::Kind::kLost;
        return Status::Ok();
      }
      // The worker's transaction holds SQLite's write lock: a call back into the inbox
      // from the handler would wait for it (store/reentry.h). The handler's contract is
      // judged as for a Consumer (store/contract.h).
      HandlerRun run;
      run_sqlite_handler(
          db, store_.owner(), [&](const TxnRef& txn) { handler(txn, d); }, &run);
      judge_contract(&run);
      if (!run.reset.empty())
        store_.log->warn(
            "store-then-process '{}', message '{}': the handler left {} statement(s) stepped "
            "(first: {}); the library reset them",
            printable(consumer_), printable(d.message_id), run.reset.size(),
            printable(run.reset.front(), 200));
      const HandlerVerdict& v = run.verdict;
      if (run.left == TxnLeft::kClosed) {
        // A worker connection its handler closed: let go, and a new one in its place.
        let_go();
        open();
      }
      if (v.kind != HandlerVerdict::Kind::kOk) {
        if (run.left != TxnLeft::kClosed) rollback_quietly(db);
        if (v.kind == HandlerVerdict::Kind::kStoreError) return v.store;  // run it again
        out->kind = StoredRunResult::Kind::kNotDone;
        out->verdict = v;
        return Status::Ok();
      }
      if (expired()) {  // the policy's decision, right before the row is marked done
        rollback_quietly(db);
        out->kind = StoredRunResult::Kind::kExpired;
        return Status::Ok();
      }
      const int64_t now = store_.retention_clock();
      {
        SQLite::Statement& q = *done_;
        StatementReset reset(q);
        q.bind(1, c.seq);
        q.bind(2, d.attempt);
        q.bind(3, now);
        q.bind(4, c.token);
        if (q.exec() != 1) {  // the handler itself changed the row: not ours any more
          rollback_quietly(db);
          out->kind = StoredRunResult::Kind::kLost;
          return Status::Ok();
        }
      }
      {
        SQLite::Statement& q = *close_dl_;
        StatementReset reset(q);
        q.bind(1, consumer_);
        q.bind(2, d.message_id);
        q.bind(3, store_.clock->wall_ms());
        q.exec();
      }
      {
        // The next row of the batch starts now: renew the batch's lease.
        SQLite::Statement& q = *renew_;
        StatementReset reset(q);
        q.bind(1, consumer_);
        q.bind(2, claimant);
        q.bind(3, store_.clock->wall_ms());
        q.exec();
      }
      db.exec("COMMIT");
    } catch (const SQLite::Exception& e) {
      rollback_quietly(db);
      // The row's change refused at COMMIT (a deferred foreign key, a CHECK, a commit
      // hook): a failed attempt of this row, not a store failure to retry forever.
      if (error_class(e.getErrorCode()) == ErrorClass::kMessage) {
        out->kind = StoredRunResult::Kind::kNotDone;
        out->verdict.kind = HandlerVerdict::Kind::kFailed;
        out->verdict.text = std::string("the store refused this row's transaction: ") + e.what();
        return Status::Ok();
      }
      return to_status(e, "handler transaction");
    } catch (const std::exception& e) {
      rollback_quietly(db);
      return Status::Internal(std::string("handler transaction: ") + e.what());
    }
    out->held_ms = store_.clock->steady_ms() - began;
    return Status::Ok();
  }

  Status retry_later(const RowClaim& c, int attempts, const std::string& error, const RowWait& wait,
                     int64_t delay_ms, const std::vector<RowClaim>& release_too,
                     bool* held) override {
    *held = true;
    set_sync(Synchronous::kNormal);
    return transaction(*db_, "putting a row back to wait", [&] {
      {
        SQLite::Statement& q = *failed_;
        StatementReset reset(q);
        q.bind(1, c.seq);
        q.bind(2, attempts);
        q.bind(3, error);
        q.bind(4, store_.retention_clock() + delay_ms);
        q.bind(5, c.token);
        q.bind(6, wait.runs);
        q.bind(7, wait.since);
        *held = q.exec() > 0;
      }
      release_rows(release_too);
    });
  }

  Status release(const std::vector<RowClaim>& rows) override {
    set_sync(Synchronous::kNormal);
    return transaction(*db_, "releasing rows", [&] { release_rows(rows); });
  }

  Status mark_dead(const RowClaim& c, int attempts, const std::string& text, bool* held) override {
    *held = true;
    set_sync(handler_sync_);
    return transaction(*db_, "marking a row dead", [&] {
      SQLite::Statement& q = *dead_;
      StatementReset reset(q);
      q.bind(1, c.seq);
      q.bind(2, attempts);
      q.bind(3, text);
      q.bind(4, store_.retention_clock());
      q.bind(5, c.token);
      *held = q.exec() > 0;
    });
  }

 private:
  // Bookkeeping commits (claim, failure, release) skip the fsync: losing one on power
  // loss only repeats a claim or undercounts one attempt; the row itself is durable.
  void set_sync(Synchronous s) {
    if (current_sync_ == s) return;
    try {
      db_->exec(s == Synchronous::kFull ? "PRAGMA synchronous = FULL"
                                        : "PRAGMA synchronous = NORMAL");
      current_sync_ = s;
    } catch (const SQLite::Exception&) {
      // Outside a transaction this does no I/O; if it fails the connection is broken
      // and the next statement reports it.
    }
  }

  bool owned(const RowClaim& c) {
    SQLite::Statement& q = *owned_;
    StatementReset reset(q);
    q.bind(1, c.seq);
    q.bind(2, c.token);
    return q.executeStep() && q.getColumn(0).getInt() != 0;
  }

  void release_rows(const std::vector<RowClaim>& rows) {
    SQLite::Statement& q = *release_;
    for (const RowClaim& c : rows) {
      StatementReset reset(q);
      q.bind(1, c.seq);
      q.bind(2, c.token);
      q.exec();  // a finished or reaped row no longer matches
    }
  }

  // The first max_rows pending rows of each aggregate without a 'processing' row, one
  // aggregate after another. Cost: one index seek per aggregate with pending rows, plus
  // up to max_rows rows of each; never a scan of the whole backlog.
  void candidates(int max_rows, std::vector<ClaimCandidate>* out) {
    std::set<std::string> busy;
    {
      SQLite::Statement& q = *busy_aggs_;
      StatementReset reset(q);
      q.bind(1, consumer_);
      while (q.executeStep()) busy.insert(q.getColumn(0).getString());
    }
    std::optional<std::string> key;
    for (;;) {
      SQLite::Statement& q = key ? *next_agg_ : *first_agg_;
      StatementReset reset(q);
      q.bind(1, consumer_);
      if (key) q.bind(2, *key);
      if (!q.executeStep() || q.getColumn(0).isNull()) break;
      key = q.getColumn(0).getString();
      if (busy.count(*key)) continue;
      SQLite::Statement& h = *agg_head_;
      StatementReset reset_h(h);
      h.bind(1, consumer_);
      h.bind(2, *key);
      h.bind(3, static_cast<int64_t>(max_rows));
      while (h.executeStep())
        out->push_back({h.getColumn(0).getInt64(), *key, h.getColumn(1).getInt64()});
    }
  }

  SqliteBackend& store_;
  const std::string consumer_;
  const Synchronous handler_sync_;
  std::optional<Synchronous> current_sync_;
  std::unique_ptr<SQLite::Database> db_;
  // As the Inbox's own connection has (store/sqlite/wal_guard.h): a handler's commit that
  // enqueued wakes the outbox relays, and checkpoints keep to wal_autocheckpoint_pages and
  // the free space. After db_: its hook is removed before the connection closes.
  std::unique_ptr<WalGuard> wal_guard_;
  std::unique_ptr<SQLite::Statement> first_agg_, next_agg_, busy_aggs_, agg_head_, claim_row_,
      claimed_row_, owned_, done_, close_dl_, renew_, failed_, release_, dead_;
};

class SqliteStpConsumerRows final : public StpConsumerRows {
 public:
  SqliteStpConsumerRows(SqliteBackend& store, std::string name)
      : store_(store), name_(std::move(name)) {}

  ~SqliteStpConsumerRows() override {
    close_quietly_if_unusable(store_, maint_.get());
    // Statements on the Inbox's connection are finalized under its mutex. No I/O, so
    // also once the store is unusable.
    std::lock_guard<std::mutex> lock(store_.mu);
    insert_.reset();
    exists_.reset();
  }

  // Opens the maintenance connection. Throws SQLite::Exception.
  void open() { maint_ = open_connection(store_, std::nullopt); }

  Status store_received(const std::string& message_id, const std::string& aggregate_key,
                        const Message& m, const std::string& properties_json,
                        std::optional<int64_t> expires_at, bool* stored) override {
    return on_inbox_connection("storing message", [&](SQLite::Database& db) {
      if (!insert_) insert_ = std::make_unique<SQLite::Statement>(db, kInsertSql);
      SQLite::Statement& q = *insert_;
      StatementReset reset(q);
      q.bind(1, name_);
      q.bind(2, message_id);
      q.bind(3, aggregate_key);
      q.bind(4, m.topic);
      q.bind(5, m.payload.data(), static_cast<int>(m.payload.size()));
      q.bind(6, properties_json);
      q.bind(7, m.qos);
      q.bind(8, store_.retention_clock());
      if (expires_at)
        q.bind(9, *expires_at);
      else
        q.bind(9);
      // One autocommit INSERT: committed (fsynced with synchronous=FULL) on return.
      *stored = q.exec() > 0;
    });
  }

  Status is_stored(const std::string& message_id, bool* found) override {
    return on_inbox_connection("looking up a stored message", [&](SQLite::Database& db) {
      if (!exists_) exists_ = std::make_unique<SQLite::Statement>(db, kExistsSql);
      SQLite::Statement& q = *exists_;
      StatementReset reset(q);
      q.bind(1, name_);
      q.bind(2, message_id);
      *found = q.executeStep() && q.getColumn(0).getInt() != 0;
    });
  }

  Status open_worker(Synchronous handler_sync, std::unique_ptr<StpWorkerSession>* out) override {
    auto w = std::make_unique<SqliteStpWorkerSession>(store_, name_, handler_sync);
    try {
      w->open();
    } catch (const SQLite::Exception& e) {
      return to_status(e, "opening a worker connection to " + store_.path);
    } catch (const std::exception& e) {
      return Status::Internal(std::string("opening a worker connection: ") + e.what());
    }
    *out = std::move(w);
    return Status::Ok();
  }

  Status reap(const ReapChooser& choose, int64_t* rows) override {
    *rows = 0;
    SQLite::Database& db = *maint_;
    std::vector<LiveClaim> claims;
    std::vector<ReturnedClaim> back;
    return transaction(db, "reaping expired claims", [&] {
      claims.clear();
      back.clear();
      *rows = 0;
      {
        SQLite::Statement q(
            db,
            "SELECT coalesce(claimant, ''), min(seq) FROM inbox_messages"
            " WHERE consumer_name = ?1 AND status = 'processing' GROUP BY claimant");
        q.bind(1, name_);
        while (q.executeStep())
          claims.push_back({q.getColumn(0).getString(), q.getColumn(1).getInt64()});
      }
      // Under the write lock: no claim is made or finished until COMMIT.
      choose(claims, &back);
      SQLite::Statement bump(db,
                             "UPDATE inbox_messages SET attempts = attempts + 1, last_error = ?2"
                             " WHERE seq = ?1");
      SQLite::Statement ret(db,
                            "UPDATE inbox_messages SET status = 'pending', claimant = NULL,"
                            " claimed_at = NULL"
                            " WHERE consumer_name = ?1 AND status = 'processing'"
                            "   AND coalesce(claimant, '') = ?2");
      for (const ReturnedClaim& r : back) {
        bump.tryReset();
        bump.bind(1, r.running_seq);
        bump.bind(2, r.last_error);
        bump.exec();
        ret.tryReset();
        ret.bind(1, name_);
        ret.bind(2, r.claimant);
        *rows += ret.exec();
      }
    });
  }

  Status replay(const ReplayFilter& f, ReplayResult* out) override {
    std::string where = " WHERE consumer_name = ?1";
    if (f.received_since_ms) where += " AND received_at >= ?2";
    if (f.received_before_ms) where += " AND received_at < ?3";
    if (f.aggregate_key) where += " AND aggregate_key = ?4";
    if (f.message_id) where += " AND message_id = ?5";
    const std::string finished =
        f.include_dead ? " AND status IN ('done', 'dead')" : " AND status = 'done'";
    auto bind = [&](SQLite::Statement& q) {
      q.bind(1, name_);
      if (f.received_since_ms) q.bind(2, *f.received_since_ms);
      if (f.received_before_ms) q.bind(3, *f.received_before_ms);
      if (f.aggregate_key) q.bind(4, *f.aggregate_key);
      if (f.message_id) q.bind(5, *f.message_id);
    };
    SQLite::Database& db = *maint_;
    return transaction(db, "replaying rows", [&] {
      *out = ReplayResult{};
      {
        SQLite::Statement q(
            db, "SELECT count(*) FROM inbox_messages" + where + " AND status = 'processing'");
        bind(q);
        q.executeStep();
        out->in_flight = q.getColumn(0).getInt64();
      }
      {
        SQLite::Statement q(
            db, "SELECT count(*) FROM inbox_messages" + where + finished + " AND payload IS NULL");
        bind(q);
        q.executeStep();
        out->not_replayable = q.getColumn(0).getInt64();
      }
      SQLite::Statement q(db,
                          "UPDATE inbox_messages SET status = 'pending', attempts = 0,"
                          " next_attempt_at = 0, last_error = NULL, claimant = NULL,"
                          " claimed_at = NULL, done_at = NULL, not_yet = 0,"
                          " waiting_since = NULL" +
                              where + finished + " AND payload IS NOT NULL");
      bind(q);
      out->reset = q.exec();
    });
  }

  Status compact_done(int64_t done_before, int limit, int64_t* rows) override {
    *rows = 0;
    SQLite::Database& db = *maint_;
    return transaction(db, "compacting done rows", [&] {
      // Served by the partial index inbox_messages_compact.
      SQLite::Statement q(db,
                          "UPDATE inbox_messages SET payload = NULL, properties = NULL"
                          " WHERE seq IN (SELECT seq FROM inbox_messages"
                          "   WHERE consumer_name = ?1 AND status = 'done'"
                          "     AND payload IS NOT NULL AND done_at < ?2 LIMIT ?3)");
      q.bind(1, name_);
      q.bind(2, done_before);
      q.bind(3, limit);
      *rows = q.exec();
    });
  }

  Status delete_finished(int64_t received_before, int limit, int64_t* rows) override {
    *rows = 0;
    SQLite::Database& db = *maint_;
    return transaction(db, "deleting old rows", [&] {
      SQLite::Statement q(db,
                          "DELETE FROM inbox_messages WHERE seq IN (SELECT seq FROM inbox_messages"
                          "   WHERE received_at < ?2 AND consumer_name = ?1"
                          "     AND status IN ('done', 'dead') LIMIT ?3)");
      q.bind(1, name_);
      q.bind(2, received_before);
      q.bind(3, limit);
      *rows = q.exec();
    });
  }

  Status count(StoreThenProcessStats* out) override {
    try {
      SQLite::Statement q(*maint_,
                          "SELECT status, count(*) FROM inbox_messages WHERE consumer_name = ?1"
                          " GROUP BY status");
      q.bind(1, name_);
      *out = StoreThenProcessStats{};
      while (q.executeStep()) {
        const std::string st = q.getColumn(0).getString();
        const int64_t n = q.getColumn(1).getInt64();
        if (st == "pending")
          out->pending = n;
        else if (st == "processing")
          out->processing = n;
        else if (st == "done")
          out->done = n;
        else if (st == "dead")
          out->dead = n;
      }
    } catch (const SQLite::Exception& e) {
      return to_status(e, "counting stored messages");
    }
    return Status::Ok();
  }

 private:
  // Runs `fn` on the Inbox's connection under its mutex, as Inbox::with_connection does
  // (which refuses a file found corrupt); SQLite errors come back as Status.
  template <typename Fn>
  Status on_inbox_connection(const char* what, Fn&& fn) {
    std::lock_guard<std::mutex> lock(store_.mu);
    if (store_.unusable())
      return to_status(SQLITE_CORRUPT, std::string(what) + ": " + store_.fatal_status().message());
    try {
      fn(*store_.db);
    } catch (const SQLite::Exception& e) {
      return to_status(e, what);
    } catch (const std::exception& e) {
      return Status::Internal(std::string(what) + ": " + e.what());
    }
    return Status::Ok();
  }

  SqliteBackend& store_;
  const std::string name_;
  // The maintenance connection: reaper, replay, prune, counts.
  std::unique_ptr<SQLite::Database> maint_;
  // Receipt's statements, on the Inbox's connection, used under its mutex.
  std::unique_ptr<SQLite::Statement> insert_, exists_;
};

class SqliteStpRows final : public StpRows {
 public:
  explicit SqliteStpRows(SqliteBackend& store) : store_(store) {}

  Status open(const std::string& name, std::unique_ptr<StpConsumerRows>* out) override {
    auto rows = std::make_unique<SqliteStpConsumerRows>(store_, name);
    try {
      rows->open();
    } catch (const SQLite::Exception& e) {
      return to_status(e, "opening the maintenance connection to " + store_.path);
    } catch (const std::exception& e) {
      return Status::Internal(std::string("opening the maintenance connection: ") + e.what());
    }
    *out = std::move(rows);
    return Status::Ok();
  }

  bool single_process() const override { return store_.options.exclusive; }

 private:
  SqliteBackend& store_;
};

}  // namespace

std::unique_ptr<StpRows> make_sqlite_stp_rows(SqliteBackend& store) {
  return std::make_unique<SqliteStpRows>(store);
}

}  // namespace mqtt_inbox::detail

namespace mqtt_inbox {

// The public, SQLite-typed adapter (mqtt_inbox/sqlite.h).
StoredHandler stored_handler(Handler handler) {
  return [h = std::move(handler)](SQLite::Database& db, const StoredDelivery& d) {
    const Delivery delivery{d.message, d.message_id, d.attempt};
    h(db, delivery);
  };
}

}  // namespace mqtt_inbox

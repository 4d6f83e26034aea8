// The SQLite store's store-then-process rows (store/stp_rows.h): inbox_messages. Receipt
// runs one autocommit INSERT on the Inbox's connection (under its mutex); each consumer's
// maintenance has a connection of its own to the same file, and every write is a short
// BEGIN IMMEDIATE transaction. docs/store-then-process.md has the steps.
#include "store/stp_rows.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/sqlite/errors.h"
#include "store/sqlite/store.h"
#include "store/sqlite/util.h"

namespace mqtt_inbox::detail {

namespace {

constexpr const char* kInsertSql =
    "INSERT INTO inbox_messages (consumer_name, message_id, aggregate_key, topic, payload,"
    "                            properties, qos, received_at)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
    " ON CONFLICT (consumer_name, message_id) DO NOTHING";

constexpr const char* kExistsSql =
    "SELECT EXISTS(SELECT 1 FROM inbox_messages WHERE consumer_name = ?1 AND message_id = ?2)";

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
std::unique_ptr<SQLite::Database> open_connection(const SqliteStore& store,
                                                  std::optional<Synchronous> sync) {
  const InboxOptions& io = store.options;
  auto db = std::make_unique<SQLite::Database>(
      store.path, SQLite::OPEN_READWRITE | SQLite::OPEN_URI, io.busy_timeout_ms, io.vfs);
  const Synchronous s = sync ? *sync : io.synchronous;
  db->exec(s == Synchronous::kFull ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
  db->exec("PRAGMA foreign_keys = ON");
  db->exec("PRAGMA cache_size = -" + std::to_string(io.cache_size_kib));
  return db;
}

// Once the file is unusable (the store latched a fatal error), closing `db` must not
// checkpoint the WAL into it.
void close_quietly_if_unusable(const SqliteStore& store, SQLite::Database* db) {
  if (db && store.fatal.load())
    sqlite3_db_config(db->getHandle(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
}

class SqliteStpConsumerRows final : public StpConsumerRows {
 public:
  SqliteStpConsumerRows(SqliteStore& store, std::string name)
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
                        bool* stored) override {
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
                          " claimed_at = NULL, done_at = NULL" +
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
    if (store_.fatal.load())
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

  SqliteStore& store_;
  const std::string name_;
  // The maintenance connection: reaper, replay, prune, counts.
  std::unique_ptr<SQLite::Database> maint_;
  // Receipt's statements, on the Inbox's connection, used under its mutex.
  std::unique_ptr<SQLite::Statement> insert_, exists_;
};

class SqliteStpRows final : public StpRows {
 public:
  explicit SqliteStpRows(SqliteStore& store) : store_(store) {}

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
  SqliteStore& store_;
};

}  // namespace

std::unique_ptr<StpRows> make_sqlite_stp_rows(SqliteStore& store) {
  return std::make_unique<SqliteStpRows>(store);
}

}  // namespace mqtt_inbox::detail

// The SQLite store's retention (store/retention_rows.h): the delete batches, run on the
// store's connection in short transactions without fsync; a second connection to the same
// file that finds expired ids and checkpoints between batches without holding up message
// commits; incremental vacuum; and the retention clock and horizon in inbox_meta.
// docs/design.md#retention-passes says why each step is the way it is.
#include "store/retention_rows.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/sqlite/backend.h"
#include "store/sqlite/util.h"

namespace mqtt_inbox::detail {

namespace {

// Expired ids, in primary-key order from a cursor. inbox_processed has no index on
// received_at (it would cost a WAL page per message, schema.sql version 4), so the pass
// walks the primary key; the filter runs inside SQLite and only expired keys come back.
constexpr const char* kExpiredIdsFirstSql =
    "SELECT consumer_name, message_id FROM inbox_processed WHERE received_at < ?1"
    " ORDER BY consumer_name, message_id LIMIT ?2";
constexpr const char* kExpiredIdsAfterSql =
    "SELECT consumer_name, message_id FROM inbox_processed"
    " WHERE (consumer_name, message_id) > (?3, ?4) AND received_at < ?1"
    " ORDER BY consumer_name, message_id LIMIT ?2";
constexpr const char* kDeleteIdSql =
    "DELETE FROM inbox_processed"
    " WHERE consumer_name = ?1 AND message_id = ?2 AND received_at < ?3";

// A 'requeued' row is work still to do (a message parked by a full outbox, or one the
// admin tool handed back to the running consumer), so it is never pruned, however old:
// deleting it would lose a message whose PUBACK has gone.
constexpr const char* kPruneDeadLettersSql =
    "DELETE FROM inbox_dead_letters WHERE id IN ("
    "  SELECT id FROM inbox_dead_letters WHERE retention_at < ?1 AND status <> 'requeued'"
    "  ORDER BY retention_at LIMIT ?2)";

// The outbox's finished rows (outbox.h): sent ones past the window (their UNIQUE id guards
// a re-enqueue of the same derived id as long as the inbox remembers the incoming one),
// dead ones past dead_letter_window. Each walks its partial index (schema.sql version 8).
constexpr const char* kPruneOutboxSentSql =
    "DELETE FROM outbox_messages WHERE seq IN ("
    "  SELECT seq FROM outbox_messages WHERE state = 'sent' AND retention_at < ?1"
    "  ORDER BY retention_at LIMIT ?2)";
constexpr const char* kPruneOutboxDeadSql =
    "DELETE FROM outbox_messages WHERE seq IN ("
    "  SELECT seq FROM outbox_messages WHERE state = 'dead' AND retention_at < ?1"
    "  ORDER BY retention_at LIMIT ?2)";

const char* delete_sql(ExpiringRows rows) {
  switch (rows) {
    case ExpiringRows::kDeadLetters:
      return kPruneDeadLettersSql;
    case ExpiringRows::kOutboxSent:
      return kPruneOutboxSentSql;
    case ExpiringRows::kOutboxDead:
      return kPruneOutboxDeadSql;
  }
  return kPruneOutboxDeadSql;  // unreachable: every enumerator is handled above
}

int64_t us_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

using IdKey = std::pair<std::string, std::string>;  // (consumer_name, message_id)

class SqliteRetentionSweep final : public RetentionSweep {
 public:
  SqliteRetentionSweep(SqliteBackend& store, const RetentionSweepOptions& options)
      : store_(store), options_(options) {
    const InboxOptions& io = store_.options;
    try {
      reader_ = std::make_unique<SQLite::Database>(
          store_.path, SQLite::OPEN_READWRITE | SQLite::OPEN_URI, io.busy_timeout_ms, io.vfs);
      // A checkpoint syncs the WAL before copying it and the database after, unless
      // synchronous is OFF (https://sqlite.org/pragma.html#pragma_synchronous).
      reader_->exec(io.synchronous == Synchronous::kFull ? "PRAGMA synchronous = FULL"
                                                         : "PRAGMA synchronous = NORMAL");
    } catch (const SQLite::Exception& e) {
      reader_.reset();
      store_.log->warn(
          "retention: cannot open a second connection to {} ({}); "
          "checkpoints run once per pass and row counts hold the write lock",
          store_.path, e.what());
    }
  }

  ~SqliteRetentionSweep() override {
    // A corrupt file is never written again, not even by this connection's closing
    // checkpoint.
    if (reader_ && store_.unusable())
      sqlite3_db_config(reader_->getHandle(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  }

  Status delete_expired_claims(int64_t cutoff, int64_t limit, RetentionBatch* out) override {
    *out = RetentionBatch{};
    try {
      const std::vector<IdKey> keys = next_expired(cutoff, limit);
      out->found = static_cast<int64_t>(keys.size());
      if (keys.empty()) {
        cursor_.reset();  // walked to the end: the next batch starts over
        return Status::Ok();
      }
      const auto t0 = std::chrono::steady_clock::now();
      out->deleted = delete_keys(keys, cutoff);
      out->write_us = us_since(t0);
      out->wrote = true;
      cursor_ = keys.back();
      if (out->found < limit) cursor_.reset();
    } catch (const SQLite::Exception& e) {
      return failed(e, "retention pass");
    }
    return Status::Ok();
  }

  Status delete_expired(ExpiringRows rows, int64_t cutoff, int64_t limit,
                        RetentionBatch* out) override {
    *out = RetentionBatch{};
    const auto t0 = std::chrono::steady_clock::now();
    try {
      std::lock_guard<std::mutex> lock(store_.mu);
      // No fsync for a delete of expired rows: if power loss undoes it, the next pass
      // deletes them again. The write lock is then held for the delete alone, and the next
      // claim's fsync makes it durable anyway.
      SqliteBackend::RelaxedSync relaxed(store_);
      store_.write_transaction([&] {
        SQLite::Statement q(*store_.db, delete_sql(rows));
        q.bind(1, cutoff);
        q.bind(2, limit);
        out->deleted = q.exec();
      });
    } catch (const SQLite::Exception& e) {
      return failed(e, "retention pass");
    }
    out->found = out->deleted;
    out->wrote = true;
    out->write_us = us_since(t0);
    return Status::Ok();
  }

  // Copies the WAL back into the database on the second connection (PASSIVE: never waits
  // for a lock, does what it can). Each delete batch dirties pages all over the primary
  // key (message ids are random), so without this the WAL crosses wal_autocheckpoint every
  // few batches and the next message commit that crosses it pays for copying ~1000 pages
  // and fsyncing the database file: that was the p99 during pruning. Once the WAL is fully
  // copied, the next writer starts it again from the beginning, so message commits stay
  // below the autocheckpoint threshold.
  void after_batch() override {
    if (!reader_ || !options_.checkpoint || store_.unusable()) return;
    (void)sqlite3_wal_checkpoint_v2(reader_->getHandle(), nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                    nullptr, nullptr);
  }

  // A few pages at a time: one large incremental_vacuum would hold the write lock for
  // seconds.
  Status reclaim_step(ReclaimStep* out) override {
    constexpr int kPagesPerStep = 128;
    *out = ReclaimStep{};
    if (!options_.reclaim_space) return Status::Ok();
    try {
      std::lock_guard<std::mutex> lock(store_.mu);
      SqliteBackend::RelaxedSync relaxed(store_);  // as for the deletes
      SQLite::Database& db = *store_.db;
      const int64_t before = db.execAndGet("PRAGMA freelist_count").getInt64();
      if (before == 0) return Status::Ok();
      db.exec("PRAGMA incremental_vacuum(" + std::to_string(kPagesPerStep) + ")");
      out->freed = before - db.execAndGet("PRAGMA freelist_count").getInt64();
    } catch (const SQLite::Exception& e) {
      return failed(e, "vacuum/checkpoint");
    }
    out->ran = true;
    out->more = out->freed >= kPagesPerStep;
    return Status::Ok();
  }

  void finish_pass() override {
    std::lock_guard<std::mutex> lock(store_.mu);
    if (!options_.checkpoint || store_.unusable()) return;
    // TRUNCATE when idle: nothing committed during the last period. A busy reader makes it
    // return SQLITE_BUSY-like partial results, which is fine: try again next pass.
    const bool idle =
        store_.clock->steady_ms() - store_.front().last_commit_steady_ms() >= options_.idle_ms;
    (void)sqlite3_wal_checkpoint_v2(store_.db->getHandle(), nullptr,
                                    idle ? SQLITE_CHECKPOINT_TRUNCATE : SQLITE_CHECKPOINT_PASSIVE,
                                    nullptr, nullptr);
  }

  // The row count scans the whole table: on the second connection it blocks no commit.
  Status measure_rows() override { return store_.measure_rows(reader_.get()); }

 private:
  // Classifies and counts a failed step. Under the store's lock: store_error may
  // checkpoint (disk full).
  Status failed(const SQLite::Exception& e, const char* what) {
    std::lock_guard<std::mutex> lock(store_.mu);
    return store_.store_error(to_status(e, what));
  }

  // Reads the next up-to-`limit` expired keys after the cursor (on the second connection:
  // a read of a WAL snapshot that blocks no commit; else under the store's lock).
  std::vector<IdKey> next_expired(int64_t cutoff, int64_t limit) {
    std::vector<IdKey> keys;
    auto read = [&](SQLite::Database& db) {
      SQLite::Statement q(db, cursor_ ? kExpiredIdsAfterSql : kExpiredIdsFirstSql);
      q.bind(1, cutoff);
      q.bind(2, limit);
      if (cursor_) {
        q.bind(3, cursor_->first);
        q.bind(4, cursor_->second);
      }
      while (q.executeStep())
        keys.emplace_back(q.getColumn(0).getString(), q.getColumn(1).getString());
    };
    if (reader_) {
      read(*reader_);
    } else {
      std::lock_guard<std::mutex> lock(store_.mu);
      read(*store_.db);
    }
    return keys;
  }

  // Deletes `keys` (still expired) in one short transaction; returns the count. Keys in key
  // order share a few leaf pages: far fewer pages per batch than deleting in time order.
  int64_t delete_keys(const std::vector<IdKey>& keys, int64_t cutoff) {
    std::lock_guard<std::mutex> lock(store_.mu);
    // The running-attempt marker can still name the last processed id (claim.cpp leaves it
    // after a commit); once that id is pruned, the next open would count it as a lost
    // attempt. No handler runs while we hold the lock, so clear it first.
    if (store_.marker) store_.marker->clear();
    SqliteBackend::RelaxedSync relaxed(store_);  // as in delete_expired
    int64_t n = 0;
    store_.write_transaction([&] {
      SQLite::Statement q(*store_.db, kDeleteIdSql);
      for (const auto& k : keys) {
        q.bind(1, k.first);
        q.bind(2, k.second);
        q.bind(3, cutoff);
        n += q.exec();
        q.reset();
      }
    });
    return n;
  }

  SqliteBackend& store_;
  const RetentionSweepOptions options_;
  // A second connection to the same file, to find expired ids, checkpoint between batches
  // and count rows. It never takes the store's lock, so a message commit does not wait for
  // it: in WAL mode readers and checkpoints run alongside the writer
  // (https://sqlite.org/wal.html#concurrency). Null if it could not be opened.
  std::unique_ptr<SQLite::Database> reader_;
  // Where the walk over inbox_processed resumes (the last key deleted); empty: the start.
  std::optional<IdKey> cursor_;
};

class SqliteRetentionRows final : public RetentionRows {
 public:
  explicit SqliteRetentionRows(SqliteBackend& store) : store_(store) {}

  Status record_required_window(int64_t required_ms, int lock_wait_ms) override {
    std::lock_guard<std::mutex> lock(store_.mu);
    if (store_.unusable()) return store_.fatal_status();
    SqliteBackend::BusyTimeout busy(store_.db->getHandle(), lock_wait_ms,
                                    store_.options.busy_timeout_ms);
    try {
      SQLite::Statement q(*store_.db,
                          "INSERT INTO inbox_meta (key, value) VALUES ('required_window_ms', ?1)"
                          " ON CONFLICT (key) DO UPDATE SET value = excluded.value");
      q.bind(1, std::to_string(required_ms));
      q.exec();
    } catch (const SQLite::Exception& e) {
      return store_.store_error(to_status(e, "recording the retention horizon"));
    }
    return Status::Ok();
  }

  Status persist_clock() override {
    if (store_.unusable()) return store_.fatal_status();
    std::lock_guard<std::mutex> lock(store_.mu);
    try {
      SQLite::Statement q(
          *store_.db,
          "INSERT INTO inbox_meta (key, value) VALUES ('retention_clock_ms', ?1)"
          " ON CONFLICT (key) DO UPDATE SET value = CAST(max(CAST(value AS INTEGER),"
          " CAST(excluded.value AS INTEGER)) AS TEXT)");
      q.bind(1, std::to_string(store_.retention_clock()));
      q.exec();
    } catch (const SQLite::Exception& e) {
      return store_.store_error(to_status(e, "persisting the retention clock"));
    }
    return Status::Ok();
  }

  Status open_sweep(const RetentionSweepOptions& options,
                    std::unique_ptr<RetentionSweep>* out) override {
    *out = std::make_unique<SqliteRetentionSweep>(store_, options);
    return Status::Ok();
  }

 private:
  SqliteBackend& store_;
};

}  // namespace

std::unique_ptr<RetentionRows> make_sqlite_retention_rows(SqliteBackend& store) {
  return std::make_unique<SqliteRetentionRows>(store);
}

}  // namespace mqtt_inbox::detail

// The SQLite store's outbox (store/outbox_rows.h): outbox_messages and outbox_usage. The
// enqueue's statements run on the connection of the caller's transaction (a handler's:
// the Inbox's, or a store-then-process worker's); the relay's fetch and marks, inspection
// and repair on the Inbox's connection under its mutex. The wake-up of the relays after a
// commit that enqueued is the file's CommitWake (store/sqlite/commit_wake.h).
// docs/design.md#outbox-rows says why each step is the way it is.
#include "store/outbox_rows.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/sqlite/backend.h"
#include "store/sqlite/errors.h"
#include "store/sqlite/util.h"

namespace mqtt_inbox::detail {

namespace {

// The columns read_row() reads, in its order.
constexpr const char* kRowColumns =
    "seq, message_id, ordering_key, topic, payload, properties, size_bytes, enqueued_at, state, "
    "attempts, sent_at, dead_reason, reason_code, reason_text, enqueued_clock";

constexpr const char* kInsertSql =
    "INSERT INTO outbox_messages (message_id, ordering_key, class, topic, payload, properties, "
    "qos, size_bytes, enqueued_at, enqueued_clock) VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?) "
    "ON CONFLICT (message_id) DO NOTHING";

// A class's oldest pending row: the first of the partial index (class, seq).
constexpr const char* kOldestPendingSql =
    "SELECT seq, size_bytes, message_id, enqueued_clock FROM outbox_messages "
    "WHERE class = ? AND state = 'pending' AND seq <> ? ORDER BY seq LIMIT 1";

constexpr const char* kUsageSql =
    "SELECT class, rows, bytes, dropped FROM outbox_usage ORDER BY class";

// One row of kRowColumns; `clock_now` is the retention clock now (for waited_ms).
StoredOutboxRow read_row(SQLite::Statement& q, int64_t clock_now) {
  StoredOutboxRow s;
  OutboxRow& r = s.row;
  r.seq = q.getColumn(0).getInt64();
  r.message_id = q.getColumn(1).getString();
  r.ordering_key = q.getColumn(2).getString();
  r.topic = q.getColumn(3).getString();
  r.payload = q.getColumn(4).getString();
  s.properties_json = q.getColumn(5).getString();
  r.size_bytes = q.getColumn(6).getInt64();
  r.enqueued_at_ms = q.getColumn(7).getInt64();
  const std::string state = q.getColumn(8).getString();
  r.state = state == "sent"   ? OutboxState::kSent
            : state == "dead" ? OutboxState::kDead
                              : OutboxState::kPending;
  r.attempts = q.getColumn(9).getInt();
  r.sent_at_ms = q.getColumn(10).isNull() ? 0 : q.getColumn(10).getInt64();
  if (!q.getColumn(11).isNull()) {
    const std::string reason = q.getColumn(11).getString();
    for (auto c : {OutboxDeadReason::kRejectedByBroker, OutboxDeadReason::kExpired,
                   OutboxDeadReason::kPayloadTooLarge, OutboxDeadReason::kConnectionDropped})
      if (reason == to_string(c)) r.dead_reason = c;
  }
  r.reason_code = q.getColumn(12).isNull() ? 0 : q.getColumn(12).getInt();
  r.reason_text = q.getColumn(13).isNull() ? "" : q.getColumn(13).getString();
  r.waited_ms = std::max<int64_t>(0, clock_now - q.getColumn(14).getInt64());
  return s;
}

SQLite::Database& db_of(const TxnRef& txn) {
  if (!txn.type || *txn.type != typeid(SQLite::Database*))
    throw std::invalid_argument(
        "outbox enqueue: the transaction is not an SQLite::Database of this inbox's store");
  return *static_cast<SQLite::Database*>(txn.handle);
}

class SqliteOutbox final : public OutboxStore {
 public:
  explicit SqliteOutbox(SqliteBackend& store) : s_(store) {}

  bool in_transaction(const TxnRef& txn) override {
    return !sqlite3_get_autocommit(db_of(txn).getHandle());
  }

  bool insert(const TxnRef& txn, const NewOutboxRow& row, int64_t* seq) override {
    SQLite::Database& db = db_of(txn);
    SQLite::Statement ins(db, kInsertSql);
    ins.bind(1, *row.message_id);
    ins.bind(2, *row.ordering_key);
    ins.bind(3, *row.class_prefix);
    ins.bind(4, *row.topic);
    ins.bind(5, row.payload->data(), static_cast<int>(row.payload->size()));
    ins.bind(6, *row.properties_json);
    ins.bind(7, row.size_bytes);
    ins.bind(8, row.enqueued_at_ms);
    ins.bind(9, row.enqueued_clock);
    if (ins.exec() == 0) return false;
    *seq = sqlite3_last_insert_rowid(db.getHandle());
    return true;
  }

  void remove(const TxnRef& txn, int64_t seq) override {
    SQLite::Statement del(db_of(txn), "DELETE FROM outbox_messages WHERE seq = ?");
    del.bind(1, seq);
    del.exec();
  }

  void class_usage(const TxnRef& txn, const std::string& class_prefix, int64_t* rows,
                   int64_t* bytes) override {
    SQLite::Statement q(db_of(txn), "SELECT rows, bytes FROM outbox_usage WHERE class = ?");
    q.bind(1, class_prefix);
    *rows = 0;
    *bytes = 0;
    if (q.executeStep()) {
      *rows = q.getColumn(0).getInt64();
      *bytes = q.getColumn(1).getInt64();
    }
  }

  bool oldest_pending(const TxnRef& txn, const std::string& class_prefix, int64_t except_seq,
                      OldestPending* out) override {
    SQLite::Statement q(db_of(txn), kOldestPendingSql);
    q.bind(1, class_prefix);
    q.bind(2, except_seq);
    if (!q.executeStep()) return false;
    out->seq = q.getColumn(0).getInt64();
    out->size_bytes = q.getColumn(1).getInt64();
    out->message_id = q.getColumn(2).getString();
    out->enqueued_clock = q.getColumn(3).getInt64();
    return true;
  }

  int64_t remove_pending_before(const TxnRef& txn, const std::string& class_prefix,
                                int64_t except_seq, int64_t cutoff) override {
    SQLite::Statement drop(db_of(txn),
                           "DELETE FROM outbox_messages WHERE class = ? AND state = 'pending' "
                           "AND seq <> ? AND enqueued_clock < ?");
    drop.bind(1, class_prefix);
    drop.bind(2, except_seq);
    drop.bind(3, cutoff);
    return drop.exec();
  }

  void count_drops(const TxnRef& txn, const std::string& class_prefix, int64_t n) override {
    SQLite::Statement count(db_of(txn),
                            "UPDATE outbox_usage SET dropped = dropped + ? WHERE class = ?");
    count.bind(1, n);
    count.bind(2, class_prefix);
    count.exec();
  }

  void wake_after_commit(const TxnRef& txn) override {
    // A no-op on a connection the library did not open (commit_wake.h).
    s_.commit_wake->arm(db_of(txn).getHandle());
  }

  bool store_error(const std::exception& e, const char* what, Status* out) override {
    const auto* q = dynamic_cast<const SQLite::Exception*>(&e);
    if (!q) return false;
    *out = to_status(*q, what);
    return true;
  }

  Status fetch_pending(int64_t after_seq, int limit, std::vector<StoredOutboxRow>* out) override {
    // A read: one statement, so one snapshot, and no write lock (docs/design.md#outbox-rows).
    return on_store("Outbox::fetch_pending", /*write=*/false, /*relaxed_sync=*/false, [&] {
      out->clear();
      const int64_t clock_now = s_.retention_clock();
      SQLite::Statement q(*s_.db, std::string("SELECT ") + kRowColumns +
                                      " FROM outbox_messages WHERE state = 'pending' AND seq > ? "
                                      "ORDER BY seq LIMIT ?");
      q.bind(1, after_seq);
      q.bind(2, limit);
      while (q.executeStep()) out->push_back(read_row(q, clock_now));
    });
  }

  Status mark_sent(const std::vector<OutboxMark>& rows, int64_t* changed) override {
    return on_store("Outbox::mark_sent", /*write=*/true, /*relaxed_sync=*/true, [&] {
      *changed = 0;
      SQLite::Statement up(*s_.db,
                           "UPDATE outbox_messages SET state = 'sent', sent_at = ?, "
                           "retention_at = ?, attempts = attempts + ? "
                           "WHERE seq = ? AND state = 'pending'");
      const int64_t now = s_.clock->wall_ms();
      const int64_t retention_now = s_.retention_clock();
      for (const OutboxMark& r : rows) {
        up.bind(1, now);
        up.bind(2, retention_now);
        up.bind(3, std::max(0, r.publishes));
        up.bind(4, r.seq);
        *changed += up.exec();
        up.tryReset();
      }
    });
  }

  Status mark_dead(const OutboxMark& row, OutboxDeadReason reason, int reason_code,
                   const std::string& text, bool* changed) override {
    return on_store("Outbox::mark_dead", /*write=*/true, /*relaxed_sync=*/false, [&] {
      SQLite::Statement up(*s_.db,
                           "UPDATE outbox_messages SET state = 'dead', dead_reason = ?, "
                           "reason_code = ?, reason_text = ?, dead_at = ?, retention_at = ?, "
                           "attempts = attempts + ? WHERE seq = ? AND state = 'pending'");
      up.bind(1, to_string(reason));
      up.bind(2, reason_code);
      up.bind(3, text);
      up.bind(4, s_.clock->wall_ms());
      up.bind(5, s_.retention_clock());
      up.bind(6, std::max(0, row.publishes));
      up.bind(7, row.seq);
      *changed = up.exec() > 0;
    });
  }

  Status list(OutboxState state, int limit, std::vector<StoredOutboxRow>* out) override {
    return on_store("Outbox::list", /*write=*/true, /*relaxed_sync=*/false, [&] {
      out->clear();
      const int64_t clock_now = s_.retention_clock();
      // The state as a literal, so the query can use that state's partial index.
      SQLite::Statement q(*s_.db, std::string("SELECT ") + kRowColumns +
                                      " FROM outbox_messages WHERE state = '" + to_string(state) +
                                      "' ORDER BY seq LIMIT ?");
      q.bind(1, limit);
      while (q.executeStep()) out->push_back(read_row(q, clock_now));
    });
  }

  Status usage(std::vector<OutboxClassUsage>* out) override {
    return on_store("Outbox::usage", /*write=*/true, /*relaxed_sync=*/false, [&] {
      out->clear();
      SQLite::Statement q(*s_.db, kUsageSql);
      while (q.executeStep())
        out->push_back({q.getColumn(0).getString(), q.getColumn(1).getInt64(),
                        q.getColumn(2).getInt64(), q.getColumn(3).getInt64()});
    });
  }

  Status summary(OutboxSummary* out) override {
    return on_store("Outbox::summary", /*write=*/true, /*relaxed_sync=*/false, [&] {
      out->classes.clear();
      SQLite::Statement u(*s_.db, kUsageSql);
      while (u.executeStep())
        out->classes.push_back({u.getColumn(0).getString(), u.getColumn(1).getInt64(),
                                u.getColumn(2).getInt64(), u.getColumn(3).getInt64()});
      // Each count is answered from that state's partial index, never from a scan of the
      // payloads.
      SQLite::Statement q(*s_.db,
                          "SELECT (SELECT count(*) FROM outbox_messages WHERE state = 'pending'),"
                          " (SELECT count(*) FROM outbox_messages WHERE state = 'sent'),"
                          " (SELECT count(*) FROM outbox_messages WHERE state = 'dead'),"
                          " (SELECT enqueued_at FROM outbox_messages WHERE state = 'pending'"
                          "  ORDER BY seq LIMIT 1),"
                          " (SELECT enqueued_clock FROM outbox_messages WHERE state = 'pending'"
                          "  ORDER BY seq LIMIT 1)");
      if (q.executeStep()) {
        out->pending_rows = q.getColumn(0).getInt64();
        out->sent_rows = q.getColumn(1).getInt64();
        out->dead_rows = q.getColumn(2).getInt64();
        out->oldest_pending_enqueued_at_ms =
            q.getColumn(3).isNull() ? 0 : q.getColumn(3).getInt64();
        if (!q.getColumn(4).isNull())
          out->oldest_pending_waited_ms =
              std::max<int64_t>(0, s_.retention_clock() - q.getColumn(4).getInt64());
      }
      out->pending_bytes = 0;
      for (const auto& c : out->classes) out->pending_bytes += c.bytes;
    });
  }

  Status get(const std::string& message_id, StoredOutboxRow* out, bool* found) override {
    return on_store("Outbox::get", /*write=*/true, /*relaxed_sync=*/false, [&] {
      const int64_t clock_now = s_.retention_clock();
      SQLite::Statement q(*s_.db, std::string("SELECT ") + kRowColumns +
                                      " FROM outbox_messages WHERE message_id = ?");
      q.bind(1, message_id);
      *found = q.executeStep();
      if (*found) *out = read_row(q, clock_now);
    });
  }

  Status replay_dead(const std::string& message_id, std::optional<OutboxState>* state,
                     int64_t* new_seq) override {
    SQLite::Database& db = *s_.db;
    return on_store("Outbox::replay_dead", /*write=*/true, /*relaxed_sync=*/false, [&] {
      state->reset();
      SQLite::Statement q(db, "SELECT state FROM outbox_messages WHERE message_id = ?");
      q.bind(1, message_id);
      if (!q.executeStep()) return;
      const std::string st = q.getColumn(0).getString();
      *state = st == "sent"   ? OutboxState::kSent
               : st == "dead" ? OutboxState::kDead
                              : OutboxState::kPending;
      q.tryReset();
      if (*state != OutboxState::kDead) return;
      // A new seq: the row is read, deleted and inserted again (message_id is UNIQUE).
      // AUTOINCREMENT never hands out a seq used before, so the relay cannot skip it. The
      // triggers count the pending row in its class again; the dead one counted nowhere.
      SQLite::Statement read(db,
                             "SELECT ordering_key, class, topic, payload, properties, "
                             "size_bytes, enqueued_at FROM outbox_messages WHERE message_id = ?");
      read.bind(1, message_id);
      read.executeStep();
      const std::string key = read.getColumn(0).getString(), cls = read.getColumn(1).getString(),
                        topic = read.getColumn(2).getString(),
                        payload = read.getColumn(3).getString(),
                        props = read.getColumn(4).getString();
      const int64_t size = read.getColumn(5).getInt64(), enqueued_at = read.getColumn(6).getInt64();
      read.tryReset();
      SQLite::Statement del(db, "DELETE FROM outbox_messages WHERE message_id = ?");
      del.bind(1, message_id);
      del.exec();
      SQLite::Statement ins(db,
                            "INSERT INTO outbox_messages (message_id, ordering_key, class, "
                            "topic, payload, properties, qos, size_bytes, enqueued_at, "
                            "enqueued_clock) VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?)");
      ins.bind(1, message_id);
      ins.bind(2, key);
      ins.bind(3, cls);
      ins.bind(4, topic);
      ins.bind(5, payload.data(), static_cast<int>(payload.size()));
      ins.bind(6, props);
      ins.bind(7, size);
      ins.bind(8, enqueued_at);
      ins.bind(9, s_.retention_clock());  // a replay starts its age bound afresh
      ins.exec();
      s_.commit_wake->arm(db.getHandle());  // a running relay sends it after the commit
      *new_seq = sqlite3_last_insert_rowid(db.getHandle());
    });
  }

  Status purge(const OutboxPurgeFilter& f, int64_t* removed) override {
    return on_store("Outbox::purge", /*write=*/true, /*relaxed_sync=*/false, [&] {
      const bool dead = f.state == OutboxState::kDead;
      std::string sql = std::string("DELETE FROM outbox_messages WHERE state = '") +
                        (dead ? "dead" : "sent") + "'";
      if (f.message_id) sql += " AND message_id = :id";
      if (f.before_ms) sql += dead ? " AND dead_at < :before" : " AND sent_at < :before";
      SQLite::Statement q(*s_.db, sql);
      if (f.message_id) q.bind(":id", *f.message_id);
      if (f.before_ms) q.bind(":before", *f.before_ms);
      *removed = q.exec();
    });
  }

  uint64_t add_commit_waker(std::function<void()> wake) override {
    return s_.commit_wake->add(std::move(wake));
  }
  void remove_commit_waker(uint64_t id) override { s_.commit_wake->remove(id); }

 private:
  // Runs `fn` on the store's connection under its mutex: in a write transaction
  // (`write`), committed without fsync with `relaxed_sync`, or outside any transaction,
  // each statement then its own read transaction, which takes no write lock (for reads
  // only). SQLite errors come back classified and counted (a corrupt file latches the
  // store); `call` names the public method.
  template <typename Fn>
  Status on_store(const char* call, bool write, bool relaxed_sync, Fn&& fn) {
    std::lock_guard<std::mutex> lock(s_.mu);
    if (s_.unusable()) return s_.fatal_status();
    try {
      std::optional<SqliteBackend::RelaxedSync> relaxed;
      if (relaxed_sync) relaxed.emplace(s_);
      if (write)
        s_.write_transaction(fn);
      else
        fn();
      return Status::Ok();
    } catch (const SQLite::Exception& e) {
      return s_.store_error(to_status(e, call));
    } catch (const std::exception& e) {
      return Status::Internal(std::string(call) + ": " + e.what());
    }
  }

  SqliteBackend& s_;
};

}  // namespace

std::unique_ptr<OutboxStore> make_sqlite_outbox(SqliteBackend& store) {
  return std::make_unique<SqliteOutbox>(store);
}

}  // namespace mqtt_inbox::detail

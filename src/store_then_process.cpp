// Store-then-process: receipt stores the raw message (the PUBACK follows that commit);
// workers process stored rows in arrival order per aggregate key. All SQL of this mode
// lives in this file. See include/mqtt_inbox/store_then_process.h and
// docs/store-then-process.md.
#include "mqtt_inbox/store_then_process.h"

#include <sqlite3.h>
#include <unistd.h>

#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "log.h"
#include "message_id.h"
#include "mqtt_inbox/clock.h"
#include "properties_json.h"
#include "sqlite_util.h"
#include "store_retry.h"
#include "text.h"

namespace mqtt_inbox {

namespace {

// last_error of a row whose claim expired: the reaper counted an attempt for it. A row
// dead-lettered after such an attempt is reported as handler_crashed.
constexpr const char* kExpiredClaimError = "claim expired: the worker died or hung";

constexpr const char* kInsertSql =
    "INSERT INTO inbox_messages (consumer_name, message_id, aggregate_key, topic, payload,"
    "                            properties, qos, received_at)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
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

constexpr const char* kClaimRowSql =
    "UPDATE inbox_messages SET status = 'processing', claimed_at = ?2, claimant = ?3"
    " WHERE seq = ?1 AND status = 'pending'"
    " RETURNING message_id, aggregate_key, topic, payload, properties, qos, received_at,"
    "           attempts, last_error";

constexpr const char* kOwnedSql =
    "SELECT EXISTS(SELECT 1 FROM inbox_messages"
    "              WHERE seq = ?1 AND status = 'processing' AND claimant = ?2)";

constexpr const char* kDoneSql =
    "UPDATE inbox_messages SET status = 'done', attempts = ?2, done_at = ?3,"
    "       last_error = NULL, next_attempt_at = 0"
    " WHERE seq = ?1";

// A successful run of a message that had been dead-lettered (and replayed) closes its
// dead letter in the same transaction. Usually matches nothing (an index probe).
constexpr const char* kCloseDeadLetterSql =
    "UPDATE inbox_dead_letters SET status = 'replayed', replayed_at = ?3"
    " WHERE consumer_name = ?1 AND message_id = ?2 AND status = 'dead'";

constexpr const char* kRenewLeaseSql =
    "UPDATE inbox_messages SET claimed_at = ?3"
    " WHERE consumer_name = ?1 AND status = 'processing' AND claimant = ?2";

constexpr const char* kFailedSql =
    "UPDATE inbox_messages SET status = 'pending', attempts = ?2, last_error = ?3,"
    "       next_attempt_at = ?4, claimant = NULL, claimed_at = NULL"
    " WHERE seq = ?1 AND status = 'processing' AND claimant = ?5";

// Releases claimed rows without counting an attempt (stop, or rows of an aggregate whose
// earlier row just failed). ?3 NULL = every aggregate.
constexpr const char* kReleaseSql =
    "UPDATE inbox_messages SET status = 'pending', claimant = NULL, claimed_at = NULL"
    " WHERE consumer_name = ?1 AND status = 'processing' AND claimant = ?2"
    "   AND (?3 IS NULL OR aggregate_key = ?3)";

constexpr const char* kDeadSql =
    "UPDATE inbox_messages SET status = 'dead', attempts = ?2, last_error = ?3, done_at = ?4"
    " WHERE seq = ?1 AND status = 'processing' AND claimant = ?5";

int64_t backoff_ms(const ConsumerOptions& o, int attempt) {
  int64_t b = o.retry_backoff_initial.count();
  for (int i = 1; i < attempt && b < o.retry_backoff_max.count(); ++i) b *= 2;
  return std::min<int64_t>(b, o.retry_backoff_max.count());
}

// A random token naming this process instance in claimant columns.
std::string instance_token() {
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d-%08x", static_cast<int>(getpid()), rd());
  return buf;
}

}  // namespace

StoredHandler stored_handler(Handler handler) {
  return [h = std::move(handler)](SQLite::Database& db, const StoredDelivery& d) {
    const Delivery delivery{d.message, d.message_id, d.attempt};
    h(db, delivery);
  };
}

std::function<std::string(const Message&)> aggregate_key_from_topic_level(size_t index) {
  return [index](const Message& m) {
    size_t start = 0;
    for (size_t level = 0; level < index; ++level) {
      const size_t slash = m.topic.find('/', start);
      if (slash == std::string::npos) return std::string();
      start = slash + 1;
    }
    const size_t end = m.topic.find('/', start);
    return m.topic.substr(start, end == std::string::npos ? std::string::npos : end - start);
  };
}

std::function<std::string(const Message&)> aggregate_key_from_json_field(std::string field) {
  return [field = std::move(field)](const Message& m) {
    const auto j = nlohmann::json::parse(m.payload, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::string();
    const auto it = j.find(field);
    if (it == j.end()) return std::string();
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_integer()) return it->dump();
    return std::string();
  };
}

struct StoreThenProcess::Impl {
  Inbox* inbox = nullptr;
  std::string name;
  StoredHandler handler;
  StoreThenProcessOptions options;
  Clock* clock = nullptr;
  std::shared_ptr<spdlog::logger> log;
  std::string instance;
  std::atomic<uint64_t> next_claim{0};

  // Receipt statements live on the Inbox's connection and are used under its mutex
  // (Inbox::with_connection).
  std::unique_ptr<SQLite::Statement> insert, exists;

  // The maintenance connection: reaper, replay, prune, stats.
  std::mutex maint_mu;
  std::unique_ptr<SQLite::Database> maint;

  mutable std::mutex state_mu;  // guards counters; never held across I/O
  StoreThenProcessCounters counters;
  std::unique_ptr<detail::StoreRetry> retry;  // the receipt's health (health())

  std::mutex run_mu;  // guards started/threads and the wake-up generation
  std::condition_variable wake;
  uint64_t wake_gen = 0;
  std::atomic<bool> stopping{false};
  bool started = false;
  std::vector<std::thread> threads;

  // The retention clock (received_at, done_at): the Inbox's, which wall-clock jumps
  // cannot move, so retention and replay ranges are measured like inbox_processed's.
  int64_t retention_now() { return inbox->retention_clock_ms(); }

  void count(int64_t StoreThenProcessCounters::*field, int64_t n = 1) {
    std::lock_guard<std::mutex> lock(state_mu);
    counters.*field += n;
  }

  void worker_error(const Status& s) {
    std::lock_guard<std::mutex> lock(state_mu);
    ++counters.worker_store_errors;
    counters.last_worker_error = s.to_string();
  }

  void notify_workers() {
    {
      std::lock_guard<std::mutex> lock(run_mu);
      ++wake_gen;
    }
    wake.notify_all();
  }

  // Sleeps up to `ms`, or until stop() or a wake-up. Returns false when stopping.
  bool idle(int64_t ms, uint64_t* seen_gen) {
    std::unique_lock<std::mutex> lock(run_mu);
    wake.wait_for(lock, std::chrono::milliseconds(ms),
                  [&] { return stopping.load() || wake_gen != *seen_gen; });
    *seen_gen = wake_gen;
    return !stopping.load();
  }

  std::unique_ptr<SQLite::Database> open_connection(std::optional<Synchronous> sync) {
    const InboxOptions& io = inbox->options();
    auto db = std::make_unique<SQLite::Database>(
        inbox->path(), SQLite::OPEN_READWRITE | SQLite::OPEN_URI, io.busy_timeout_ms, io.vfs);
    const Synchronous s = sync ? *sync : io.synchronous;
    db->exec(s == Synchronous::kFull ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
    db->exec("PRAGMA foreign_keys = ON");
    db->exec("PRAGMA cache_size = -" + std::to_string(io.cache_size_kib));
    return db;
  }

  // ---------------------------------------------------------------- receipt

  // While the store fails, the message has no durable outcome, so the caller must not
  // return (that would release the PUBACK): see detail::StoreRetry.
  template <typename Op>
  void until_stored(const char* what, Op&& op) {
    retry->until_stored(what, std::forward<Op>(op));
  }

  Status stored_already(const std::string& id, bool* found) {
    Status st;
    inbox->with_connection([&](SQLite::Database& db) {
      try {
        if (!exists) exists = std::make_unique<SQLite::Statement>(db, kExistsSql);
        SQLite::Statement& q = *exists;
        detail::StatementReset reset(q);
        q.bind(1, name);
        q.bind(2, id);
        *found = q.executeStep() && q.getColumn(0).getInt() != 0;
      } catch (const SQLite::Exception& e) {
        st = detail::to_status(e, "looking up a stored message");
      } catch (const std::exception& e) {
        st = Status::Internal(std::string("looking up a stored message: ") + e.what());
      }
    });
    return st;
  }

  Status store(const Message& m, const std::string& id, const std::string& key,
               const std::string& props, bool* inserted) {
    Status st;
    inbox->with_connection([&](SQLite::Database& db) {
      try {
        if (!insert) insert = std::make_unique<SQLite::Statement>(db, kInsertSql);
        SQLite::Statement& q = *insert;
        detail::StatementReset reset(q);
        q.bind(1, name);
        q.bind(2, id);
        q.bind(3, key);
        q.bind(4, m.topic);
        q.bind(5, m.payload.data(), static_cast<int>(m.payload.size()));
        q.bind(6, props);
        q.bind(7, m.qos);
        q.bind(8, retention_now());
        // One autocommit INSERT: committed (fsynced with synchronous=FULL) on return.
        *inserted = q.exec() > 0;
      } catch (const SQLite::Exception& e) {
        st = detail::to_status(e, "storing message");
      } catch (const std::exception& e) {
        st = Status::Internal(std::string("storing message: ") + e.what());
      }
    });
    return st;
  }

  Outcome receipt_dead_letter(const Message& m, const std::optional<std::string>& id,
                              DeadLetterReason reason, const std::string& text) {
    DeadLetter dl;
    dl.consumer_name = name;
    dl.message_id = id;
    dl.topic = m.topic;
    dl.payload = m.payload.substr(0, options.consumer.dead_letter_payload_bytes);
    dl.payload_size = static_cast<int64_t>(m.payload.size());
    dl.properties_json = detail::properties_json(m);
    dl.qos = m.qos;
    dl.reason = reason;
    dl.reason_text = text;
    dl.last_attempt_at_ms = clock->wall_ms();
    int64_t row = 0;
    until_stored("writing a dead letter",
                 [&] { return inbox->add_dead_letter(dl, std::nullopt, &row); });
    count(&StoreThenProcessCounters::dead_lettered);
    log->warn("store-then-process '{}': dead-lettered message '{}' on topic '{}' as {} (row {}): {}",
              name, id ? detail::printable(*id) : std::string("<no id>"),
              detail::printable(m.topic), to_string(reason), row, detail::printable(text, 300));
    return Outcome::kDeadLettered;
  }

  Outcome receive(const Message& m) {
    const ConsumerOptions& o = options.consumer;
    if (m.payload.size() > o.max_payload_bytes) {
      // As Consumer: only the user property is consulted for an oversized payload.
      std::optional<std::string> id;
      if (const std::string* v = m.user_property(o.message_id.user_property))
        if (detail::validate_message_id(*v, o.message_id.max_id_bytes).empty()) id = *v;
      if (id) {
        bool found = false;
        until_stored("looking up a message", [&] { return stored_already(*id, &found); });
        if (found) {
          count(&StoreThenProcessCounters::duplicates);
          return Outcome::kDuplicate;
        }
      }
      return receipt_dead_letter(m, id, DeadLetterReason::kPayloadTooLarge,
                                 "payload is " + std::to_string(m.payload.size()) +
                                     " bytes, limit is " + std::to_string(o.max_payload_bytes));
    }

    std::string id;
    DeadLetterReason reason;
    std::string why;
    if (!detail::extract_message_id(m, o.message_id, &id, &reason, &why))
      return receipt_dead_letter(m, std::nullopt, reason, why);

    std::string key;
    if (options.aggregate_key) {
      try {
        key = options.aggregate_key(m);
      } catch (const std::exception& e) {
        return receipt_dead_letter(m, id, DeadLetterReason::kUndecodablePayload,
                                   std::string("aggregate key extractor threw: ") + e.what());
      } catch (...) {
        return receipt_dead_letter(m, id, DeadLetterReason::kUndecodablePayload,
                                   "aggregate key extractor threw");
      }
    }

    const std::string props = detail::properties_json(m);
    bool inserted = false;
    until_stored("storing", [&] { return store(m, id, key, props, &inserted); });
    if (!inserted) {
      count(&StoreThenProcessCounters::duplicates);
      return Outcome::kDuplicate;
    }
    count(&StoreThenProcessCounters::stored);
    if (inbox->options().after_commit_hook) inbox->options().after_commit_hook(name, id);
    notify_workers();
    return Outcome::kProcessed;
  }

  // ---------------------------------------------------------------- workers

  struct Row {
    int64_t seq = 0;
    std::string message_id, aggregate_key;
    Message message;
    int64_t received_at = 0;
    int attempts = 0;
    std::string last_error;
  };

  // One worker's connection and its cached statements.
  struct Worker {
    int index = 0;
    std::unique_ptr<SQLite::Database> db;
    std::unique_ptr<SQLite::Statement> first_agg, next_agg, busy_aggs, agg_head, claim_row, owned, done, close_dl, renew,
        failed, release, dead;
    Synchronous handler_sync = Synchronous::kFull;
    std::optional<Synchronous> current_sync;

    // Bookkeeping commits (claim, failure, release) skip the fsync: losing one on power
    // loss only repeats a claim or undercounts one attempt; the row itself is durable.
    void set_sync(Synchronous s) {
      if (current_sync == s) return;
      try {
        db->exec(s == Synchronous::kFull ? "PRAGMA synchronous = FULL"
                                         : "PRAGMA synchronous = NORMAL");
        current_sync = s;
      } catch (const SQLite::Exception&) {
        // Outside a transaction this does no I/O; if it fails the connection is broken
        // and the next statement reports it.
      }
    }
  };

  // Runs `fn` in BEGIN IMMEDIATE ... COMMIT on `db`. Store errors come back as Status.
  template <typename Fn>
  static Status transaction(SQLite::Database& db, const char* what, Fn&& fn) {
    try {
      db.exec("BEGIN IMMEDIATE");
    } catch (const SQLite::Exception& e) {
      return detail::to_status(e, std::string(what) + ": BEGIN IMMEDIATE");
    }
    try {
      fn();
      db.exec("COMMIT");
    } catch (const SQLite::Exception& e) {
      detail::rollback_quietly(db);
      return detail::to_status(e, what);
    } catch (const std::exception& e) {
      detail::rollback_quietly(db);
      return Status::Internal(std::string(what) + ": " + e.what());
    }
    return Status::Ok();
  }

  // Retries a worker-side store operation with capped backoff until it succeeds or the
  // pool stops. Returns false if it gave up because of stop().
  template <typename Op>
  bool worker_retry(const char* what, Op&& op) {
    int64_t backoff = options.consumer.store_backoff_initial.count();
    for (int tries = 1;; ++tries) {
      const Status s = op();
      if (s.ok()) return true;
      worker_error(s);
      if (tries == 1 || tries % 20 == 0)
        log->warn("store-then-process '{}': {} failed ({}), retrying", name, what, s.to_string());
      if (stopping.load()) return false;
      clock->sleep_ms(backoff);
      backoff = std::min<int64_t>(backoff * 2, options.consumer.store_backoff_max.count());
    }
  }

  void prepare_worker(Worker& w) {
    SQLite::Database& db = *w.db;
    w.first_agg = std::make_unique<SQLite::Statement>(db, kFirstAggregateSql);
    w.next_agg = std::make_unique<SQLite::Statement>(db, kNextAggregateSql);
    w.busy_aggs = std::make_unique<SQLite::Statement>(db, kBusyAggregatesSql);
    w.agg_head = std::make_unique<SQLite::Statement>(db, kAggregateHeadSql);
    w.claim_row = std::make_unique<SQLite::Statement>(db, kClaimRowSql);
    w.owned = std::make_unique<SQLite::Statement>(db, kOwnedSql);
    w.done = std::make_unique<SQLite::Statement>(db, kDoneSql);
    w.close_dl = std::make_unique<SQLite::Statement>(db, kCloseDeadLetterSql);
    w.renew = std::make_unique<SQLite::Statement>(db, kRenewLeaseSql);
    w.failed = std::make_unique<SQLite::Statement>(db, kFailedSql);
    w.release = std::make_unique<SQLite::Statement>(db, kReleaseSql);
    w.dead = std::make_unique<SQLite::Statement>(db, kDeadSql);
    w.handler_sync = options.worker_synchronous;
  }

  // The claimable rows (seq, aggregate), oldest first. An aggregate with a 'processing'
  // row is skipped; within an aggregate, rows are taken in seq order up to the first one
  // whose next_attempt_at is in the future: a row waiting for its retry blocks the rows
  // after it. Cost: one index seek per aggregate with pending rows, plus batch_size rows
  // of each; never a scan of the whole backlog.
  std::vector<std::pair<int64_t, std::string>> candidates(Worker& w, int64_t now) {
    std::set<std::string> busy;
    {
      SQLite::Statement& q = *w.busy_aggs;
      detail::StatementReset reset(q);
      q.bind(1, name);
      while (q.executeStep()) busy.insert(q.getColumn(0).getString());
    }
    std::vector<std::pair<int64_t, std::string>> out;
    std::optional<std::string> key;
    for (;;) {
      SQLite::Statement& q = key ? *w.next_agg : *w.first_agg;
      detail::StatementReset reset(q);
      q.bind(1, name);
      if (key) q.bind(2, *key);
      if (!q.executeStep() || q.getColumn(0).isNull()) break;
      key = q.getColumn(0).getString();
      if (busy.count(*key)) continue;
      SQLite::Statement& h = *w.agg_head;
      detail::StatementReset reset_h(h);
      h.bind(1, name);
      h.bind(2, *key);
      h.bind(3, static_cast<int64_t>(options.batch_size));
      while (h.executeStep()) {
        if (h.getColumn(1).getInt64() > now) break;
        out.emplace_back(h.getColumn(0).getInt64(), *key);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // Claims a batch: rows of at most ceil(eligible aggregates / workers) aggregates (so
  // the other workers find work too), oldest first, up to batch_size rows.
  Status claim(Worker& w, const std::string& claimant, std::vector<Row>* rows) {
    rows->clear();
    const int64_t now = clock->wall_ms();
    w.set_sync(Synchronous::kNormal);
    return transaction(*w.db, "claiming rows", [&] {
      const std::vector<std::pair<int64_t, std::string>> cand = candidates(w, now);
      if (cand.empty()) return;
      std::vector<std::string> order;  // aggregates by their oldest eligible row
      for (const auto& c : cand)
        if (std::find(order.begin(), order.end(), c.second) == order.end()) order.push_back(c.second);
      const size_t workers = static_cast<size_t>(std::max(1, options.workers));
      const size_t take_aggs = std::max<size_t>(1, (order.size() + workers - 1) / workers);
      const std::set<std::string> chosen(order.begin(), order.begin() + static_cast<long>(take_aggs));
      for (const auto& c : cand) {
        if (rows->size() >= static_cast<size_t>(options.batch_size)) break;
        if (!chosen.count(c.second)) continue;
        SQLite::Statement& q = *w.claim_row;
        detail::StatementReset reset(q);
        q.bind(1, c.first);
        q.bind(2, now);
        q.bind(3, claimant);
        if (!q.executeStep()) continue;
        Row r;
        r.seq = c.first;
        r.message_id = q.getColumn(0).getString();
        r.aggregate_key = q.getColumn(1).getString();
        DeadLetter shape;  // reuses the dead letter's Message decoding
        shape.topic = q.getColumn(2).getString();
        shape.payload = q.getColumn(3).getString();
        shape.properties_json = q.getColumn(4).isNull() ? "{}" : q.getColumn(4).getString();
        shape.qos = q.getColumn(5).getInt();
        r.message = detail::message_from_dead_letter(shape);
        r.received_at = q.getColumn(6).getInt64();
        r.attempts = q.getColumn(7).getInt();
        r.last_error = q.getColumn(8).isNull() ? "" : q.getColumn(8).getString();
        while (q.executeStep()) {
        }
        rows->push_back(std::move(r));
      }
    });
  }

  Status release(Worker& w, const std::string& claimant, const std::string* aggregate) {
    w.set_sync(Synchronous::kNormal);
    return transaction(*w.db, "releasing rows", [&] {
      SQLite::Statement& q = *w.release;
      detail::StatementReset reset(q);
      q.bind(1, name);
      q.bind(2, claimant);
      if (aggregate) q.bind(3, *aggregate);
      q.exec();
    });
  }

  enum class RunResult { kDone, kFailed, kDead, kLost, kStopped };

  // Dead-letters a claimed row: the dead letter first (on the Inbox's connection), then
  // the row's status. A crash in between leaves the row claimed; it is reaped, comes back
  // with its attempts used up, and is dead-lettered again, which only bumps the existing
  // dead letter's redelivery count.
  RunResult dead_letter_row(Worker& w, const Row& r, const std::string& claimant,
                            DeadLetterReason reason, const std::string& text, int attempts) {
    DeadLetter dl;
    dl.consumer_name = name;
    dl.message_id = r.message_id;
    dl.topic = r.message.topic;
    dl.payload = r.message.payload.substr(0, options.consumer.dead_letter_payload_bytes);
    dl.payload_size = static_cast<int64_t>(r.message.payload.size());
    dl.properties_json = detail::properties_json(r.message);
    dl.qos = r.message.qos;
    dl.reason = reason;
    dl.reason_text = text;
    dl.attempts = attempts;
    dl.last_attempt_at_ms = clock->wall_ms();
    int64_t id = 0;
    if (!worker_retry("writing a dead letter",
                      [&] { return inbox->add_dead_letter(dl, std::nullopt, &id); }))
      return RunResult::kStopped;
    bool owned = true;
    w.set_sync(w.handler_sync);
    if (!worker_retry("marking a row dead", [&] {
          return transaction(*w.db, "marking a row dead", [&] {
            SQLite::Statement& q = *w.dead;
            detail::StatementReset reset(q);
            q.bind(1, r.seq);
            q.bind(2, attempts);
            q.bind(3, text);
            q.bind(4, retention_now());
            q.bind(5, claimant);
            owned = q.exec() > 0;
          });
        }))
      return RunResult::kStopped;
    count(&StoreThenProcessCounters::dead_lettered);
    log->warn("store-then-process '{}': dead-lettered stored message '{}' (seq {}) as {} "
              "(dead letter {}): {}",
              name, detail::printable(r.message_id), r.seq, to_string(reason), id,
              detail::printable(text, 300));
    return owned ? RunResult::kDead : RunResult::kLost;
  }

  RunResult fail_row(Worker& w, const Row& r, const std::string& claimant, int attempt,
                     const std::string& error) {
    count(&StoreThenProcessCounters::handler_failures);
    log->warn("store-then-process '{}': handler failed on '{}' (seq {}, attempt {}/{}): {}", name,
              detail::printable(r.message_id), r.seq, attempt, options.consumer.max_attempts,
              detail::printable(error, 300));
    if (attempt >= options.consumer.max_attempts)
      return dead_letter_row(w, r, claimant, DeadLetterReason::kHandlerFailed,
                             "handler failed " + std::to_string(attempt) +
                                 " time(s); last error: " + error,
                             attempt);
    bool owned = true;
    w.set_sync(Synchronous::kNormal);
    if (!worker_retry("recording a failed attempt", [&] {
          return transaction(*w.db, "recording a failed attempt", [&] {
            {
              SQLite::Statement& q = *w.failed;
              detail::StatementReset reset(q);
              q.bind(1, r.seq);
              q.bind(2, attempt);
              q.bind(3, error);
              q.bind(4, clock->wall_ms() + backoff_ms(options.consumer, attempt));
              q.bind(5, claimant);
              owned = q.exec() > 0;
            }
            // The later rows of this aggregate in the batch must wait for the retry.
            SQLite::Statement& q = *w.release;
            detail::StatementReset reset(q);
            q.bind(1, name);
            q.bind(2, claimant);
            q.bind(3, r.aggregate_key);
            q.exec();
          });
        }))
      return RunResult::kStopped;
    return owned ? RunResult::kFailed : RunResult::kLost;
  }

  RunResult run_row(Worker& w, const Row& r, const std::string& claimant) {
    const int max_attempts = options.consumer.max_attempts;
    if (r.attempts >= max_attempts) {
      // Used up by expired claims (crashes) or by failures whose dead letter did not
      // finish: do not run it again.
      const bool crashed = r.last_error.rfind(kExpiredClaimError, 0) == 0;
      return dead_letter_row(
          w, r, claimant, crashed ? DeadLetterReason::kHandlerCrashed : DeadLetterReason::kHandlerFailed,
          crashed ? "the claim expired on " + std::to_string(r.attempts) +
                        " attempt(s): the worker died or hung inside the handler"
                  : "handler failed " + std::to_string(r.attempts) + " time(s); last error: " +
                        r.last_error,
          r.attempts);
    }
    const int attempt = r.attempts + 1;
    std::any prepared;
    const StoredDelivery pre{r.message, r.message_id, r.aggregate_key, r.seq, r.received_at,
                             attempt, prepared};
    if (options.prepare) {
      try {
        prepared = options.prepare(pre);
      } catch (const UndecodablePayload& e) {
        return dead_letter_row(w, r, claimant, DeadLetterReason::kUndecodablePayload, e.what(),
                               attempt);
      } catch (const std::exception& e) {
        return fail_row(w, r, claimant, attempt, std::string("prepare: ") + e.what());
      } catch (...) {
        return fail_row(w, r, claimant, attempt, "prepare threw a non-standard exception");
      }
    }
    if (options.before_handler_hook) options.before_handler_hook(r.message_id);
    const StoredDelivery d{r.message, r.message_id, r.aggregate_key, r.seq, r.received_at,
                           attempt, prepared};

    enum { kOk, kLostClaim, kThrew, kUndecodable } result = kOk;
    std::string error;
    int64_t held_ms = 0;
    w.set_sync(w.handler_sync);
    SQLite::Database& db = *w.db;
    const bool stored = worker_retry("running the handler transaction", [&]() -> Status {
      result = kOk;
      try {
        db.exec("BEGIN IMMEDIATE");
      } catch (const SQLite::Exception& e) {
        return detail::to_status(e, "handler transaction: BEGIN IMMEDIATE");
      }
      const int64_t began = clock->steady_ms();
      try {
        {
          SQLite::Statement& q = *w.owned;
          detail::StatementReset reset(q);
          q.bind(1, r.seq);
          q.bind(2, claimant);
          if (!q.executeStep() || q.getColumn(0).getInt() == 0) {
            detail::rollback_quietly(db);
            result = kLostClaim;
            return Status::Ok();
          }
        }
        try {
          handler(db, d);
        } catch (const SQLite::Exception& e) {
          detail::rollback_quietly(db);
          const Status s = detail::to_status(e, "handler statement");
          if (s.is_transient_store_error()) return s;  // not the handler's fault: retry
          result = kThrew;
          error = e.what();
          return Status::Ok();
        } catch (const UndecodablePayload& e) {
          detail::rollback_quietly(db);
          result = kUndecodable;
          error = e.what();
          return Status::Ok();
        } catch (const std::exception& e) {
          detail::rollback_quietly(db);
          result = kThrew;
          error = e.what();
          return Status::Ok();
        } catch (...) {
          detail::rollback_quietly(db);
          result = kThrew;
          error = "handler threw a non-standard exception";
          return Status::Ok();
        }
        if (sqlite3_get_autocommit(db.getHandle())) {
          result = kThrew;
          error = "handler ended the transaction (COMMIT/ROLLBACK is not allowed)";
          return Status::Ok();
        }
        const int64_t now = retention_now();
        {
          SQLite::Statement& q = *w.done;
          detail::StatementReset reset(q);
          q.bind(1, r.seq);
          q.bind(2, attempt);
          q.bind(3, now);
          q.exec();
        }
        {
          SQLite::Statement& q = *w.close_dl;
          detail::StatementReset reset(q);
          q.bind(1, name);
          q.bind(2, r.message_id);
          q.bind(3, clock->wall_ms());
          q.exec();
        }
        {
          // The next row of the batch starts now: renew the batch's lease.
          SQLite::Statement& q = *w.renew;
          detail::StatementReset reset(q);
          q.bind(1, name);
          q.bind(2, claimant);
          q.bind(3, clock->wall_ms());
          q.exec();
        }
        db.exec("COMMIT");
      } catch (const SQLite::Exception& e) {
        detail::rollback_quietly(db);
        return detail::to_status(e, "handler transaction");
      } catch (const std::exception& e) {
        detail::rollback_quietly(db);
        return Status::Internal(std::string("handler transaction: ") + e.what());
      }
      held_ms = clock->steady_ms() - began;
      return Status::Ok();
    });
    if (!stored) return RunResult::kStopped;
    switch (result) {
      case kOk:
        count(&StoreThenProcessCounters::processed);
        if (options.slow_handler_warn_ms > 0 && held_ms > options.slow_handler_warn_ms)
          log->warn("store-then-process '{}': handler on '{}' held the write lock for {} ms; "
                    "receipt waited for it (move slow work to a prepare function)",
                    name, detail::printable(r.message_id), held_ms);
        return RunResult::kDone;
      case kLostClaim:
        return RunResult::kLost;
      case kUndecodable:
        return dead_letter_row(w, r, claimant, DeadLetterReason::kUndecodablePayload, error,
                               attempt);
      case kThrew:
        break;
    }
    return fail_row(w, r, claimant, attempt, error);
  }

  void worker_loop(Worker& w) {
    uint64_t seen = 0;
    std::vector<Row> rows;
    while (!stopping.load()) {
      const std::string claimant = instance + "/w" + std::to_string(w.index) + "/" +
                                   std::to_string(next_claim.fetch_add(1));
      Status s = claim(w, claimant, &rows);
      if (!s.ok()) {
        worker_error(s);
        if (!idle(options.poll_interval_ms, &seen)) break;
        continue;
      }
      if (rows.empty()) {
        if (!idle(options.poll_interval_ms, &seen)) break;
        continue;
      }
      std::set<std::string> blocked;  // aggregates whose earlier row failed or was lost
      bool released = false;
      for (const Row& r : rows) {
        if (stopping.load()) {
          if (!worker_retry("releasing rows at stop", [&] { return release(w, claimant, nullptr); }))
            log->warn("store-then-process '{}': could not release claimed rows at stop; they "
                      "return after the lease",
                      name);
          released = true;
          break;
        }
        if (blocked.count(r.aggregate_key)) continue;
        switch (run_row(w, r, claimant)) {
          case RunResult::kDone:
          case RunResult::kDead:
            break;
          case RunResult::kFailed:
            blocked.insert(r.aggregate_key);
            break;
          case RunResult::kLost:
            count(&StoreThenProcessCounters::claims_lost);
            blocked.insert(r.aggregate_key);
            break;
          case RunResult::kStopped:
            released = true;  // the store is failing and we stop: the lease returns them
            break;
        }
        if (released) break;
      }
      (void)released;
      if (!blocked.empty()) notify_workers();  // released rows may be claimable elsewhere
    }
  }

  void maintenance_loop() {
    const int64_t reap_every =
        options.reap_interval_ms > 0 ? options.reap_interval_ms : std::max<int64_t>(1, options.lease_ms / 4);
    int64_t next_reap = clock->steady_ms();  // at once: claims of a crashed earlier run
    int64_t next_prune = options.prune_interval_ms > 0 ? clock->steady_ms() : INT64_MAX;
    uint64_t seen = 0;
    while (!stopping.load()) {
      const int64_t now = clock->steady_ms();
      if (now >= next_reap) {
        int64_t reaped = 0;
        const Status s = reap_now(&reaped);
        if (!s.ok()) worker_error(s);
        if (reaped > 0) notify_workers();
        next_reap = now + reap_every;
      }
      if (now >= next_prune) {
        StoredPruneResult pr;
        const Status s = prune_now(&pr);
        if (!s.ok()) worker_error(s);
        next_prune = now + options.prune_interval_ms;
      }
      const int64_t wait = std::max<int64_t>(1, std::min(next_reap, next_prune) - clock->steady_ms());
      std::unique_lock<std::mutex> lock(run_mu);
      wake.wait_for(lock, std::chrono::milliseconds(std::min<int64_t>(wait, 1000)),
                    [&] { return stopping.load(); });
      (void)seen;
    }
  }

  // ---------------------------------------------------------------- maintenance

  Status reap_now(int64_t* reaped) {
    *reaped = 0;
    std::lock_guard<std::mutex> lock(maint_mu);
    SQLite::Database& db = *maint;
    const int64_t cutoff = clock->wall_ms() - options.lease_ms;
    std::vector<std::pair<std::string, int64_t>> running;
    const Status s = transaction(db, "reaping expired claims", [&] {
      running.clear();
      {
        // Each expired batch was running its lowest-seq row still 'processing' (a worker
        // runs its batch in seq order, and a finished row leaves 'processing'): that row
        // gets the attempt; the rest of the batch never started.
        SQLite::Statement q(db,
                            "SELECT claimant, min(seq) FROM inbox_messages"
                            " WHERE consumer_name = ?1 AND status = 'processing'"
                            "   AND claimed_at < ?2 GROUP BY claimant");
        q.bind(1, name);
        q.bind(2, cutoff);
        while (q.executeStep())
          running.emplace_back(q.getColumn(0).isNull() ? "" : q.getColumn(0).getString(),
                               q.getColumn(1).getInt64());
      }
      SQLite::Statement bump(db,
                             "UPDATE inbox_messages SET attempts = attempts + 1, last_error = ?2"
                             " WHERE seq = ?1");
      for (const auto& run : running) {
        bump.tryReset();
        bump.bind(1, run.second);
        bump.bind(2, std::string(kExpiredClaimError) + " (claimant " + run.first + ", lease " +
                         std::to_string(options.lease_ms) + " ms)");
        bump.exec();
      }
      SQLite::Statement back(db,
                             "UPDATE inbox_messages SET status = 'pending', claimant = NULL,"
                             " claimed_at = NULL"
                             " WHERE consumer_name = ?1 AND status = 'processing'"
                             "   AND claimed_at < ?2");
      back.bind(1, name);
      back.bind(2, cutoff);
      *reaped = back.exec();
    });
    if (s.ok() && *reaped > 0) {
      count(&StoreThenProcessCounters::reaped, *reaped);
      log->warn("store-then-process '{}': reaped {} expired claim(s) of {} batch(es) (lease {} ms)",
                name, *reaped, running.size(), options.lease_ms);
    }
    return s;
  }

  Status prune_now(StoredPruneResult* out) {
    *out = StoredPruneResult{};
    std::lock_guard<std::mutex> lock(maint_mu);
    SQLite::Database& db = *maint;
    const int64_t now = retention_now();
    constexpr int kChunk = 500;
    for (;;) {
      int changed = 0;
      const Status s = transaction(db, "compacting done rows", [&] {
        // Served by the partial index inbox_messages_compact.
        SQLite::Statement q(db,
                            "UPDATE inbox_messages SET payload = NULL, properties = NULL"
                            " WHERE seq IN (SELECT seq FROM inbox_messages"
                            "   WHERE consumer_name = ?1 AND status = 'done'"
                            "     AND payload IS NOT NULL AND done_at < ?2 LIMIT ?3)");
        q.bind(1, name);
        q.bind(2, now - options.compact_after_ms);
        q.bind(3, kChunk);
        changed = q.exec();
      });
      if (!s.ok()) return s;
      out->compacted += changed;
      if (changed < kChunk) break;
    }
    for (;;) {
      int changed = 0;
      const Status s = transaction(db, "deleting old rows", [&] {
        SQLite::Statement q(db,
                            "DELETE FROM inbox_messages WHERE seq IN (SELECT seq FROM inbox_messages"
                            "   WHERE received_at < ?2 AND consumer_name = ?1"
                            "     AND status IN ('done', 'dead') LIMIT ?3)");
        q.bind(1, name);
        q.bind(2, now - options.dedup_retention_ms);
        q.bind(3, kChunk);
        changed = q.exec();
      });
      if (!s.ok()) return s;
      out->deleted += changed;
      if (changed < kChunk) break;
    }
    if (out->compacted || out->deleted)
      log->info("store-then-process '{}': pruned: {} compacted, {} deleted", name, out->compacted,
                out->deleted);
    return Status::Ok();
  }
};

StoreThenProcess::StoreThenProcess(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreThenProcess::~StoreThenProcess() {
  (void)stop();
  Impl& m = *impl_;
  m.inbox->with_connection([&](SQLite::Database&) {
    m.insert.reset();
    m.exists.reset();
  });
}

Status StoreThenProcess::create(Inbox* inbox, const std::string& name, StoredHandler handler,
                                const StoreThenProcessOptions& options,
                                std::unique_ptr<StoreThenProcess>* out) {
  if (!inbox) return Status::InvalidArgument("inbox is null");
  if (name.empty() || name.size() > 200 || !detail::is_valid_utf8(name))
    return Status::InvalidArgument("consumer name must be 1..200 bytes of UTF-8");
  if (!handler) return Status::InvalidArgument("handler is empty");
  const ConsumerOptions& c = options.consumer;
  if (c.max_attempts < 1) return Status::InvalidArgument("max_attempts must be >= 1");
  if (c.message_id.max_id_bytes < 1)
    return Status::InvalidArgument("message_id.max_id_bytes must be >= 1");
  if (c.message_id.user_property.empty() && c.message_id.json_field.empty() &&
      !c.message_id.extractor)
    return Status::InvalidArgument("no message id source configured");
  if (c.retry_backoff_initial.count() < 0 || c.retry_backoff_max < c.retry_backoff_initial ||
      c.store_backoff_initial.count() < 1 || c.store_backoff_max < c.store_backoff_initial)
    return Status::InvalidArgument("backoff: need 0 <= initial <= max (store initial >= 1 ms)");
  if (options.workers < 0) return Status::InvalidArgument("workers must be >= 0");
  if (options.batch_size < 1) return Status::InvalidArgument("batch_size must be >= 1");
  if (options.poll_interval_ms < 1) return Status::InvalidArgument("poll_interval_ms must be >= 1");
  if (options.lease_ms < 1) return Status::InvalidArgument("lease_ms must be >= 1");
  if (options.reap_interval_ms < 0 || options.compact_after_ms < 0 ||
      options.dedup_retention_ms < 0 || options.prune_interval_ms < 0 ||
      options.slow_handler_warn_ms < 0)
    return Status::InvalidArgument("intervals and retention durations must be >= 0");

  auto impl = std::make_unique<Impl>();
  impl->inbox = inbox;
  impl->name = name;
  impl->handler = std::move(handler);
  impl->options = options;
  impl->clock = inbox->options().clock ? inbox->options().clock : Clock::system();
  impl->log = detail::logger_or_default(inbox->options().logger);
  impl->retry = std::make_unique<detail::StoreRetry>("store-then-process '" + name + "'",
                                                     options.consumer, impl->clock, impl->log);
  impl->instance = instance_token();
  try {
    impl->maint = impl->open_connection(std::nullopt);
  } catch (const SQLite::Exception& e) {
    return detail::to_status(e, "opening the maintenance connection to " + inbox->path());
  } catch (const std::exception& e) {
    return Status::Internal(std::string("opening the maintenance connection: ") + e.what());
  }
  out->reset(new StoreThenProcess(std::move(impl)));
  return Status::Ok();
}

const std::string& StoreThenProcess::name() const { return impl_->name; }

Outcome StoreThenProcess::reject(const Message& message, const std::string& why) {
  try {
    return impl_->receipt_dead_letter(message, std::nullopt, DeadLetterReason::kHandlerFailed, why);
  } catch (...) {
    std::abort();  // only bad_alloc can get here; never report an unrecorded message as done
  }
}

Outcome StoreThenProcess::handle(const Message& message) {
  Outcome o = Outcome::kDuplicate;
  try {
    o = impl_->receive(message);
  } catch (const std::exception& e) {
    // Only a bug (or std::bad_alloc) gets here. Never let it cross into the transport's
    // callback; the message was not stored, so die rather than ack it.
    impl_->log->critical("store-then-process '{}': unexpected error at receipt: {}",
                         impl_->name, e.what());
    std::abort();
  }
  if (impl_->log->should_log(spdlog::level::debug))
    impl_->log->debug("store-then-process '{}': message on '{}': {}", impl_->name,
                      detail::printable(message.topic), to_string(o));
  return o;
}

Status StoreThenProcess::start() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.run_mu);
  if (m.started) return Status::InvalidArgument("already started");
  std::vector<std::unique_ptr<Impl::Worker>> workers;
  try {
    for (int i = 0; i < m.options.workers; ++i) {
      auto w = std::make_unique<Impl::Worker>();
      w->index = i;
      w->db = m.open_connection(std::nullopt);
      m.prepare_worker(*w);
      workers.push_back(std::move(w));
    }
  } catch (const SQLite::Exception& e) {
    return detail::to_status(e, "opening a worker connection to " + m.inbox->path());
  } catch (const std::exception& e) {
    return Status::Internal(std::string("opening a worker connection: ") + e.what());
  }
  m.stopping = false;
  m.started = true;
  for (auto& w : workers) {
    m.threads.emplace_back([&m, worker = std::shared_ptr<Impl::Worker>(std::move(w))] {
      m.worker_loop(*worker);
    });
  }
  m.threads.emplace_back([&m] { m.maintenance_loop(); });
  m.log->info("store-then-process '{}': started {} worker(s)", m.name, m.options.workers);
  return Status::Ok();
}

Status StoreThenProcess::stop() {
  Impl& m = *impl_;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(m.run_mu);
    if (!m.started) return Status::Ok();
    m.stopping = true;
    threads.swap(m.threads);
    m.started = false;
  }
  m.wake.notify_all();
  for (auto& t : threads) t.join();
  return Status::Ok();
}

Status StoreThenProcess::reap(int64_t* reaped) {
  int64_t n = 0;
  const Status s = impl_->reap_now(&n);
  if (reaped) *reaped = n;
  if (s.ok() && n > 0) impl_->notify_workers();
  return s;
}

Status StoreThenProcess::replay(const ReplayFilter& f, ReplayResult* result) {
  Impl& m = *impl_;
  ReplayResult r;
  std::string where = " WHERE consumer_name = ?1";
  if (f.received_since_ms) where += " AND received_at >= ?2";
  if (f.received_before_ms) where += " AND received_at < ?3";
  if (f.aggregate_key) where += " AND aggregate_key = ?4";
  if (f.message_id) where += " AND message_id = ?5";
  const std::string finished =
      f.include_dead ? " AND status IN ('done', 'dead')" : " AND status = 'done'";
  auto bind = [&](SQLite::Statement& q) {
    q.bind(1, m.name);
    if (f.received_since_ms) q.bind(2, *f.received_since_ms);
    if (f.received_before_ms) q.bind(3, *f.received_before_ms);
    if (f.aggregate_key) q.bind(4, *f.aggregate_key);
    if (f.message_id) q.bind(5, *f.message_id);
  };
  Status s;
  {
    std::lock_guard<std::mutex> lock(m.maint_mu);
    SQLite::Database& db = *m.maint;
    s = Impl::transaction(db, "replaying rows", [&] {
      r = ReplayResult{};
      {
        SQLite::Statement q(db, "SELECT count(*) FROM inbox_messages" + where +
                                    " AND status = 'processing'");
        bind(q);
        q.executeStep();
        r.in_flight = q.getColumn(0).getInt64();
      }
      {
        SQLite::Statement q(db, "SELECT count(*) FROM inbox_messages" + where + finished +
                                    " AND payload IS NULL");
        bind(q);
        q.executeStep();
        r.not_replayable = q.getColumn(0).getInt64();
      }
      SQLite::Statement q(db,
                          "UPDATE inbox_messages SET status = 'pending', attempts = 0,"
                          " next_attempt_at = 0, last_error = NULL, claimant = NULL,"
                          " claimed_at = NULL, done_at = NULL" +
                              where + finished + " AND payload IS NOT NULL");
      bind(q);
      r.reset = q.exec();
    });
  }
  if (!s.ok()) return s;
  m.log->info("store-then-process '{}': replay reset {} row(s) to pending ({} compacted, {} in "
              "flight left alone)",
              m.name, r.reset, r.not_replayable, r.in_flight);
  if (r.reset > 0) m.notify_workers();
  if (result) *result = r;
  return Status::Ok();
}

Status StoreThenProcess::prune(StoredPruneResult* result) {
  StoredPruneResult r;
  const Status s = impl_->prune_now(&r);
  if (result) *result = r;
  return s;
}

Status StoreThenProcess::stats(StoreThenProcessStats* out) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.maint_mu);
  try {
    SQLite::Statement q(*m.maint,
                        "SELECT status, count(*) FROM inbox_messages WHERE consumer_name = ?1"
                        " GROUP BY status");
    q.bind(1, m.name);
    *out = StoreThenProcessStats{};
    while (q.executeStep()) {
      const std::string st = q.getColumn(0).getString();
      const int64_t n = q.getColumn(1).getInt64();
      if (st == "pending") out->pending = n;
      else if (st == "processing") out->processing = n;
      else if (st == "done") out->done = n;
      else if (st == "dead") out->dead = n;
    }
  } catch (const SQLite::Exception& e) {
    return detail::to_status(e, "counting stored messages");
  }
  return Status::Ok();
}

Health StoreThenProcess::health() const { return impl_->retry->health(); }

StoreThenProcessCounters StoreThenProcess::counters() const {
  StoreThenProcessCounters c;
  {
    std::lock_guard<std::mutex> lock(impl_->state_mu);
    c = impl_->counters;
  }
  c.store_retries = impl_->retry->store_retries();
  return c;
}

}  // namespace mqtt_inbox

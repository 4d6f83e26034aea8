// The pruner: forgets processed ids after the retention window, in short batches on the
// Inbox's own connection, and keeps the files small (incremental vacuum, checkpoints).
#include "mqtt_inbox/retention.h"

#include <condition_variable>
#include <cstdio>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "store/sqlite/store.h"
#include "store/reentry.h"
#include "util/textfile.h"

namespace mqtt_inbox {

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

std::string format_ms(int64_t ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f h", static_cast<double>(ms) / 3.6e6);
  return buf;
}

}  // namespace

struct Pruner::Impl {
  Inbox* inbox = nullptr;
  detail::SqliteStore* store = nullptr;
  RetentionOptions options;
  std::mutex pass_mu;  // one pass at a time
  std::mutex mu;       // guards stopping/thread, pairs with cv
  std::condition_variable cv;
  bool stopping = false;
  std::thread thread;
  int64_t last_stats_log_ms = 0;
  // A second connection to the same file, used to checkpoint between batches and to
  // count rows after a pass. It never takes store->mu, so a message commit does not wait
  // for it: in WAL mode readers and checkpoints run alongside the writer
  // (https://sqlite.org/wal.html#concurrency). Null if it could not be opened.
  std::unique_ptr<SQLite::Database> side_db;
  // The requirement from the recorded sessions last warned about under the override.
  int64_t session_override_warned_ms = -1;
  // Refuses (kInvalidArgument) a window below the recorded session expiries, unless
  // overridden; defined with required_window_ms(Inbox*, ...) below.
  Status check_recorded_sessions(bool at_create);
  // Where the walk over inbox_processed resumes when a pass ran out of budget (the last
  // key it deleted); empty = from the start.
  std::optional<std::pair<std::string, std::string>> cursor;

  // Copies the WAL back into the database on the second connection (PASSIVE: never
  // waits for a lock, does what it can). Each delete batch dirties pages all over the
  // primary key (message ids are random), so without this the WAL crosses
  // wal_autocheckpoint every few batches and the next message commit that crosses it
  // pays for copying ~1000 pages and fsyncing the database file: that was the p99 during
  // pruning. Once the WAL is fully copied, the next writer starts it again from the
  // beginning, so message commits stay below the autocheckpoint threshold.
  void checkpoint_between_batches() {
    if (!side_db || !options.checkpoint || store->fatal.load()) return;
    (void)sqlite3_wal_checkpoint_v2(side_db->getHandle(), nullptr,
                                    SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  }

  // Deletes up to `limit` rows with `sql` in one short transaction; returns the count.
  int64_t delete_batch(const char* sql, int64_t cutoff, int64_t limit) {
    std::lock_guard<std::mutex> lock(store->mu);
    // No fsync for a delete of expired rows: if power loss undoes it, the next pass
    // deletes them again. The write lock is then held for the delete alone, and the next
    // claim's fsync makes it durable anyway.
    detail::SqliteStore::RelaxedSync relaxed(*store);
    int64_t n = 0;
    store->write_transaction([&] {
      SQLite::Statement q(*store->db, sql);
      q.bind(1, cutoff);
      q.bind(2, limit);
      n = q.exec();
    });
    return n;
  }

  static int64_t us_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now() - t0)
        .count();
  }

  // Sleeps after a step that kept the store busy for `busy_us` (its time under the lock
  // plus its checkpoint): pause_factor x busy, at least batch_pause. Pacing by the I/O a
  // step caused, not only by the lock it held, matters because the checkpoint writes and
  // fsyncs the database file, and a message's fsync queues behind that on the same
  // device. The pruner thus uses at most 1 / (1 + pause_factor) of the device's time.
  void pace(int64_t busy_us) {
    const auto pause_ms =
        static_cast<int64_t>(options.pause_factor * static_cast<double>(busy_us) / 1000.0);
    store->clock->sleep_ms(std::max<int64_t>(options.batch_pause.count(), pause_ms));
  }

  // Deletes everything older than `cutoff` with `sql`, batch by batch, until done or the
  // pass budget is spent. The batch size adapts so one batch holds the write lock for
  // about max_batch_ms (a message commit waits for at most one batch); after each batch
  // the WAL is checkpointed and the pruner pauses (pace()).
  int64_t delete_expired(const char* sql, int64_t cutoff, int64_t deadline_ms, PruneResult* r) {
    int64_t total = 0;
    int64_t limit = options.batch_rows;
    for (;;) {
      if (store->clock->steady_ms() >= deadline_ms) {
        r->budget_exhausted = true;
        return total;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t n = delete_batch(sql, cutoff, limit);
      const int64_t took_us = us_since(t0);
      ++r->batches;
      total += n;
      checkpoint_between_batches();
      if (n < limit) return total;
      if (took_us > options.max_batch_ms * 1000) limit = std::max<int64_t>(10, limit / 2);
      else if (took_us * 2 < options.max_batch_ms * 1000)
        limit = std::min<int64_t>(options.batch_rows, limit * 2);
      pace(us_since(t0));
    }
  }

  // Reads the next up-to-`limit` expired keys after `cursor` (on the second connection:
  // a read of a WAL snapshot that blocks no commit; else under the inbox lock).
  std::vector<std::pair<std::string, std::string>> next_expired(int64_t cutoff, int64_t limit) {
    std::vector<std::pair<std::string, std::string>> keys;
    auto read = [&](SQLite::Database& db) {
      SQLite::Statement q(db, cursor ? kExpiredIdsAfterSql : kExpiredIdsFirstSql);
      q.bind(1, cutoff);
      q.bind(2, limit);
      if (cursor) {
        q.bind(3, cursor->first);
        q.bind(4, cursor->second);
      }
      while (q.executeStep()) keys.emplace_back(q.getColumn(0).getString(), q.getColumn(1).getString());
    };
    if (side_db) {
      read(*side_db);
    } else {
      std::lock_guard<std::mutex> lock(store->mu);
      read(*store->db);
    }
    return keys;
  }

  // Deletes `keys` (still expired) in one short transaction; returns the count.
  int64_t delete_keys(const std::vector<std::pair<std::string, std::string>>& keys,
                      int64_t cutoff) {
    std::lock_guard<std::mutex> lock(store->mu);
    // The running-attempt marker can still name the last processed id (store/sqlite/claim.cpp leaves it
    // after a commit); once that id is pruned, the next open would count it as a lost
    // attempt. No handler runs while we hold the lock, so clear it first.
    if (store->marker) store->marker->clear();
    detail::SqliteStore::RelaxedSync relaxed(*store);  // as in delete_batch
    int64_t n = 0;
    store->write_transaction([&] {
      SQLite::Statement q(*store->db, kDeleteIdSql);
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

  // Deletes every id older than `cutoff`, walking the primary key from where the last
  // pass stopped to its end, batch by batch, until done or the budget is spent. Batches
  // are sized and paced like delete_expired's. Keys come in key order, so a batch of ids
  // shares a few leaf pages: far fewer pages per batch than deleting in time order.
  int64_t sweep_expired_ids(int64_t cutoff, int64_t deadline_ms, PruneResult* r) {
    int64_t total = 0;
    int64_t limit = options.batch_rows;
    for (;;) {
      if (store->clock->steady_ms() >= deadline_ms) {
        r->budget_exhausted = true;
        return total;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const auto keys = next_expired(cutoff, limit);
      if (keys.empty()) {
        cursor.reset();  // walked to the end: the next pass starts over
        return total;
      }
      const auto t1 = std::chrono::steady_clock::now();
      total += delete_keys(keys, cutoff);
      const int64_t took_us = us_since(t1);
      ++r->batches;
      cursor = keys.back();
      checkpoint_between_batches();
      if (static_cast<int64_t>(keys.size()) < limit) {
        cursor.reset();
        return total;
      }
      if (took_us > options.max_batch_ms * 1000) limit = std::max<int64_t>(10, limit / 2);
      else if (took_us * 2 < options.max_batch_ms * 1000)
        limit = std::min<int64_t>(options.batch_rows, limit * 2);
      pace(us_since(t0));
    }
  }

  // Gives free pages back to the file system a few at a time, with the same pacing as
  // the deletes (one large incremental_vacuum would hold the write lock for seconds).
  void vacuum(PruneResult* r) {
    constexpr int kPagesPerStep = 128;
    for (;;) {
      int64_t freed = 0;
      const auto t0 = std::chrono::steady_clock::now();
      {
        std::lock_guard<std::mutex> lock(store->mu);
        detail::SqliteStore::RelaxedSync relaxed(*store);  // as for the deletes
        SQLite::Database& db = *store->db;
        const int64_t before = db.execAndGet("PRAGMA freelist_count").getInt64();
        if (before == 0) return;
        db.exec("PRAGMA incremental_vacuum(" + std::to_string(kPagesPerStep) + ")");
        freed = before - db.execAndGet("PRAGMA freelist_count").getInt64();
      }
      r->pages_freed += freed;
      checkpoint_between_batches();
      if (freed < kPagesPerStep) return;
      pace(us_since(t0));
    }
  }

  void hygiene(PruneResult* r) {
    if (options.incremental_vacuum && (r->processed_deleted > 0 || r->dead_letters_deleted > 0 ||
                                       r->outbox_sent_deleted > 0 || r->outbox_dead_deleted > 0))
      vacuum(r);
    std::lock_guard<std::mutex> lock(store->mu);
    SQLite::Database& db = *store->db;
    if (options.checkpoint && !store->fatal.load()) {
      // TRUNCATE when idle: nothing committed during the last period. A busy reader makes
      // it return SQLITE_BUSY-like partial results, which is fine: try again next pass.
      const bool idle = store->clock->steady_ms() - store->last_commit_steady_ms.load() >=
                        options.period.count();
      (void)sqlite3_wal_checkpoint_v2(db.getHandle(), nullptr,
                                      idle ? SQLITE_CHECKPOINT_TRUNCATE : SQLITE_CHECKPOINT_PASSIVE,
                                      nullptr, nullptr);
    }
  }

  void report() {
    const InboxStats s = inbox->stats();
    if (options.stats_log_period_ms > 0) {
      const int64_t now = store->clock->steady_ms();
      if (last_stats_log_ms == 0 || now - last_stats_log_ms >= options.stats_log_period_ms) {
        last_stats_log_ms = now;
        store->log->info("inbox {}: {}", store->path, summary_line(s));
      }
    }
    std::string error;
    if (!options.prometheus_textfile.empty() &&
        !detail::write_textfile(options.prometheus_textfile, prometheus_text(s), &error))
      store->log->warn("{}", error);
  }
};

Pruner::Pruner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pruner::~Pruner() {
  stop();
  // A corrupt file is never written again, not even by this connection's closing
  // checkpoint.
  if (impl_->side_db && impl_->store->fatal.load())
    sqlite3_db_config(impl_->side_db->getHandle(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
}

int64_t Pruner::required_window_ms(const RetentionOptions& o) {
  return std::max(o.broker_session_expiry, o.max_offline).count() + o.replay_window.count() +
         o.margin.count();
}

Status Pruner::create(Inbox* inbox, const RetentionOptions& options, std::unique_ptr<Pruner>* out) {
  if (!inbox) return Status::InvalidArgument("inbox is null");
  if (Status r = detail::refuse_if_in_handler(inbox, "Pruner::create"); !r.ok()) return r;
  if (options.window.count() <= 0) return Status::InvalidArgument("retention window must be > 0");
  if (options.batch_rows < 1) return Status::InvalidArgument("batch_rows must be >= 1");
  if (options.max_batch_ms < 1) return Status::InvalidArgument("max_batch_ms must be >= 1");
  if (!(options.pause_factor >= 0) || options.pause_factor > 1000)
    return Status::InvalidArgument("pause_factor must be in 0..1000");
  if (options.period.count() < 1 || options.pass_budget.count() < 1 ||
      options.batch_pause.count() < 0 || options.dead_letter_window.count() < 0 ||
      options.broker_session_expiry.count() < 0 || options.max_offline.count() < 0 ||
      options.replay_window.count() < 0 || options.margin.count() < 0)
    return Status::InvalidArgument("retention durations must not be negative (period, budget > 0)");
  const int64_t required = required_window_ms(options);
  auto impl = std::make_unique<Impl>();
  impl->inbox = inbox;
  impl->store = &detail::sqlite_store(inbox);
  impl->options = options;
  if (options.window.count() < required) {
    const std::string what =
        "retention window " + format_ms(options.window.count()) +
        " is shorter than the redelivery horizon plus margin (" + format_ms(required) +
        " = max(session expiry, max offline) + replay window + margin): a redelivery after the "
        "window would be processed again";
    if (!options.allow_window_below_horizon) return Status::InvalidArgument(what);
    impl->store->log->warn("RETENTION OVERRIDE: {}. Accepted because "
                           "allow_window_below_horizon is set.",
                           what);
  }
  if (Status s = impl->check_recorded_sessions(true); !s.ok()) return s;
  // Record the declared horizon so the admin tool can refuse shorter manual prunes. At
  // start-up, so a locked or full store is waited out (InboxOptions::startup_*).
  detail::SqliteStore& store = *impl->store;
  const Status recorded =
      store.wait_at_startup("recording the retention horizon", [&](int busy_ms) -> Status {
        std::lock_guard<std::mutex> lock(store.mu);
        if (store.fatal.load()) return store.fatal_status();
        detail::SqliteStore::BusyTimeout busy(store.db->getHandle(), busy_ms, store.options.busy_timeout_ms);
        try {
          SQLite::Statement q(*store.db,
                              "INSERT INTO inbox_meta (key, value) VALUES ('required_window_ms', ?1)"
                              " ON CONFLICT (key) DO UPDATE SET value = excluded.value");
          q.bind(1, std::to_string(required));
          q.exec();
        } catch (const SQLite::Exception& e) {
          return store.store_error(detail::to_status(e, "recording the retention horizon"));
        }
        return Status::Ok();
      });
  if (!recorded.ok()) return recorded;
  {
    const InboxOptions& io = impl->store->options;
    try {
      impl->side_db = std::make_unique<SQLite::Database>(
          impl->store->path, SQLite::OPEN_READWRITE | SQLite::OPEN_URI, io.busy_timeout_ms, io.vfs);
      // A checkpoint syncs the WAL before copying it and the database after, unless
      // synchronous is OFF (https://sqlite.org/pragma.html#pragma_synchronous).
      impl->side_db->exec(io.synchronous == Synchronous::kFull ? "PRAGMA synchronous = FULL"
                                                               : "PRAGMA synchronous = NORMAL");
    } catch (const SQLite::Exception& e) {
      impl->side_db.reset();
      impl->store->log->warn("retention: cannot open a second connection to {} ({}); "
                             "checkpoints run once per pass and row counts hold the write lock",
                             impl->store->path, e.what());
    }
  }
  out->reset(new Pruner(std::move(impl)));
  return Status::Ok();
}

Status Pruner::prune_once(PruneResult* result) {
  Impl& m = *impl_;
  if (Status r = detail::refuse_if_in_handler(m.inbox, "Pruner::prune_once"); !r.ok()) return r;
  std::lock_guard<std::mutex> pass(m.pass_mu);
  *result = PruneResult{};
  if (m.store->fatal.load()) return m.store->fatal_status();  // never touch a corrupt file
  if (Status s = m.check_recorded_sessions(false); !s.ok()) return s;
  PruneResult r;
  const int64_t start = m.store->clock->steady_ms();
  const int64_t deadline = start + m.options.pass_budget.count();
  const int64_t now = m.store->retention_clock();
  r.cutoff = now - m.options.window.count();
  try {
    r.processed_deleted = m.sweep_expired_ids(r.cutoff, deadline, &r);
    m.store->pruned += r.processed_deleted;
    r.outbox_sent_deleted = m.delete_expired(kPruneOutboxSentSql, r.cutoff, deadline, &r);
    if (m.options.dead_letter_window.count() > 0) {
      const int64_t dead_cutoff = now - m.options.dead_letter_window.count();
      r.dead_letters_deleted = m.delete_expired(kPruneDeadLettersSql, dead_cutoff, deadline, &r);
      m.store->dead_letters_pruned += r.dead_letters_deleted;
      r.outbox_dead_deleted = m.delete_expired(kPruneOutboxDeadSql, dead_cutoff, deadline, &r);
    }
  } catch (const SQLite::Exception& e) {
    r.duration_ms = m.store->clock->steady_ms() - start;
    *result = r;
    std::lock_guard<std::mutex> lock(m.store->mu);  // store_error may checkpoint (disk full)
    return m.store->store_error(detail::to_status(e, "retention pass"));
  }
  // Writes first, checkpoint last, so a TRUNCATE leaves an empty WAL.
  Status s = m.store->persist_retention_clock();
  // The row count scans the whole table: on the second connection it blocks no commit.
  if (s.ok()) s = m.store->measure_rows(m.side_db.get());
  try {
    m.hygiene(&r);
  } catch (const SQLite::Exception& e) {
    std::lock_guard<std::mutex> lock(m.store->mu);
    if (s.ok()) s = m.store->store_error(detail::to_status(e, "vacuum/checkpoint"));
  }
  r.duration_ms = m.store->clock->steady_ms() - start;
  if (r.processed_deleted || r.dead_letters_deleted || r.outbox_sent_deleted ||
      r.outbox_dead_deleted)
    m.store->log->info("retention pass: {} ids, {} dead letters, {} sent and {} dead outbox rows "
                       "deleted in {} batches, {} pages freed, {} ms{}",
                       r.processed_deleted, r.dead_letters_deleted, r.outbox_sent_deleted,
                       r.outbox_dead_deleted, r.batches, r.pages_freed,
                       r.duration_ms, r.budget_exhausted ? " (budget spent, more next pass)" : "");
  m.report();
  *result = r;
  return s;
}

Status Pruner::start() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.thread.joinable()) return Status::InvalidArgument("already started");
  m.stopping = false;
  m.thread = std::thread([this] {
    Impl& im = *impl_;
    // Rows now rather than after the first period, so stats() and the summary line have a
    // real count from the start (on the second connection: it blocks no commit).
    {
      std::lock_guard<std::mutex> pass(im.pass_mu);
      const Status s = im.store->measure_rows(im.side_db.get());
      if (!s.ok()) im.store->log->warn("retention: measuring rows failed: {}", s.to_string());
    }
    bool backlog = false;
    for (;;) {
      // A pass that spent its budget left expired rows behind: continue after a pause as
      // long as the budget (at most half the time pruning) instead of a whole period, so
      // the pruner keeps up with any stream it can keep up with at all.
      const auto wait = backlog ? std::min(im.options.period, im.options.pass_budget)
                                : im.options.period;
      {
        std::unique_lock<std::mutex> l(im.mu);
        if (im.cv.wait_for(l, wait, [&] { return im.stopping; })) return;
      }
      PruneResult r;
      const Status s = prune_once(&r);
      if (!s.ok()) im.store->log->warn("retention pass failed: {}", s.to_string());
      backlog = s.ok() && r.budget_exhausted;
    }
  });
  return Status::Ok();
}

void Pruner::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = true;
    m.cv.notify_all();
  }
  // From inside a handler of the inbox, the thread may be waiting for the connection the
  // handler holds: ask it to stop, but leave the join to a later stop() or ~Pruner.
  if (!detail::refuse_if_in_handler(m.inbox, "Pruner::stop").ok()) return;
  if (m.thread.joinable()) m.thread.join();
}

Status Pruner::required_window_ms(Inbox* inbox, const RetentionOptions& o, int64_t* out,
                                  std::string* why) {
  if (!inbox) return Status::InvalidArgument("inbox is null");
  int64_t required = required_window_ms(o);
  std::string source = "the declared horizon (max(broker_session_expiry, max_offline) + "
                       "replay_window + margin)";
  std::vector<SessionRecord> sessions;
  if (Status s = inbox->sessions().list(&sessions); !s.ok()) return s;
  for (const SessionRecord& r : sessions) {
    const int64_t need = std::max(r.session_expiry_ms, o.max_offline.count()) +
                         o.replay_window.count() + o.margin.count();
    if (need > required) {
      required = need;
      source = "the session of client '" + detail::printable(r.client_id) + "' (expiry " +
               format_ms(r.session_expiry_ms) + ", " + to_string(r.expiry_source) +
               ", recorded by its subscriber) + replay window + margin";
    }
  }
  *out = required;
  if (why) *why = source;
  return Status::Ok();
}

Status Pruner::Impl::check_recorded_sessions(bool at_create) {
  int64_t required = 0;
  std::string source;
  if (Status s = Pruner::required_window_ms(inbox, options, &required, &source); !s.ok())
    return s;
  // The declared horizon alone is checked once, by create(); this is about the records.
  if (options.window.count() >= required || required == Pruner::required_window_ms(options))
    return Status::Ok();
  const std::string what =
      "retention window " + format_ms(options.window.count()) + " is shorter than " +
      format_ms(required) + ", required by " + source +
      ": the broker can redeliver a message until the session expires, and a redelivery "
      "after its id was pruned would be processed again. Raise RetentionOptions::window, "
      "lower SubscriberOptions::session_expiry_s, or, for a client id retired for good, "
      "SessionRecords::forget";
  if (!options.allow_window_below_horizon) {
    if (!at_create) store->log->error("RETENTION REFUSED, nothing deleted: {}", what);
    return Status::InvalidArgument(what);
  }
  if (session_override_warned_ms != required) {
    session_override_warned_ms = required;
    store->log->warn("RETENTION OVERRIDE: {}. Accepted because allow_window_below_horizon is set.",
                     what);
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox

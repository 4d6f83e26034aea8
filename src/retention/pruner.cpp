// The Pruner: the retention policy. It forgets processed ids (and finished dead letters and
// outbox rows) after their windows, checks the window against the redelivery horizon and
// the recorded sessions, and paces its batches so that message commits barely notice. The
// store does the deleting and its own housekeeping behind store/retention_rows.h.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "mqtt_inbox/retention.h"
#include "store/inbox.h"
#include "store/reentry.h"
#include "store/retention_rows.h"
#include "store/store.h"
#include "util/log.h"
#include "util/textfile.h"

namespace mqtt_inbox {

namespace {

std::string format_ms(int64_t ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f h", static_cast<double>(ms) / 3.6e6);
  return buf;
}

int64_t us_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

}  // namespace

struct Pruner::Impl {
  Inbox* inbox = nullptr;
  detail::Store* store = nullptr;
  RetentionOptions options;
  std::mutex pass_mu;  // one pass at a time; guards `sweep`'s use
  std::mutex mu;       // guards stopping/thread, pairs with cv
  std::condition_variable cv;
  bool stopping = false;
  std::thread thread;
  int64_t last_stats_log_ms = 0;
  std::unique_ptr<detail::RetentionSweep> sweep;
  // The requirement from the recorded sessions last warned about under the override.
  int64_t session_override_warned_ms = -1;
  // Refuses (kInvalidArgument) a window below the recorded session expiries, unless
  // overridden; defined with required_window_ms(Inbox*, ...) below.
  Status check_recorded_sessions(bool at_create);

  // Sleeps after a step that kept the store busy for `busy_us` (its write transaction plus
  // the store's housekeeping after it): pause_factor x busy, at least batch_pause. Pacing
  // by the I/O a step caused, not only by the lock it held, matters because the SQLite
  // store's checkpoint writes and fsyncs the database file, and a message's fsync queues
  // behind that on the same device. The pruner thus uses at most 1 / (1 + pause_factor)
  // of the device's time.
  void pace(int64_t busy_us) {
    const auto pause_ms =
        static_cast<int64_t>(options.pause_factor * static_cast<double>(busy_us) / 1000.0);
    store->clock()->sleep_ms(std::max<int64_t>(options.batch_pause.count(), pause_ms));
  }

  // Deletes, batch by batch with `batch(limit, &b)`, until no expired row is left or the
  // pass budget is spent; *deleted: the rows deleted, set only on success. The batch size
  // adapts so that one batch holds the write lock for about max_batch_ms (a message commit
  // waits for at most one batch); after each batch the store does its housekeeping
  // (after_batch) and the pruner pauses (pace()).
  template <typename BatchFn>
  Status delete_in_batches(BatchFn batch, int64_t deadline_ms, PruneResult* r, int64_t* deleted) {
    int64_t total = 0;
    int64_t limit = options.batch_rows;
    for (;;) {
      if (store->clock()->steady_ms() >= deadline_ms) {
        r->budget_exhausted = true;
        break;
      }
      const auto t0 = std::chrono::steady_clock::now();
      detail::RetentionBatch b;
      if (Status s = batch(limit, &b); !s.ok()) return s;
      if (!b.wrote) break;
      ++r->batches;
      total += b.deleted;
      sweep->after_batch();
      if (b.found < limit) break;
      if (b.write_us > options.max_batch_ms * 1000)
        limit = std::max<int64_t>(10, limit / 2);
      else if (b.write_us * 2 < options.max_batch_ms * 1000)
        limit = std::min<int64_t>(options.batch_rows, limit * 2);
      pace(us_since(t0));
    }
    *deleted = total;
    return Status::Ok();
  }

  // Deletes every processed id older than `cutoff`, from where the last pass stopped.
  Status delete_expired_claims(int64_t cutoff, int64_t deadline_ms, PruneResult* r,
                               int64_t* deleted) {
    return delete_in_batches(
        [&](int64_t limit, detail::RetentionBatch* b) {
          return sweep->delete_expired_claims(cutoff, limit, b);
        },
        deadline_ms, r, deleted);
  }

  // Deletes every row of `rows` older than `cutoff`.
  Status delete_expired(detail::ExpiringRows rows, int64_t cutoff, int64_t deadline_ms,
                        PruneResult* r, int64_t* deleted) {
    return delete_in_batches(
        [&](int64_t limit, detail::RetentionBatch* b) {
          return sweep->delete_expired(rows, cutoff, limit, b);
        },
        deadline_ms, r, deleted);
  }

  // Gives free space back step by step, paced like the deletes.
  Status reclaim_space(PruneResult* r) {
    for (;;) {
      const auto t0 = std::chrono::steady_clock::now();
      detail::ReclaimStep step;
      if (Status s = sweep->reclaim_step(&step); !s.ok()) return s;
      if (!step.ran) return Status::Ok();
      r->pages_freed += step.freed;
      sweep->after_batch();
      if (!step.more) return Status::Ok();
      pace(us_since(t0));
    }
  }

  void report() {
    const InboxStats s = inbox->stats();
    if (options.stats_log_period_ms > 0) {
      const int64_t now = store->clock()->steady_ms();
      if (last_stats_log_ms == 0 || now - last_stats_log_ms >= options.stats_log_period_ms) {
        last_stats_log_ms = now;
        store->log()->info("inbox {}: {}", store->location(), summary_line(s));
      }
    }
    std::string error;
    if (!options.prometheus_textfile.empty() &&
        !detail::write_textfile(options.prometheus_textfile, prometheus_text(s), &error))
      store->log()->warn("{}", error);
  }
};

Pruner::Pruner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pruner::~Pruner() { stop(); }

int64_t Pruner::required_window_ms(const RetentionOptions& o) {
  return std::max(o.broker_session_expiry, o.max_offline).count() + o.replay_window.count() +
         o.margin.count();
}

Status Pruner::create(Inbox* inbox, const RetentionOptions& options, std::unique_ptr<Pruner>* out) {
  detail::Store* store = detail::InboxImpl::store_of(inbox);
  if (!store) return Status::InvalidArgument("inbox is null");
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
  impl->store = store;
  impl->options = options;
  if (options.window.count() < required) {
    const std::string what =
        "retention window " + format_ms(options.window.count()) +
        " is shorter than the redelivery horizon plus margin (" + format_ms(required) +
        " = max(session expiry, max offline) + replay window + margin): a redelivery after the "
        "window would be processed again";
    if (!options.allow_window_below_horizon) return Status::InvalidArgument(what);
    impl->store->log()->warn(
        "RETENTION OVERRIDE: {}. Accepted because "
        "allow_window_below_horizon is set.",
        what);
  }
  if (Status s = impl->check_recorded_sessions(true); !s.ok()) return s;
  // Record the declared horizon so the admin tool can refuse shorter manual prunes. At
  // start-up, so a locked or full store is waited out (InboxOptions::startup_*).
  detail::RetentionRows& rows = impl->store->retention_rows();
  const Status recorded = impl->store->wait_at_startup(
      "recording the retention horizon",
      [&](int lock_wait_ms) { return rows.record_required_window(required, lock_wait_ms); });
  if (!recorded.ok()) return recorded;
  detail::RetentionSweepOptions sweep;
  sweep.checkpoint = options.checkpoint;
  sweep.reclaim_space = options.incremental_vacuum;
  sweep.idle_ms = options.period.count();
  if (Status s = rows.open_sweep(sweep, &impl->sweep); !s.ok()) return s;
  out->reset(new Pruner(std::move(impl)));
  return Status::Ok();
}

Status Pruner::prune_once(PruneResult* result) {
  Impl& m = *impl_;
  if (Status r = detail::refuse_if_in_handler(m.inbox, "Pruner::prune_once"); !r.ok()) return r;
  std::lock_guard<std::mutex> pass(m.pass_mu);
  *result = PruneResult{};
  if (m.store->unusable()) return m.store->fatal_status();  // never touch a corrupt file
  if (Status s = m.check_recorded_sessions(false); !s.ok()) return s;
  PruneResult r;
  const int64_t start = m.store->clock()->steady_ms();
  const int64_t deadline = start + m.options.pass_budget.count();
  const int64_t now = m.store->retention_clock();
  r.cutoff = now - m.options.window.count();
  Status deleted = m.delete_expired_claims(r.cutoff, deadline, &r, &r.processed_deleted);
  if (deleted.ok()) {
    m.store->count_pruned(r.processed_deleted, 0);
    deleted = m.delete_expired(detail::ExpiringRows::kOutboxSent, r.cutoff, deadline, &r,
                               &r.outbox_sent_deleted);
  }
  if (deleted.ok() && m.options.dead_letter_window.count() > 0) {
    const int64_t dead_cutoff = now - m.options.dead_letter_window.count();
    deleted = m.delete_expired(detail::ExpiringRows::kDeadLetters, dead_cutoff, deadline, &r,
                               &r.dead_letters_deleted);
    if (deleted.ok()) {
      m.store->count_pruned(0, r.dead_letters_deleted);
      deleted = m.delete_expired(detail::ExpiringRows::kOutboxDead, dead_cutoff, deadline, &r,
                                 &r.outbox_dead_deleted);
    }
  }
  if (!deleted.ok()) {  // the pass stops; what was deleted stays deleted
    r.duration_ms = m.store->clock()->steady_ms() - start;
    *result = r;
    return deleted;
  }
  // Writes first, the store's housekeeping last (SQLite: a checkpoint that truncates the
  // WAL is then left with nothing to copy).
  detail::RetentionRows& rows = m.store->retention_rows();
  Status s = rows.persist_clock();
  if (s.ok()) s = m.sweep->measure_rows();
  Status reclaimed;
  if (r.processed_deleted > 0 || r.dead_letters_deleted > 0 || r.outbox_sent_deleted > 0 ||
      r.outbox_dead_deleted > 0)
    reclaimed = m.reclaim_space(&r);
  if (reclaimed.ok())
    m.sweep->finish_pass();
  else if (s.ok())
    s = reclaimed;
  r.duration_ms = m.store->clock()->steady_ms() - start;
  if (r.processed_deleted || r.dead_letters_deleted || r.outbox_sent_deleted ||
      r.outbox_dead_deleted)
    m.store->log()->info(
        "retention pass: {} ids, {} dead letters, {} sent and {} dead outbox rows "
        "deleted in {} batches, {} pages freed, {} ms{}",
        r.processed_deleted, r.dead_letters_deleted, r.outbox_sent_deleted, r.outbox_dead_deleted,
        r.batches, r.pages_freed, r.duration_ms,
        r.budget_exhausted ? " (budget spent, more next pass)" : "");
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
    // real count from the start.
    {
      std::lock_guard<std::mutex> pass(im.pass_mu);
      const Status s = im.sweep->measure_rows();
      if (!s.ok()) im.store->log()->warn("retention: measuring rows failed: {}", s.to_string());
    }
    // The Prometheus textfile exists from the start, not a whole period later.
    if (!im.options.prometheus_textfile.empty()) im.report();
    bool backlog = false;
    for (;;) {
      // A pass that spent its budget left expired rows behind: continue after a pause as
      // long as the budget (at most half the time pruning) instead of a whole period, so
      // the pruner keeps up with any stream it can keep up with at all.
      const auto wait =
          backlog ? std::min(im.options.period, im.options.pass_budget) : im.options.period;
      {
        std::unique_lock<std::mutex> l(im.mu);
        if (im.cv.wait_for(l, wait, [&] { return im.stopping; })) return;
      }
      PruneResult r;
      const Status s = prune_once(&r);
      if (!s.ok()) im.store->log()->warn("retention pass failed: {}", s.to_string());
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
  std::string source =
      "the declared horizon (max(broker_session_expiry, max_offline) + "
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
  if (Status s = Pruner::required_window_ms(inbox, options, &required, &source); !s.ok()) return s;
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
    if (!at_create) store->log()->error("RETENTION REFUSED, nothing deleted: {}", what);
    return Status::InvalidArgument(what);
  }
  if (session_override_warned_ms != required) {
    session_override_warned_ms = required;
    store->log()->warn(
        "RETENTION OVERRIDE: {}. Accepted because allow_window_below_horizon is set.", what);
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox

// Store-then-process, maintenance: on the consumer's maintenance connection, the reaper
// (claims whose lease expired go back to 'pending', the running row charged an attempt),
// replay (finished rows back to 'pending'), compaction and deletion of old rows, and the
// row counts of stats(). maintenance_loop() runs the reaper and pruning on a timer.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "log.h"
#include "reentry.h"
#include "store_then_process_impl.h"

namespace mqtt_inbox {

void StoreThenProcess::Impl::maintenance_loop() {
  const int64_t reap_every =
      options.reap_interval_ms > 0 ? options.reap_interval_ms : std::max<int64_t>(1, options.lease_ms / 4);
  int64_t next_reap = clock->steady_ms();  // at once: claims of a crashed earlier run
  int64_t next_prune = options.prune_interval_ms > 0 ? clock->steady_ms() : INT64_MAX;
  uint64_t seen = 0;
  while (!stopping.load()) {
    const int64_t now = clock->steady_ms();
    // A corrupt file is never written again (worker_error): no reaping, no pruning.
    const bool unusable = store_unusable();
    if (!unusable && now >= next_reap) {
      int64_t reaped = 0;
      const Status s = reap_now(&reaped);
      if (!s.ok()) worker_error(s);
      if (reaped > 0) notify_workers();
      next_reap = now + reap_every;
    }
    if (!unusable && now >= next_prune) {
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

Status StoreThenProcess::Impl::reap_now(int64_t* reaped) {
  *reaped = 0;
  if (store_unusable()) return unusable_status();  // never touch a corrupt file
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
      bump.bind(2, std::string(detail::kExpiredClaimError) + " (claimant " + run.first + ", lease " +
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

Status StoreThenProcess::Impl::prune_now(StoredPruneResult* out) {
  *out = StoredPruneResult{};
  if (store_unusable()) return unusable_status();  // never touch a corrupt file
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
  if (Status refused = check_dedup_window(); !refused.ok()) return refused;
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

Status StoreThenProcess::reap(int64_t* reaped) {
  if (Status r = detail::refuse_if_in_handler(impl_->inbox, "StoreThenProcess::reap"); !r.ok())
    return r;
  int64_t n = 0;
  const Status s = impl_->reap_now(&n);
  if (reaped) *reaped = n;
  if (s.ok() && n > 0) impl_->notify_workers();
  return s;
}

Status StoreThenProcess::replay(const ReplayFilter& f, ReplayResult* result) {
  if (Status r = detail::refuse_if_in_handler(impl_->inbox, "StoreThenProcess::replay"); !r.ok())
    return r;
  Impl& m = *impl_;
  if (m.store_unusable()) return m.unusable_status();  // never touch a corrupt file
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
  if (Status r = detail::refuse_if_in_handler(impl_->inbox, "StoreThenProcess::prune"); !r.ok())
    return r;
  StoredPruneResult r;
  const Status s = impl_->prune_now(&r);
  if (result) *result = r;
  return s;
}

Status StoreThenProcess::stats(StoreThenProcessStats* out) {
  if (Status r = detail::refuse_if_in_handler(impl_->inbox, "StoreThenProcess::stats"); !r.ok())
    return r;
  Impl& m = *impl_;
  if (m.store_unusable()) return m.unusable_status();  // never touch a corrupt file
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

// The done rows are what recognises a redelivery: the same rule as the Pruner's
// (retention.h), without its margin so that the defaults (7 days each) agree.
Status StoreThenProcess::Impl::check_dedup_window() {
  std::vector<SessionRecord> sessions;
  if (Status s = inbox->list_sessions(&sessions); !s.ok()) return s;
  const SessionRecord* longest = nullptr;
  for (const SessionRecord& r : sessions)
    if (!longest || r.session_expiry_ms > longest->session_expiry_ms) longest = &r;
  if (!longest || options.dedup_retention_ms >= longest->session_expiry_ms) return Status::Ok();
  const std::string what =
      "store-then-process '" + name + "': dedup_retention_ms " +
      std::to_string(options.dedup_retention_ms) + " is shorter than the session expiry of "
      "client '" + detail::printable(longest->client_id) + "' (" +
      std::to_string(longest->session_expiry_ms) + " ms, " + to_string(longest->expiry_source) +
      "): a redelivery after its row was deleted would be processed again. Raise "
      "dedup_retention_ms, lower SubscriberOptions::session_expiry_s, or, for a client id "
      "retired for good, Inbox::forget_session";
  if (!options.allow_dedup_retention_below_session) {
    log->error("RETENTION REFUSED, no stored row deleted: {}", what);
    return Status::InvalidArgument(what);
  }
  if (dedup_override_warned_ms != longest->session_expiry_ms) {
    dedup_override_warned_ms = longest->session_expiry_ms;
    log->warn("RETENTION OVERRIDE: {}. Accepted because allow_dedup_retention_below_session "
              "is set.",
              what);
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox

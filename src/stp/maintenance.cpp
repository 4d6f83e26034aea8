// Store-then-process, maintenance: the reaper (orphaned and expired claims go back to
// 'pending', the running row charged an attempt; which claims, and when, is decided here
// on the monotonic clock), replay (finished rows back to 'pending'), compaction and
// deletion of old rows, and the row counts of stats(), each through the consumer's rows
// in the store (store/stp_rows.h). maintenance_loop() runs the reaper and pruning on a
// timer.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "store/reentry.h"
#include "store/stp_rows.h"
#include "stp/store_then_process_impl.h"
#include "util/log.h"

namespace mqtt_inbox {

void StoreThenProcess::Impl::maintenance_loop() {
  const int64_t reap_every = options.reap_interval_ms > 0
                                 ? options.reap_interval_ms
                                 : std::max<int64_t>(1, options.lease_ms / 4);
  int64_t next_reap = clock->steady_ms();  // at once: the orphans of a crashed earlier run
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
      // A failed pass (the store was busy) is tried again soon: orphans block their
      // aggregates until it succeeds.
      next_reap = now + (s.ok() ? reap_every : std::min(reap_every, options.poll_interval_ms));
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

namespace {

// The instances of this process whose workers may hold claims (set_running).
std::mutex running_mu;
std::set<std::string>& running_instances() {
  static std::set<std::string> instances;
  return instances;
}

}  // namespace

void StoreThenProcess::Impl::set_running(bool running) {
  std::lock_guard<std::mutex> lock(running_mu);
  if (running)
    running_instances().insert(instance);
  else
    running_instances().erase(instance);
}

bool StoreThenProcess::Impl::instance_running(const std::string& instance) {
  std::lock_guard<std::mutex> lock(running_mu);
  return running_instances().count(instance) > 0;
}

// No wall clock here: a step of it in either direction must neither stall the rows of a
// dead worker nor take rows from a live one.
//  - Orphans. Under the Inbox's exclusive lock no other process works the file, so a claim
//    of no running instance of this process belongs to a process (or a pool) that is gone:
//    it goes back at once. That is every claim found at start-up after a crash.
//  - Leases. Any other claim goes back once this reaper has seen its running row (the
//    lowest seq still 'processing': a worker runs its batch in seq order and every
//    finished row leaves 'processing') stay the same for lease_ms of this process's
//    monotonic clock. A reaper counts from when it first saw that row running, so it never
//    returns a claim early, whoever made it; that is also what makes the lease sound
//    between processes sharing a file (exclusive = false), whose monotonic clocks cannot
//    be compared.
// Either way the running row is charged one attempt, so a row that kills its process
// every time is dead-lettered after max_attempts. A worker still alive behind a returned
// claim is fenced off by the row's claim_token (stp/workers.cpp).
Status StoreThenProcess::Impl::reap_now(int64_t* reaped) {
  *reaped = 0;
  if (store_unusable()) return unusable_status();  // never touch a corrupt file
  std::lock_guard<std::mutex> lock(maint_mu);
  const bool exclusive = store->stp_rows().single_process();
  struct Returned {
    std::string claimant;
    bool orphan;
  };
  std::vector<Returned> returned;
  std::map<std::string, Watched> still_watched;
  const Status s = rows->reap(
      [&](const std::vector<detail::LiveClaim>& claims, std::vector<detail::ReturnedClaim>* back) {
        returned.clear();
        still_watched.clear();
        // Read inside the reaper's transaction: a claim committed before it was made by an
        // instance that was registered before its workers started.
        const int64_t now = clock->steady_ms();
        auto give_back = [&](const detail::LiveClaim& c, bool orphan) {
          returned.push_back({c.claimant, orphan});
          back->push_back({c.claimant, c.running_seq,
                           std::string(detail::kExpiredClaimError) + " (claimant " + c.claimant +
                               (orphan ? ", whose process is gone)"
                                       : ", no progress for the lease of " +
                                             std::to_string(options.lease_ms) + " ms)")});
        };
        for (const detail::LiveClaim& c : claims) {
          if (exclusive && !instance_running(detail::claimant_instance(c.claimant))) {
            give_back(c, true);
            continue;
          }
          Watched w{c.running_seq, now};
          if (auto it = watched.find(c.claimant);
              it != watched.end() && it->second.running_seq == c.running_seq)
            w.since_ms = it->second.since_ms;
          if (now - w.since_ms >= options.lease_ms)
            give_back(c, false);
          else
            still_watched.emplace(c.claimant, w);
        }
      },
      reaped);
  if (!s.ok()) return s;
  watched.swap(still_watched);
  if (*reaped > 0) {
    count(&StoreThenProcessCounters::reaped, *reaped);
    const auto orphans =
        std::count_if(returned.begin(), returned.end(), [](const Returned& r) { return r.orphan; });
    log->warn(
        "store-then-process '{}': returned {} claimed row(s) to pending: {} claim(s) of "
        "a process that is gone, {} without progress for the lease ({} ms)",
        name, *reaped, orphans, returned.size() - static_cast<size_t>(orphans), options.lease_ms);
  }
  return s;
}

Status StoreThenProcess::Impl::prune_now(StoredPruneResult* out) {
  *out = StoredPruneResult{};
  if (store_unusable()) return unusable_status();  // never touch a corrupt file
  std::lock_guard<std::mutex> lock(maint_mu);
  const int64_t now = retention_now();
  constexpr int kChunk = 500;  // rows per transaction: each one is short
  for (;;) {
    int64_t changed = 0;
    const Status s = rows->compact_done(now - options.compact_after_ms, kChunk, &changed);
    if (!s.ok()) return s;
    out->compacted += changed;
    if (changed < kChunk) break;
  }
  if (Status refused = check_dedup_window(); !refused.ok()) return refused;
  for (;;) {
    int64_t changed = 0;
    const Status s = rows->delete_finished(now - options.dedup_retention_ms, kChunk, &changed);
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
  Status s;
  {
    std::lock_guard<std::mutex> lock(m.maint_mu);
    s = m.rows->replay(f, &r);
  }
  if (!s.ok()) return s;
  m.log->info(
      "store-then-process '{}': replay reset {} row(s) to pending ({} compacted, {} in "
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
  return m.rows->count(out);
}

// The done rows are what recognises a redelivery: the same rule as the Pruner's
// (retention.h), without its margin so that the defaults (7 days each) agree.
Status StoreThenProcess::Impl::check_dedup_window() {
  std::vector<SessionRecord> sessions;
  if (Status s = inbox->sessions().list(&sessions); !s.ok()) return s;
  const SessionRecord* longest = nullptr;
  for (const SessionRecord& r : sessions)
    if (!longest || r.session_expiry_ms > longest->session_expiry_ms) longest = &r;
  if (!longest || options.dedup_retention_ms >= longest->session_expiry_ms) return Status::Ok();
  const std::string what =
      "store-then-process '" + name + "': dedup_retention_ms " +
      std::to_string(options.dedup_retention_ms) +
      " is shorter than the session expiry of "
      "client '" +
      detail::printable(longest->client_id) + "' (" + std::to_string(longest->session_expiry_ms) +
      " ms, " + to_string(longest->expiry_source) +
      "): a redelivery after its row was deleted would be processed again. Raise "
      "dedup_retention_ms, lower SubscriberOptions::session_expiry_s, or, for a client id "
      "retired for good, SessionRecords::forget";
  if (!options.allow_dedup_retention_below_session) {
    log->error("RETENTION REFUSED, no stored row deleted: {}", what);
    return Status::InvalidArgument(what);
  }
  if (dedup_override_warned_ms != longest->session_expiry_ms) {
    dedup_override_warned_ms = longest->session_expiry_ms;
    log->warn(
        "RETENTION OVERRIDE: {}. Accepted because allow_dedup_retention_below_session "
        "is set.",
        what);
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox

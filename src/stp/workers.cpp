// Store-then-process, the worker pool: each worker claims a batch of stored rows (one
// aggregate key at a time, in arrival order), runs the application's handler in the
// store's transaction that marks the row done, and records failures, retries with backoff
// and dead letters. Which rows a claim takes, what a failure costs and when a row is
// dead-lettered are decided here; every read and write of the rows is the worker's
// session with the store (store/stp_rows.h). start() and stop() own the threads (the
// maintenance thread's loop is in stp/maintenance.cpp).
#include <algorithm>
#include <any>
#include <exception>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "inbox/properties_json.h"
#include "store/lifetime.h"
#include "store/reentry.h"
#include "store/store.h"
#include "store/stp_rows.h"
#include "store/verdict.h"
#include "stp/store_then_process_impl.h"
#include "util/log.h"
#include "util/log_context.h"

namespace mqtt_inbox {

namespace {

int64_t backoff_ms(const ConsumerOptions& o, int attempt) {
  int64_t b = o.retry_backoff_initial.count();
  for (int i = 1; i < attempt && b < o.retry_backoff_max.count(); ++i) b *= 2;
  return std::min<int64_t>(b, o.retry_backoff_max.count());
}

}  // namespace

// Retries a worker-side store operation with capped backoff until it succeeds or the
// pool stops. Returns false if it gave up because of stop().
template <typename Op>
bool StoreThenProcess::Impl::worker_retry(const char* what, Op&& op) {
  int64_t backoff = options.consumer.store_backoff_initial.count();
  for (int tries = 1;; ++tries) {
    const Status s = op();
    if (s.ok()) return true;
    worker_error(s);  // a fatal one latches the store
    // A corrupt file: stop retrying; the row stays claimed and is never finished.
    if (s.is_fatal_store_error() || store_unusable()) return false;
    if (tries == 1 || tries % 20 == 0)
      log->warn("store-then-process '{}': {} failed ({}), retrying", name, what, s.to_string());
    if (stopping.load()) return false;
    clock->sleep_ms(backoff);
    backoff = std::min<int64_t>(backoff * 2, options.consumer.store_backoff_max.count());
  }
}

// Which of the offered rows (store/stp_rows.h ClaimChooser) a claim takes, oldest first.
// The ordering rule: an aggregate with a 'processing' row is not offered at all; within
// an aggregate, rows are taken in seq order up to the first one whose next_attempt_at is
// in the future: a row waiting for its retry blocks the rows after it. A claim takes rows
// of at most ceil(eligible aggregates / workers) aggregates, so the other workers find
// work too.
// `now` and next_attempt_at are on the retention clock, which no wall-clock step moves.
// No row waits longer than retry_backoff_max or dependency_backoff_max, so a
// next_attempt_at further ahead than that was stamped by a clock ahead of this process's (a
// wall-clock stamp of a release before schema version 11, another process's retention clock, a
// clock that restarted from an older persisted value after a crash): the row is due now rather than
// stalled.
void StoreThenProcess::Impl::choose_claim(int64_t now,
                                          const std::vector<detail::ClaimCandidate>& offered,
                                          std::vector<int64_t>* take) const {
  const int64_t longest_wait = std::max(options.consumer.retry_backoff_max.count(),
                                        options.consumer.dependency_backoff_max.count());
  std::vector<std::pair<int64_t, const std::string*>> due;  // (seq, aggregate)
  const std::string* blocked = nullptr;  // the aggregate whose head is not due yet
  for (const detail::ClaimCandidate& c : offered) {
    if (blocked && *blocked == c.aggregate_key) continue;
    blocked = nullptr;
    if (c.next_attempt_at > now && c.next_attempt_at - now <= longest_wait) {
      blocked = &c.aggregate_key;
      continue;
    }
    due.emplace_back(c.seq, &c.aggregate_key);
  }
  std::sort(due.begin(), due.end());
  std::vector<const std::string*> order;  // aggregates by their oldest eligible row
  for (const auto& d : due)
    if (std::find_if(order.begin(), order.end(),
                     [&](const std::string* k) { return *k == *d.second; }) == order.end())
      order.push_back(d.second);
  const size_t workers = static_cast<size_t>(std::max(1, options.workers));
  const size_t take_aggs = std::max<size_t>(1, (order.size() + workers - 1) / workers);
  std::set<std::string> chosen;
  for (size_t i = 0; i < take_aggs && i < order.size(); ++i) chosen.insert(*order[i]);
  for (const auto& d : due)
    if (chosen.count(*d.second)) take->push_back(d.first);
}

Status StoreThenProcess::Impl::claim(Worker& w, const std::string& claimant) {
  std::vector<detail::StoredRow> claimed;
  const Status s = w.session->claim(
      claimant, options.batch_size,
      [this](int64_t now, const std::vector<detail::ClaimCandidate>& offered,
             std::vector<int64_t>* take) { choose_claim(now, offered, take); },
      &claimed);
  w.batch.clear();
  if (!s.ok()) return s;
  for (detail::StoredRow& c : claimed) {
    Row r;
    r.seq = c.claim.seq;
    r.claim_token = c.claim.token;
    r.message_id = std::move(c.message_id);
    r.aggregate_key = std::move(c.aggregate_key);
    DeadLetter shape;  // reuses the dead letter's Message decoding
    shape.topic = std::move(c.topic);
    shape.payload = std::move(c.payload);
    shape.properties_json = std::move(c.properties_json);
    shape.qos = c.qos;
    r.message = detail::message_from_dead_letter(shape);
    r.received_at = c.received_at;
    r.attempts = c.attempts;
    r.last_error = std::move(c.last_error);
    r.expires_at = c.expires_at;
    r.wait = c.wait;
    w.batch.push_back(std::move(r));
  }
  return s;
}

std::vector<detail::RowClaim> StoreThenProcess::Impl::claims_of(const Worker& w,
                                                                const std::string* aggregate) {
  std::vector<detail::RowClaim> out;
  for (const Row& r : w.batch)
    if (!aggregate || r.aggregate_key == *aggregate) out.push_back(r.claim());
  return out;
}

// Dead-letters a claimed row: the dead letter first (on the Inbox's connection), then
// the row's status. A crash in between leaves the row claimed; it is reaped, comes back
// with its attempts used up, and is dead-lettered again, which only bumps the existing
// dead letter's redelivery count. A worker whose claim was reaped meanwhile writes no
// dead letter: the row belongs to the next claim, which may well succeed.
StoreThenProcess::Impl::RunResult StoreThenProcess::Impl::dead_letter_row(Worker& w, const Row& r,
                                                                          DeadLetterReason reason,
                                                                          const std::string& text,
                                                                          int attempts) {
  bool owned = true;
  if (!worker_retry("checking a claim", [&] { return w.session->holds(r.claim(), &owned); }))
    return RunResult::kStopped;
  if (!owned) return RunResult::kLost;
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
                    [&] { return store->add_dead_letter(dl, std::nullopt, &id); }))
    return RunResult::kStopped;
  release_hold(r.seq);
  if (!worker_retry("marking a row dead",
                    [&] { return w.session->mark_dead(r.claim(), attempts, text, &owned); }))
    return RunResult::kStopped;
  count(&StoreThenProcessCounters::dead_lettered);
  log->warn(
      "store-then-process '{}': dead-lettered stored message '{}' (seq {}) as {} "
      "(dead letter {}): {}",
      name, detail::printable(r.message_id), r.seq, to_string(reason), id,
      detail::printable(text, 300));
  return owned ? RunResult::kDead : RunResult::kLost;
}

StoreThenProcess::Impl::RunResult StoreThenProcess::Impl::fail_row(Worker& w, const Row& r,
                                                                   int attempt,
                                                                   const std::string& error) {
  count(&StoreThenProcessCounters::handler_failures);
  release_hold(r.seq);  // a failure ends a wait for a dependency (the row's too: below)
  log->warn("store-then-process '{}': handler failed on '{}' (seq {}, attempt {}/{}): {}", name,
            detail::printable(r.message_id), r.seq, attempt, options.consumer.max_attempts,
            detail::printable(error, 300));
  if (attempt >= options.consumer.max_attempts)
    return dead_letter_row(
        w, r, DeadLetterReason::kHandlerFailed,
        "handler failed " + std::to_string(attempt) + " time(s); last error: " + error, attempt);
  return retry_row_later(w, r, attempt, error, backoff_ms(options.consumer, attempt));
}

StoreThenProcess::Impl::RunResult StoreThenProcess::Impl::retry_row_later(
    Worker& w, const Row& r, int attempts, const std::string& error, int64_t delay_ms,
    const detail::RowWait& wait) {
  bool owned = true;
  // The later rows of this aggregate in the batch must wait for the retry.
  const std::vector<detail::RowClaim> later = claims_of(w, &r.aggregate_key);
  if (!worker_retry("putting a row back to wait", [&] {
        return w.session->retry_later(r.claim(), attempts, error, wait, delay_ms, later, &owned);
      }))
    return RunResult::kStopped;
  return owned ? RunResult::kFailed : RunResult::kLost;
}

std::optional<detail::Expiry> StoreThenProcess::Impl::Row::expiry(ExpiredPolicy policy) const {
  if (policy == ExpiredPolicy::kApply || !expires_at) return std::nullopt;
  detail::Expiry e;
  // The interval as it arrived (the row's properties); the deadline as receipt set it.
  e.interval_s = message.message_expiry_interval_s.value_or(0);
  e.received_at = *expires_at - e.interval_s * 1000;
  return e;
}

StoreThenProcess::Impl::RunResult StoreThenProcess::Impl::expired_row(Worker& w, const Row& r,
                                                                      const detail::Expiry& e,
                                                                      const char* where) {
  count(&StoreThenProcessCounters::expired);
  return dead_letter_row(w, r, DeadLetterReason::kExpired,
                         detail::expired_text(e, retention_now(), where), r.attempts);
}

StoreThenProcess::Impl::RunResult StoreThenProcess::Impl::not_yet_row(Worker& w, const Row& r,
                                                                      const std::string& why) {
  count(&StoreThenProcessCounters::not_yet);
  const int64_t now = retention_now();
  detail::RowWait wait;
  wait.runs = r.wait.runs + 1;
  wait.since = r.wait.runs > 0 ? r.wait.since : now;
  const int64_t delay = detail::not_yet_delay_ms(options.consumer, wait.runs, wait.since, now);
  if (delay < 0)
    return dead_letter_row(w, r, DeadLetterReason::kDependencyUnavailable,
                           detail::dependency_unavailable_text(wait.runs, now - wait.since, why),
                           r.attempts);
  const std::string text = detail::printable(why, 300);
  if (wait.runs == 1)
    log->warn(
        "store-then-process '{}': '{}' (seq {}) waits for a dependency: the handler said "
        "\"not yet\" ({}); rescheduled in {} ms, dead letter dependency_unavailable after {}",
        name, detail::printable(r.message_id), r.seq, text, delay,
        detail::duration_text(options.consumer.dependency_wait_max.count()));
  else
    log->log(wait.runs <= options.consumer.dependency_immediate_attempts ? spdlog::level::debug
                                                                         : spdlog::level::info,
             "store-then-process '{}': '{}' (seq {}) still waits for a dependency ({}, run {}): "
             "{}; rescheduled in {} ms",
             name, detail::printable(r.message_id), r.seq, detail::duration_text(now - wait.since),
             wait.runs, text, delay);
  hold(r, wait, now + delay, why);
  // The row keeps its attempts: "not yet" is not one.
  return retry_row_later(w, r, r.attempts, "not yet: " + why, delay, wait);
}

void StoreThenProcess::Impl::hold(const Row& r, const detail::RowWait& wait, int64_t next_run,
                                  const std::string& why) {
  std::lock_guard<std::mutex> lock(state_mu);
  Held& h = held[r.seq];
  h.message_id = r.message_id;
  h.runs = wait.runs;
  h.since = wait.since;
  h.next_run = next_run;
  h.reason = why;
}

void StoreThenProcess::Impl::release_hold(int64_t seq) {
  std::lock_guard<std::mutex> lock(state_mu);
  held.erase(seq);
}

StoreThenProcess::Impl::RunResult StoreThenProcess::Impl::run_row(Worker& w, const Row& r,
                                                                  const std::string& claimant) {
  detail::LogContextScope log_fields(name);  // CONSUMER= and INBOX_MESSAGE_ID= in the journal
  log_fields.set_message_id(r.message_id);
  const int max_attempts = options.consumer.max_attempts;
  if (r.attempts >= max_attempts) {
    // Used up by expired claims (crashes) or by failures whose dead letter did not
    // finish: do not run it again.
    const bool crashed = r.last_error.rfind(detail::kExpiredClaimError, 0) == 0;
    return dead_letter_row(
        w, r, crashed ? DeadLetterReason::kHandlerCrashed : DeadLetterReason::kHandlerFailed,
        crashed ? "the claim expired on " + std::to_string(r.attempts) +
                      " attempt(s): the worker died or hung inside the handler"
                : "handler failed " + std::to_string(r.attempts) +
                      " time(s); last error: " + r.last_error,
        r.attempts);
  }
  // The message's expiry (store_then_process.h): checked before anything runs, after the
  // PrepareFn (it may be slow) and right before the handler's transaction commits.
  const std::optional<detail::Expiry> expiry = r.expiry(options.consumer.expired);
  if (expiry && expiry->ran_out(retention_now()))
    return expired_row(w, r, *expiry, "in the backlog, before it was processed");
  const int attempt = r.attempts + 1;
  std::any prepared;
  const StoredDelivery pre{r.message,     r.message_id, r.aggregate_key, r.seq,
                           r.received_at, attempt,      prepared};
  if (options.prepare) {
    // A PrepareFn holds no connection: it is judged like a handler but may call anything.
    // No store's classifier applies (it runs in no transaction of the store): whatever it
    // throws that handler.h does not name is a failed attempt.
    const detail::HandlerVerdict v =
        detail::run_handler(nullptr, nullptr, [&] { prepared = options.prepare(pre); });
    if (v.kind == detail::HandlerVerdict::Kind::kDeadLetter)
      return dead_letter_row(w, r, v.reason, v.text, attempt);
    if (v.kind == detail::HandlerVerdict::Kind::kNotYet) return not_yet_row(w, r, v.text);
    if (v.kind != detail::HandlerVerdict::Kind::kOk)
      return fail_row(w, r, attempt, "prepare: " + v.text);
    if (expiry && expiry->ran_out(retention_now()))
      return expired_row(w, r, *expiry, "before its handler ran, after the prepare function");
  }
  if (options.before_handler_hook) options.before_handler_hook(r.message_id);
  const StoredDelivery d{r.message,     r.message_id, r.aggregate_key, r.seq,
                         r.received_at, attempt,      prepared};

  detail::StoredRunResult run;
  const auto expired = [&] { return expiry && expiry->ran_out(retention_now()); };
  const bool stored = worker_retry("running the handler transaction", [&] {
    return w.session->process(r.claim(), claimant, handler, d, expired, &run);
  });
  if (!stored) return RunResult::kStopped;
  switch (run.kind) {
    case detail::StoredRunResult::Kind::kExpired:
      return expired_row(w, r, *expiry, "before its transaction could commit");
    case detail::StoredRunResult::Kind::kDone:
      count(&StoreThenProcessCounters::processed);
      release_hold(r.seq);
      if (options.slow_handler_warn_ms > 0 && run.held_ms > options.slow_handler_warn_ms)
        log->warn(
            "store-then-process '{}': handler on '{}' held the write lock for {} ms; "
            "receipt waited for it (move slow work to a prepare function)",
            name, detail::printable(r.message_id), run.held_ms);
      return RunResult::kDone;
    case detail::StoredRunResult::Kind::kLost:
      return RunResult::kLost;
    case detail::StoredRunResult::Kind::kNotDone:
      break;
  }
  const detail::HandlerVerdict& v = run.verdict;
  switch (v.kind) {
    case detail::HandlerVerdict::Kind::kDeadLetter:
      return dead_letter_row(w, r, v.reason, v.text, attempt);
    case detail::HandlerVerdict::Kind::kNotYet:
      return not_yet_row(w, r, v.text);
    case detail::HandlerVerdict::Kind::kOutboxFull:
      // Backpressure (outbox.h OutboxFull): not an attempt. The row waits at the longest
      // retry backoff; the relay runs on other threads, so room comes while it waits.
      // At info the first time; at debug while it keeps waiting (its last error says so).
      count(&StoreThenProcessCounters::outbox_full_waits);
      log->log(r.last_error == v.text ? spdlog::level::debug : spdlog::level::info,
               "store-then-process '{}': '{}' (seq {}) waits for the relay to make room: {}", name,
               detail::printable(r.message_id), r.seq, detail::printable(v.text, 300));
      return retry_row_later(w, r, r.attempts, v.text, options.consumer.retry_backoff_max.count(),
                             r.wait);
    case detail::HandlerVerdict::Kind::kOk:
    case detail::HandlerVerdict::Kind::kStoreError:  // the store returns these as a Status
    case detail::HandlerVerdict::Kind::kFailed:
      break;
  }
  return fail_row(w, r, attempt, v.text);
}

void StoreThenProcess::Impl::worker_loop(Worker& w) {
  uint64_t seen = 0;
  const std::vector<Row>& batch = w.batch;
  while (!stopping.load()) {
    if (store_unusable()) {  // a corrupt file is never written again (worker_error)
      if (!idle(options.poll_interval_ms, &seen)) break;
      continue;
    }
    const std::string claimant =
        instance + "/w" + std::to_string(w.index) + "/" + std::to_string(next_claim.fetch_add(1));
    Status s = claim(w, claimant);
    if (!s.ok()) {
      worker_error(s);
      if (!idle(options.poll_interval_ms, &seen)) break;
      continue;
    }
    if (batch.empty()) {
      if (!idle(options.poll_interval_ms, &seen)) break;
      continue;
    }
    std::set<std::string> blocked;  // aggregates whose earlier row failed or was lost
    bool released = false;
    for (const Row& r : batch) {
      if (stopping.load()) {
        const std::vector<detail::RowClaim> all = claims_of(w, nullptr);
        if (!worker_retry("releasing rows at stop", [&] { return w.session->release(all); }))
          log->warn(
              "store-then-process '{}': could not release claimed rows at stop; they "
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
  // The session (its connection) closes with this thread.
}

Status StoreThenProcess::start() {
  Impl& m = *impl_;
  if (Status r = detail::refuse_if_in_handler(m.inbox, "StoreThenProcess::start"); !r.ok())
    return r;
  {
    std::lock_guard<std::mutex> lock(m.run_mu);
    if (m.started) return Status::InvalidArgument("already started");
  }
  std::vector<std::unique_ptr<Impl::Worker>> workers;
  // At start-up: waited out like Inbox::open while the store is transiently unavailable.
  // run_mu is not held meanwhile: receipt's wake-up (notify_workers) and stop() must not
  // wait for the store.
  const Status opened = m.store->wait_at_startup(
      "opening the store-then-process worker connections", [&](int) -> Status {
        workers.clear();
        for (int i = 0; i < m.options.workers; ++i) {
          auto w = std::make_unique<Impl::Worker>();
          w->index = i;
          if (Status s = m.rows->open_worker(m.options.worker_synchronous, &w->session); !s.ok()) {
            workers.clear();
            return s;
          }
          workers.push_back(std::move(w));
        }
        return Status::Ok();
      });
  if (!opened.ok()) return opened;
  std::lock_guard<std::mutex> lock(m.run_mu);
  if (m.started) return Status::InvalidArgument("already started");  // a concurrent start()
  m.stopping = false;
  m.started = true;
  m.instance = m.token + "." + std::to_string(++m.runs);
  // Before any claim: the reaper (of this or another pool of this process) must never
  // take this pool's claims for orphans.
  m.set_running(true);
  for (auto& w : workers) {
    m.threads.emplace_back(
        [&m, worker = std::shared_ptr<Impl::Worker>(std::move(w))] { m.worker_loop(*worker); });
  }
  m.threads.emplace_back([&m] { m.maintenance_loop(); });
  m.log->info("store-then-process '{}': started {} worker(s)", m.name, m.options.workers);
  return Status::Ok();
}

Status StoreThenProcess::stop() {
  Impl& m = *impl_;
  // From a worker's handler, stop() would join its own thread.
  if (Status r = detail::refuse_if_in_handler(m.inbox, "StoreThenProcess::stop"); !r.ok()) return r;
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
  // Claims the workers could not release are orphans from now on (reaped at once by
  // another pool of this process under the exclusive lock, or at the next start).
  m.set_running(false);
  return Status::Ok();
}

}  // namespace mqtt_inbox

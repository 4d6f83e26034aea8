// Store-then-process, the worker pool: each worker claims a batch of stored rows (one
// aggregate key at a time, in arrival order), holds the claim as a lease it renews per
// row, runs the application's handler in the transaction that marks the row done, and
// records failures, retries with backoff and dead letters. start() and stop() own the
// threads (the maintenance thread's loop is in stp/maintenance.cpp).
#include <sqlite3.h>

#include "store/sqlite/store.h"
#include "store/sqlite/errors.h"

#include <algorithm>
#include <any>
#include <exception>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store/verdict.h"
#include "util/log.h"
#include "util/log_context.h"
#include "inbox/properties_json.h"
#include "store/dead_letters.h"
#include "store/reentry.h"
#include "stp/store_then_process_impl.h"

namespace mqtt_inbox {

namespace {

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
// lease is timed in the reaper's memory (stp/maintenance.cpp).
constexpr const char* kClaimRowSql =
    "UPDATE inbox_messages SET status = 'processing', claimed_at = ?2, claimant = ?3,"
    "       claim_token = claim_token + 1"
    " WHERE seq = ?1 AND status = 'pending'"
    " RETURNING message_id, aggregate_key, topic, payload, properties, qos, received_at,"
    "           attempts, last_error, claim_token";

constexpr const char* kOwnedSql =
    "SELECT EXISTS(SELECT 1 FROM inbox_messages"
    "              WHERE seq = ?1 AND status = 'processing' AND claim_token = ?2)";

constexpr const char* kDoneSql =
    "UPDATE inbox_messages SET status = 'done', attempts = ?2, done_at = ?3,"
    "       last_error = NULL, next_attempt_at = 0"
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

// next_attempt_at is on the retention clock (candidates() says how it is read).
constexpr const char* kFailedSql =
    "UPDATE inbox_messages SET status = 'pending', attempts = ?2, last_error = ?3,"
    "       next_attempt_at = ?4, claimant = NULL, claimed_at = NULL"
    " WHERE seq = ?1 AND status = 'processing' AND claim_token = ?5";

// Releases a claimed row without counting an attempt (stop, or a row of an aggregate whose
// earlier row just failed).
constexpr const char* kReleaseSql =
    "UPDATE inbox_messages SET status = 'pending', claimant = NULL, claimed_at = NULL"
    " WHERE seq = ?1 AND status = 'processing' AND claim_token = ?2";

constexpr const char* kDeadSql =
    "UPDATE inbox_messages SET status = 'dead', attempts = ?2, last_error = ?3, done_at = ?4"
    " WHERE seq = ?1 AND status = 'processing' AND claim_token = ?5";

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
    worker_error(s);  // a fatal one latches the Inbox
    // A corrupt file: stop retrying; the row stays claimed and is never finished.
    if (s.is_fatal_store_error() || store_unusable()) return false;
    if (tries == 1 || tries % 20 == 0)
      log->warn("store-then-process '{}': {} failed ({}), retrying", name, what, s.to_string());
    if (stopping.load()) return false;
    clock->sleep_ms(backoff);
    backoff = std::min<int64_t>(backoff * 2, options.consumer.store_backoff_max.count());
  }
}

void StoreThenProcess::Impl::prepare_worker(Worker& w) {
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
// `now` and next_attempt_at are on the retention clock, which no wall-clock step moves.
// No row waits longer than retry_backoff_max, so a next_attempt_at further ahead than
// that was stamped by a clock ahead of this process's (a wall-clock stamp of a release
// before schema version 11, another process's retention clock, a clock that restarted
// from an older persisted value after a crash): the row is due now rather than stalled.
std::vector<std::pair<int64_t, std::string>> StoreThenProcess::Impl::candidates(Worker& w,
                                                                               int64_t now) {
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
    const int64_t longest_wait = options.consumer.retry_backoff_max.count();
    while (h.executeStep()) {
      const int64_t due = h.getColumn(1).getInt64();
      if (due > now && due - now <= longest_wait) break;
      out.emplace_back(h.getColumn(0).getInt64(), *key);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Claims a batch: rows of at most ceil(eligible aggregates / workers) aggregates (so
// the other workers find work too), oldest first, up to batch_size rows.
Status StoreThenProcess::Impl::claim(Worker& w, const std::string& claimant) {
  std::vector<Row>* rows = &w.batch;
  rows->clear();
  const int64_t now = retention_now();
  w.set_sync(Synchronous::kNormal);
  return transaction(*w.db, "claiming rows", [&] {
    rows->clear();  // a retried transaction starts afresh
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
      q.bind(2, clock->wall_ms());
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
      r.claim_token = q.getColumn(9).getInt64();
      while (q.executeStep()) {
      }
      rows->push_back(std::move(r));
    }
  });
}

bool StoreThenProcess::Impl::still_owned(Worker& w, const Row& r) {
  SQLite::Statement& q = *w.owned;
  detail::StatementReset reset(q);
  q.bind(1, r.seq);
  q.bind(2, r.claim_token);
  return q.executeStep() && q.getColumn(0).getInt() != 0;
}

void StoreThenProcess::Impl::release_rows(Worker& w, const std::string* aggregate) {
  SQLite::Statement& q = *w.release;
  for (const Row& r : w.batch) {
    if (aggregate && r.aggregate_key != *aggregate) continue;
    detail::StatementReset reset(q);
    q.bind(1, r.seq);
    q.bind(2, r.claim_token);
    q.exec();  // a finished or reaped row no longer matches
  }
}

Status StoreThenProcess::Impl::release(Worker& w, const std::string* aggregate) {
  w.set_sync(Synchronous::kNormal);
  return transaction(*w.db, "releasing rows", [&] { release_rows(w, aggregate); });
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
  if (!worker_retry("checking a claim", [&]() -> Status {
        try {
          owned = still_owned(w, r);
        } catch (const SQLite::Exception& e) {
          return detail::to_status(e, "checking a claim");
        }
        return Status::Ok();
      }))
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
                    [&] { return inbox->store().dead_letters().add(dl, std::nullopt, &id); }))
    return RunResult::kStopped;
  w.set_sync(w.handler_sync);
  if (!worker_retry("marking a row dead", [&] {
        return transaction(*w.db, "marking a row dead", [&] {
          SQLite::Statement& q = *w.dead;
          detail::StatementReset reset(q);
          q.bind(1, r.seq);
          q.bind(2, attempts);
          q.bind(3, text);
          q.bind(4, retention_now());
          q.bind(5, r.claim_token);
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

StoreThenProcess::Impl::RunResult StoreThenProcess::Impl::fail_row(Worker& w, const Row& r,
                                                                   int attempt,
                                                                   const std::string& error) {
  count(&StoreThenProcessCounters::handler_failures);
  log->warn("store-then-process '{}': handler failed on '{}' (seq {}, attempt {}/{}): {}", name,
            detail::printable(r.message_id), r.seq, attempt, options.consumer.max_attempts,
            detail::printable(error, 300));
  if (attempt >= options.consumer.max_attempts)
    return dead_letter_row(
        w, r, DeadLetterReason::kHandlerFailed,
        "handler failed " + std::to_string(attempt) + " time(s); last error: " + error, attempt);
  return retry_row_later(w, r, attempt, error, backoff_ms(options.consumer, attempt));
}

StoreThenProcess::Impl::RunResult StoreThenProcess::Impl::retry_row_later(Worker& w, const Row& r,
                                                                          int attempts,
                                                                          const std::string& error,
                                                                          int64_t delay_ms) {
  bool owned = true;
  w.set_sync(Synchronous::kNormal);
  if (!worker_retry("putting a row back to wait", [&] {
        return transaction(*w.db, "putting a row back to wait", [&] {
          {
            SQLite::Statement& q = *w.failed;
            detail::StatementReset reset(q);
            q.bind(1, r.seq);
            q.bind(2, attempts);
            q.bind(3, error);
            q.bind(4, retention_now() + delay_ms);
            q.bind(5, r.claim_token);
            owned = q.exec() > 0;
          }
          // The later rows of this aggregate in the batch must wait for the retry.
          release_rows(w, &r.aggregate_key);
        });
      }))
    return RunResult::kStopped;
  return owned ? RunResult::kFailed : RunResult::kLost;
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
  const int attempt = r.attempts + 1;
  std::any prepared;
  const StoredDelivery pre{r.message, r.message_id, r.aggregate_key, r.seq, r.received_at,
                           attempt, prepared};
  if (options.prepare) {
    // A PrepareFn holds no connection: it is judged like a handler but may call anything.
    const detail::HandlerVerdict v =
        detail::run_handler(nullptr, &detail::classify_sqlite_exception, [&] { prepared = options.prepare(pre); });
    if (v.kind == detail::HandlerVerdict::Kind::kDeadLetter)
      return dead_letter_row(w, r, v.reason, v.text, attempt);
    if (v.kind != detail::HandlerVerdict::Kind::kOk)
      return fail_row(w, r, attempt, "prepare: " + v.text);
  }
  if (options.before_handler_hook) options.before_handler_hook(r.message_id);
  const StoredDelivery d{r.message, r.message_id, r.aggregate_key, r.seq, r.received_at,
                         attempt, prepared};

  enum { kOk, kLostClaim, kThrew, kDeadLetter, kOutboxFull } result = kOk;
  std::string error;
  DeadLetterReason reason = DeadLetterReason::kHandlerFailed;
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
      // The fence: the row must still carry this claim's token. Checked under the write
      // lock that the commit below keeps, so no reaper can come between.
      if (!still_owned(w, r)) {
        detail::rollback_quietly(db);
        result = kLostClaim;
        return Status::Ok();
      }
      // The worker's transaction holds SQLite's write lock: a call back into the inbox
      // from the handler would wait for it (store/reentry.h).
      const detail::HandlerVerdict v = detail::run_handler(inbox, &detail::classify_sqlite_exception, [&] { handler(db, d); });
      if (v.kind != detail::HandlerVerdict::Kind::kOk) {
        detail::rollback_quietly(db);
        if (v.kind == detail::HandlerVerdict::Kind::kStoreError) return v.store;  // retry
        result = v.kind == detail::HandlerVerdict::Kind::kDeadLetter   ? kDeadLetter
                 : v.kind == detail::HandlerVerdict::Kind::kOutboxFull ? kOutboxFull
                                                                       : kThrew;
        reason = v.reason;
        error = v.text;
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
        q.bind(4, r.claim_token);
        if (q.exec() != 1) {  // the handler itself changed the row: not ours any more
          detail::rollback_quietly(db);
          result = kLostClaim;
          return Status::Ok();
        }
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
      // The row's change refused at COMMIT (a deferred foreign key, a CHECK, a commit
      // hook): a failed attempt of this row, not a store failure to retry forever.
      if (detail::error_class(e.getErrorCode()) == detail::ErrorClass::kMessage) {
        result = kThrew;
        error = std::string("the store refused this row's transaction: ") + e.what();
        return Status::Ok();
      }
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
    case kDeadLetter:
      return dead_letter_row(w, r, reason, error, attempt);
    case kOutboxFull:
      // Backpressure (outbox.h OutboxFull): not an attempt. The row waits at the longest
      // retry backoff; the relay runs on other threads, so room comes while it waits.
      // At info the first time; at debug while it keeps waiting (its last error says so).
      count(&StoreThenProcessCounters::outbox_full_waits);
      log->log(r.last_error == error ? spdlog::level::debug : spdlog::level::info,
               "store-then-process '{}': '{}' (seq {}) waits for the relay to make room: {}",
               name, detail::printable(r.message_id), r.seq, detail::printable(error, 300));
      return retry_row_later(w, r, r.attempts, error, options.consumer.retry_backoff_max.count());
    case kThrew:
      break;
  }
  return fail_row(w, r, attempt, error);
}

void StoreThenProcess::Impl::worker_loop(Worker& w) {
  uint64_t seen = 0;
  const std::vector<Row>& rows = w.batch;
  while (!stopping.load()) {
    if (store_unusable()) {  // a corrupt file is never written again (worker_error)
      if (!idle(options.poll_interval_ms, &seen)) break;
      continue;
    }
    const std::string claimant = instance + "/w" + std::to_string(w.index) + "/" +
                                 std::to_string(next_claim.fetch_add(1));
    Status s = claim(w, claimant);
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
        if (!worker_retry("releasing rows at stop", [&] { return release(w, nullptr); }))
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
  close_quietly_if_unusable(w.db.get());  // the connection closes with this thread
}

Status StoreThenProcess::start() {
  Impl& m = *impl_;
  if (Status r = detail::refuse_if_in_handler(m.inbox, "StoreThenProcess::start"); !r.ok()) return r;
  {
    std::lock_guard<std::mutex> lock(m.run_mu);
    if (m.started) return Status::InvalidArgument("already started");
  }
  std::vector<std::unique_ptr<Impl::Worker>> workers;
  // At start-up: waited out like Inbox::open while the store is transiently unavailable.
  // run_mu is not held meanwhile: receipt's wake-up (notify_workers) and stop() must not
  // wait for the store.
  const Status opened = detail::sqlite_store(m.inbox).wait_at_startup(
      "opening the store-then-process worker connections", [&](int) -> Status {
        workers.clear();
        try {
          for (int i = 0; i < m.options.workers; ++i) {
            auto w = std::make_unique<Impl::Worker>();
            w->index = i;
            w->db = m.open_connection(std::nullopt);
            m.prepare_worker(*w);
            workers.push_back(std::move(w));
          }
        } catch (const SQLite::Exception& e) {
          workers.clear();
          return detail::to_status(e, "opening a worker connection to " + m.inbox->path());
        } catch (const std::exception& e) {
          workers.clear();
          return Status::Internal(std::string("opening a worker connection: ") + e.what());
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

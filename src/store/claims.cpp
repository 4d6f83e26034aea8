// The claim decision of one delivery (Store::process, Store::lookup), once for every
// store: what is recorded for the id decides between a duplicate, a dead letter, attempts
// exhausted and a run of the handler; the handler runs under its contract
// (store/contract.h) in the same transaction as the claim; a failed attempt is counted
// before the call returns. The backend (store/backend.h) supplies the statements.
// docs/design.md#the-claim-transaction and #attempts-and-crash-loops say why.
#include <chrono>
#include <optional>
#include <string>

#include "mqtt_inbox/inbox.h"
#include "store/backend.h"
#include "store/claims.h"
#include "store/contract.h"
#include "store/reentry.h"
#include "store/store.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

namespace {

int64_t since_us(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

std::string refused_text(const std::string& why) {
  return "the store refused this message's transaction: " + why;
}

}  // namespace

Status Store::lookup(const std::string& consumer, const std::string& message_id,
                     MessageState* out) {
  const ClaimKey key{consumer, message_id};
  bool processed = false;
  const Status s = on_connection("looking up message", [&] {
    backend_->begin_read();
    try {
      processed = backend_->read_state(key, out);
    } catch (...) {
      backend_->end_read();
      throw;
    }
    backend_->end_read();
  });
  if (s.ok() && processed) ++duplicates_;  // the caller skips it as a duplicate
  return s;
}

Status Store::process(const std::string& consumer, const Message& message,
                      const std::string& message_id, const TransactionHandler& handler,
                      int max_attempts, std::optional<int64_t> replayed_dead_letter,
                      const nlohmann::json* payload_json, const Expiry* expiry,
                      ProcessReport* report) {
  if (Status r = refuse_if_in_handler(owner_, "Store::process"); !r.ok()) return r;
  if (unusable()) return fatal_status();
  if (options_.before_claim_hook) options_.before_claim_hook(consumer, message_id);
  *report = ProcessReport{};
  const ClaimKey key{consumer, message_id};
  StoreBackend& b = *backend_;
  std::lock_guard<std::mutex> lock(b.mu);
  const auto started = std::chrono::steady_clock::now();
  bool decided = false;  // the transaction decided without running the handler
  bool marked = false;   // the backend records the running attempt outside the database
  bool counted = false;  // this attempt is committed in the attempts already
  Status s = locked("claim transaction", [&] {
    b.begin(/*for_handler=*/true);
    if (!b.insert_claim(key, message, /*only_if_nothing_recorded=*/true)) {
      // A duplicate, or something is recorded for the id: read what (the slow path).
      if (b.read_state(key, &report->state)) {
        if (replayed_dead_letter) {
          // The replayed message's effect is already committed: close its dead letter, so
          // a requeued row always ends (Consumer::replay_requeued).
          b.mark_replayed(*replayed_dead_letter);
          std::string why;
          b.commit(nullptr, &why);
        } else {
          b.rollback();
        }
        report->result = ClaimResult::kDuplicate;
        decided = true;
        return;
      }
      if (report->state.dead_letter_id && !replayed_dead_letter) {
        b.rollback();
        report->result = ClaimResult::kDeadLettered;
        decided = true;
        return;
      }
      if (report->state.attempts >= max_attempts) {
        b.rollback();
        report->result = ClaimResult::kAttemptsExhausted;
        decided = true;
        return;
      }
      if (!b.insert_claim(key, message, false)) {
        // A concurrent claim committed between the two statements (a store several
        // processes write: its transaction waited for ours' lock, then skipped).
        b.rollback();
        report->result = ClaimResult::kDuplicate;
        decided = true;
        return;
      }
    }
    // The message's lifetime, decided with the claim in hand (after the write lock and any
    // wait for it): a message whose expiry ran out is never applied (store/lifetime.h).
    if (expiry) {
      const int64_t now = retention_clock();
      if (expiry->ran_out(now)) {
        b.rollback();
        report->result = ClaimResult::kExpired;
        report->handler_error = expired_text(*expiry, now, "before its handler ran");
        decided = true;
        return;
      }
    }
    report->attempt = report->state.attempts + 1;
    marked = b.mark_running(key);
    // Without a marker, a run that may follow a death inside the handler is counted before
    // it starts, committed: a redelivery (the broker resends what a dead process did not
    // ack, with DUP set) and an id with attempts recorded. A first delivery is not, so
    // that it costs one transaction on every store; a message that kills its process on
    // every run is dead-lettered after max_attempts counted runs plus the first.
    if (!marked && (message.dup || report->state.attempts > 0)) {
      b.rollback();
      report->attempt = b.count_attempt(key, nullptr);
      counted = true;
      b.begin(/*for_handler=*/true);
      if (!b.insert_claim(key, message, false)) {
        // A concurrent delivery committed meanwhile: our attempt row goes with it.
        b.delete_attempts(key);
        std::string why;
        b.commit(nullptr, &why);
        report->result = ClaimResult::kDuplicate;
        decided = true;
      }
    }
  });
  if (!s.ok()) {
    if (marked) b.clear_running();
    if (s.code() != Status::Code::kRejected) return s;
    // The store refused the claim itself because of this message (a constraint): a failed
    // attempt, not a store failure.
    report->result = ClaimResult::kHandlerFailed;
    report->handler_error = refused_text(s.message());
    s = Status::Ok();
  } else if (decided) {
    if (report->result == ClaimResult::kDuplicate) ++duplicates_;
    return s;
  } else {
    s = run_claim(key, message, report->attempt, handler,
                  /*delete_attempts=*/counted || report->state.attempts > 0, replayed_dead_letter,
                  payload_json, expiry, report);
  }
  if (s.ok() && report->result == ClaimResult::kHandlerFailed)
    s = count_failed_attempt(key, counted, report);
  // "Not yet" is not an attempt: one committed before the run (no marker) is taken back.
  // A run that dies instead stays counted, as any other.
  if (s.ok() && counted && report->result == ClaimResult::kNotYet)
    s = locked("taking back an attempt", [&] { b.uncount_attempt(key); });
  const bool committed = s.ok() && report->result == ClaimResult::kProcessed;
  // After a commit the marker may stay: the next open skips an id that is processed, and
  // the next message overwrites it (one store instead of two).
  if (marked && !committed) b.clear_running();
  if (committed) {
    record_commit(since_us(started));
    if (options_.after_commit_hook) options_.after_commit_hook(consumer, message_id);
  }
  return s;
}

Status Store::count_failed_attempt(const ClaimKey& key, bool counted, ProcessReport* report) {
  // The attempt failed and was rolled back: count it (a marker only counted it while the
  // handler ran), so the next delivery knows how many are left.
  Status s = locked("recording attempt failure", [&] {
    if (!counted)
      report->attempt = backend_->count_attempt(key, &report->handler_error);
    else
      backend_->mark_attempt_failed(key, report->handler_error);
  });
  if (s.ok()) ++retries_;
  return s;
}

Status Store::run_claim(const ClaimKey& key, const Message& message, int attempt,
                        const TransactionHandler& handler, bool delete_attempts,
                        std::optional<int64_t> replayed_dead_letter,
                        const nlohmann::json* payload_json, const Expiry* expiry,
                        ProcessReport* report) {
  // Called with the lock held, the transaction open and the claim inserted. Every path
  // ends the transaction.
  StoreBackend& b = *backend_;
  const Delivery delivery{message, key.message_id, attempt, payload_json};
  HandlerRun run;
  b.run_handler(
      owner_, [&](const TxnRef& txn) { handler(txn, delivery); }, &run);
  judge_contract(&run);
  if (!run.reset.empty())
    log_->warn(
        "consumer '{}', message '{}': the handler left {} statement(s) stepped on the inbox's "
        "connection (first: {}); the library reset them (handler.h: finalize or reset every "
        "statement)",
        printable(key.consumer), printable(key.message_id), run.reset.size(),
        printable(run.reset.front(), 200));
  // A run that did not go well: rolled back, and reported as the verdict says.
  const auto not_done = [&]() -> Status {
    const HandlerVerdict& v = run.verdict;
    b.rollback();
    if (v.kind == HandlerVerdict::Kind::kStoreError) return store_error(v.store);
    if (run.left == TxnLeft::kEnded || run.left == TxnLeft::kClosed)
      log_->error("consumer '{}', message '{}': {}", printable(key.consumer),
                  printable(key.message_id), v.text);
    report->result = v.kind == HandlerVerdict::Kind::kFailed       ? ClaimResult::kHandlerFailed
                     : v.kind == HandlerVerdict::Kind::kOutboxFull ? ClaimResult::kOutboxFull
                     : v.kind == HandlerVerdict::Kind::kNotYet     ? ClaimResult::kNotYet
                                                                   : ClaimResult::kDeadLetterNow;
    report->reason = v.reason;
    report->handler_error = v.text;
    return Status::Ok();
  };
  if (run.verdict.kind != HandlerVerdict::Kind::kOk) return not_done();
  // The expiry once more, right before the commit that applies it: the handler's run (a
  // PostgreSQL statement waiting for a row lock, say) may have outlasted it.
  if (expiry) {
    const int64_t now = retention_clock();
    if (expiry->ran_out(now)) {
      b.rollback();
      report->result = ClaimResult::kExpired;
      report->handler_error = expired_text(*expiry, now, "before its claim could commit");
      return Status::Ok();
    }
  }
  bool refused = false;
  std::optional<std::string> ended;  // the handler ended the transaction, as found here
  Status s = locked("claim transaction", [&] {
    try {
      if (delete_attempts) b.delete_attempts(key);
      if (replayed_dead_letter) b.mark_replayed(*replayed_dead_letter);
      std::string why;
      if (b.commit(&key, &why) == CommitOutcome::kRefused) {
        refused = true;
        report->handler_error = refused_text(why);
      }
    } catch (const TransactionNotOurs& e) {
      ended = e.what();
    }
  });
  if (ended) {
    run.left = TxnLeft::kEnded;
    run.how = *ended;
    judge_contract(&run);
    return not_done();
  }
  if (!s.ok()) {
    if (s.code() != Status::Code::kRejected) return s;
    refused = true;
    report->handler_error = refused_text(s.message());
  }
  if (refused) {
    report->result = ClaimResult::kHandlerFailed;
    return Status::Ok();
  }
  report->result = ClaimResult::kProcessed;
  ++processed_;
  note_commit();
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

// Internal: the claims, the store's record of which messages each consumer has processed,
// and the attempts that lead to one. A ClaimStore owns the claim transaction: the claim
// of (consumer, message id), unique per pair, the application's handler run inside the
// same transaction, and the commit that makes both durable at once
// (docs/design.md#the-claim-transaction). It also counts handler attempts, across
// restarts and across a handler that kills the process, so that the policy can stop a
// crash loop (docs/design.md#attempts-and-crash-loops).
//
// The store records and reports; what a result means (retry, dead letter, duplicate) is
// the per-message policy's (inbox/consumer.cpp). Times written with a claim come from
// the store's retention clock (Store::retention_clock).
//
// Thread safety: implementations are thread-safe; calls are serialised on the store's
// connection. A call from inside a handler the store runs is refused with
// kInvalidArgument naming it (store/reentry.h). Errors: a non-OK Status is the store's own
// failure (nothing committed; the caller retries later, and a handler failure is then
// not counted); the handler's failures come back in the result.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/status.h"
#include "store/txn.h"

namespace mqtt_inbox::detail {

// What the store knows about (consumer, message id) before a delivery is processed.
struct MessageState {
  bool processed = false;                 // a claim exists
  std::optional<int64_t> dead_letter_id;  // a dead letter with status 'dead' or
                                          // 'requeued' exists
  int attempts = 0;                       // attempts recorded so far (0 = none)
  bool last_attempt_running = false;      // the last attempt never finished: the process
                                          // died inside the handler
  std::string last_error;                 // error text of the last failed attempt
  int64_t first_attempt_at_ms = 0;        // wall clock, Unix ms
};

// Result of one claim transaction.
enum class ClaimResult {
  kProcessed,          // claim inserted, handler ran, committed
  kDuplicate,          // the claim was there already: rolled back, handler not run
  kHandlerFailed,      // handler threw (not a store error): rolled back
  kUndecodable,        // handler threw UndecodablePayload: rolled back
  kRejected,           // handler threw RejectMessage: rolled back (dead letter
                       // invalid_payload at once)
  kReentered,          // handler called back into its inbox (handler.h): rolled back
                       // (dead letter handler_reentered at once)
  kOutboxRefused,      // handler threw OutboxRefused (outbox.h): rolled back (dead letter
                       // outbox_refused at once)
  kDeadLettered,       // process() only: the id has a dead letter ('dead'): rolled back,
                       // handler not run
  kAttemptsExhausted,  // process() only: max_attempts attempts are recorded for the id:
                       // rolled back, handler not run
  kOutboxFull,         // handler threw OutboxFull (a full kReject outbox class): rolled
                       // back and, in process(), no failure recorded: the message is not
                       // at fault (the Consumer parks it, dead_letter.h kOutboxFull, which
                       // also clears an attempt committed before the handler ran)
};

// What ClaimStore::process() found and did for one delivery.
struct ProcessReport {
  ClaimResult result = ClaimResult::kHandlerFailed;
  // The attempt the handler ran as: 1-based, counting the attempts of earlier processes;
  // 0 if the handler did not run.
  int attempt = 0;
  // What was recorded for the id before this delivery (claim, attempts, a dead letter).
  // Read only when the claim did not go through at once: all zero for a first delivery.
  MessageState state;
  // The handler's exception text, for kHandlerFailed, kUndecodable, kRejected and
  // kOutboxRefused; the refused call, for kReentered.
  std::string handler_error;
};

// The claim result of a handler that asked for (or earned) an immediate dead letter as
// `reason` (HandlerVerdict::kDeadLetter, store/verdict.h); one mapping for every store.
inline ClaimResult claim_result_for(DeadLetterReason reason) {
  switch (reason) {
    case DeadLetterReason::kInvalidPayload:
      return ClaimResult::kRejected;
    case DeadLetterReason::kHandlerReentered:
      return ClaimResult::kReentered;
    case DeadLetterReason::kOutboxRefused:
      return ClaimResult::kOutboxRefused;
    default:
      return ClaimResult::kUndecodable;
  }
}

// The payload's fingerprint a claim keeps with InboxOptions::record_metadata: 64-bit
// FNV-1a, cheap, for debugging (not security); the same on every store.
inline int64_t claim_payload_hash(const std::string& bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return static_cast<int64_t>(h);
}

class ClaimStore {
 public:
  virtual ~ClaimStore() = default;

  // One delivery in one transaction, what the Consumer calls for every message. Claims
  // (consumer, message_id) unless something is recorded for the id; if something is, it
  // reads what in the same transaction: a claim (kDuplicate), a dead letter (kDeadLettered,
  // unless `replayed_dead_letter` is set) or `max_attempts` attempts (kAttemptsExhausted),
  // all without running the handler. Otherwise runs `handler` inside the transaction as
  // attempt report->attempt, clears the id's attempts, marks `replayed_dead_letter`
  // (if set) replayed, and commits. A first delivery costs one transaction and one
  // durable commit. A failed attempt is counted before this returns; one that kills the
  // process is counted at the next open. If the claim exists and `replayed_dead_letter`
  // is set, that dead letter is marked replayed (its effect is committed already).
  // `payload_json`: the payload's parse if the caller made one, handed to the handler as
  // Delivery::payload_json; may be null; must stay valid during the call.
  virtual Status process(const std::string& consumer, const Message& message,
                         const std::string& message_id, const StoreHandler& handler,
                         int max_attempts, std::optional<int64_t> replayed_dead_letter,
                         const nlohmann::json* payload_json, ProcessReport* report) = 0;

  // Reads what is recorded for (consumer, message_id) into *out. A read only: it never
  // blocks a writer. A processed id counts as a duplicate (InboxStats::duplicates): the
  // caller skips it.
  virtual Status lookup(const std::string& consumer, const std::string& message_id,
                        MessageState* out) = 0;

  // The claim transaction alone, for a policy that counts attempts itself (begin_attempt
  // before it): claims (consumer, message_id); if the claim exists, kDuplicate without
  // running the handler; else runs `handler` as `attempt`, clears the id's attempts, marks
  // `replayed_dead_letter` (if set) replayed and commits. It neither reads nor counts
  // attempts. The handler's failures come back as *result, with the exception text in
  // *handler_error.
  virtual Status claim(const std::string& consumer, const Message& message,
                       const std::string& message_id, int attempt, const StoreHandler& handler,
                       std::optional<int64_t> replayed_dead_letter, ClaimResult* result,
                       std::string* handler_error) = 0;

  // Counts the start of one more attempt for (consumer, message_id) (state 'running')
  // and commits it before returning, durable against a crash of the process (after a
  // power loss it may be missing: one extra attempt at most). *attempt receives the new
  // count, 1-based.
  virtual Status begin_attempt(const std::string& consumer, const std::string& message_id,
                               int* attempt) = 0;

  // Marks the running attempt of (consumer, message_id) failed with `error`, with the
  // same durability as begin_attempt.
  virtual Status record_attempt_failure(const std::string& consumer, const std::string& message_id,
                                        const std::string& error) = 0;

  // The number of claims `consumer` holds now (rows not yet pruned) in *rows.
  virtual Status count_claims(const std::string& consumer, int64_t* rows) = 0;
};

}  // namespace mqtt_inbox::detail

// Internal: the claims, the store's record of which messages each consumer has processed,
// and the attempts that lead to one: the types of the claim decision (Store::process,
// store/claims.cpp). A claim of (consumer, message id), unique per pair, is made in the
// same transaction as the application's handler runs, and the commit makes both durable
// at once (docs/design.md#the-claim-transaction). Handler attempts are counted across
// restarts and across a handler that kills the process, so that the policy can stop a
// crash loop (docs/design.md#attempts-and-crash-loops).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/status.h"

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
  kHandlerFailed,      // handler threw (not a store error), or the store refused its change
                       // at commit: rolled back, one failed attempt counted
  kDeadLetterNow,      // the handler asked for (or earned) a dead letter at once, as
                       // ProcessReport::reason (UndecodablePayload, RejectMessage,
                       // OutboxRefused, a call back into its inbox, a transaction it
                       // ended): rolled back
  kDeadLettered,       // the id has a dead letter ('dead'): rolled back, handler not run
  kAttemptsExhausted,  // max_attempts attempts are recorded for the id: rolled back,
                       // handler not run
  kOutboxFull,         // handler threw OutboxFull (a full kReject outbox class): rolled
                       // back, no failure recorded: the message is not at fault (the
                       // Consumer parks it, dead_letter.h kOutboxFull)
  kExpired,            // the message's expiry (store/lifetime.h) had run out before the
                       // handler ran, or before its commit: rolled back, the handler not
                       // run or its writes dropped; the text in handler_error
  kNotYet,             // handler threw RetryLater (a dependency of its own is down): rolled
                       // back, no attempt recorded (one counted before the run is taken
                       // back); the caller runs it again on the dependency schedule
};

// What Store::process() found and did for one delivery.
struct ProcessReport {
  ClaimResult result = ClaimResult::kHandlerFailed;
  // The attempt the handler ran as: 1-based, counting the attempts of earlier processes;
  // 0 if the handler did not run.
  int attempt = 0;
  // What was recorded for the id before this delivery (claim, attempts, a dead letter).
  // Read only when the claim did not go through at once: all zero for a first delivery.
  MessageState state;
  // kDeadLetterNow: the dead letter's reason.
  DeadLetterReason reason = DeadLetterReason::kHandlerFailed;
  // The handler's exception text (kHandlerFailed, kDeadLetterNow, kOutboxFull, kNotYet):
  // the refused call for a re-entry, what it ran for a transaction it ended; kExpired: the
  // dead letter's text (the interval and the wait).
  std::string handler_error;
};

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

}  // namespace mqtt_inbox::detail

// Internal: what one run of an application handler means for its message. The one place
// that reads what a handler may throw (handler.h) and whether it re-entered its inbox
// (store/reentry.h); used by the Consumer's claim transaction (store/sqlite/claim.cpp) and by
// the store-then-process handler transaction (store/sqlite/stp_rows.cpp) and prepare step
// (stp/workers.cpp), so both modes judge a handler alike.
// What the store's own exceptions mean (an SQLite result code, a PostgreSQL SQLSTATE) is
// the store's to say: it passes a StoreErrorClassifier.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/status.h"
#include "store/reentry.h"

namespace mqtt_inbox::detail {

struct HandlerVerdict {
  enum class Kind {
    kOk,          // the handler returned normally
    kStoreError,  // it threw the store's own exception, and the store says the store
                  // failed, not the message (StoreErrorClassifier): a transient error is
                  // retried and not counted, a fatal one latches the store
    kFailed,      // it threw anything else: a failed attempt, retried up to max_attempts
    kDeadLetter,  // dead-letter at once as `reason`: UndecodablePayload, RejectMessage,
                  // OutboxRefused, or a call back into its own inbox (that outranks
                  // whatever followed)
    kOutboxFull,  // it threw OutboxFull (outbox.h): backpressure, never an attempt
    kNotYet,      // it threw RetryLater (handler.h): a dependency of its own is down; run
                  // again on the dependency schedule, never an attempt
  };
  Kind kind = Kind::kOk;
  DeadLetterReason reason = DeadLetterReason::kHandlerFailed;  // kDeadLetter
  std::string text;  // the exception text (kStoreError, kFailed, kDeadLetter, kNotYet)
  Status store;      // kStoreError
};

// What a store says of an exception a handler threw: false if it is not the store's own
// (then the policy judges it); else true, with *status the store error it stands for and
// *message_fault whether it is this message's fault (a constraint, a CHECK: a failed
// attempt) rather than the store's (retried, or latched if fatal).
using StoreErrorClassifier = bool (*)(const std::exception& e, Status* status, bool* message_fault);

// Judges a run: `failure` is what it threw (null if it returned), `scope` its mark,
// `classify` the store's reading of its own exceptions (may be null).
HandlerVerdict judge_handler(const std::exception_ptr& failure, const HandlerScope& scope,
                             StoreErrorClassifier classify);

// Runs `fn` (the handler call) with the thread marked as running a handler for `inbox`
// (null for code that holds no connection, such as a PrepareFn), and judges it with the
// store's `classify`. Never throws.
template <typename Fn>
HandlerVerdict run_handler(const Inbox* inbox, StoreErrorClassifier classify, Fn&& fn) {
  HandlerScope scope(inbox);
  std::exception_ptr failure;
  try {
    std::forward<Fn>(fn)();
  } catch (...) {
    failure = std::current_exception();
  }
  return judge_handler(failure, scope, classify);
}

}  // namespace mqtt_inbox::detail

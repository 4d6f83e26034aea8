// Internal: what one run of an application handler means for its message. The one place
// that reads what a handler may throw (handler.h) and whether it re-entered its inbox
// (inbox/reentry.h); used by the Consumer's claim transaction (store/sqlite/claim.cpp) and by the
// store-then-process workers (stp/workers.cpp), so both modes judge a
// handler alike.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/status.h"
#include "inbox/reentry.h"

namespace mqtt_inbox::detail {

struct HandlerVerdict {
  enum class Kind {
    kOk,          // the handler returned normally
    kStoreError,  // it threw a SQLite::Exception whose code is not the message's
                  // (store/sqlite/errors.h): the store failed, not the handler; a transient
                  // code is retried and not counted, a fatal one latches the inbox
    kFailed,      // it threw anything else: a failed attempt, retried up to max_attempts
    kDeadLetter,  // dead-letter at once as `reason`: UndecodablePayload, RejectMessage,
                  // OutboxRefused, or a call back into its own inbox (that outranks
                  // whatever followed)
    kOutboxFull,  // it threw OutboxFull (outbox.h): backpressure, never an attempt
  };
  Kind kind = Kind::kOk;
  DeadLetterReason reason = DeadLetterReason::kHandlerFailed;  // kDeadLetter
  std::string text;  // the exception text (kStoreError, kFailed, kDeadLetter)
  Status store;      // kStoreError
};

// Judges a run: `failure` is what it threw (null if it returned), `scope` its mark.
HandlerVerdict judge_handler(const std::exception_ptr& failure, const HandlerScope& scope);

// Runs `fn` (the handler call) with the thread marked as running a handler for `inbox`
// (null for code that holds no connection, such as a PrepareFn), and judges it. Never
// throws.
template <typename Fn>
HandlerVerdict run_handler(const Inbox* inbox, Fn&& fn) {
  HandlerScope scope(inbox);
  std::exception_ptr failure;
  try {
    std::forward<Fn>(fn)();
  } catch (...) {
    failure = std::current_exception();
  }
  return judge_handler(failure, scope);
}

}  // namespace mqtt_inbox::detail

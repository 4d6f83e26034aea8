// Judging a handler's run (store/verdict.h).
#include "store/verdict.h"

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/outbox.h"  // OutboxFull, OutboxRefused

namespace mqtt_inbox::detail {

HandlerVerdict judge_handler(const std::exception_ptr& failure, const HandlerScope& scope,
                             StoreErrorClassifier classify) {
  HandlerVerdict v;
  if (!scope.reentered_call().empty()) {
    v.kind = HandlerVerdict::Kind::kDeadLetter;
    v.reason = DeadLetterReason::kHandlerReentered;
    v.text = scope.reentry_text();
    return v;
  }
  if (!failure) return v;
  try {
    std::rethrow_exception(failure);
  } catch (const UndecodablePayload& e) {
    v.kind = HandlerVerdict::Kind::kDeadLetter;
    v.reason = DeadLetterReason::kUndecodablePayload;
    v.text = e.what();
  } catch (const OutboxFull& e) {
    v.kind = HandlerVerdict::Kind::kOutboxFull;
    v.text = e.what();
  } catch (const OutboxRefused& e) {
    v.kind = HandlerVerdict::Kind::kDeadLetter;
    v.reason = DeadLetterReason::kOutboxRefused;
    v.text = e.what();
  } catch (const RetryLater& e) {
    v.kind = HandlerVerdict::Kind::kNotYet;
    v.text = e.what();
  } catch (const RejectMessage& e) {
    v.kind = HandlerVerdict::Kind::kDeadLetter;
    v.reason = DeadLetterReason::kInvalidPayload;
    v.text = e.what();
  } catch (const std::exception& e) {
    v.text = e.what();
    bool message_fault = true;
    // The store's own exception (an SQLite result code, ...): the store's failure
    // (transient: retried; fatal: latched), or this message's (a failed attempt).
    if (classify && classify(e, &v.store, &message_fault) && !message_fault)
      v.kind = HandlerVerdict::Kind::kStoreError;
    else
      v.kind = HandlerVerdict::Kind::kFailed;
  } catch (...) {
    v.kind = HandlerVerdict::Kind::kFailed;
    v.text = "handler threw a non-standard exception";
  }
  return v;
}

}  // namespace mqtt_inbox::detail

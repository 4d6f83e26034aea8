// Judging a handler's run (inbox/handler_verdict.h).
#include "inbox/handler_verdict.h"

#include <SQLiteCpp/Exception.h>

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/outbox.h"  // OutboxFull, OutboxRefused
#include "store/sqlite/errors.h"
#include "store/sqlite/util.h"

namespace mqtt_inbox::detail {

HandlerVerdict judge_handler(const std::exception_ptr& failure, const HandlerScope& scope) {
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
  } catch (const SQLite::Exception& e) {
    v.text = e.what();
    v.store = to_status(e, "handler statement");
    // By the one table (store/sqlite/errors.h): the store's failure (transient: retried; fatal:
    // latched), or this message's (a failed attempt).
    v.kind = error_class(e.getErrorCode()) == ErrorClass::kMessage
                 ? HandlerVerdict::Kind::kFailed
                 : HandlerVerdict::Kind::kStoreError;
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
  } catch (const RejectMessage& e) {
    v.kind = HandlerVerdict::Kind::kDeadLetter;
    v.reason = DeadLetterReason::kInvalidPayload;
    v.text = e.what();
  } catch (const std::exception& e) {
    v.kind = HandlerVerdict::Kind::kFailed;
    v.text = e.what();
  } catch (...) {
    v.kind = HandlerVerdict::Kind::kFailed;
    v.text = "handler threw a non-standard exception";
  }
  return v;
}

}  // namespace mqtt_inbox::detail

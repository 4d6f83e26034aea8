// The handler's contract, judged once for every store (store/contract.h).
#include "store/contract.h"

namespace mqtt_inbox::detail {

void judge_contract(HandlerRun* run) {
  HandlerVerdict& v = run->verdict;
  if (v.kind == HandlerVerdict::Kind::kDeadLetter &&
      v.reason == DeadLetterReason::kHandlerReentered)
    return;
  switch (run->left) {
    case TxnLeft::kOpen:
      return;
    case TxnLeft::kEnded:
      v.kind = HandlerVerdict::Kind::kDeadLetter;
      v.reason = DeadLetterReason::kHandlerEndedTransaction;
      v.text = std::string(kHandlerEndedTransaction) + ": it ran " + run->how +
               ", which the library refuses inside a handler (it commits the handler's "
               "writes with the claim; savepoints of the handler's own are allowed): nothing "
               "of it committed";
      v.store = Status::Ok();
      return;
    case TxnLeft::kClosed:
      v.kind = HandlerVerdict::Kind::kDeadLetter;
      v.reason = DeadLetterReason::kHandlerEndedTransaction;
      v.text = std::string(kHandlerEndedTransaction) + ": it closed the inbox's connection (" +
               run->how + "): nothing of it committed; the inbox opens a new connection";
      v.store = Status::Ok();
      return;
    case TxnLeft::kAborted:
      // Only a run that returned as if all went well is judged here: one that threw rolls
      // back anyway, and a store error it threw (a full disk, which rolls back by itself)
      // stays one, retried or latched.
      if (v.kind != HandlerVerdict::Kind::kOk) return;
      v.kind = HandlerVerdict::Kind::kFailed;
      v.text = std::string(kHandlerEndedTransaction) +
               ": it was rolled back inside the handler by an error the handler did not "
               "report" +
               (run->how.empty() ? std::string() : " (" + run->how + ")");
      v.store = Status::Ok();
      return;
  }
}

}  // namespace mqtt_inbox::detail

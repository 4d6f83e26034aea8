// Internal: the handler's contract (handler.h), judged once for every store. A backend
// runs the handler on its transaction and reports the facts (StoreBackend::run_handler:
// what the handler threw, and what it left of the transaction); this turns them into the
// verdict the policy acts on, the same on SQLite and PostgreSQL, for a Consumer's claim
// transaction and a store-then-process worker's alike:
//  - a call back into its own inbox outranks everything (handler_reentered);
//  - a handler that ended the library's transaction or tried to (COMMIT, ROLLBACK, BEGIN,
//    commit() or abort() on the transaction object), or closed the store's connection, is
//    a dead letter at once as handler_ended_transaction, whatever it returned or threw:
//    the stores refuse the statement or roll everything back, so nothing of it commits,
//    and it would do the same on every retry;
//  - a handler that returned normally from a transaction an error it did not report had
//    aborted is a failed attempt (retried: the error may be transient);
//  - otherwise its own verdict (store/verdict.h) stands.
#pragma once

#include <string>

#include "store/backend.h"

namespace mqtt_inbox::detail {

// The start of every text a run gets for ending or losing its transaction: one name to grep.
inline constexpr const char* kHandlerEndedTransaction = "handler ended the transaction";

// Judges `run` by the contract: rewrites run->verdict.
void judge_contract(HandlerRun* run);

}  // namespace mqtt_inbox::detail

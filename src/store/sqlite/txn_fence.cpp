// The fence around a handler run: the authorizer and the verdict of a handler that ended
// its transaction (store/sqlite/txn_fence.h).
#include "store/sqlite/txn_fence.h"

#include <cstdio>
#include <string>

namespace mqtt_inbox::detail {

namespace {
thread_local TxnFence* t_innermost = nullptr;
}  // namespace

void TxnFence::install(sqlite3* db) noexcept {
  sqlite3_set_authorizer(db, &TxnFence::authorize, db);
}

TxnFence::TxnFence(sqlite3* db) noexcept : db_(db), outer_(t_innermost) { t_innermost = this; }

TxnFence::~TxnFence() { t_innermost = outer_; }

int TxnFence::authorize(void* db, int action, const char* a1, const char*, const char*,
                        const char*) {
  if (action != SQLITE_TRANSACTION) return SQLITE_OK;
  for (TxnFence* f = t_innermost; f; f = f->outer_) {
    if (f->db_ != db) continue;
    if (!f->refused_[0]) {
      const char* op = a1 && *a1 ? a1 : "a transaction statement";
      std::snprintf(f->refused_, sizeof f->refused_, "%s", op);
    }
    return SQLITE_DENY;
  }
  return SQLITE_OK;
}

void TxnFence::judge(HandlerVerdict* v) const {
  if (v->kind == HandlerVerdict::Kind::kDeadLetter &&
      v->reason == DeadLetterReason::kHandlerReentered)
    return;
  // Without a refused statement, only a run that returned with its transaction gone is
  // judged here: any other verdict rolls back anyway, and a store error (SQLITE_FULL, which
  // rolls back by itself) stays one, retried or latched.
  if (!refused_[0] && (v->kind != HandlerVerdict::Kind::kOk || sqlite3_get_autocommit(db_) == 0))
    return;
  const std::string what =
      refused_[0] ? std::string(": it ran ") + refused_ +
                        ", which is refused inside a handler (the library commits the "
                        "handler's writes with the claim; SAVEPOINT and RELEASE are allowed)"
                  : std::string(
                        ": it was rolled back inside the handler (an SQLite error "
                        "the handler did not report)");
  v->kind = HandlerVerdict::Kind::kFailed;
  v->text = kHandlerEndedTransaction + what;
  v->store = Status::Ok();
}

}  // namespace mqtt_inbox::detail

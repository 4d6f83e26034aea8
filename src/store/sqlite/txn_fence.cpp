// A handler's run on an SQLite connection: the fence's authorizer and the facts of what
// the handler left (store/sqlite/txn_fence.h).
#include "store/sqlite/txn_fence.h"

#include <cstdio>
#include <string>

#include "store/sqlite/errors.h"
#include "store/verdict.h"

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

void run_sqlite_handler(SQLite::Database& db, const Inbox* owner,
                        FunctionRef<void(const TxnRef&)> call, HandlerRun* out) {
  sqlite3* h = db.getHandle();
  const TxnRef txn{&db, &typeid(SQLite::Database*)};
  std::string refused;
  {
    const TxnFence fence(h);
    out->verdict = run_handler(owner, &classify_sqlite_exception, [&] { call(txn); });
    refused = fence.refused();
  }
  // A connection closed by the handler (sqlite3_close_v2 with the library's statements
  // still prepared leaves a zombie): every call that checks the connection refuses it
  // with SQLITE_MISUSE, an empty sqlite3_exec first of all, at no cost otherwise.
  if (sqlite3_exec(h, "", nullptr, nullptr, nullptr) == SQLITE_MISUSE) {
    out->left = TxnLeft::kClosed;
    out->how = "sqlite3_close on it";
    return;
  }
  // Statements the handler left stepped hold a read snapshot (checkpoints stop, the WAL
  // grows) and, at close, make SQLite refuse to close: reset them. The library's own are
  // reset after each use, so none of them is stepped here.
  for (sqlite3_stmt* st = sqlite3_next_stmt(h, nullptr); st; st = sqlite3_next_stmt(h, st)) {
    if (!sqlite3_stmt_busy(st)) continue;
    const char* sql = sqlite3_sql(st);
    out->reset.emplace_back(sql ? sql : "?");
    sqlite3_reset(st);
  }
  if (!refused.empty()) {
    out->left = TxnLeft::kEnded;
    out->how = refused;
  } else if (sqlite3_get_autocommit(h)) {
    out->left = TxnLeft::kAborted;
  }
}

}  // namespace mqtt_inbox::detail

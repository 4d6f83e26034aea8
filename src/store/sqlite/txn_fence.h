// Internal: a handler's run on an SQLite connection the library holds in a transaction
// (the Consumer's claim transaction, a store-then-process worker's handler transaction),
// and the facts the handler's contract (store/contract.h) is judged by. The library owns
// BEGIN/COMMIT/ROLLBACK there: a handler that ended the transaction would commit its
// effect apart from the claim (or the row's done state), and a redelivery would apply it
// again. So every such connection gets an authorizer that, while a TxnFence for it lives
// on the preparing thread, refuses BEGIN, COMMIT, ROLLBACK and END at prepare time
// (SQLITE_AUTH) and remembers the refusal. SAVEPOINT, RELEASE and ROLLBACK TO stay
// allowed. After the run the connection is read for what else the handler left: a
// transaction an error rolled back, statements still stepped (reset here), a connection it
// closed.
//
// Thread safety: fences are thread_local marks, one per handler run, on that run's stack.
#pragma once

#include <SQLiteCpp/Database.h>
#include <sqlite3.h>

#include "store/backend.h"
#include "util/function_ref.h"

namespace mqtt_inbox::detail {

class TxnFence {
 public:
  // Installs the authorizer on `db`. Once per connection, at open: setting an authorizer
  // expires every prepared statement.
  static void install(sqlite3* db) noexcept;

  // Fences `db` on this thread while the object lives. End it as soon as the handler
  // returns: the library's own COMMIT may be re-prepared after a schema change.
  explicit TxnFence(sqlite3* db) noexcept;
  ~TxnFence();
  TxnFence(const TxnFence&) = delete;
  TxnFence& operator=(const TxnFence&) = delete;

  // The first statement refused ("BEGIN", "COMMIT", "ROLLBACK"), or empty.
  const char* refused() const { return refused_; }

 private:
  static int authorize(void* db, int action, const char* a1, const char*, const char*, const char*);
  sqlite3* db_;
  TxnFence* outer_;
  char refused_[32] = {0};
};

// Runs `call` with `db` as the store's transaction (a TxnRef of SQLite::Database), fenced,
// the thread marked as running a handler for `owner`, and fills *out: what it threw
// (judged with the SQLite classifier), what it left of the transaction, and the SQL of
// the statements it left stepped (reset here). A connection the handler closed is
// reported as TxnLeft::kClosed and must not be used again (the caller lets it go).
void run_sqlite_handler(SQLite::Database& db, const Inbox* owner,
                        FunctionRef<void(const TxnRef&)> call, HandlerRun* out);

}  // namespace mqtt_inbox::detail

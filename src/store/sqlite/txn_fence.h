// Internal: the fence around a handler run on an SQLite connection the library holds in a
// transaction (the Consumer's claim transaction, a store-then-process worker's handler
// transaction). The library owns BEGIN/COMMIT/ROLLBACK there: a handler that ended the
// transaction would commit its effect apart from the claim (or the row's done state), and a
// redelivery would apply it again. So every such connection gets an authorizer that, while
// a TxnFence for it lives on the preparing thread, refuses BEGIN, COMMIT, ROLLBACK and END
// at prepare time (SQLITE_AUTH) and remembers the refusal; the run then fails with a named
// text whatever the handler did with the error (handler.h, c.h). SAVEPOINT, RELEASE and
// ROLLBACK TO stay allowed. A transaction that ended anyway (an SQLite error that rolled it
// back, which the handler did not report) fails the run with the same name.
//
// Thread safety: fences are thread_local marks, one per handler run, on that run's stack.
#pragma once

#include <sqlite3.h>

#include <string>

#include "store/verdict.h"

namespace mqtt_inbox::detail {

// The start of every text a run gets for ending its transaction: one name to grep for.
inline constexpr const char* kHandlerEndedTransaction = "handler ended the transaction";

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

  // The verdict of the run, after the fence: a refused statement turns `v`, whatever it
  // was, into a failed attempt named kHandlerEndedTransaction, unless the run must be
  // dead-lettered as handler_reentered (that outranks it, store/reentry.h); so does a run
  // that returned normally with its transaction no longer open.
  void judge(HandlerVerdict* v) const;

 private:
  static int authorize(void* db, int action, const char* a1, const char*, const char*, const char*);
  sqlite3* db_;
  TxnFence* outer_;
  char refused_[32] = {0};
};

}  // namespace mqtt_inbox::detail

// Internal helpers around SQLiteCpp: statement hygiene (the error mapping is
// store/sqlite/errors.h).
#pragma once

#include <sqlite3.h>

#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>

#include <exception>
#include <string>

#include "mqtt_inbox/status.h"
#include "store/sqlite/errors.h"  // to_status: the classification of result codes

namespace mqtt_inbox::detail {

// ROLLBACK if a transaction is open. Never throws: after some I/O errors SQLite has
// already rolled back by itself, and a failed ROLLBACK leaves nothing committed either.
inline void rollback_quietly(SQLite::Database& db) noexcept {
  if (sqlite3_get_autocommit(db.getHandle())) return;
  sqlite3_exec(db.getHandle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

// Rolls back, when the scope is left by an exception, a transaction still open on `db`.
// The code between BEGIN and COMMIT catches the exceptions it expects (SQLite's); anything
// else (std::bad_alloc from a string it copies) would leave the connection inside the
// transaction, and every later BEGIN would fail with "cannot start a transaction within a
// transaction" for the life of the process. Put one after each BEGIN that is not
// followed by a catch-all.
class RollbackOnThrow {
 public:
  explicit RollbackOnThrow(SQLite::Database& db) noexcept
      : db_(db), uncaught_(std::uncaught_exceptions()) {}
  ~RollbackOnThrow() {
    if (std::uncaught_exceptions() > uncaught_) rollback_quietly(db_);
  }
  RollbackOnThrow(const RollbackOnThrow&) = delete;
  RollbackOnThrow& operator=(const RollbackOnThrow&) = delete;

 private:
  SQLite::Database& db_;
  const int uncaught_;
};

// Resets a cached statement and clears its bindings when the scope ends. A statement left
// un-reset keeps its read snapshot and stops WAL checkpoints (the WAL file then grows).
// tryReset() because SQLiteCpp's reset() rethrows the last step's error.
class StatementReset {
 public:
  explicit StatementReset(SQLite::Statement& s) : s_(s) {}
  ~StatementReset() {
    s_.tryReset();
    s_.clearBindings();
  }
  StatementReset(const StatementReset&) = delete;
  StatementReset& operator=(const StatementReset&) = delete;

 private:
  SQLite::Statement& s_;
};

}  // namespace mqtt_inbox::detail

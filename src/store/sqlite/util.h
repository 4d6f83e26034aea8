// Internal helpers around SQLiteCpp: statement hygiene (the error mapping is
// store/sqlite/errors.h).
#pragma once

#include <sqlite3.h>

#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>

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

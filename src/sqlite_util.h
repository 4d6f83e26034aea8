// Internal helpers around SQLiteCpp: error mapping and statement hygiene.
#pragma once

#include <sqlite3.h>

#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>

#include <string>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// Maps an SQLite error to a Status. SQLiteCpp reports extended codes (e.g. 1555 for a
// primary-key violation), so the primary code is the low byte.
inline Status to_status(int primary_code, const std::string& what) {
  switch (primary_code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return Status(Status::Code::kBusy, what);
    case SQLITE_FULL: return Status(Status::Code::kFull, what);
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_PROTOCOL: return Status(Status::Code::kIoError, what);
    case SQLITE_READONLY: return Status(Status::Code::kReadOnly, what);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return Status(Status::Code::kCorruption, what);
    default: return Status(Status::Code::kInternal, what);
  }
}

inline Status to_status(const SQLite::Exception& e, const std::string& context) {
  return to_status(e.getErrorCode(), context + ": " + e.what());
}

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

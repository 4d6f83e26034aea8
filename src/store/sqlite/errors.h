// Internal: the one classification of SQLite result codes (https://sqlite.org/rescode.html).
//
// Every primary and extended result code belongs to one of three classes, and the class
// decides what the per-message paths (Consumer, the store-then-process receipt and
// workers) and the admin tool do with it:
//
//   kTransient  the store failed in a way that can clear by itself: a lock is released,
//               space is freed, the I/O recovers, memory comes back. Retry without limit
//               and never acknowledge meanwhile (BUSY, LOCKED, FULL, IOERR_*, READONLY_*,
//               CANTOPEN, NOMEM, PROTOCOL, ...).
//   kMessage    this message's change was refused: a constraint at any point of its
//               transaction including COMMIT (a deferred foreign key, a CHECK, the commit
//               hook's veto SQLITE_CONSTRAINT_COMMITHOOK), TOOBIG, MISMATCH, RANGE, and
//               whatever else the handler's own statements raise (a syntax error, an
//               authorizer refusal). It counts as a handler attempt and ends as a dead
//               letter after max_attempts.
//   kFatal      the store is unusable: CORRUPT, NOTADB. Stop taking messages, never
//               acknowledge, never write the file again
//               (docs/operations.md#recovering-a-corrupt-database).
//
// The table is data (store/sqlite/errors.cpp), one row per code defined by sqlite3.h of
// SQLite 3.40; tests/unit/sqlite_errors_test.cpp checks every row against sqlite3.h and the
// rules above. A code the table does not know (a newer SQLite) falls back to its
// primary code's row.
#pragma once

#include <cstddef>
#include <string>

#include "mqtt_inbox/status.h"

struct sqlite3;

namespace SQLite {
class Exception;
}

namespace mqtt_inbox::detail {

enum class ErrorClass { kTransient, kMessage, kFatal };

// "transient", "message", "fatal".
const char* to_string(ErrorClass c);

struct SqliteErrorRow {
  int code;          // primary or extended result code
  const char* name;  // as in sqlite3.h, e.g. "SQLITE_CONSTRAINT_FOREIGNKEY"
  ErrorClass error_class;
  Status::Code status;  // how a Status reports it (transient rows: a transient code)
  const char* note;     // why, where the class is not obvious ("" otherwise)
};

// Every row of the table, primary codes first.
const SqliteErrorRow* sqlite_error_rows(size_t* count);

// The row for `code`: its own row if the table has one, else its primary code's row
// (code & 0xff), else a row for an unknown primary code (kMessage, kInternal).
const SqliteErrorRow& classify_sqlite_error(int code);

inline ErrorClass error_class(int code) { return classify_sqlite_error(code).error_class; }

// The Status for an SQLite error `code` with message `what`.
Status to_status(int code, const std::string& what);
// "<context>: <what()>", classified by the exception's (extended) error code.
Status to_status(const SQLite::Exception& e, const std::string& context);
// The same, for an error on connection `db` (may be null), and a full disk whatever code
// SQLite chose: an I/O error or a file it cannot open whose system errno
// (sqlite3_system_errno) is ENOSPC or EDQUOT is kFull. Opening an existing database on a
// full disk fails making its -shm or -wal file with SQLITE_IOERR_* ("disk I/O error"), not
// SQLITE_FULL; classified by its code alone it read as a failing disk.
Status to_status(const SQLite::Exception& e, sqlite3* db, const std::string& context);

// The SQLite store's StoreErrorClassifier (store/verdict.h): true for an SQLite::Exception
// a handler threw, with its Status and whether its code is the message's (kMessage) rather
// than the store's.
bool classify_sqlite_exception(const std::exception& e, Status* status, bool* message_fault);

}  // namespace mqtt_inbox::detail

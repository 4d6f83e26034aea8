// The classification table of SQLite result codes (see store/sqlite/errors.h for the classes).
// Data only: one row per primary and extended code of sqlite3.h (3.40), primary codes
// first. SQLITE_OK_LOAD_PERMANENTLY and SQLITE_OK_SYMLINK are success codes, not errors.
#include "store/sqlite/errors.h"

#include <sqlite3.h>

#include <cerrno>
#include <cstring>

#include <SQLiteCpp/Exception.h>

namespace mqtt_inbox::detail {

namespace {

#define ROW(code, cls, status, note) \
  { code, #code, ErrorClass::cls, Status::Code::status, note }

// clang-format off
const SqliteErrorRow kRows[] = {
    ROW(SQLITE_ERROR, kMessage, kInternal,
        "generic: an SQL error of the handler's own statements (no such table, syntax), or a bug"),
    ROW(SQLITE_INTERNAL, kMessage, kInternal,
        "a bug inside SQLite; held against the message so the stream goes on"),
    ROW(SQLITE_PERM, kTransient, kReadOnly,
        "the OS denied access; clears when the permission is fixed"),
    ROW(SQLITE_ABORT, kMessage, kAborted,
        "a callback of the handler's (a function, a hook) asked to abort"),
    ROW(SQLITE_BUSY, kTransient, kBusy, ""),
    ROW(SQLITE_LOCKED, kTransient, kBusy, ""),
    ROW(SQLITE_NOMEM, kTransient, kFull,
        "out of memory; may clear"),
    ROW(SQLITE_READONLY, kTransient, kReadOnly, ""),
    ROW(SQLITE_INTERRUPT, kMessage, kAborted,
        "sqlite3_interrupt(): the application stopped a handler that ran too long"),
    ROW(SQLITE_IOERR, kTransient, kIoError, ""),
    ROW(SQLITE_CORRUPT, kFatal, kCorruption, ""),
    ROW(SQLITE_NOTFOUND, kMessage, kInternal,
        "returned by sqlite3_file_control() only, never by a statement"),
    ROW(SQLITE_FULL, kTransient, kFull, ""),
    ROW(SQLITE_CANTOPEN, kTransient, kIoError, ""),
    ROW(SQLITE_PROTOCOL, kTransient, kIoError,
        "a race on the WAL locks"),
    ROW(SQLITE_EMPTY, kMessage, kInternal,
        "not used by SQLite"),
    ROW(SQLITE_SCHEMA, kTransient, kBusy,
        "another connection changed the schema; a retry prepares again"),
    ROW(SQLITE_TOOBIG, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT, kMessage, kRejected, ""),
    ROW(SQLITE_MISMATCH, kMessage, kRejected, ""),
    ROW(SQLITE_MISUSE, kMessage, kInternal,
        "the API used wrongly: by the handler, or a bug"),
    ROW(SQLITE_NOLFS, kTransient, kFull,
        "a file larger than the OS allows: a space problem"),
    ROW(SQLITE_AUTH, kMessage, kInternal,
        "the authorizer refused a statement (a handler's BEGIN/COMMIT/ROLLBACK)"),
    ROW(SQLITE_FORMAT, kMessage, kInternal,
        "not used by SQLite"),
    ROW(SQLITE_RANGE, kMessage, kRejected, ""),
    ROW(SQLITE_NOTADB, kFatal, kCorruption, ""),
    ROW(SQLITE_NOTICE, kMessage, kInternal,
        "passed to sqlite3_log() only, never returned"),
    ROW(SQLITE_WARNING, kMessage, kInternal,
        "passed to sqlite3_log() only, never returned"),
    ROW(SQLITE_ERROR_MISSING_COLLSEQ, kMessage, kInternal, ""),
    ROW(SQLITE_ERROR_RETRY, kMessage, kInternal,
        "internal to SQLite"),
    ROW(SQLITE_ERROR_SNAPSHOT, kMessage, kInternal, ""),
    ROW(SQLITE_IOERR_READ, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_SHORT_READ, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_WRITE, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_FSYNC, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_DIR_FSYNC, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_TRUNCATE, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_FSTAT, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_UNLOCK, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_RDLOCK, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_DELETE, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_BLOCKED, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_NOMEM, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_ACCESS, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_CHECKRESERVEDLOCK, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_LOCK, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_CLOSE, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_DIR_CLOSE, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_SHMOPEN, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_SHMSIZE, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_SHMLOCK, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_SHMMAP, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_SEEK, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_DELETE_NOENT, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_MMAP, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_GETTEMPPATH, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_CONVPATH, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_VNODE, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_AUTH, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_BEGIN_ATOMIC, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_COMMIT_ATOMIC, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_ROLLBACK_ATOMIC, kTransient, kIoError, ""),
    ROW(SQLITE_IOERR_DATA, kFatal, kCorruption,
        "a page's checksum is wrong (checksum VFS): corruption found below SQLite"),
    ROW(SQLITE_IOERR_CORRUPTFS, kFatal, kCorruption,
        "the file system reports the file corrupt: corruption found below SQLite"),
    ROW(SQLITE_LOCKED_SHAREDCACHE, kTransient, kBusy, ""),
    ROW(SQLITE_LOCKED_VTAB, kTransient, kBusy, ""),
    ROW(SQLITE_BUSY_RECOVERY, kTransient, kBusy, ""),
    ROW(SQLITE_BUSY_SNAPSHOT, kTransient, kBusy, ""),
    ROW(SQLITE_BUSY_TIMEOUT, kTransient, kBusy, ""),
    ROW(SQLITE_CANTOPEN_NOTEMPDIR, kTransient, kIoError, ""),
    ROW(SQLITE_CANTOPEN_ISDIR, kTransient, kIoError, ""),
    ROW(SQLITE_CANTOPEN_FULLPATH, kTransient, kIoError, ""),
    ROW(SQLITE_CANTOPEN_CONVPATH, kTransient, kIoError, ""),
    ROW(SQLITE_CANTOPEN_DIRTYWAL, kTransient, kIoError, ""),
    ROW(SQLITE_CANTOPEN_SYMLINK, kTransient, kIoError, ""),
    ROW(SQLITE_CORRUPT_VTAB, kFatal, kCorruption, ""),
    ROW(SQLITE_CORRUPT_SEQUENCE, kFatal, kCorruption, ""),
    ROW(SQLITE_CORRUPT_INDEX, kFatal, kCorruption, ""),
    ROW(SQLITE_READONLY_RECOVERY, kTransient, kReadOnly, ""),
    ROW(SQLITE_READONLY_CANTLOCK, kTransient, kReadOnly, ""),
    ROW(SQLITE_READONLY_ROLLBACK, kTransient, kReadOnly, ""),
    ROW(SQLITE_READONLY_DBMOVED, kTransient, kReadOnly, ""),
    ROW(SQLITE_READONLY_CANTINIT, kTransient, kReadOnly, ""),
    ROW(SQLITE_READONLY_DIRECTORY, kTransient, kReadOnly, ""),
    ROW(SQLITE_ABORT_ROLLBACK, kTransient, kBusy,
        "the transaction was rolled back under the statement (after a store error); the retry runs it again"),
    ROW(SQLITE_CONSTRAINT_CHECK, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_COMMITHOOK, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_FOREIGNKEY, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_FUNCTION, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_NOTNULL, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_PRIMARYKEY, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_TRIGGER, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_UNIQUE, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_VTAB, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_ROWID, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_PINNED, kMessage, kRejected, ""),
    ROW(SQLITE_CONSTRAINT_DATATYPE, kMessage, kRejected, ""),
    ROW(SQLITE_NOTICE_RECOVER_WAL, kMessage, kInternal,
        "passed to sqlite3_log() only, never returned"),
    ROW(SQLITE_NOTICE_RECOVER_ROLLBACK, kMessage, kInternal,
        "passed to sqlite3_log() only, never returned"),
    ROW(SQLITE_WARNING_AUTOINDEX, kMessage, kInternal,
        "passed to sqlite3_log() only, never returned"),
    ROW(SQLITE_AUTH_USER, kMessage, kInternal,
        "the user-authentication extension refused a statement"),
};
// clang-format on

#undef ROW

// A primary code that no row names (a newer SQLite): held against the message, as an
// unknown error of the handler's statements would be.
const SqliteErrorRow kUnknown = {0, "SQLITE_(unknown)", ErrorClass::kMessage,
                                 Status::Code::kInternal, "a result code this table does not know"};

}  // namespace

const char* to_string(ErrorClass c) {
  switch (c) {
    case ErrorClass::kTransient:
      return "transient";
    case ErrorClass::kMessage:
      return "message";
    case ErrorClass::kFatal:
      return "fatal";
  }
  return "unknown";
}

const SqliteErrorRow* sqlite_error_rows(size_t* count) {
  *count = sizeof kRows / sizeof kRows[0];
  return kRows;
}

const SqliteErrorRow& classify_sqlite_error(int code) {
  const SqliteErrorRow* primary = nullptr;
  for (const SqliteErrorRow& r : kRows) {
    if (r.code == code) return r;
    if (r.code == (code & 0xff)) primary = &r;
  }
  return primary ? *primary : kUnknown;
}

Status to_status(int code, const std::string& what) {
  return Status(classify_sqlite_error(code).status, what);
}

Status to_status(const SQLite::Exception& e, const std::string& context) {
  return to_status(e.getErrorCode(), context + ": " + e.what());
}

Status to_status(const SQLite::Exception& e, sqlite3* db, const std::string& context) {
  Status s = to_status(e, context);
  const int primary = e.getErrorCode() & 0xff;
  if (db && (primary == SQLITE_IOERR || primary == SQLITE_CANTOPEN)) {
    const int os = sqlite3_system_errno(db);
    if (os == ENOSPC || os == EDQUOT)
      return Status(Status::Code::kFull,
                    s.message() + " (" + std::strerror(os) + ": the disk is full)");
  }
  return s;
}

bool classify_sqlite_exception(const std::exception& e, Status* status, bool* message_fault) {
  const auto* q = dynamic_cast<const SQLite::Exception*>(&e);
  if (!q) return false;
  *status = to_status(*q, "handler statement");
  *message_fault = error_class(q->getErrorCode()) == ErrorClass::kMessage;
  return true;
}

}  // namespace mqtt_inbox::detail

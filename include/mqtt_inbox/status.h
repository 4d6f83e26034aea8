// Status: the result of every fallible call in the public API.
//
// The library never throws across its API (leveldb's convention): a call that can fail
// returns a Status, and values come back through out-parameters. This keeps errors
// explicit on the per-message path, which runs inside Paho's callback where an escaping
// exception would terminate the process (docs/guarantees.md section 1).
// The one place exceptions are used on purpose is the user's handler: it signals a
// failed message by throwing (see consumer.h).
//
// Thread safety: a Status is a value; distinct objects may be used from distinct threads.
#pragma once

#include <string>
#include <utility>

namespace mqtt_inbox {

class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk = 0,
    kInvalidArgument,   // an option or argument is malformed or refused (see message)
    kNotFound,          // the named row does not exist
    kBusy,              // SQLITE_BUSY/LOCKED (another connection holds the lock), SCHEMA
    kFull,              // SQLITE_FULL (disk or max_page_count reached), NOMEM, NOLFS
    kIoError,           // SQLITE_IOERR*, SQLITE_CANTOPEN*, PROTOCOL: the file system failed
    kReadOnly,          // SQLITE_READONLY*, PERM: the database cannot be written
    kCorruption,        // SQLITE_CORRUPT*/NOTADB, or a schema newer than this library: the
                        // store is unusable (docs/operations.md#recovering-a-corrupt-database)
    kAborted,           // the operation was stopped on request (SQLITE_INTERRUPT/ABORT)
    kInternal,          // anything else (a bug, an unexpected SQLite code)
    kRejected,          // SQLite refused the change of one message: a constraint (CHECK,
                        // FOREIGN KEY at COMMIT, NOT NULL, UNIQUE, a commit hook's veto),
                        // TOOBIG, MISMATCH, RANGE. The message's fault, not the store's
    kPermissionDenied,  // the store refuses this process or role an object it needs:
                        // SQLite, a file the inbox must write (the database, its -wal, -shm
                        // or .lock, or their folder) belongs to another user or cannot be
                        // written (docs/operations.md#files-created-under-another-user);
                        // PostgreSQL, a missing privilege (SQLSTATE 42501), a password file
                        // that cannot be read. The message names the object and the fix
                        // (the GRANT it needs: docs/postgres.md#privileges)
    // The codes below have fixed values: 12 to 14 are the C API's own (c.h).
    kAuthentication = 15,  // the server refused who we are: a wrong password, no
                           // pg_hba.conf entry, an unknown role (PostgreSQL)
    kSchema = 16,          // the store's schema is missing, older than this library and
                           // this role may not migrate it ("run `mqtt-inbox migrate` as the
                           // owner"), or newer than this library (a newer library wrote it)
  };

  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // True for failures of the store that may clear by themselves (lock released, space
  // freed, I/O recovered); the per-message path retries these instead of acking, and
  // start-up waits them out. Which SQLite result code gets which Status code is one
  // table (src/store/sqlite/errors.cpp), so this and the classification there agree.
  bool is_transient_store_error() const {
    return code_ == Code::kBusy || code_ == Code::kFull || code_ == Code::kIoError ||
           code_ == Code::kReadOnly;
  }
  // True when the store is unusable (kCorruption): nothing is taken or acknowledged any
  // more, and the file is not written again.
  bool is_fatal_store_error() const { return code_ == Code::kCorruption; }

  // "OK" or "<code name>: <message>".
  std::string to_string() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Name of a code, e.g. "busy".
const char* to_string(Status::Code code);

}  // namespace mqtt_inbox

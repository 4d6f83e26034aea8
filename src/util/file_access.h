// Internal: whether this process may write the inbox's files. SQLite opens a database
// read-only, without a word, when it cannot write the file or its -wal/-shm; every write
// then fails with "attempt to write a readonly database", which looks transient and is
// not. The usual cause is a -wal/-shm left by a tool (mqtt-inbox, sqlite3) run as
// another user while the consumer was stopped
// (docs/operations.md#files-created-under-another-user). Checked before SQLite opens
// anything, so the refusal names the file and owner.
#pragma once

#include <sys/types.h>

#include <string>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// The database at `db_path`, its -wal and -shm, "<db_path>.lock" when `with_lock`, and
// their folder: each that exists must be writable by this process (effective uid and
// groups; root always can). Files that do not exist yet are fine; a read-only file
// system is left to SQLite (SQLITE_READONLY, waited out). Returns kPermissionDenied
// naming the first file that is not writable, its owner, this process's user and the
// fix; OK otherwise.
Status check_writable(const std::string& db_path, bool with_lock);

// Whether `db_path` can be a database at all, checked before anything is created, for
// the errors that waiting would never mend: kInvalidArgument if it names a folder or
// anything but a regular file, or if its folder does not exist or is not a folder;
// kReadOnly if the file does not exist yet and its folder cannot be written (a read-only
// file system, no permission). *exists says whether the file exists. An SQLite URI
// ("file:...") or ":memory:" is left to SQLite (OK, *exists false).
Status check_database_location(const std::string& db_path, bool* exists);

// "name (uid N)", or "uid N" when the user database has no name for it.
std::string describe_user(uid_t uid);

}  // namespace mqtt_inbox::detail

// How the admin tool opens an inbox database that a running consumer may be using:
// read-only facts first (never creating or migrating a file), then the library's Inbox
// once the schema is known to be current, with the consumer's locks left alone. What the
// tool reads beyond the public Inbox is the store's (store/sqlite/admin.h,
// store/postgres/admin.h through pg_admin.h): no SQL in tools/.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/sqlite.h>
#include <mqtt_inbox/store_then_process.h>

#include "tool.h"

namespace mqtt_inbox::cli {

// True for a PostgreSQL location ("postgresql://...", "postgres://..."): the commands that
// work on that store go to pg_admin.h.
bool is_postgres(const std::string& location);

// fail(kUnsupported) for a PostgreSQL location: `command` works on SQLite files only
// (docs/admin-tool.md#postgresql).
void require_sqlite(const std::string& location, const std::string& command);

// What a read-only look at the file says.
struct FileFacts {
  int user_version = 0;
  std::string journal_mode;
  bool has_inbox_tables = false;
};

// fail(kStoreError) unless `path` is an existing regular file.
void require_file(const std::string& path);

// Reads the schema version with a read-only connection: never creates, migrates or writes.
// fail(kStoreError) if the file is missing or not an mqtt-inbox database.
FileFacts read_facts(const std::string& path);

// The options the tool opens every Inbox with: --busy-timeout-ms, the tool's logger
// (warnings and up, stderr), never the consumer's exclusive lock.
InboxOptions tool_inbox_options();

// fail(kSchema) unless the file's schema version is this tool's.
void require_current_schema(const std::string& path, const FileFacts& f);

// Opens through the library once the schema is known to be current, so Inbox::open applies
// no migration (on SQLite or, for a PostgreSQL location, on its schema: pg_admin.h). Inbox::open
// switches the file to WAL if it was not (a repair) and persists the retention clock when closed
// (only ever a value the clock already had).
std::unique_ptr<Inbox> open_inbox(const std::string& path);

// fail(kNotFound) for a kNotFound status, fail(kStoreError) for any other error.
void check_status(const Status& s, const std::string& what);

// fail(kStoreError, "<what>: <message>") for a failed read of the store's admin calls
// (store/sqlite/admin.h), whose message is the store's own text.
void check_read(const Status& s, const std::string& what);

// The rows of inbox_meta, key -> value.
std::map<std::string, std::string> read_meta(Inbox& inbox);

// An integer value of inbox_meta; nullopt if absent or not a number.
std::optional<int64_t> meta_int(const std::map<std::string, std::string>& meta,
                                const std::string& key);

// A StoreThenProcess for the tool's own use: no workers, never started, so its handler
// never runs. Only replay(), reap() and stats() are used; they run on its maintenance
// connection. lease_ms 0: the library's default.
std::unique_ptr<StoreThenProcess> stp_for(Inbox* inbox, const std::string& consumer,
                                          int64_t lease_ms = 0);

// Whether `stp`'s consumer has stored messages, whatever their status (either store).
bool has_stp_rows(StoreThenProcess& stp);

// The consumers with store-then-process rows (SQLite).
std::set<std::string> stp_consumers(Inbox& inbox);

}  // namespace mqtt_inbox::cli

// What the admin tool (tools/, docs/admin-tool.md) reads of an SQLite inbox that it does
// not get from the public Inbox: the facts a read-only look at the file gives (schema
// version, journal mode), what `check` reports (integrity, inbox_meta, stale rows, the
// WAL's checkpoint, page counts), the counts `stats` shows beside InboxStats, what a
// `prune --dry-run` would delete, the processed ids `export` writes, and the few lookups
// the tool's commands make (inbox_meta, the store-then-process consumers and the status
// of a stored message). The SQL is in admin.cpp; PostgreSQL's counterpart is
// store/postgres/admin.h.
//
// Two kinds of call. read_sqlite_facts and inspect_sqlite open a connection of their own
// to `path` (never creating the file) before any Inbox is opened; the others take the
// tool's open Inbox and read on its connection (Inbox::with_connection), each in one
// short statement or a few, outside any transaction, so a running consumer waits for
// none of them for longer than one statement. None creates, migrates or writes anything,
// except inspect_sqlite's PASSIVE checkpoint (it never waits for a lock and is skipped on a
// file found corrupt).
//
// Errors: a Status whose message is SQLite's own text (SQLite::Exception::what()), its code
// classified by the one table of result codes (store/sqlite/errors.h: kCorruption for a
// corrupt file or one that is not a database, a transient code for a locked or failing
// store); another exception of the statements as kInternal with its text. What
// Inbox::with_connection itself throws (a store already found unusable, a call from inside
// a handler) is not caught: it propagates to the caller.
//
// Thread safety: the calls share nothing but the Inbox given, which serialises them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// What a read-only look at the file says.
struct SqliteFileFacts {
  int user_version = 0;           // PRAGMA user_version: the schema version
  std::string journal_mode;       // PRAGMA journal_mode ("wal" for a usable inbox)
  bool has_inbox_tables = false;  // a table inbox_processed exists
};

// Reads the facts above with a read-only connection of its own (busy timeout
// options.busy_timeout_ms): never creates, migrates or writes. Errors: as above (a file
// that cannot be opened, a locked or corrupt file).
Status read_sqlite_facts(const std::string& path, const InboxOptions& options,
                         SqliteFileFacts* out);

// What `check` reports, read in the order of the fields. A field is set only once it was
// read: an error stops the inspection, and the fields after it stay empty (as do those
// that do not apply, said for each).
struct SqliteInspection {
  std::optional<int> schema_version;        // PRAGMA user_version
  std::optional<bool> has_inbox_tables;     // a table inbox_processed exists
  std::optional<std::string> journal_mode;  // PRAGMA journal_mode
  // An integrity check: the statement that ran ("PRAGMA quick_check", "PRAGMA
  // integrity_check") and the lines it returned, {"ok"} alone for a sound file.
  struct Check {
    std::string statement;
    std::vector<std::string> lines;
  };
  std::optional<Check> quick_check;
  std::optional<Check> integrity_check;
  // inbox_meta, key -> value; empty (and set) without the inbox tables.
  std::optional<std::map<std::string, std::string>> meta;
  // Store-then-process rows 'processing' with a wall-clock claimed_at before the cutoff
  // given; only with the inbox tables at schema version 2 or later.
  std::optional<int64_t> processing_claimed_before;
  // Attempts left 'running' (a process died inside a handler); only with the inbox tables.
  std::optional<int64_t> attempts_running;
  // The WAL and a PASSIVE checkpoint of it (never waits for a lock). On a file found
  // corrupt no checkpoint runs: rc 0, frames -1.
  struct Wal {
    int64_t bytes = 0;               // size of "<path>-wal" before the checkpoint; 0 if none
    int checkpoint_rc = 0;           // sqlite3_wal_checkpoint_v2's result code
    bool checkpoint_failed = false;  // neither SQLITE_OK nor SQLITE_BUSY
    std::string checkpoint_error;    // sqlite3_errstr(checkpoint_rc)
    int frames_in_wal = -1;
    int frames_checkpointed = -1;
    bool fully_checkpointed = false;  // SQLITE_OK and frames_checkpointed == frames_in_wal
  };
  std::optional<Wal> wal;
  std::optional<int64_t> page_size;       // PRAGMA page_size, bytes
  std::optional<int64_t> page_count;      // PRAGMA page_count
  std::optional<int64_t> freelist_count;  // PRAGMA freelist_count
  std::optional<int> auto_vacuum;         // PRAGMA auto_vacuum (2: INCREMENTAL)
  // The file was found corrupt: a quick_check or integrity_check that did not say "ok", or
  // an error classified fatal (kCorruption). Nothing was written to it then, not even by
  // the closing checkpoint (SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE).
  bool corrupt = false;
};

// Inspects the file at `path` for `check` with a read-write connection of its own (busy
// timeout options.busy_timeout_ms; read-write only for the checkpoint; never creates the
// file). `processing_cutoff_ms`: the wall-clock claimed_at below which a 'processing' row
// is counted (processing_claimed_before). *out holds what was read, also on an error.
// Errors: as above; kCorruption for a file found corrupt by an error (also marked in
// out->corrupt).
Status inspect_sqlite(const std::string& path, const InboxOptions& options,
                      int64_t processing_cutoff_ms, SqliteInspection* out);

// The rows of inbox_meta, key -> value, on `inbox`'s connection.
Status read_sqlite_meta(Inbox& inbox, std::map<std::string, std::string>* out);

// The consumer names that have store-then-process rows (inbox_messages), whatever their
// status.
Status list_sqlite_stp_consumers(Inbox& inbox, std::set<std::string>* out);

// The status of the store-then-process row of (consumer, message_id): 'pending',
// 'processing', 'done' or 'dead'; *out is left empty if there is none.
Status read_sqlite_stored_status(Inbox& inbox, const std::string& consumer,
                                 const std::string& message_id, std::optional<std::string>* out);

// Dead letters of one consumer, reason and status ('dead', 'requeued', 'replayed').
struct SqliteDeadLetterCount {
  std::string consumer, reason, status;
  int64_t count = 0;
};

// The counts `stats` shows beside InboxStats.
struct SqliteCounts {
  std::vector<SqliteDeadLetterCount> dead_letters;      // grouped by consumer, reason, status
  std::map<std::string, int64_t> attempts_by_consumer;  // inbox_attempts rows
};

// Reads the counts above in two statements on `inbox`'s connection.
Status count_sqlite(Inbox& inbox, SqliteCounts* out);

// What a retention pass with these cutoffs (ms on the inbox's retention clock) would
// delete: processed ids with received_at < claims_cutoff, per consumer (consumers with none
// absent), and (if dead_letters_cutoff > 0) dead letters with retention_at <
// dead_letters_cutoff that are not 'requeued'; the outbox's sent rows with retention_at <
// claims_cutoff and (if dead_letters_cutoff > 0) its dead rows with retention_at <
// dead_letters_cutoff. The counts not read stay 0. As count_expired_postgres
// (store/postgres/admin.h).
Status count_expired_sqlite(Inbox& inbox, int64_t claims_cutoff, int64_t dead_letters_cutoff,
                            std::map<std::string, int64_t>* claims_by_consumer,
                            int64_t* dead_letters, int64_t* outbox_sent, int64_t* outbox_dead);

// One processed id as `export` writes it. The debugging columns are set only where the row
// has them (InboxOptions::record_metadata).
struct SqliteProcessedRow {
  std::string consumer;
  std::string message_id;
  int64_t received_at = 0;  // retention clock, ms
  std::optional<std::string> topic, message_type, correlation_id;
  std::optional<int64_t> payload_hash;
};

// Which processed ids read_sqlite_processed_page reads: in primary-key order (consumer,
// message id), those after (after_consumer, after_message_id) unless `from_start`, with
// received_at >= since_received_at if given, of `consumer` if not empty, at most `limit`.
struct SqliteProcessedPage {
  bool from_start = true;
  std::string after_consumer;
  std::string after_message_id;
  std::optional<int64_t> since_received_at;
  std::string consumer;
  int limit = 1000;
};

// Calls `row` with each processed id of `page`, in key order, while it reads them (one
// statement on `inbox`'s connection: a page is short, and the caller pages on the last key
// it was given, so no read snapshot is held between pages). *count (optional) receives
// the rows given to `row`. An exception `row` throws ends the read as an error (kInternal,
// its text).
Status read_sqlite_processed_page(Inbox& inbox, const SqliteProcessedPage& page,
                                  const std::function<void(const SqliteProcessedRow&)>& row,
                                  int64_t* count = nullptr);

}  // namespace mqtt_inbox::detail

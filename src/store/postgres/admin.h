// What the admin tool (tools/, docs/admin-tool.md) reads of a PostgreSQL inbox that it does
// not get from the public Inbox: the facts `check` reports before anything opens the
// inbox (schema version, tables, the isolation level and durability settings a session of
// the inbox's role gets), the counts `stats` shows beside InboxStats, and what a `prune
// --dry-run` would delete. The SQL is in admin.cpp. This header names no libpqxx type;
// admin.cpp is built only with the PostgreSQL store (MQTT_INBOX_WITH_POSTGRES), and the
// tool calls it only then.
//
// Every call opens a connection of its own to `uri` (with InboxOptions::postgres_password_file
// and postgres_schema, as Inbox::open would), reads in one READ ONLY transaction and
// closes it: it never creates, migrates or writes anything, and takes no lock a consumer
// waits for. A `uri` holding a password is refused before connecting (kInvalidArgument,
// without repeating it), as Inbox::open refuses it.
//
// Thread safety: the calls share nothing; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mqtt_inbox/options.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// The PostgreSQL schema version this library writes (store/postgres/backend.h's
// kPgSchemaVersion, for code that does not include libpqxx).
int postgres_schema_version();

// The tables of the inbox's schema at postgres_schema_version(), inbox_meta included.
const std::vector<std::string>& postgres_inbox_tables();

// Dead letters of one consumer, reason and status ('dead', 'requeued', 'replayed').
struct PgDeadLetterCount {
  std::string consumer, reason, status;
  int64_t count = 0;
};

struct PgInspection {
  std::string server_version;      // SHOW server_version
  std::string isolation;           // SHOW default_transaction_isolation: what the role gets
  std::string synchronous_commit;  // SHOW synchronous_commit
  std::string fsync;               // SHOW fsync
  int64_t server_now_ms = 0;       // the server's clock (retention reads it)
  std::string role;                // current_user: the role the location logs in as
  // CREATE on the database and on the schema (false if it does not exist). Inbox::open
  // runs CREATE SCHEMA / CREATE TABLE ... IF NOT EXISTS at every open, and PostgreSQL
  // checks the privilege before it looks whether the object exists: without both, every
  // open fails with 42501 (which the store waits out as a server-side condition).
  bool can_create_in_database = false;
  bool can_create_in_schema = false;
  bool schema_exists = false;                 // the schema InboxOptions::postgres_schema names
  int schema_version = 0;                     // inbox_meta 'schema_version'; 0 if absent
  std::vector<std::string> tables;            // of postgres_inbox_tables(), present
  std::vector<std::string> missing_tables;    // of postgres_inbox_tables(), absent
  std::map<std::string, int64_t> row_counts;  // per table present (exact count)
  std::map<std::string, std::string> meta;    // inbox_meta, key -> value
  int64_t attempts_running = 0;               // inbox_attempts in state 'running'
  std::map<std::string, int64_t> attempts_by_consumer;
  std::vector<PgDeadLetterCount> dead_letters;  // grouped by consumer, reason, status
};

// Reads the facts above. The counts and meta are read only where their tables exist.
// Errors: kInvalidArgument (a password in `uri`, a bad schema name); kPermissionDenied (the server
// refused the role); kIoError (unreachable); other store codes classified by SQLSTATE.
Status inspect_postgres(const std::string& uri, const InboxOptions& options, PgInspection* out);

// What a retention pass with these cutoffs (ms on the server's clock) would delete:
// processed ids with received_at < claims_cutoff, per consumer, and (if
// dead_letters_cutoff > 0) dead letters with retention_at < dead_letters_cutoff that are
// not 'requeued'; the outbox's sent rows with retention_at < claims_cutoff and (if
// dead_letters_cutoff > 0) its dead rows with retention_at < dead_letters_cutoff.
// Errors: as inspect_postgres.
Status count_expired_postgres(const std::string& uri, const InboxOptions& options,
                              int64_t claims_cutoff, int64_t dead_letters_cutoff,
                              std::map<std::string, int64_t>* claims_by_consumer,
                              int64_t* dead_letters, int64_t* outbox_sent, int64_t* outbox_dead);

}  // namespace mqtt_inbox::detail

// The admin tool on the PostgreSQL store (docs/admin-tool.md#postgresql): what it reads of
// the server before opening the inbox, the commands whose PostgreSQL form differs from the
// SQLite one (stats, check, migrate), and prune's dry-run counts. Everything goes through
// the library: the public Inbox, and for what it has no call for, the store's read-only
// inspection (src/store/postgres/admin.h); no SQL here. In a build without the PostgreSQL
// store each of these fails with kUnsupported.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <mqtt_inbox/inbox.h>

#include "store/postgres/admin.h"

namespace mqtt_inbox::cli {

// The server's facts (detail::inspect_postgres) with the tool's options. A password in the
// location is refused (kUsage) without being repeated; a server that cannot be reached or
// refuses the role is a store error (kStoreError).
detail::PgInspection pg_inspect(const std::string& uri);

// fail(kSchema) unless the inbox's schema exists at the library's version: the tool never
// creates or migrates it by opening (only `migrate` does).
void pg_require_current_schema(const std::string& uri, const detail::PgInspection& f);

// pg_inspect, pg_require_current_schema, then Inbox::open (which then changes nothing).
std::unique_ptr<Inbox> pg_open_inbox(const std::string& uri);

// prune --dry-run: processed ids per consumer and sent outbox rows older than
// claims_cutoff, dead letters and outbox dead letters older than dead_letters_cutoff (0:
// none), on the server's clock.
void pg_count_expired(const std::string& uri, int64_t claims_cutoff, int64_t dead_letters_cutoff,
                      std::map<std::string, int64_t>* claims_by_consumer, int64_t* dead_letters,
                      int64_t* outbox_sent, int64_t* outbox_dead);

// The commands' PostgreSQL forms.
int cmd_pg_stats(const std::string& uri);
int cmd_pg_check(const std::string& uri);
int cmd_pg_migrate(const std::string& uri);

}  // namespace mqtt_inbox::cli

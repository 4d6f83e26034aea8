// The admin tool on the PostgreSQL store (see pg_admin.h).
#include "pg_admin.h"

#include <algorithm>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <mqtt_inbox/session_record.h>
#include <mqtt_inbox/stats.h>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

#if MQTT_INBOX_WITH_POSTGRES

namespace {

// What `check` and `stats` cannot say on PostgreSQL, because it is SQLite's alone.
const std::vector<std::string>& sqlite_only_items() {
  static const std::vector<std::string> items = {
      "journal mode, WAL size and checkpoints (the server manages its own WAL)",
      "quick_check/integrity_check (run amcheck or pg_amcheck on the server)",
      "the synchronous record in inbox_meta (the server's synchronous_commit and fsync are "
      "checked instead)",
      "file size, free pages and free disk space (the server's files are not the client's)",
      "the persisted retention clock (the server's clock is the retention clock)"};
  return items;
}

// Why Inbox::open with this role would fail at every attempt ("" if it would not): on a
// schema at the library's version it creates nothing, so USAGE and the table privileges
// are enough; a missing or older schema takes CREATE, which PostgreSQL checks before it
// looks whether the object exists (docs/postgres.md#privileges).
std::string open_privilege_problem(const detail::PgInspection& f) {
  if (f.schema_exists && f.schema_version == detail::postgres_schema_version()) return "";
  if (f.can_create_in_database && (!f.schema_exists || f.can_create_in_schema)) return "";
  return "role '" + f.role + "' has no CREATE privilege on " +
         (f.can_create_in_database ? "schema '" + g.pg_schema + "'" : "the database") +
         ", and the schema is " + (f.schema_exists ? "at an older version" : "missing") +
         ": creating or migrating it takes CREATE (42501 otherwise). Run `mqtt-inbox migrate` "
         "as the schema's owner, or GRANT CREATE on the database and schema to this role "
         "(docs/postgres.md#privileges)";
}

// The tool never waits for ever at start-up: a server that stays unavailable, or refuses
// the role, is a store error after the busy timeout (at least 2 s).
mi::InboxOptions pg_inbox_options() {
  mi::InboxOptions o = tool_inbox_options();
  o.startup_deadline_ms = std::max(g.busy_timeout_ms, 2000);
  return o;
}

}  // namespace

detail::PgInspection pg_inspect(const std::string& uri) {
  detail::PgInspection f;
  const mi::Status s = detail::inspect_postgres(uri, tool_inbox_options(), &f);
  if (s.code() == mi::Status::Code::kInvalidArgument)
    fail(kUsage, s.message() + (s.message().find("password") != std::string::npos
                                    ? "; for mqtt-inbox: --password-file FILE"
                                    : ""));
  if (!s.ok()) fail(kStoreError, s.to_string());
  return f;
}

void pg_require_current_schema(const std::string& uri, const detail::PgInspection& f) {
  const int want = detail::postgres_schema_version();
  if (!f.schema_exists || f.schema_version == 0)
    fail(kSchema, uri + " has no mqtt-inbox schema '" + g.pg_schema +
                      "' (nothing was created): check the location and --pg-schema, or start "
                      "the application once (Inbox::open creates it), or run `mqtt-inbox "
                      "migrate`");
  if (f.schema_version > want)
    fail(kSchema, uri + ": schema '" + g.pg_schema + "' is at version " +
                      std::to_string(f.schema_version) + ", newer than this tool's " +
                      std::to_string(want) +
                      ": use the mqtt-inbox tool of the release that wrote it");
  if (f.schema_version < want)
    fail(kSchema, uri + ": schema '" + g.pg_schema + "' is at version " +
                      std::to_string(f.schema_version) + ", older than this tool's " +
                      std::to_string(want) + ". Nothing was changed. Run `mqtt-inbox migrate " +
                      uri + "` after upgrading the application that uses it.");
}

std::unique_ptr<mi::Inbox> pg_open_inbox(const std::string& uri) {
  const detail::PgInspection f = pg_inspect(uri);
  pg_require_current_schema(uri, f);
  if (const std::string why = open_privilege_problem(f); !why.empty()) fail(kStoreError, why);
  std::unique_ptr<mi::Inbox> inbox;
  const mi::Status s = mi::Inbox::open(uri, pg_inbox_options(), &inbox);
  if (s.code() == mi::Status::Code::kInvalidArgument) fail(kUsage, s.message());
  if (!s.ok())
    fail(s.code() == mi::Status::Code::kCorruption ? kSchema : kStoreError, s.to_string());
  return inbox;
}

void pg_count_expired(const std::string& uri, int64_t claims_cutoff, int64_t dead_letters_cutoff,
                      std::map<std::string, int64_t>* claims_by_consumer, int64_t* dead_letters,
                      int64_t* outbox_sent, int64_t* outbox_dead) {
  check_status(
      detail::count_expired_postgres(uri, tool_inbox_options(), claims_cutoff, dead_letters_cutoff,
                                     claims_by_consumer, dead_letters, outbox_sent, outbox_dead),
      "counting expired rows");
}

int cmd_pg_stats(const std::string& uri) {
  auto inbox = pg_open_inbox(uri);
  check_status(inbox->refresh_row_stats(), "measuring rows");
  const mi::InboxStats s = inbox->stats();
  // After the Inbox's own reads: the counts the public Inbox has no call for.
  const detail::PgInspection f = pg_inspect(uri);
  const int64_t clock = s.retention_clock_ms;

  std::set<std::string> names;
  for (const auto& c : s.consumers) names.insert(c.first);
  for (const auto& a : f.attempts_by_consumer) names.insert(a.first);
  std::map<std::string, std::map<std::string, int64_t>> dead_by_reason;
  std::map<std::string, int64_t> requeued, replayed;
  for (const auto& d : f.dead_letters) {
    names.insert(d.consumer);
    if (d.status == "dead")
      dead_by_reason[d.consumer][d.reason] += d.count;
    else if (d.status == "requeued")
      requeued[d.consumer] += d.count;
    else
      replayed[d.consumer] += d.count;
  }
  std::optional<int64_t> required;
  if (auto it = f.meta.find("required_window_ms"); it != f.meta.end()) {
    try {
      required = std::stoll(it->second);
    } catch (...) {
    }
  }

  json j;
  j["database"] = uri;
  j["store"] = "postgresql";
  j["schema"] = g.pg_schema;
  j["schema_version"] = f.schema_version;
  j["library_schema_version"] = detail::postgres_schema_version();
  j["server_version"] = f.server_version;
  j["retention_clock_ms"] = clock;  // the server's clock
  j["wall_clock_ms"] = wall_now_ms();
  j["required_window_ms"] = required ? json(*required) : json();
  j["not_applicable"] = sqlite_only_items();
  j["consumers"] = json::array();
  std::vector<std::vector<std::string>> rows;
  for (const auto& name : names) {
    mi::ConsumerRows r;
    if (auto it = s.consumers.find(name); it != s.consumers.end()) r = it->second;
    const int64_t attempts =
        f.attempts_by_consumer.count(name) ? f.attempts_by_consumer.at(name) : 0;
    json reasons = json::object();
    int64_t dead_total = 0;
    std::string reasons_cell;
    for (const auto& kv : dead_by_reason[name]) {
      reasons[kv.first] = kv.second;
      dead_total += kv.second;
      reasons_cell +=
          (reasons_cell.empty() ? "" : ",") + kv.first + "=" + std::to_string(kv.second);
    }
    j["consumers"].push_back({{"name", name},
                              {"processed_rows", r.rows},
                              {"oldest_received_at", r.oldest_received_at},
                              {"newest_received_at", r.newest_received_at},
                              {"oldest_age_ms", r.rows ? clock - r.oldest_received_at : 0},
                              {"attempts_in_progress", attempts},
                              {"dead_letters",
                               {{"dead", dead_total},
                                {"by_reason", reasons},
                                {"requeued", requeued[name]},
                                {"replayed", replayed[name]}}},
                              {"store_then_process", nullptr}});
    rows.push_back(
        {name, std::to_string(r.rows), r.rows ? human_ms(clock - r.oldest_received_at) : "-",
         r.rows ? human_ms(clock - r.newest_received_at) : "-",
         std::to_string(dead_total) +
             (requeued[name] ? " (+" + std::to_string(requeued[name]) + " requeued)" : ""),
         reasons_cell.empty() ? "-" : reasons_cell, std::to_string(attempts)});
  }
  const SessionsSection sessions = read_sessions_section(*inbox);
  j["sessions"] = sessions.list;
  j["sessions_lost"] = sessions.lost_total;
  if (g.json) {
    emit(j);
    return kOk;
  }
  print_kv(
      {{"database", uri},
       {"store", "PostgreSQL " + f.server_version + ", schema " + g.pg_schema},
       {"schema version", std::to_string(f.schema_version) + " (tool " +
                              std::to_string(detail::postgres_schema_version()) + ")"},
       {"retention clock", std::to_string(clock) + " ms (the server's clock, ~" + iso(clock) +
                               "; wall " + iso(wall_now_ms()) + ")"},
       {"required window", required ? human_ms(*required) : "not recorded (no Pruner has run)"}});
  std::cout << "\n";
  print_table(
      {"consumer", "processed", "oldest age", "newest age", "dead", "dead by reason", "attempts"},
      rows);
  print_sessions_section(sessions);
  std::cout << "\nNot on PostgreSQL (SQLite only): db and WAL sizes, the persisted retention "
               "clock; not yet: store-then-process counts (docs/admin-tool.md#postgresql).\n";
  return kOk;
}

int cmd_pg_check(const std::string& uri) {
  const detail::PgInspection f = pg_inspect(uri);
  const int want = detail::postgres_schema_version();
  json problems = json::array(), warnings = json::array();
  if (f.isolation != "read committed")
    problems.push_back("default_transaction_isolation is '" + f.isolation +
                       "' for this role and database: the inbox's claim needs READ COMMITTED and "
                       "Inbox::open refuses to run under it; set it to 'read committed' for the "
                       "inbox's role or database (docs/postgres.md#read-committed)");
  if (f.fsync != "on")
    problems.push_back("fsync is '" + f.fsync +
                       "' on the server: commits acked to the broker can be lost in a crash");
  if (f.synchronous_commit == "off")
    problems.push_back(
        "synchronous_commit is 'off' for this role and database: the last commits before a "
        "server crash can be lost after their PUBACK (docs/postgres.md)");
  if (!f.schema_exists)
    problems.push_back("no schema '" + g.pg_schema +
                       "' in this database: not an mqtt-inbox database (check the location and "
                       "--pg-schema), or no application has opened it yet");
  else if (f.schema_version == 0)
    problems.push_back("schema '" + g.pg_schema + "' has no recorded schema version");
  else if (f.schema_version < want)
    problems.push_back("schema version " + std::to_string(f.schema_version) +
                       " is older than this tool's " + std::to_string(want) +
                       ": run `mqtt-inbox migrate` (after upgrading the application)");
  else if (f.schema_version > want)
    problems.push_back("schema version " + std::to_string(f.schema_version) +
                       " is newer than this tool's " + std::to_string(want) +
                       ": use a newer mqtt-inbox");
  if (f.schema_exists && !f.missing_tables.empty()) {
    std::string missing;
    for (const auto& t : f.missing_tables) missing += (missing.empty() ? "" : ", ") + t;
    problems.push_back("tables missing from schema '" + g.pg_schema + "': " + missing);
  }
  if (const std::string why = open_privilege_problem(f); !why.empty()) warnings.push_back(why);
  if (f.schema_exists && !f.meta.count("required_window_ms"))
    warnings.push_back(
        "no retention horizon recorded (no Pruner has run): `prune` falls back to the library "
        "defaults");

  json j = {{"database", uri},
            {"store", "postgresql"},
            {"server_version", f.server_version},
            {"schema", g.pg_schema},
            {"schema_exists", f.schema_exists},
            {"schema_version", f.schema_version},
            {"library_schema_version", want},
            {"tables", f.tables},
            {"missing_tables", f.missing_tables},
            {"row_counts", f.row_counts},
            {"isolation", f.isolation},
            {"role", f.role},
            {"role_can_open", open_privilege_problem(f).empty()},
            {"synchronous_commit", f.synchronous_commit},
            {"fsync", f.fsync},
            {"attempts_running", f.attempts_running},
            {"server_clock_ms", f.server_now_ms},
            {"not_applicable", sqlite_only_items()}};
  if (auto it = f.meta.find("required_window_ms"); it != f.meta.end())
    j["required_window_ms"] = it->second;
  else
    j["required_window_ms"] = nullptr;
  j["problems"] = problems;
  j["warnings"] = warnings;
  j["ok"] = problems.empty();
  if (g.json) {
    emit(j);
  } else {
    std::string tables, counts;
    for (const auto& t : f.tables) tables += (tables.empty() ? "" : ", ") + t;
    for (const auto& kv : f.row_counts)
      counts += (counts.empty() ? "" : ", ") + kv.first + "=" + std::to_string(kv.second);
    print_kv({{"database", uri},
              {"store", "PostgreSQL " + f.server_version},
              {"schema", g.pg_schema + (f.schema_exists ? "" : " (absent)")},
              {"schema version",
               std::to_string(f.schema_version) + " (tool " + std::to_string(want) + ")"},
              {"tables", tables.empty() ? "-" : tables},
              {"rows", counts.empty() ? "-" : counts},
              {"isolation", f.isolation},
              {"synchronous_commit", f.synchronous_commit},
              {"fsync", f.fsync}});
    for (const auto& p : problems) std::cout << "PROBLEM: " << p.get<std::string>() << "\n";
    for (const auto& w : warnings) std::cout << "warning: " << w.get<std::string>() << "\n";
    std::cout << "not checked (SQLite only): journal mode/WAL, integrity_check, the synchronous "
                 "record, file and disk sizes (docs/admin-tool.md#postgresql)\n";
    std::cout << (problems.empty() ? "check: OK" : "check: PROBLEMS FOUND") << "\n";
  }
  return problems.empty() ? kOk : kProblems;
}

int cmd_pg_migrate(const std::string& uri) {
  const detail::PgInspection before = pg_inspect(uri);
  const int want = detail::postgres_schema_version();
  if (before.schema_version > want) pg_require_current_schema(uri, before);
  {
    std::unique_ptr<mi::Inbox> inbox;
    // Inbox::open creates the schema or applies its missing steps, under an advisory lock.
    const mi::Status s = mi::Inbox::open(uri, pg_inbox_options(), &inbox);
    if (s.code() == mi::Status::Code::kInvalidArgument) fail(kUsage, s.message());
    if (!s.ok())
      fail(s.code() == mi::Status::Code::kCorruption ? kSchema : kStoreError,
           "migrating: " + s.to_string());
  }
  const detail::PgInspection after = pg_inspect(uri);
  json j = {{"database", uri},
            {"schema", g.pg_schema},
            {"from_version", before.schema_version},
            {"to_version", after.schema_version},
            {"migrated", before.schema_version != after.schema_version}};
  if (g.json)
    emit(j);
  else if (before.schema_version == after.schema_version)
    std::cout << "schema '" << g.pg_schema << "' is up to date (version " << after.schema_version
              << ")\n";
  else
    std::cout << "schema '" << g.pg_schema << "' migrated from version " << before.schema_version
              << " to " << after.schema_version << "\n";
  return kOk;
}

#else  // A build without the PostgreSQL store: every PostgreSQL location is refused.

namespace {
[[noreturn]] void no_postgres() {
  fail(kUnsupported,
       "this mqtt-inbox was built without the PostgreSQL store (MQTT_INBOX_WITH_POSTGRES=OFF)");
}
}  // namespace

detail::PgInspection pg_inspect(const std::string&) { no_postgres(); }
void pg_require_current_schema(const std::string&, const detail::PgInspection&) { no_postgres(); }
std::unique_ptr<mi::Inbox> pg_open_inbox(const std::string&) { no_postgres(); }
void pg_count_expired(const std::string&, int64_t, int64_t, std::map<std::string, int64_t>*,
                      int64_t*, int64_t*, int64_t*) {
  no_postgres();
}
int cmd_pg_stats(const std::string&) { no_postgres(); }
int cmd_pg_check(const std::string&) { no_postgres(); }
int cmd_pg_migrate(const std::string&) { no_postgres(); }

#endif  // MQTT_INBOX_WITH_POSTGRES

}  // namespace mqtt_inbox::cli

// `mqtt-inbox check` and `mqtt-inbox migrate`: the schema, integrity, WAL and settings
// that void the guarantee, and applying this release's schema steps (docs/admin-tool.md).
#include <algorithm>
#include <cctype>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "pg_admin.h"
#include "store/sqlite/admin.h"
#include "store/sqlite/wal_guard.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

namespace {

// docs/operations.md#recovering-a-corrupt-database, in one line for the output.
std::string recovery_hint(const std::string& path) {
  return "the file is corrupt: stop the application, keep the file, and recover a copy: `sqlite3 " +
         path + " .recover` where your sqlite3 has it (Debian 12's lacks it), otherwise `sqlite3 " +
         path +
         " .dump` with its final ROLLBACK turned into COMMIT, into a new file; then check that "
         "file "
         "(docs/operations.md#recovering-a-corrupt-database has the commands and what can be lost)";
}

}  // namespace

int cmd_check(const std::string& path) {
  if (is_postgres(path)) return cmd_pg_check(path);
  require_file(path);
  json j;
  json problems = json::array(), warnings = json::array();
  j["database"] = path;
  // What the store reads (store/sqlite/admin.h): each part only if it was read before an
  // error stopped the inspection, so the report says what it found up to the error.
  mi::detail::SqliteInspection f;
  const mi::Status read =
      mi::detail::inspect_sqlite(path, tool_inbox_options(), wall_now_ms() - 60000, &f);
  if (f.schema_version) {
    const int version = *f.schema_version;
    j["schema_version"] = version;
    j["library_schema_version"] = mi::kSchemaVersion;
    if (version < mi::kSchemaVersion)
      problems.push_back("schema version " + std::to_string(version) +
                         " is older than this tool's " + std::to_string(mi::kSchemaVersion) +
                         ": run `mqtt-inbox migrate` (after upgrading the application)");
    else if (version > mi::kSchemaVersion)
      problems.push_back("schema version " + std::to_string(version) +
                         " is newer than this tool's " + std::to_string(mi::kSchemaVersion) +
                         ": use a newer mqtt-inbox");
  }
  if (f.has_inbox_tables && !*f.has_inbox_tables)
    problems.push_back("no inbox tables: not an mqtt-inbox database");
  if (f.journal_mode) {
    const std::string& mode = *f.journal_mode;
    j["journal_mode"] = mode;
    if (mode != "wal")
      problems.push_back("journal_mode is '" + mode +
                         "', not 'wal': the inbox requires WAL (Inbox::open or `mqtt-inbox "
                         "migrate` switches it back)");
  }
  auto report_check = [&](const std::optional<mi::detail::SqliteInspection::Check>& check,
                          const char* key) {
    if (!check) return;
    json lines = json::array();
    for (const auto& line : check->lines) lines.push_back(line);
    const bool ok = lines.size() == 1 && lines[0] == "ok";
    j[key] = {{"ok", ok}, {"result", lines}};
    if (!ok)
      problems.push_back(check->statement + " reported " + lines.dump() + ": " +
                         recovery_hint(path));
  };
  report_check(f.quick_check, "quick_check");
  report_check(f.integrity_check, "integrity_check");

  if (f.meta) {
    // synchronous is per connection and not stored in the file: only what the running
    // application recorded in inbox_meta can be checked (docs/admin-tool.md).
    std::map<std::string, std::string> meta = *f.meta;
    json sync;
    if (auto it = meta.find("synchronous"); it != meta.end()) {
      std::string v = it->second;
      std::transform(v.begin(), v.end(), v.begin(), ::tolower);
      const bool opt_in = meta.count("synchronous_opt_in") && meta["synchronous_opt_in"] != "0" &&
                          meta["synchronous_opt_in"] != "false";
      sync = {{"recorded", v}, {"opt_in", opt_in}};
      if (v != "full" && v != "2" && v != "extra" && v != "3" && !opt_in)
        problems.push_back(
            "the application runs with synchronous=" + v +
            " without an explicit opt-in: commits acked before a power loss can be lost");
      else if (v != "full" && v != "2" && v != "extra" && v != "3")
        warnings.push_back(
            "synchronous=" + v +
            " (opted in): the last commits before a power loss can be lost after their PUBACK");
    } else {
      sync = {{"recorded", nullptr}};
      warnings.push_back(
          "synchronous is not recorded in inbox_meta (this library version does not record it): "
          "cannot verify FULL");
    }
    j["synchronous"] = sync;
    j["required_window_ms"] =
        meta.count("required_window_ms") ? json(std::stoll(meta["required_window_ms"])) : json();
    if (!meta.count("required_window_ms"))
      warnings.push_back(
          "no retention horizon recorded (no Pruner has run): `prune` falls back to the library "
          "defaults");
  }

  // Stale claims (a worker died) and attempts left 'running' (a process died in a handler).
  // claimed_at is wall-clock time, so this is a hint for people, no more: a clock step
  // makes it wrong either way. The library never decides by it (the reaper watches
  // progress on a monotonic clock; a restart returns a dead process's claims at once).
  if (f.processing_claimed_before) {
    const int64_t stale = *f.processing_claimed_before;
    j["processing_older_than_60s"] = stale;
    if (stale > 0)
      warnings.push_back(
          std::to_string(stale) +
          " store-then-process row(s) 'processing' for over 60 s by their wall-clock claim time: "
          "a worker may hang (the reaper returns a claim without progress after lease_ms; a "
          "restart returns a dead process's claims at once)");
  }
  if (f.attempts_running) j["attempts_running"] = *f.attempts_running;

  if (f.wal) {
    const auto& w = *f.wal;
    j["wal"] = {{"bytes", w.bytes},
                {"checkpoint_rc", w.checkpoint_rc},
                {"frames_in_wal", w.frames_in_wal},
                {"frames_checkpointed", w.frames_checkpointed},
                {"fully_checkpointed", w.fully_checkpointed}};
    if (w.checkpoint_failed)
      problems.push_back("wal_checkpoint(PASSIVE) failed: " + w.checkpoint_error);
    else if (w.frames_in_wal > 0 && w.frames_checkpointed < w.frames_in_wal)
      warnings.push_back("WAL not fully checkpointed (" + std::to_string(w.frames_checkpointed) +
                         "/" + std::to_string(w.frames_in_wal) +
                         " frames): a reader holds an old snapshot, or the consumer is busy; it "
                         "grows until readers finish");
  }
  if (f.page_size) j["page_size"] = *f.page_size;
  if (f.page_count) j["page_count"] = *f.page_count;
  if (f.freelist_count) j["freelist_count"] = *f.freelist_count;
  if (f.auto_vacuum) {
    j["auto_vacuum"] = *f.auto_vacuum;
    if (*f.auto_vacuum != 2)
      warnings.push_back("auto_vacuum is not INCREMENTAL: pruning cannot give pages back");
    // The inbox recovers from a full disk by itself only with this much free
    // (docs/operations.md#disk-space).
    const int64_t free_space = mi::detail::free_bytes(path);
    const int64_t need = mi::min_free_bytes(static_cast<int>(*f.page_size));
    j["free_bytes"] = free_space;
    j["min_free_bytes"] = need;
    if (free_space >= 0 && free_space < need)
      warnings.push_back("only " + human_bytes(free_space) + " free on the file system of " + path +
                         "; the inbox needs at least " + human_bytes(need) +
                         " to recover from a full disk by itself (docs/operations.md#disk-space)");
  }

  if (!read.ok()) {
    // One classification of SQLite errors (src/store/sqlite/errors.h): a corrupt file is a
    // problem the check found (exit 2), a locked or failing store an error (exit 3).
    if (read.is_fatal_store_error())
      problems.push_back("SQLite: " + read.message() + ": " + recovery_hint(path));
    else
      problems.push_back("SQLite error: " + read.message());
    j["problems"] = problems;
    j["warnings"] = warnings;
    j["ok"] = false;
    if (g.json)
      emit(j);
    else if (f.corrupt) {
      for (const auto& p : problems) std::cout << "PROBLEM: " << p.get<std::string>() << "\n";
      std::cout << "check: PROBLEMS FOUND\n";
    }
    if (f.corrupt) return kProblems;
    fail(kStoreError, path + ": " + read.message());
  }
  j["problems"] = problems;
  j["warnings"] = warnings;
  j["ok"] = problems.empty();
  if (g.json)
    emit(j);
  else {
    print_kv({{"database", path},
              {"schema version", std::to_string(j["schema_version"].get<int>()) + " (tool " +
                                     std::to_string(mi::kSchemaVersion) + ")"},
              {"journal mode", j["journal_mode"].get<std::string>()},
              {"quick_check", j["quick_check"]["ok"].get<bool>() ? "ok" : "FAILED"},
              {"integrity_check", j["integrity_check"]["ok"].get<bool>() ? "ok" : "FAILED"},
              {"synchronous", j["synchronous"]["recorded"].is_null()
                                  ? "not recorded"
                                  : j["synchronous"]["recorded"].get<std::string>()},
              {"wal", human_bytes(j["wal"]["bytes"].get<int64_t>()) + ", checkpoint " +
                          std::to_string(j["wal"]["frames_checkpointed"].get<int>()) + "/" +
                          std::to_string(j["wal"]["frames_in_wal"].get<int>()) + " frames"}});
    for (const auto& p : problems) std::cout << "PROBLEM: " << p.get<std::string>() << "\n";
    for (const auto& w : warnings) std::cout << "warning: " << w.get<std::string>() << "\n";
    std::cout << (problems.empty() ? "check: OK" : "check: PROBLEMS FOUND") << "\n";
  }
  return problems.empty() ? kOk : kProblems;
}

int cmd_migrate(const std::string& path) {
  if (is_postgres(path)) return cmd_pg_migrate(path);
  const FileFacts f = read_facts(path);
  if (f.user_version > mi::kSchemaVersion) require_current_schema(path, f);
  const int before = f.user_version;
  const bool was_wal = f.journal_mode == "wal";
  {
    std::unique_ptr<mi::Inbox> inbox;
    const mi::Status s =
        mi::Inbox::open(path, tool_inbox_options(), &inbox);  // applies every missing step
    if (!s.ok())
      fail(s.code() == mi::Status::Code::kCorruption ? kSchema : kStoreError,
           "migrating: " + s.to_string());
  }
  const FileFacts after = read_facts(path);
  json j = {{"database", path},
            {"from_version", before},
            {"to_version", after.user_version},
            {"migrated", before != after.user_version},
            {"journal_mode_fixed", !was_wal && after.journal_mode == "wal"}};
  if (g.json)
    emit(j);
  else if (before == after.user_version)
    std::cout << "schema is up to date (version " << after.user_version << ")"
              << (!was_wal ? "; journal mode switched to WAL" : "") << "\n";
  else
    std::cout << "schema migrated from version " << before << " to " << after.user_version << "\n";
  return kOk;
}

}  // namespace mqtt_inbox::cli

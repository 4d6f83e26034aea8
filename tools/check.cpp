// `mqtt-inbox check` and `mqtt-inbox migrate`: the schema, integrity, WAL and settings
// that void the guarantee, and applying this release's schema steps (docs/admin-tool.md).
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <map>
#include <string>

#include <SQLiteCpp/SQLiteCpp.h>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "pg_admin.h"
#include "store/sqlite/errors.h"
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
  // Read-write only for the PASSIVE checkpoint; nothing else writes. Never creates.
  std::unique_ptr<SQLite::Database> conn;
  bool corrupt = false;
  // A corrupt file is never written, not even by the closing checkpoint.
  auto found_corrupt = [&] {
    corrupt = true;
    if (conn) sqlite3_db_config(conn->getHandle(), SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  };
  try {
    conn = std::make_unique<SQLite::Database>(path, SQLite::OPEN_READWRITE, g.busy_timeout_ms);
    SQLite::Database& db = *conn;
    const int version = db.execAndGet("PRAGMA user_version").getInt();
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
    const bool tables =
        db.execAndGet("SELECT count(*) FROM sqlite_master WHERE name = 'inbox_processed'")
            .getInt() > 0;
    if (!tables) problems.push_back("no inbox tables: not an mqtt-inbox database");

    const std::string mode = db.execAndGet("PRAGMA journal_mode").getString();
    j["journal_mode"] = mode;
    if (mode != "wal")
      problems.push_back("journal_mode is '" + mode +
                         "', not 'wal': the inbox requires WAL (Inbox::open or `mqtt-inbox "
                         "migrate` switches it back)");

    auto run_check = [&](const char* pragma, const char* key) {
      SQLite::Statement q(db, pragma);
      json lines = json::array();
      while (q.executeStep()) lines.push_back(q.getColumn(0).getString());
      const bool ok = lines.size() == 1 && lines[0] == "ok";
      j[key] = {{"ok", ok}, {"result", lines}};
      if (!ok) {
        problems.push_back(std::string(pragma) + " reported " + lines.dump() + ": " +
                           recovery_hint(path));
        found_corrupt();
      }
    };
    run_check("PRAGMA quick_check", "quick_check");
    run_check("PRAGMA integrity_check", "integrity_check");

    // synchronous is per connection and not stored in the file: only what the running
    // application recorded in inbox_meta can be checked (docs/admin-tool.md).
    std::map<std::string, std::string> meta;
    if (tables) {
      SQLite::Statement q(db, "SELECT key, value FROM inbox_meta");
      while (q.executeStep()) meta[q.getColumn(0).getString()] = q.getColumn(1).getString();
    }
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

    if (tables && version >= 2) {
      // Stale claims (a worker died) and attempts left 'running' (a process died in a handler).
      // claimed_at is wall-clock time, so this is a hint for people, no more: a clock step
      // makes it wrong either way. The library never decides by it (the reaper watches
      // progress on a monotonic clock; a restart returns a dead process's claims at once).
      const int64_t stale = db.execAndGet(
                                  "SELECT count(*) FROM inbox_messages WHERE status = 'processing' "
                                  "AND claimed_at < " +
                                  std::to_string(wall_now_ms() - 60000))
                                .getInt64();
      j["processing_older_than_60s"] = stale;
      if (stale > 0)
        warnings.push_back(
            std::to_string(stale) +
            " store-then-process row(s) 'processing' for over 60 s by their wall-clock claim time: "
            "a worker may hang (the reaper returns a claim without progress after lease_ms; a "
            "restart returns a dead process's claims at once)");
    }
    if (tables) {
      const int64_t running =
          db.execAndGet("SELECT count(*) FROM inbox_attempts WHERE state = 'running'").getInt64();
      j["attempts_running"] = running;
    }

    struct stat st {};
    const int64_t wal_before = ::stat((path + "-wal").c_str(), &st) == 0 ? st.st_size : 0;
    int log = -1, ckpt = -1;
    const int rc = corrupt ? SQLITE_OK
                           : sqlite3_wal_checkpoint_v2(db.getHandle(), nullptr,
                                                       SQLITE_CHECKPOINT_PASSIVE, &log, &ckpt);
    j["wal"] = {{"bytes", wal_before},
                {"checkpoint_rc", rc},
                {"frames_in_wal", log},
                {"frames_checkpointed", ckpt},
                {"fully_checkpointed", rc == SQLITE_OK && log == ckpt}};
    if (rc != SQLITE_OK && rc != SQLITE_BUSY)
      problems.push_back(std::string("wal_checkpoint(PASSIVE) failed: ") + sqlite3_errstr(rc));
    else if (log > 0 && ckpt < log)
      warnings.push_back("WAL not fully checkpointed (" + std::to_string(ckpt) + "/" +
                         std::to_string(log) +
                         " frames): a reader holds an old snapshot, or the consumer is busy; it "
                         "grows until readers finish");
    j["page_size"] = db.execAndGet("PRAGMA page_size").getInt64();
    j["page_count"] = db.execAndGet("PRAGMA page_count").getInt64();
    j["freelist_count"] = db.execAndGet("PRAGMA freelist_count").getInt64();
    j["auto_vacuum"] = db.execAndGet("PRAGMA auto_vacuum").getInt();
    if (j["auto_vacuum"].get<int>() != 2)
      warnings.push_back("auto_vacuum is not INCREMENTAL: pruning cannot give pages back");
    // The inbox recovers from a full disk by itself only with this much free
    // (docs/operations.md#disk-space).
    const int64_t free_space = mi::detail::free_bytes(path);
    const int64_t need = mi::min_free_bytes(static_cast<int>(j["page_size"].get<int64_t>()));
    j["free_bytes"] = free_space;
    j["min_free_bytes"] = need;
    if (free_space >= 0 && free_space < need)
      warnings.push_back("only " + human_bytes(free_space) + " free on the file system of " + path +
                         "; the inbox needs at least " + human_bytes(need) +
                         " to recover from a full disk by itself (docs/operations.md#disk-space)");
  } catch (const SQLite::Exception& e) {
    // One classification of SQLite errors (src/store/sqlite/errors.h): a corrupt file is a
    // problem the check found (exit 2), a locked or failing store an error (exit 3).
    const auto cls = mi::detail::error_class(e.getErrorCode());
    if (cls == mi::detail::ErrorClass::kFatal) {
      found_corrupt();
      problems.push_back(std::string("SQLite: ") + e.what() + ": " + recovery_hint(path));
    } else {
      problems.push_back(std::string("SQLite error: ") + e.what());
    }
    j["problems"] = problems;
    j["warnings"] = warnings;
    j["ok"] = false;
    if (g.json)
      emit(j);
    else if (corrupt) {
      for (const auto& p : problems) std::cout << "PROBLEM: " << p.get<std::string>() << "\n";
      std::cout << "check: PROBLEMS FOUND\n";
    }
    if (corrupt) return kProblems;
    fail(kStoreError, path + ": " + e.what());
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

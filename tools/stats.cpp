// `mqtt-inbox stats`: rows per consumer, sizes, schema, dead letters and
// store-then-process counts (docs/admin-tool.md).
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <mqtt_inbox/session_record.h>
#include <mqtt_inbox/stats.h>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "pg_admin.h"
#include "store/sqlite/admin.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

namespace {

// Why "oldest age"/"newest age" can be smaller than the time that really passed.
constexpr const char* kAgesNote =
    "ages are on the retention clock as this file last recorded it (the larger of the "
    "persisted value and the newest row): the clock does not run while no consumer does, "
    "and a consumer persists it only at each Pruner pass and at a clean stop, so a "
    "running consumer is ahead of it and the time since the last persist before a "
    "kill -9 or power loss is not counted (ids are then kept longer, never shorter)";

}  // namespace

SessionsSection read_sessions_section(Inbox& inbox) {
  std::vector<mi::SessionRecord> records;
  check_status(inbox.sessions().list(&records), "reading the session records");
  SessionsSection s;
  for (const auto& r : records) {
    s.lost_total += r.sessions_lost;
    s.list.push_back({{"client_id", json_text(r.client_id)},
                      {"topic_filters", r.topic_filters.size()},
                      {"session_expiry_ms", r.session_expiry_ms},
                      {"updated_at", r.updated_at_ms},
                      {"sessions_lost", r.sessions_lost},
                      {"last_lost_at", r.last_lost_at_ms ? json(r.last_lost_at_ms) : json()}});
    s.rows.push_back({printable(r.client_id, 60), std::to_string(r.topic_filters.size()),
                      human_ms(r.session_expiry_ms), iso(r.updated_at_ms),
                      std::to_string(r.sessions_lost),
                      r.last_lost_at_ms ? iso(r.last_lost_at_ms) : "-"});
  }
  return s;
}

void print_sessions_section(const SessionsSection& s) {
  if (s.rows.empty()) return;
  std::cout << "\n";
  print_table({"session of client", "filters", "expiry", "recorded", "sessions lost", "last lost"},
              s.rows);
  if (s.lost_total > 0)
    std::cout << "\nThe broker lost " << s.lost_total
              << " session(s) holding topic filters: what it had queued for them then is gone "
                 "(docs/operations.md#stats).\n";
}

int cmd_stats(const std::string& path) {
  if (is_postgres(path)) return cmd_pg_stats(path);
  auto inbox = open_inbox(path);
  const FileFacts facts = read_facts(path);
  check_status(inbox->refresh_row_stats(), "measuring rows");
  const mi::InboxStats s = inbox->stats();
  const auto meta = read_meta(*inbox);
  const int64_t clock = s.retention_clock_ms;

  std::set<std::string> names;
  for (const auto& c : s.consumers) names.insert(c.first);
  std::map<std::string, std::map<std::string, int64_t>> dead_by_reason;
  std::map<std::string, int64_t> replayed, requeued, attempts;
  mi::detail::SqliteCounts counts;
  check_read(mi::detail::count_sqlite(*inbox, &counts), "counting dead letters");
  for (const auto& d : counts.dead_letters) {
    names.insert(d.consumer);
    if (d.status == "dead")
      dead_by_reason[d.consumer][d.reason] += d.count;
    else if (d.status == "requeued")
      requeued[d.consumer] += d.count;  // parked or requeued: still to apply
    else
      replayed[d.consumer] += d.count;
  }
  for (const auto& a : counts.attempts_by_consumer) {
    names.insert(a.first);
    attempts[a.first] = a.second;
  }
  const std::set<std::string> stp_names = stp_consumers(*inbox);
  names.insert(stp_names.begin(), stp_names.end());

  json j;
  j["database"] = path;
  j["schema_version"] = facts.user_version;
  j["library_schema_version"] = mi::kSchemaVersion;
  j["db_bytes"] = s.db_bytes;
  j["wal_bytes"] = s.wal_bytes;
  j["retention_clock_ms"] = clock;
  j["wall_clock_ms"] = wall_now_ms();
  const std::optional<int64_t> persisted = meta_int(meta, "retention_clock_ms");
  j["persisted_retention_clock_ms"] = persisted ? json(*persisted) : json();
  // The tool's clock starts where the file's clock stands (the larger of the persisted
  // value and the newest row, Inbox::open): the ages are lower bounds.
  j["ages_are_lower_bounds"] = true;
  j["ages_note"] = kAgesNote;
  j["required_window_ms"] =
      meta_int(meta, "required_window_ms") ? json(*meta_int(meta, "required_window_ms")) : json();
  j["consumers"] = json::array();
  std::vector<std::vector<std::string>> rows;
  for (const auto& name : names) {
    json c;
    c["name"] = name;
    mi::ConsumerRows r;
    if (auto it = s.consumers.find(name); it != s.consumers.end()) r = it->second;
    c["processed_rows"] = r.rows;
    c["oldest_received_at"] = r.oldest_received_at;
    c["newest_received_at"] = r.newest_received_at;
    c["oldest_age_ms"] = r.rows ? clock - r.oldest_received_at : 0;
    c["attempts_in_progress"] = attempts[name];
    json reasons = json::object();
    int64_t dead_total = 0;
    for (const auto& kv : dead_by_reason[name]) {
      reasons[kv.first] = kv.second;
      dead_total += kv.second;
    }
    c["dead_letters"] = {{"dead", dead_total},
                         {"by_reason", reasons},
                         {"requeued", requeued[name]},
                         {"replayed", replayed[name]}};
    std::string stp_cell = "-";
    if (stp_names.count(name)) {
      auto stp = stp_for(inbox.get(), name);
      mi::StoreThenProcessStats st;
      check_status(stp->stats(&st), "store-then-process stats");
      c["store_then_process"] = {{"pending", st.pending},
                                 {"processing", st.processing},
                                 {"done", st.done},
                                 {"dead", st.dead}};
      stp_cell = std::to_string(st.pending) + "/" + std::to_string(st.processing) + "/" +
                 std::to_string(st.done) + "/" + std::to_string(st.dead);
    } else {
      c["store_then_process"] = nullptr;
    }
    j["consumers"].push_back(c);
    std::string reasons_cell;
    for (const auto& kv : dead_by_reason[name])
      reasons_cell +=
          (reasons_cell.empty() ? "" : ",") + kv.first + "=" + std::to_string(kv.second);
    rows.push_back(
        {name, std::to_string(r.rows), r.rows ? human_ms(clock - r.oldest_received_at) : "-",
         r.rows ? human_ms(clock - r.newest_received_at) : "-",
         std::to_string(dead_total) +
             (requeued[name] ? " (+" + std::to_string(requeued[name]) + " requeued)" : ""),
         reasons_cell.empty() ? "-" : reasons_cell, std::to_string(attempts[name]), stp_cell});
  }
  // Sessions the broker lost, per client id, across restarts (SessionRecord::sessions_lost,
  // schema step 13): the in-process count (InboxStats::sessions_lost) died with its process.
  const SessionsSection sessions = read_sessions_section(*inbox);
  j["sessions"] = sessions.list;
  j["sessions_lost"] = sessions.lost_total;
  if (g.json) {
    emit(j);
    return kOk;
  }
  print_kv({{"database", path},
            {"schema version", std::to_string(facts.user_version) + " (tool " +
                                   std::to_string(mi::kSchemaVersion) + ")"},
            {"db size", human_bytes(s.db_bytes)},
            {"wal size", human_bytes(s.wal_bytes)},
            {"retention clock",
             std::to_string(clock) + " ms (~" + iso(clock) + "; wall " + iso(wall_now_ms()) + ")"},
            {"required window", j["required_window_ms"].is_null()
                                    ? "not recorded (no Pruner has run)"
                                    : human_ms(j["required_window_ms"].get<int64_t>())}});
  std::cout << "\n";
  print_table({"consumer", "processed", "oldest age", "newest age", "dead", "dead by reason",
               "attempts", "stp pend/proc/done/dead"},
              rows);
  print_sessions_section(sessions);
  std::cout << "\nNote: " << kAgesNote << ".\n";
  return kOk;
}

}  // namespace mqtt_inbox::cli

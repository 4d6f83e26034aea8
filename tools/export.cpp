// `mqtt-inbox export`: JSON Lines of processed ids and dead letters, for a support
// ticket (docs/admin-tool.md).
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <mqtt_inbox/version.h>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

int cmd_export(const std::string& path, const ExportArgs& a) {
  require_sqlite(path, "export");
  auto inbox = open_inbox(path);
  const int64_t clock = inbox->retention_clock_ms();
  const int64_t wall = wall_now_ms();
  std::optional<int64_t> since_clock, since_wall;
  if (!a.since.empty()) {
    since_clock = parse_time(a.since, clock, "--since");
    since_wall = parse_time(a.since, wall, "--since");
  }
  auto line = [](const json& j) {
    std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  };
  line({{"type", "header"},
        {"database", path},
        {"tool_version", MQTT_INBOX_VERSION_STRING},
        {"schema_version", mi::kSchemaVersion},
        {"exported_at", wall},
        {"retention_clock_ms", clock},
        {"since_received_at", since_clock ? json(*since_clock) : json()},
        {"since_dead_lettered_at", since_wall ? json(*since_wall) : json()},
        {"payload_encoding", a.encoding}});
  // Processed ids, in pages of 1000 keyed on the primary key: each page is one short
  // statement, so the export never holds a read snapshot (which would stop checkpoints).
  int64_t processed = 0;
  std::string last_consumer, last_id;
  bool first = true;
  for (;;) {
    int64_t n = 0;
    read_sql(*inbox, "exporting processed ids", [&](SQLite::Database& db) {
      std::string sql =
          "SELECT consumer_name, message_id, received_at, topic, message_type, correlation_id, "
          "payload_hash"
          " FROM inbox_processed WHERE (?1 OR (consumer_name, message_id) > (?2, ?3))";
      if (since_clock) sql += " AND received_at >= ?4";
      if (!a.consumer.empty()) sql += " AND consumer_name = ?5";
      sql += " ORDER BY consumer_name, message_id LIMIT 1000";
      SQLite::Statement q(db, sql);
      q.bind(1, first ? 1 : 0);
      q.bind(2, last_consumer);
      q.bind(3, last_id);
      if (since_clock) q.bind(4, *since_clock);
      if (!a.consumer.empty()) q.bind(5, a.consumer);
      while (q.executeStep()) {
        json j = {{"type", "processed"},
                  {"consumer", q.getColumn(0).getString()},
                  {"message_id", json_text(q.getColumn(1).getString())},
                  {"received_at", q.getColumn(2).getInt64()}};
        if (!q.getColumn(3).isNull()) j["topic"] = json_text(q.getColumn(3).getString());
        if (!q.getColumn(4).isNull()) j["message_type"] = json_text(q.getColumn(4).getString());
        if (!q.getColumn(5).isNull()) j["correlation_id"] = json_text(q.getColumn(5).getString());
        if (!q.getColumn(6).isNull()) j["payload_hash"] = q.getColumn(6).getInt64();
        line(j);
        last_consumer = q.getColumn(0).getString();
        last_id = q.getColumn(1).getString();
        ++n;
      }
    });
    first = false;
    processed += n;
    if (n < 1000) break;
  }
  mi::DeadLetterFilter f;
  if (!a.consumer.empty()) f.consumer_name = a.consumer;
  if (since_wall) f.since_ms = *since_wall;
  f.include_replayed = true;
  f.limit = 0;
  std::vector<mi::DeadLetter> dls;
  check_status(inbox->list_dead_letters(f, &dls), "exporting dead letters");
  for (const auto& d : dls) {
    json j = dl_json(d, true, a.encoding);
    j["type"] = "dead_letter";
    line(j);
  }
  line({{"type", "footer"}, {"processed", processed}, {"dead_letters", dls.size()}});
  return kOk;
}

}  // namespace mqtt_inbox::cli

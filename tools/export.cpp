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
#include "store/sqlite/admin.h"
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
    mi::detail::SqliteProcessedPage page;
    page.from_start = first;
    page.after_consumer = last_consumer;
    page.after_message_id = last_id;
    page.since_received_at = since_clock;
    page.consumer = a.consumer;
    page.limit = 1000;
    int64_t n = 0;
    check_read(mi::detail::read_sqlite_processed_page(
                   *inbox, page,
                   [&](const mi::detail::SqliteProcessedRow& r) {
                     json j = {{"type", "processed"},
                               {"consumer", r.consumer},
                               {"message_id", json_text(r.message_id)},
                               {"received_at", r.received_at}};
                     if (r.topic) j["topic"] = json_text(*r.topic);
                     if (r.message_type) j["message_type"] = json_text(*r.message_type);
                     if (r.correlation_id) j["correlation_id"] = json_text(*r.correlation_id);
                     if (r.payload_hash) j["payload_hash"] = *r.payload_hash;
                     line(j);
                     last_consumer = r.consumer;
                     last_id = r.message_id;
                   },
                   &n),
               "exporting processed ids");
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

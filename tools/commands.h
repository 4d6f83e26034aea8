// The admin tool's commands, one group per file (docs/admin-tool.md): each takes the
// database path and its parsed options, prints a table or (with --json) JSON, returns
// an exit code of tool.h, and reports failures by throwing ToolError (fail()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mqtt_inbox/dead_letter.h>
#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/sqlite.h>

#include "connection_flags.h"  // examples/common/: the flags every program that connects shares

namespace mqtt_inbox::cli {

// stats.cpp
int cmd_stats(const std::string& path);

// The session-records part of `stats`, the same on both stores (stats.cpp; pg_admin.cpp's
// PostgreSQL stats uses it too): the JSON list, the sessions the broker lost in total, and
// the table's rows. Reads through Inbox::sessions(); fail(kStoreError) on an error.
struct SessionsSection {
  nlohmann::json list = nlohmann::json::array();
  int64_t lost_total = 0;
  std::vector<std::vector<std::string>> rows;
};
SessionsSection read_sessions_section(Inbox& inbox);
// Prints the table (nothing when no session is recorded) and the loss warning.
void print_sessions_section(const SessionsSection& s);

// prune.cpp
struct PruneArgs {
  std::string older_than, dead_letters_older_than, session_expiry, max_offline, replay_window,
      margin;
  bool dry_run = false, force = false;
  int64_t budget_ms = 2000;
};
int cmd_prune(const std::string& path, const PruneArgs& a);

// dead_letters.cpp
struct DlArgs {
  std::string consumer, reason, since, before, message_id;
  int64_t id = 0;
  int64_t limit = 100;
  bool include_replayed = false, yes = false, all = false;
  std::string payload_encoding = "base64";
};
int cmd_dl_list(const std::string& path, const DlArgs& a);
int cmd_dl_show(const std::string& path, const DlArgs& a);
int cmd_dl_replay(const std::string& path, const DlArgs& a);
int cmd_dl_purge(const std::string& path, const DlArgs& a);
// Every dead-letter reason's text form, joined with `sep` (help and error texts).
std::string dl_reason_names(const char* sep);
// "dead", "requeued" or "replayed".
const char* dl_status(const DeadLetter& d);
// A dead letter as JSON (also export's "dead_letter" lines); the payload in `encoding`
// (base64 or hex) when `with_payload`.
nlohmann::json dl_json(const DeadLetter& d, bool with_payload,
                       const std::string& encoding = "base64");

// outbox.cpp: the transactional outbox (include/mqtt_inbox/outbox.h).
struct OutboxArgs {
  std::string state, message_id, before;  // state "" = dead
  int64_t limit = 100;
  bool yes = false, all = false;
  std::string payload_encoding = "base64";
};
int cmd_outbox_stats(const std::string& path);
int cmd_outbox_list(const std::string& path, const OutboxArgs& a);
int cmd_outbox_show(const std::string& path, const OutboxArgs& a);
int cmd_outbox_replay(const std::string& path, const OutboxArgs& a);
int cmd_outbox_purge(const std::string& path, const OutboxArgs& a);

// replay.cpp: the store-then-process mode's replay and reap.
struct ReplayArgs {
  std::string consumer, since, until, aggregate, message_id;
  bool include_dead = false, all = false;
};
int cmd_replay(const std::string& path, const ReplayArgs& a);
int cmd_reap(const std::string& path, const std::string& consumer, int64_t lease_ms);

// check.cpp
int cmd_check(const std::string& path);
int cmd_migrate(const std::string& path);

// fleet.cpp: a fleet's members and slots (docs/fleet.md).
struct FleetArgs {
  std::string group, prefix;  // prefix: the slots' client-id prefix ("" = the group)
  int slots = 8;
};
int cmd_fleet(const std::string& db, const FleetArgs& a);

// export.cpp
struct ExportArgs {
  std::string since, consumer, encoding = "base64";
};
int cmd_export(const std::string& path, const ExportArgs& a);

// probe_broker.cpp
struct ProbeArgs {
  connection_flags::Flags connection;  // --broker, --mqtt-version (default 5), TLS, credentials
  std::string topic_prefix = "mqtt-inbox/probe";
  int timeout_ms = 5000, count = 10, pause_offline_ms = 0;
  uint32_t session_expiry_s = 300;
  bool shared = false;        // --shared: also probe a shared subscription's absent member
  int receive_maximum = 5;    // the in-flight check's Receive Maximum (and PUBACKs before it stops)
  bool no_in_flight = false;  // --no-in-flight: skip the in-flight check
  std::string reload_command;      // --reload-command: the reload check runs only with it
  int pause_before_reload_ms = 0;  // a broker restart then
  int reload_settle_ms = 1000;     // waited after the command
};
int cmd_probe(const ProbeArgs& a);

}  // namespace mqtt_inbox::cli

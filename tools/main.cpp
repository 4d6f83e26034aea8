// mqtt-inbox: inspect, repair and verify an inbox on a live device (docs/admin-tool.md).
// This file: main and the command line (CLI11); each command group is in its own file
// (commands.h), output formatting in format.h.
//
//   mqtt-inbox stats DB                      mqtt-inbox check DB / migrate DB
//   mqtt-inbox prune DB [--older-than 8d]    mqtt-inbox export DB [--since 2d]
//   mqtt-inbox dead-letters list|show|replay|purge DB ...
//   mqtt-inbox outbox stats|list|show|replay|purge DB ...
//   mqtt-inbox replay DB --consumer C ...    mqtt-inbox probe-broker --broker URL
//   mqtt-inbox fleet DB --group G [--slots K]  (PostgreSQL)
//   DB: an SQLite file, or a PostgreSQL URI for stats, check, migrate, prune,
//   dead-letters and outbox (docs/admin-tool.md#postgresql; --password-file, --pg-schema)
//                                              [--cafile/--cert/--key/--username/... as
//                                               every example: connection_flags.h]
//
// Every command prints a table by default and JSON with --json. It works on a database a
// running consumer is using: every write goes through the library (short BEGIN IMMEDIATE
// transactions, the busy timeout), every read is a short statement of its own.
//
// Exit codes (also in docs/admin-tool.md):
//   0 ok; 1 usage; 2 check or probe found problems; 3 store error (missing file, not an
//   inbox, SQLite error); 4 refused (safety rule, no confirmation, already replayed);
//   5 schema version differs from this tool's (older: run `migrate`; newer: upgrade the
//   tool); 6 not possible on this store (PostgreSQL: export) or
//   without a library change (see the message); 7 broker
//   unreachable or protocol error; 8 nothing matched (unknown id or consumer).

#include <CLI/CLI.hpp>

#include <exception>
#include <functional>
#include <iostream>
#include <string>

#include <mqtt_inbox/postgres.h>
#include <mqtt_inbox/version.h>

#include "command_line.h"
#include "commands.h"
#include "tool.h"

using namespace mqtt_inbox::cli;

int main(int argc, char** argv) {
  CLI::App app{
      "mqtt-inbox " MQTT_INBOX_VERSION_STRING
      ": inspect, repair and verify an mqtt-inbox database "
      "(docs/admin-tool.md).\nExit codes: 0 ok, 1 usage, 2 problems found, 3 store error, 4 "
      "refused, "
      "5 schema version mismatch, 6 not on this store or needs a library change, 7 broker error, 8 "
      "nothing matched."};
  app.require_subcommand(1);
  app.fallthrough();
  app.add_flag("--json", g.json, "Print JSON instead of tables");
  app.add_option("--busy-timeout-ms", g.busy_timeout_ms,
                 "How long to wait for another connection's lock (default 5000)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--password-file", g.password_file,
                 "PostgreSQL: libpq password file for the location (default: PGPASSFILE, "
                 "~/.pgpass); a password is never taken on the command line");
  app.add_option("--pg-schema", g.pg_schema,
                 "PostgreSQL: the schema the inbox's tables are in (default mqtt_inbox)");
  app.set_version_flag("--version", MQTT_INBOX_VERSION_STRING);
  // What every command's DB argument may be (docs/admin-tool.md#postgresql).
  const char* const kDb =
      "Database file, or postgresql:// URI (stats, check, migrate, prune, dead-letters, outbox)";

  std::string db;
  std::function<int()> run;

  auto* stats = app.add_subcommand(
      "stats", "Rows per consumer, sizes, schema, dead letters, store-then-process counts");
  stats->add_option("DB", db, kDb)->required();
  stats->callback([&] { run = [&] { return cmd_stats(db); }; });

  PruneArgs pa;
  auto* prune = app.add_subcommand("prune", "One pruning pass with the library's Pruner");
  prune->add_option("DB", db, kDb)->required();
  prune->add_option("--older-than", pa.older_than,
                    "Window: forget ids older than this (default: the recorded horizon)");
  prune->add_option("--dead-letters-older-than", pa.dead_letters_older_than,
                    "Also delete dead letters older than this (default: keep)");
  prune->add_option("--session-expiry", pa.session_expiry,
                    "Declare the broker session expiry (raises the horizon)");
  prune->add_option("--max-offline", pa.max_offline,
                    "Declare the longest offline period (raises the horizon)");
  prune->add_option("--replay-window", pa.replay_window,
                    "Declare a replay window (raises the horizon)");
  prune->add_option("--margin", pa.margin, "Margin above the declared horizon (default 1h)");
  prune->add_option("--budget-ms", pa.budget_ms, "Time the pass may spend deleting (default 2000)")
      ->check(CLI::PositiveNumber);
  prune->add_flag("--dry-run", pa.dry_run, "Only count what would be deleted");
  prune->add_flag("--force", pa.force, "Accept a window below the horizon");
  prune->callback([&] { run = [&] { return cmd_prune(db, pa); }; });

  DlArgs da;
  auto* dl = app.add_subcommand("dead-letters", "List, show, re-queue or purge dead letters");
  dl->require_subcommand(1);
  dl->fallthrough();
  auto add_dl_filters = [&](CLI::App* c, bool filters) {
    c->add_option("DB", db, kDb)->required();
    c->add_option("--id", da.id, "Dead-letter row id");
    if (!filters) return;
    c->add_option("--consumer", da.consumer, "Consumer name");
    c->add_option("--reason", da.reason, dl_reason_names("|"));
    c->add_option("--since", da.since,
                  "Dead-lettered at or after (ms, 2h = 2 hours ago, or 2024-05-01T12:00:00Z)");
    c->add_option("--before", da.before, "Dead-lettered before (same forms)");
    c->add_option("--message-id", da.message_id, "The producer's message id");
    c->add_flag("--include-replayed", da.include_replayed, "Also rows already replayed");
  };
  auto* dl_list = dl->add_subcommand("list", "Dead letters, newest first");
  add_dl_filters(dl_list, true);
  dl_list->add_option("--limit", da.limit, "Rows at most (0 = all; default 100)");
  dl_list->callback([&] { run = [&] { return cmd_dl_list(db, da); }; });
  auto* dl_show = dl->add_subcommand("show", "One dead letter with its payload");
  add_dl_filters(dl_show, false);
  dl_show->add_option("--payload-encoding", da.payload_encoding, "base64|hex (JSON output)")
      ->check(CLI::IsMember({"base64", "hex"}));
  dl_show->callback([&] { run = [&] { return cmd_dl_show(db, da); }; });
  auto* dl_replay = dl->add_subcommand(
      "replay", "Re-queue a dead letter: the running application replays it (alias: requeue)");
  add_dl_filters(dl_replay, false);
  dl_replay->alias("requeue");
  dl_replay->callback([&] { run = [&] { return cmd_dl_replay(db, da); }; });
  auto* dl_purge = dl->add_subcommand("purge", "Delete dead letters (asks unless --yes)");
  add_dl_filters(dl_purge, true);
  dl_purge->add_flag("--yes", da.yes, "Do not ask");
  dl_purge->add_flag("--all", da.all, "Allow purging without a filter");
  dl_purge->callback([&] { run = [&] { return cmd_dl_purge(db, da); }; });

  OutboxArgs oa;
  auto* ob = app.add_subcommand(
      "outbox", "The transactional outbox: stats, list, show, replay or purge its rows");
  ob->require_subcommand(1);
  ob->fallthrough();
  auto* ob_stats = ob->add_subcommand(
      "stats", "Pending rows and bytes per class, oldest pending, sent and dead counts");
  ob_stats->add_option("DB", db, kDb)->required();
  ob_stats->callback([&] { run = [&] { return cmd_outbox_stats(db); }; });
  auto* ob_list = ob->add_subcommand("list", "Rows in one state, oldest first");
  ob_list->add_option("DB", db, kDb)->required();
  ob_list->add_option("--state", oa.state, "pending|sent|dead (default dead)")
      ->check(CLI::IsMember({"pending", "sent", "dead"}));
  ob_list->add_option("--limit", oa.limit, "Rows at most (default 100)")
      ->check(CLI::PositiveNumber);
  ob_list->callback([&] { run = [&] { return cmd_outbox_list(db, oa); }; });
  auto* ob_show = ob->add_subcommand("show", "One row with its payload");
  ob_show->add_option("DB", db, kDb)->required();
  ob_show->add_option("--message-id", oa.message_id, "The outgoing message id")->required();
  ob_show->add_option("--payload-encoding", oa.payload_encoding, "base64|hex (JSON output)")
      ->check(CLI::IsMember({"base64", "hex"}));
  ob_show->callback([&] { run = [&] { return cmd_outbox_show(db, oa); }; });
  auto* ob_replay = ob->add_subcommand(
      "replay", "Make an outbox dead letter pending again (same id, end of the queue)");
  ob_replay->add_option("DB", db, kDb)->required();
  ob_replay->add_option("--message-id", oa.message_id, "The outgoing message id")->required();
  ob_replay->callback([&] { run = [&] { return cmd_outbox_replay(db, oa); }; });
  auto* ob_purge = ob->add_subcommand(
      "purge", "Delete dead (default) or sent rows; never pending ones (asks unless --yes)");
  ob_purge->add_option("DB", db, kDb)->required();
  ob_purge->add_option("--state", oa.state, "dead|sent (default dead)")
      ->check(CLI::IsMember({"dead", "sent"}));
  ob_purge->add_option("--message-id", oa.message_id, "Only this outgoing message id");
  ob_purge->add_option("--before", oa.before,
                       "Dead (or sent) before (ms, 2h = 2 hours ago, or 2024-05-01T12:00:00Z)");
  ob_purge->add_flag("--all", oa.all, "Allow purging without a filter");
  ob_purge->add_flag("--yes", oa.yes, "Do not ask");
  ob_purge->callback([&] { run = [&] { return cmd_outbox_purge(db, oa); }; });

  ReplayArgs ra;
  auto* replay = app.add_subcommand(
      "replay", "Store-then-process: reset rows to pending so the workers run them again");
  replay->add_option("DB", db, kDb)->required();
  replay->add_option("--consumer", ra.consumer, "Store-then-process consumer name")->required();
  replay->add_option("--since", ra.since,
                     "Received at or after (retention clock ms, 2h = 2 hours ago, or a UTC time)");
  replay->add_option("--until", ra.until, "Received before (same forms)");
  replay->add_option("--aggregate", ra.aggregate, "Aggregate key");
  replay->add_option("--id", ra.message_id, "The producer's message id");
  replay->add_flag("--include-dead", ra.include_dead, "Also rows the workers dead-lettered");
  replay->add_flag("--all", ra.all, "Every finished row of the consumer");
  replay->callback([&] { run = [&] { return cmd_replay(db, ra); }; });

  std::string reap_consumer;
  int64_t reap_lease_ms = 0;
  auto* reap = app.add_subcommand(
      "reap", "Store-then-process: return claims that make no progress for a lease to pending");
  reap->add_option("DB", db, kDb)->required();
  reap->add_option("--consumer", reap_consumer, "Store-then-process consumer name")->required();
  reap->add_option("--lease-ms", reap_lease_ms,
                   "How long to watch the claims for progress, ms (default: the library's 60000)");
  reap->callback([&] { run = [&] { return cmd_reap(db, reap_consumer, reap_lease_ms); }; });

  auto* check =
      app.add_subcommand("check", "Schema, integrity, WAL and settings that void the guarantee");
  check->add_option("DB", db, kDb)->required();
  check->callback([&] { run = [&] { return cmd_check(db); }; });

  auto* migrate = app.add_subcommand("migrate", "Apply the schema migrations of this release");
  migrate->add_option("DB", db, kDb)->required();
  migrate->callback([&] { run = [&] { return cmd_migrate(db); }; });

  FleetArgs fa;
  auto* fleet = app.add_subcommand(
      "fleet", "A fleet's members and slots: who holds each, when each last renewed");
  fleet->add_option("DB", db, "postgresql:// URI of the fleet's inbox")->required();
  fleet->add_option("--group", fa.group, "The fleet's group (FleetOptions::group)")->required();
  fleet->add_option("--slots", fa.slots, "The fleet's slot count (default 8)")
      ->check(CLI::Range(1, 1024));
  fleet->add_option("--client-id-prefix", fa.prefix,
                    "The slots' client-id prefix (default: the group)");
  fleet->callback([&] { run = [&] { return cmd_fleet(db, fa); }; });

  ExportArgs ea;
  auto* exp = app.add_subcommand(
      "export", "JSON Lines of processed ids and dead letters, for a support ticket");
  exp->add_option("DB", db, kDb)->required();
  exp->add_option("--since", ea.since,
                  "Only rows since (a duration ago like 2d, ms, or a UTC time)");
  exp->add_option("--consumer", ea.consumer, "Only this consumer");
  exp->add_option("--payload-encoding", ea.encoding, "base64|hex")
      ->check(CLI::IsMember({"base64", "hex"}));
  exp->callback([&] { run = [&] { return cmd_export(db, ea); }; });

  ProbeArgs pr;
  auto* probe = app.add_subcommand(
      "probe-broker", "Check that the broker keeps sessions and queued QoS 1 messages");
  pr.connection.mqtt_version = "5";
  pr.connection.client_id = "";
  // --broker, --client-id, --mqtt-version, TLS and credentials: as every program's.
  connection_flags::add(*probe, &pr.connection, connection_flags::Role::kProbe);
  probe->add_option("--timeout-ms", pr.timeout_ms, "Per step (default 5000)")
      ->check(CLI::PositiveNumber);
  probe->add_option("--count", pr.count, "Messages queued while offline (default 10)")
      ->check(CLI::Range(1, 100000));
  probe
      ->add_option("--session-expiry-s", pr.session_expiry_s,
                   "Session expiry requested with MQTT 5 (default 300)")
      ->check(CLI::PositiveNumber);
  probe->add_option("--pause-offline-ms", pr.pause_offline_ms,
                    "Stay offline this long after publishing (restart the broker meanwhile)");
  probe->add_option("--topic-prefix", pr.topic_prefix, "Topic prefix (default mqtt-inbox/probe)")
      ->check(command_line::topic_name());
  probe->add_flag("--shared", pr.shared,
                  "Also check what the broker does with the turns of a shared subscription's "
                  "member that went away with its session kept (docs/admin-tool.md)");
  probe
      ->add_option("--receive-maximum", pr.receive_maximum,
                   "In-flight check: the Receive Maximum it sends (MQTT 5), and the PUBACKs it "
                   "sends before it stops acknowledging (default 5)")
      ->check(CLI::Range(1, 30));
  probe->add_flag("--no-in-flight", pr.no_in_flight,
                  "Skip the in-flight check (a few seconds: it waits for the broker to end a "
                  "connection whose keep-alive it missed)");
  probe->add_option("--reload-command", pr.reload_command,
                    "Shell command that makes the broker reload its configuration (e.g. "
                    "'systemctl reload mosquitto'): checks that a reload keeps what is "
                    "published to an offline persistent session. Shown in ps: no secrets");
  probe
      ->add_option("--pause-before-reload-ms", pr.pause_before_reload_ms,
                   "With --reload-command: stay offline this long before the reload (restart "
                   "the broker meanwhile to check a restart followed by a reload)")
      ->check(CLI::NonNegativeNumber);
  probe
      ->add_option("--reload-settle-ms", pr.reload_settle_ms,
                   "With --reload-command: wait this long after the command before publishing "
                   "again (default 1000: a broker applies a reload in its own loop)")
      ->check(CLI::Range(0, 600000));
  probe->callback([&] { run = [&] { return cmd_probe(pr); }; });

  if (int rc = command_line::parse(app, argc, argv, "mqtt-inbox"); rc >= 0)
    return rc == 0 ? kOk : kUsage;
#if MQTT_INBOX_WITH_POSTGRES
  // Before any command opens a postgresql:// location: the store lives in
  // mqtt_inbox::postgres (postgres.h).
  mqtt_inbox::enable_postgres_store();
#endif
  try {
    return run();
  } catch (const ToolError& e) {
    std::cerr << "mqtt-inbox: " << e.message << std::endl;
    return e.code;
  } catch (const std::exception& e) {
    std::cerr << "mqtt-inbox: unexpected error: " << e.what() << std::endl;
    return kStoreError;
  }
}

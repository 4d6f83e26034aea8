// `mqtt-inbox prune`: one pruning pass with the library's Pruner, never below the
// redelivery horizon the application recorded unless forced (docs/admin-tool.md).
#include <chrono>
#include <iostream>
#include <map>
#include <optional>
#include <string>

#include <mqtt_inbox/retention.h>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "pg_admin.h"
#include "store/sqlite/admin.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

int cmd_prune(const std::string& path, const PruneArgs& a) {
  auto inbox = open_inbox(path);
  const bool pg = is_postgres(path);
  // The horizon the application's Pruner recorded: inbox_meta on either store.
  const auto meta = pg ? pg_inspect(path).meta : read_meta(*inbox);
  const std::optional<int64_t> stored = meta_int(meta, "required_window_ms");

  // The horizon to enforce: the one the application's Pruner recorded, raised by one
  // declared here; the library's defaults when neither exists.
  mi::RetentionOptions declared;
  bool declared_any = false;
  if (!a.session_expiry.empty())
    declared.broker_session_expiry =
        std::chrono::milliseconds(duration_or_usage(a.session_expiry, "--session-expiry")),
    declared_any = true;
  if (!a.max_offline.empty())
    declared.max_offline =
        std::chrono::milliseconds(duration_or_usage(a.max_offline, "--max-offline")),
    declared_any = true;
  if (!a.replay_window.empty())
    declared.replay_window =
        std::chrono::milliseconds(duration_or_usage(a.replay_window, "--replay-window")),
    declared_any = true;
  if (!a.margin.empty())
    declared.margin = std::chrono::milliseconds(duration_or_usage(a.margin, "--margin")),
    declared_any = true;
  int64_t required = 0;
  std::string source;
  if (stored) {
    required = *stored;
    source = "inbox_meta.required_window_ms";
  }
  if (declared_any || !stored) {
    const int64_t d = mi::Pruner::required_window_ms(declared);
    if (d > required) {
      required = d;
      source =
          declared_any ? "declared on the command line" : "library defaults (nothing recorded)";
    }
  }
  // The session expiries the subscriber recorded (SessionRecords::record), plus the margin
  // and replay window above: the same requirement as the application's Pruner.
  {
    mi::RetentionOptions sessions_only = declared;
    sessions_only.broker_session_expiry = std::chrono::milliseconds(0);
    sessions_only.max_offline = std::chrono::milliseconds(0);
    int64_t from_sessions = 0;
    std::string why;
    const mi::Status s =
        mi::Pruner::required_window_ms(inbox.get(), sessions_only, &from_sessions, &why);
    if (!s.ok()) fail(kStoreError, s.to_string());
    if (from_sessions > mi::Pruner::required_window_ms(sessions_only) && from_sessions > required) {
      required = from_sessions;
      source = why;
    }
  }
  const int64_t window =
      a.older_than.empty() ? required : duration_or_usage(a.older_than, "--older-than");
  if (window <= 0) fail(kUsage, "--older-than must be > 0");
  const int64_t dl_window =
      a.dead_letters_older_than.empty()
          ? 0
          : duration_or_usage(a.dead_letters_older_than, "--dead-letters-older-than");
  const bool below = window < required;
  if (below && !a.force)
    fail(
        kRefused,
        "refused: window " + human_ms(window) + " is below the redelivery horizon plus margin " +
            human_ms(required) + " (" + source +
            "); ids pruned now could be redelivered and processed twice. Use --force to override.");

  json j = {{"database", path},
            {"window_ms", window},
            {"required_window_ms", required},
            {"horizon_source", source},
            {"forced_below_horizon", below},
            {"dry_run", a.dry_run},
            {"dead_letter_window_ms", dl_window}};
  const int64_t clock = inbox->retention_clock_ms();
  const int64_t cutoff = clock - window;
  if (a.dry_run) {
    int64_t ids = 0, dls = 0, out_sent = 0, out_dead = 0;
    json per = json::object();
    if (pg) {
      std::map<std::string, int64_t> by_consumer;
      pg_count_expired(path, cutoff, dl_window > 0 ? clock - dl_window : 0, &by_consumer, &dls,
                       &out_sent, &out_dead);
      for (const auto& kv : by_consumer) {
        per[kv.first] = kv.second;
        ids += kv.second;
      }
    } else {
      std::map<std::string, int64_t> by_consumer;
      check_read(
          mi::detail::count_expired_sqlite(*inbox, cutoff, dl_window > 0 ? clock - dl_window : 0,
                                           &by_consumer, &dls, &out_sent, &out_dead),
          "counting expired rows");
      for (const auto& kv : by_consumer) {
        per[kv.first] = kv.second;
        ids += kv.second;
      }
    }
    j["cutoff"] = cutoff;
    j["would_delete_processed"] = ids;
    j["would_delete_by_consumer"] = per;
    j["would_delete_dead_letters"] = dls;
    j["would_delete_outbox_sent"] = out_sent;
    j["would_delete_outbox_dead"] = out_dead;
    if (g.json)
      emit(j);
    else {
      print_kv(
          {{"window", human_ms(window) + (below ? " (BELOW horizon, forced)" : "")},
           {"required window", human_ms(required) + " (" + source + ")"},
           {"cutoff (retention clock)", std::to_string(cutoff)},
           {"ids that would be deleted", std::to_string(ids)},
           {"dead letters that would be deleted",
            dl_window > 0 ? std::to_string(dls) : "none (kept; see --dead-letters-older-than)"},
           {"sent outbox rows that would be deleted", std::to_string(out_sent)},
           {"outbox dead letters that would be deleted",
            dl_window > 0 ? std::to_string(out_dead)
                          : "none (kept; see --dead-letters-older-than)"}});
      std::cout << "dry run: nothing was deleted\n";
    }
    return kOk;
  }

  mi::RetentionOptions o;
  o.window = std::chrono::milliseconds(window);
  // Pruner::create records required_window_ms(o) in inbox_meta: make it exactly the horizon
  // enforced above, so the tool never lowers what the application declared.
  o.broker_session_expiry = std::chrono::milliseconds(required);
  o.max_offline = std::chrono::milliseconds(0);
  o.replay_window = std::chrono::milliseconds(0);
  o.margin = std::chrono::milliseconds(0);
  o.allow_window_below_horizon = a.force;
  o.dead_letter_window = std::chrono::milliseconds(dl_window);
  o.pass_budget = std::chrono::milliseconds(a.budget_ms);
  o.stats_log_period_ms = 0;
  // The Pruner picks a TRUNCATE checkpoint when its own Inbox committed nothing for a
  // period, which is always true of the tool's; TRUNCATE waits for the running consumer's
  // writes (up to the busy timeout each). So the tool leaves checkpoints to the consumer.
  o.checkpoint = false;
  std::unique_ptr<mi::Pruner> pruner;
  const mi::Status cs = mi::Pruner::create(inbox.get(), o, &pruner);
  if (!cs.ok())
    fail(cs.code() == mi::Status::Code::kInvalidArgument ? kRefused : kStoreError, cs.to_string());
  mi::PruneResult r;
  const mi::Status ps = pruner->prune_once(&r);
  j["cutoff"] = r.cutoff;
  j["processed_deleted"] = r.processed_deleted;
  j["dead_letters_deleted"] = r.dead_letters_deleted;
  j["outbox_sent_deleted"] = r.outbox_sent_deleted;
  j["outbox_dead_deleted"] = r.outbox_dead_deleted;
  j["batches"] = r.batches;
  j["budget_exhausted"] = r.budget_exhausted;
  j["pages_freed"] = r.pages_freed;
  j["duration_ms"] = r.duration_ms;
  if (!ps.ok()) {
    j["error"] = ps.to_string();
    if (g.json) emit(j);
    fail(kStoreError, "pruning stopped: " + ps.to_string() + " (" +
                          std::to_string(r.processed_deleted) +
                          " ids already deleted stay deleted)");
  }
  if (g.json)
    emit(j);
  else
    print_kv({{"window", human_ms(window) + (below ? " (BELOW horizon, forced)" : "")},
              {"required window", human_ms(required) + " (" + source + ")"},
              {"ids deleted", std::to_string(r.processed_deleted)},
              {"dead letters deleted", std::to_string(r.dead_letters_deleted)},
              {"sent outbox rows deleted", std::to_string(r.outbox_sent_deleted)},
              {"outbox dead letters deleted", std::to_string(r.outbox_dead_deleted)},
              {"batches", std::to_string(r.batches)},
              {"pages freed", std::to_string(r.pages_freed)},
              {"duration", std::to_string(r.duration_ms) + " ms"},
              {"more left",
               r.budget_exhausted ? "yes: the pass budget ran out; run prune again" : "no"}});
  return kOk;
}

}  // namespace mqtt_inbox::cli

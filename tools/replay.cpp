// `mqtt-inbox replay` and `mqtt-inbox reap`: the store-then-process mode's repairs,
// through StoreThenProcess::replay and ::reap, on either store (docs/admin-tool.md).
#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

int cmd_replay(const std::string& path, const ReplayArgs& a) {
  const bool by_time = !a.since.empty() || !a.until.empty();
  const int selectors =
      (by_time ? 1 : 0) + (!a.aggregate.empty() ? 1 : 0) + (!a.message_id.empty() ? 1 : 0);
  if (selectors == 0 && !a.all)
    fail(kUsage, "replay needs --since/--until, --aggregate, --id or --all");
  auto inbox = open_inbox(path);
  auto stp = stp_for(inbox.get(), a.consumer);
  if (!has_stp_rows(*stp))
    fail(kNotFound, "no store-then-process rows for consumer '" + a.consumer +
                        "' (replay is for the store-then-process mode)");
  const int64_t clock = inbox->retention_clock_ms();
  mi::ReplayFilter f;
  if (!a.since.empty()) f.received_since_ms = parse_time(a.since, clock, "--since");
  if (!a.until.empty()) f.received_before_ms = parse_time(a.until, clock, "--until");
  if (!a.aggregate.empty()) f.aggregate_key = a.aggregate;
  if (!a.message_id.empty()) f.message_id = a.message_id;
  f.include_dead = a.include_dead;
  mi::ReplayResult r;
  check_status(stp->replay(f, &r), "replaying");
  json j = {{"consumer", a.consumer},
            {"reset", r.reset},
            {"not_replayable", r.not_replayable},
            {"in_flight", r.in_flight}};
  if (f.received_since_ms) j["received_since"] = *f.received_since_ms;
  if (f.received_before_ms) j["received_before"] = *f.received_before_ms;
  if (g.json)
    emit(j);
  else
    print_kv({{"consumer", a.consumer},
              {"rows reset to pending", std::to_string(r.reset)},
              {"not replayable (payload compacted)", std::to_string(r.not_replayable)},
              {"in flight (left alone)", std::to_string(r.in_flight)}});
  if (r.reset == 0 && r.not_replayable == 0 && r.in_flight == 0) return kNotFound;
  return kOk;
}

// Store-then-process: return claims that make no progress to 'pending' now (the running
// application's reaper does this on a timer; this is for a stuck device). The tool shares
// the file and never takes the consumer's exclusive lock, so it cannot tell a dead worker
// from a slow one at a glance, and no claim time in the file can be trusted across a
// wall-clock step: it watches the claims for one lease on its monotonic clock and returns
// those whose running row did not change meanwhile (StoreThenProcess::reap).
int cmd_reap(const std::string& path, const std::string& consumer, int64_t lease_ms) {
  auto inbox = open_inbox(path);
  auto stp = stp_for(inbox.get(), consumer, lease_ms);
  if (!has_stp_rows(*stp))
    fail(kNotFound, "no store-then-process rows for consumer '" + consumer + "'");
  mi::StoreThenProcessStats st;
  check_status(stp->stats(&st), "counting claimed rows");
  int64_t reaped = 0;
  if (st.processing > 0) {
    const int64_t lease = lease_ms > 0 ? lease_ms : mi::StoreThenProcessOptions{}.lease_ms;
    check_status(stp->reap(&reaped), "reaping");  // starts watching
    std::cerr << "watching " << st.processing << " claimed row(s) of '" << consumer << "' for "
              << lease << " ms (--lease-ms)" << std::endl;
    std::this_thread::sleep_for(std::chrono::milliseconds(lease));
    int64_t more = 0;
    check_status(stp->reap(&more), "reaping");
    reaped += more;
  }
  if (g.json)
    emit(json{{"consumer", consumer}, {"reaped", reaped}});
  else
    print_kv({{"consumer", consumer}, {"claims returned to pending", std::to_string(reaped)}});
  return kOk;
}

}  // namespace mqtt_inbox::cli

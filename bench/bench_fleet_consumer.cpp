// bench_fleet_consumer: one member of a Fleet on PostgreSQL (fleet.h, issue 31), for the
// fleet's throughput in scripts/bench.sh. The library as bench_pg_consumer runs it (Inbox
// on PostgreSQL, a Consumer whose PgHandler writes the ledger's credit with its two
// statements prepared once per connection, the Pruner, library defaults), with a Fleet in
// place of the one Subscriber: no example code (no log file, systemd frame or signals of
// ledger_consumer), so what is measured is the library.
//
//   --phase run     join the fleet (--group, --slots, --lease-ms), serve this member's
//                   share; once this member holds and has connected exactly its share
//                   (FleetHealth::target) while --members members are in the group
//                   (twice in a row, 100 ms apart), touch --ready-file. Every commit's steady-clock
//                   time (CLOCK_MONOTONIC: one clock for every process of the host) is
//                   kept; at SIGTERM or SIGINT the fleet stops, the times go to
//                   --times-file (one a line) and one JSON line gives this member's
//                   counters and its CPU time (user + system) from ready to the signal.
//   --phase merge   read the --times-file of every member (positional arguments): the
//                   fleet's commits on one clock. Prints one JSON line: msgs_per_s from
//                   the first to the last commit (the fleet's rate, start-up excluded),
//                   msgs_per_s_warm from 5 % of the stream to its end (as bench::Drain),
//                   the seconds, and how many each member applied. Exits 1 (no JSON) if
//                   the files hold other than --count commits.
//
//   bench_fleet_consumer --phase run --broker URI --topic T --group G --uri PGURI
//                        --members W --ready-file F --times-file T
//   bench_fleet_consumer --phase merge --count N --label L T1 T2 ...
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <pqxx/pqxx>

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <vector>

#include <mqtt_inbox/fleet.h>
#include <mqtt_inbox/mqtt_inbox.h>
#include <mqtt_inbox/postgres.h>

#include "bench_pg_util.h"
#include "bench_util.h"
#include "ledger.h"

namespace {

// This process's CPU time so far (user + system), seconds.
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int merge(const std::vector<std::string>& files, int64_t count, const std::string& label) {
  std::vector<int64_t> all;
  std::vector<int64_t> per_member;
  for (const auto& f : files) {
    std::ifstream in(f);
    if (!in) {
      std::fprintf(stderr, "bench_fleet_consumer merge: cannot read %s\n", f.c_str());
      return 1;
    }
    int64_t t = 0, n = 0;
    while (in >> t) {
      all.push_back(t);
      ++n;
    }
    per_member.push_back(n);
  }
  if (static_cast<int64_t>(all.size()) != count || count < 20) {
    std::fprintf(stderr,
                 "bench_fleet_consumer merge: %zu commits in the members' files, expected %lld\n",
                 all.size(), static_cast<long long>(count));
    return 1;
  }
  std::sort(all.begin(), all.end());
  const int64_t warm =
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(count) * 0.05));
  const double span = static_cast<double>(all.back() - all.front()) / 1e9;
  const double warm_span = static_cast<double>(all.back() - all[warm - 1]) / 1e9;
  std::string members;
  for (int64_t n : per_member) members += (members.empty() ? "" : "/") + std::to_string(n);
  bench::Json j;
  j.add("bench", "fleet")
      .add("label", label)
      .add("members", static_cast<int>(files.size()))
      .add("count", count)
      .add("msgs_per_s", static_cast<double>(count - 1) / span)
      .add("seconds", span)
      .add("msgs_per_s_warm", static_cast<double>(count - warm) / warm_span)
      .add("applied_per_member", members);
  j.print();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mqtt-inbox fleet member on PostgreSQL (benchmark)"};
  std::string phase = "run", broker, topic, group, uri, label = "fleet", ready_file, times_file;
  int slots = 8, lease_ms = 2000, members = 1, timeout_s = 120;
  int64_t count = 0;
  std::vector<std::string> files;
  app.add_option("--phase", phase)->check(CLI::IsMember({"run", "merge"}));
  app.add_option("--broker", broker);
  app.add_option("--topic", topic, "Topic filter (the fleet adds $share/<group>/)");
  app.add_option("--group", group, "The fleet's group (also the client ids' prefix)");
  app.add_option("--slots", slots, "The fleet's slot count");
  app.add_option("--lease-ms", lease_ms, "The fleet's lease");
  app.add_option("--members", members, "Members the fleet will have (for --ready-file)");
  app.add_option("--uri", uri, "libpq connection URI of the database");
  app.add_option("--ready-file", ready_file, "Touched once this member serves its share");
  app.add_option("--times-file", times_file, "Where the commit times go at the stop");
  app.add_option("--timeout", timeout_s, "Give up on the share after this many seconds");
  app.add_option("--count", count, "merge: the commits expected over all members");
  app.add_option("--label", label, "Name in the JSON line");
  app.add_option("files", files, "merge: the members' --times-file");
  CLI11_PARSE(app, argc, argv);

  if (phase == "merge") return merge(files, count, label);

  // SIGTERM / SIGINT are taken by sigwait below, on this thread only: block them before
  // any thread starts, so every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::mutex times_mu;
  std::vector<int64_t> times;
  times.reserve(1 << 16);
  auto log =
      std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
  mqtt_inbox::InboxOptions io;
  io.logger = log;
  io.after_commit_hook = [&](const std::string&, const std::string&) {
    const int64_t t = bench::now_ns();
    std::lock_guard<std::mutex> lock(times_mu);
    times.push_back(t);
  };
  mqtt_inbox::enable_postgres_store();
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(uri, io, &inbox); !s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.to_string().c_str());
    return 1;
  }
  // The ledger's credit, as bench_pg_consumer's (the store runs one transaction at a time
  // on its one connection, so the pointer needs no lock).
  const pqxx::connection_base* prepared_for = nullptr;
  mqtt_inbox::PgHandler credit = [&prepared_for](pqxx::transaction_base& txn,
                                                 const mqtt_inbox::Delivery& d) {
    const ledger::Credit c = ledger::decode_credit(d);
    if (prepared_for != &txn.conn()) {
      txn.conn().prepare("bench_credit", bench::kPgCreditSql);
      txn.conn().prepare("bench_entry", bench::kPgEntrySql);
      prepared_for = &txn.conn();
    }
    txn.exec_prepared0("bench_credit", c.account, c.amount);
    txn.exec_prepared0("bench_entry", d.message_id, c.account, c.amount);
  };
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  if (auto s = mqtt_inbox::Consumer::create(inbox.get(), "ledger", credit,
                                            mqtt_inbox::ConsumerOptions{}, &consumer);
      !s.ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.to_string().c_str());
    return 1;
  }
  mqtt_inbox::FleetOptions fo;
  fo.group = group;
  fo.slots = slots;
  fo.lease_ms = lease_ms;
  fo.subscriber.broker_uri = broker;
  fo.subscriber.logger = log;
  mqtt_inbox::RetentionOptions retention;  // as ledger_consumer: a window over the session
  retention.broker_session_expiry = std::chrono::seconds(fo.subscriber.session_expiry_s);
  retention.window = retention.broker_session_expiry + std::chrono::hours(24);
  std::unique_ptr<mqtt_inbox::Pruner> pruner;
  if (auto s = mqtt_inbox::Pruner::create(inbox.get(), retention, &pruner); !s.ok()) {
    std::fprintf(stderr, "pruner: %s\n", s.to_string().c_str());
    return 1;
  }
  (void)pruner->start();
  std::unique_ptr<mqtt_inbox::Fleet> fleet;
  if (auto s = mqtt_inbox::Fleet::create(inbox.get(), fo, &fleet); !s.ok()) {
    std::fprintf(stderr, "fleet: %s\n", s.to_string().c_str());
    return 1;
  }
  if (auto s = fleet->subscribe(topic, consumer.get()); !s.ok()) {
    std::fprintf(stderr, "fleet subscribe: %s\n", s.to_string().c_str());
    return 1;
  }
  if (auto s = fleet->start(); !s.ok()) {
    std::fprintf(stderr, "fleet start: %s\n", s.to_string().c_str());
    return 1;
  }
  // Settled: every member joined and this one serves exactly its share (the fleet's
  // target: slots / members, one more for the first slots % members members), connected.
  const auto settled = [&] {
    const mqtt_inbox::FleetHealth h = fleet->health();
    const auto share = static_cast<size_t>(h.target);
    return h.members == members && h.target > 0 && h.slots.size() == share &&
           h.serving.size() == share && h.connected.size() == share;
  };
  const int64_t deadline = bench::now_ns() + static_cast<int64_t>(timeout_s) * 1000000000;
  int in_a_row = 0;
  while (in_a_row < 2) {
    if (bench::now_ns() > deadline) {
      const mqtt_inbox::FleetHealth h = fleet->health();
      std::fprintf(stderr,
                   "%s: no settled share after %d s: members %d, held %zu, serving %zu, "
                   "connected %zu, target %d\n",
                   label.c_str(), timeout_s, h.members, h.slots.size(), h.serving.size(),
                   h.connected.size(), h.target);
      std::_Exit(1);
    }
    in_a_row = settled() ? in_a_row + 1 : 0;
    // A stop before the share settled (the script gave up on this run): exit at once,
    // the leases go with the connection.
    const timespec wait_100ms{0, 100 * 1000 * 1000};
    if (sigtimedwait(&stop_signals, nullptr, &wait_100ms) > 0) {
      std::fprintf(stderr, "%s: stopped before its share settled\n", label.c_str());
      std::_Exit(1);
    }
  }
  const double cpu_at_ready = cpu_seconds();
  if (!ready_file.empty()) std::ofstream(ready_file) << "ready\n";

  int sig = 0;
  sigwait(&stop_signals, &sig);
  const double cpu_served = cpu_seconds() - cpu_at_ready;
  const mqtt_inbox::FleetHealth h = fleet->health();
  const mqtt_inbox::Status stopped = fleet->stop();
  if (stopped.ok()) pruner->stop();
  std::vector<int64_t> mine;
  {
    std::lock_guard<std::mutex> lock(times_mu);
    mine = times;
  }
  {
    std::ofstream out(times_file);
    for (int64_t t : mine) out << t << '\n';
    if (!out) {
      std::fprintf(stderr, "%s: cannot write %s\n", label.c_str(), times_file.c_str());
      std::_Exit(1);
    }
  }
  const auto c = consumer->counters();
  bench::Json j;
  j.add("bench", "fleet_member")
      .add("label", label)
      .add("processed", c.processed)
      .add("duplicates", c.duplicates)
      .add("dead_lettered", c.dead_lettered)
      .add("handler_failures", c.handler_failures)
      .add("store_retries", c.store_retries)
      .add("slots_held", static_cast<int>(h.slots.size()))
      .add("slots_taken", h.slots_taken)
      .add("slots_given_back", h.slots_given_back)
      .add("leases_lost", h.leases_lost)
      .add("stopped_ok", stopped.ok())
      .add("cpu_s", cpu_served);
  j.print();
  if (!stopped.ok()) std::_Exit(3);
  return 0;
}

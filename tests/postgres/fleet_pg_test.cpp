// A fleet (fleet.h, docs/fleet.md): three ledger_consumer processes on one PostgreSQL
// inbox, sharing $share/ledger/credits/# over six client-id slots, against a real
// mosquitto (MQTT 3.1.1 and 5) and a private PostgreSQL cluster. What the issue asked:
//  - one member SIGKILLed for good mid-stream: its slots' parked share is drained by the
//    survivors, within a lease and a reconnect; another member restarted; the broker
//    restarted; PostgreSQL restarted. Every credit applied once (balances, entries,
//    claims), every slot served at the end, no client id taken over in the broker's log
//    before the server restart and at most once per slot after it; the members' relays
//    take turns and the next hop applies every event once;
//  - a member cut off from PostgreSQL (a frozen proxy: a partition) but not from the
//    broker: it stops serving its slots within half a lease, the others take them once
//    the server ends its lease session, and nothing is lost or doubled; the broker logs
//    at most one takeover per slot (a message stuck in the cut member's commit keeps its
//    connection until the new holder's CONNECT), never a second (no ping-pong);
//  - the same id delivered to two members at once (a publisher's resend while the first
//    copy is in flight): applied once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "support/cut_proxy.h"
#include "support/notify_socket.h"
#include "support/postgres.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

constexpr int kSlots = 6;
constexpr int kLeaseMs = 2000;
// The fleet's advisory locks in pg_locks (store/postgres/slot_leases.cpp: the group's key
// is hashtext("mqtt_inbox fleet <quoted schema> <group>")), not the outbox relay turn's.
#define FLEET_LOCKS                                                   \
  "locktype = 'advisory' AND granted AND objsubid = 2 AND classid = " \
  "(hashtext('mqtt_inbox fleet \"mqtt_inbox\" ledger')::int8 & 4294967295)::oid "

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The "processed=N duplicates=N" counters a ledger_consumer prints at its stop.
std::pair<int64_t, int64_t> counters(const std::string& log) {
  // "<program>: processed=...", not the inbox's periodic stats line ("inbox ...: processed=").
  size_t at = log.rfind("_consumer: processed=");
  if (at == std::string::npos) return {-1, -1};
  at = log.find("processed=", at);
  long long processed = -1, duplicates = -1;
  if (std::sscanf(log.c_str() + at, "processed=%lld duplicates=%lld", &processed, &duplicates) != 2)
    return {-1, -1};
  return {processed, duplicates};
}

class FleetPgTest : public ::testing::TestWithParam<const char*> {
 protected:
  FleetPgTest() {
    pg_.create_database("ledger");
    uri_ = pg_.uri("ledger");
  }
  bool mqtt5() const { return std::string(GetParam()) == "5"; }
  std::string log(const std::string& member) const { return dir_.file(member + ".log"); }

  // The next hop: event_consumer on a database of its own, applying the members' events
  // (ledger_consumer --emit-topic) once each.
  std::unique_ptr<Child> start_downstream() {
    pg_.create_database("events");
    auto child = std::make_unique<Child>(
        with_emulator({built_program("event_consumer"), "--broker", broker_.uri(), "--client-id",
                       "events-1", "--topic", "events/#", "--db", pg_.uri("events"),
                       "--mqtt-version", GetParam(), "--client-id-lock-dir", dir_.path()}),
        log("events"));
    EXPECT_TRUE(wait_until([&] { return occurrences(read_file(log("events")), "consuming: ") > 0; },
                           std::chrono::seconds(20)))
        << read_file(log("events"));
    return child;
  }

  // A fleet member: ledger_consumer with --fleet-group, its own log file, and its own
  // client-id lock folder, as on a host of its own: the per-host lock would otherwise
  // keep two members on this host from connecting one client id at once, and hide
  // whether the leases do.
  std::unique_ptr<Child> start_member(const std::string& member, const std::string& db = "",
                                      bool emit = false) {
    return std::make_unique<Child>(with_emulator(member_argv(member, db, emit)), log(member));
  }
  std::vector<std::string> member_argv(const std::string& member, const std::string& db = "",
                                       bool emit = false) {
    const std::string locks = dir_.file("locks-" + member);
    ::mkdir(locks.c_str(), 0700);
    std::vector<std::string> argv = {built_program("ledger_consumer"),
                                     "--broker",
                                     broker_.uri(),
                                     "--client-id",
                                     "ledger",
                                     "--topic",
                                     "credits/#",
                                     "--db",
                                     db.empty() ? uri_ : db,
                                     "--mqtt-version",
                                     GetParam(),
                                     "--fleet-group",
                                     "ledger",
                                     "--fleet-slots",
                                     std::to_string(kSlots),
                                     "--fleet-lease-ms",
                                     std::to_string(kLeaseMs),
                                     "--stop-timeout-ms",
                                     "3000",
                                     "--client-id-lock-dir",
                                     locks,
                                     "--log-level",
                                     "debug"};
    if (emit) {  // each member runs a relay; they take turns (docs/outbox.md#several-relays)
      argv.push_back("--emit-topic");
      argv.push_back("events/credited");
    }
    return argv;
  }
  std::string all_logs() const {
    std::string out;
    for (const char* m : {"a", "b", "c", "c2", "d", "events"}) {
      const std::string t = read_file(log(m));
      if (!t.empty())
        out += "---- " + std::string(m) + "\n" + t.substr(t.size() > 6000 ? t.size() - 6000 : 0);
    }
    return out;
  }

  int64_t q(const std::string& sql) const {
    const std::string v = pg_.query_value(sql, "ledger");
    return v.empty() ? 0 : std::stoll(v);
  }
  int64_t entries() const { return q("SELECT count(*) FROM ledger_entries"); }

  // Slot locks held now (the fleet's advisory locks other than membership), and members.
  int64_t slots_held() const {
    return q("SELECT count(*) FROM pg_locks WHERE " FLEET_LOCKS
             "AND objid <> 2147483647 AND mode = 'ExclusiveLock'");
  }
  int64_t members() const {
    return q("SELECT count(*) FROM pg_locks WHERE " FLEET_LOCKS "AND objid = 2147483647");
  }
  // Every slot's client id has said "consuming" in some member's log since `since`.
  bool all_slots_consuming(const std::map<std::string, size_t>& since = {}) const {
    for (int i = 0; i < kSlots; ++i) {
      const std::string needle = "consuming: client 'ledger-" + std::to_string(i) + "'";
      size_t n = 0;
      for (const char* m : {"a", "b", "c", "c2", "d"}) n += occurrences(read_file(log(m)), needle);
      auto it = since.find(needle);
      if (n <= (it == since.end() ? 0 : it->second)) return false;
    }
    return true;
  }
  std::map<std::string, size_t> consuming_counts() const {
    std::map<std::string, size_t> out;
    for (int i = 0; i < kSlots; ++i) {
      const std::string needle = "consuming: client 'ledger-" + std::to_string(i) + "'";
      for (const char* m : {"a", "b", "c", "c2", "d"})
        out[needle] += occurrences(read_file(log(m)), needle);
    }
    return out;
  }
  // Each of the `n` members holds its even share of the slots.
  bool balanced(int64_t n) const {
    return q("SELECT count(*) FROM (SELECT pid FROM pg_locks WHERE " FLEET_LOCKS
             "AND objid <> 2147483647 GROUP BY pid HAVING count(*) = " +
             std::to_string(kSlots / n) + ") s") == n;
  }
  // Waits until `n` members hold every slot, evenly, and every slot is consuming.
  void wait_fleet(int64_t n, const std::map<std::string, size_t>& since = {}) {
    ASSERT_TRUE(wait_until(
        [&] {
          return members() == n && slots_held() == kSlots && balanced(n) &&
                 all_slots_consuming(since);
        },
        std::chrono::seconds(30)))
        << "members=" << members() << " slots=" << slots_held() << "\n"
        << all_logs();
  }
  // The broker's client-id takeovers (mosquitto: "Client <id> already connected, closing
  // old connection.").
  size_t takeovers() const {
    return occurrences(read_file(broker_.log_path()), "already connected, closing old connection");
  }
  void term(Child& child) {
    child.signal(SIGTERM);
    const int st = child.wait(std::chrono::seconds(20));
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << all_logs();
  }
  // The ledger holds each of credits 0..n-1 once, with the right balances.
  void expect_applied_once(int n) {
    EXPECT_EQ(entries(), n);
    EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), n);
    EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_processed WHERE consumer_name = 'ledger'"),
              n);
    for (int a = 0; a < 7; ++a) {
      int64_t want = 0;
      for (int i = 0; i < n; ++i)
        if (i % 7 == a) want += 1 + i % 13;
      EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct-" + std::to_string(a) + "'"),
                want)
          << "acct-" << a;
    }
    EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  }
  void publish(TestPublisher& pub, int from, int to) {
    for (int i = from; i < to; ++i) {
      const std::string id = "c-" + std::to_string(i);
      pub.credit("credits/" + std::to_string(i % 5), id, "acct-" + std::to_string(i % 7),
                 1 + i % 13);
      if (i % 4 == 0)  // a producer's retry: another member may get this copy
        pub.credit("credits/" + std::to_string(i % 5), id, "acct-" + std::to_string(i % 7),
                   1 + i % 13);
    }
  }

  Postgres pg_;
  Broker broker_;
  TempDir dir_;
  std::string uri_;
};

TEST_P(FleetPgTest, MemberKilledForGoodRestartedBrokerAndServerRestartsApplyEveryCreditOnce) {
  constexpr int kTotal = 2400;
  auto events = start_downstream();
  auto a = start_member("a", "", true);
  auto b = start_member("b", "", true);
  auto c = start_member("c", "", true);
  wait_fleet(3);
  EXPECT_EQ(takeovers(), 0u);

  TestPublisher pub(broker_.uri(), mqtt5());
  // 1. Member b is SIGKILLed for good mid-stream: what the broker parked in its slots'
  //    sessions is drained by a and c once b's lease runs out.
  publish(pub, 0, 600);
  ASSERT_TRUE(wait_until([&] { return entries() >= 150; }, std::chrono::seconds(30))) << all_logs();
  const auto before_kill = consuming_counts();
  b->signal(SIGKILL);
  ASSERT_NE(b->wait(std::chrono::seconds(10)), -1);
  const auto killed_at = std::chrono::steady_clock::now();
  publish(pub, 600, 1200);
  // b's slots are served again (a new "consuming" line for each of them) by a and c.
  wait_fleet(2);
  ASSERT_TRUE(wait_until(
      [&] {
        const auto now = consuming_counts();
        int again = 0;
        for (const auto& [k, v] : now) again += v > before_kill.at(k) ? 1 : 0;
        return again >= 2;  // b held two of the six
      },
      std::chrono::seconds(30)))
      << all_logs();
  const auto retaken_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - killed_at)
                              .count();
  std::printf("[ figures ] b's slots served again %lld ms after its SIGKILL (lease %d ms)\n",
              static_cast<long long>(retaken_ms), kLeaseMs);
  // How soon is a figure, not a bound (the wait above bounds it at 30 s): on a loaded CI
  // machine it was 8.4 s on MQTT 3.1.1 and 19.2 s on 5 in the same run, against 2 leases
  // plus a connect; a slot that must first stop waits a stop timeout more (issue 40).
  ASSERT_TRUE(wait_until([&] { return entries() >= 1200; }, std::chrono::seconds(60)))
      << entries() << "\n"
      << all_logs();

  // 2. Member c restarts (SIGTERM, then a new process): its slots are given back at once
  //    and taken by a, then spread again when c2 joins.
  term(*c);
  publish(pub, 1200, 1500);
  auto c2 = start_member("c2", "", true);
  wait_fleet(2);
  ASSERT_TRUE(wait_until([&] { return entries() >= 1500; }, std::chrono::seconds(60)))
      << entries() << "\n"
      << all_logs();

  // 3. The broker restarts under the fleet: each slot reconnects to its session and
  //    subscribes again (mosquitto restores the sessions without their $share
  //    subscriptions: what is published before a member subscribes again is dropped by
  //    the broker, so the producer here waits for the members, as docs/fleet.md says).
  const auto before_broker_restart = consuming_counts();
  broker_.stop();
  broker_.start();
  ASSERT_TRUE(wait_until([&] { return all_slots_consuming(before_broker_restart); },
                         std::chrono::seconds(30)))
      << all_logs();
  {
    TestPublisher pub2(broker_.uri(), mqtt5());
    publish(pub2, 1500, 1800);
  }
  ASSERT_TRUE(wait_until([&] { return entries() >= 1800; }, std::chrono::seconds(60)))
      << entries() << "\n"
      << all_logs();

  // Until here no slot was connected by two members in turn: the broker took no client
  // id over (b's SIGKILL closed its sockets; c's stop and the spreading disconnected
  // before giving a slot back).
  EXPECT_EQ(takeovers(), 0u) << read_file(broker_.log_path());

  // 4. PostgreSQL restarts under the fleet: every member loses its leases and its slots
  //    stop; they rejoin and every slot is served again.
  const auto before_restart = consuming_counts();
  pg_.restart();
  {
    TestPublisher pub3(broker_.uri(), mqtt5());
    publish(pub3, 1800, kTotal);
  }
  wait_fleet(2, before_restart);
  ASSERT_TRUE(wait_until([&] { return entries() >= kTotal; }, std::chrono::seconds(90)))
      << entries() << "\n"
      << all_logs();
  // Every credit's event reached the next hop, which applied each once. The members'
  // relays took turns: copies only of rows in flight at a hand-over (b's kill, the
  // restarts), not one per relay (before the turn, each relay published every row).
  const auto event_rows = [&] {
    const std::string v = pg_.query_value("SELECT count(*) FROM event_sources", "events");
    return v.empty() ? 0 : std::stoll(v);
  };
  ASSERT_TRUE(wait_until([&] { return event_rows() >= kTotal; }, std::chrono::seconds(60)))
      << event_rows() << "\n"
      << read_file(log("events"));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // room for a late double
  term(*a);
  term(*c2);
  term(*events);
  EXPECT_EQ(event_rows(), kTotal);
  EXPECT_EQ(
      pg_.query_value("SELECT count(DISTINCT source_message_id) FROM event_sources", "events"),
      std::to_string(kTotal));
  // The counters are the process's view: a commit cut by the server restart, found done by
  // its claim row, counts as a duplicate; the rows above are the truth.
  const auto ev = counters(read_file(log("events")));
  std::printf("[ figures ] next hop: %lld events applied, %lld copies dropped\n",
              static_cast<long long>(ev.first), static_cast<long long>(ev.second));
  // A hand-over resends what the old holder published but had not yet marked sent (up to
  // a mark batch and the window each; measured 2-368 over three hand-overs); relays in
  // parallel would send every row once per relay (2,400 copies and more).
  EXPECT_LT(ev.second, kTotal / 2) << "more copies than hand-overs explain: relays in parallel?";

  expect_applied_once(kTotal);
  // A slot whose message was waiting for the restarting server in its commit could not
  // stop (Subscriber::stop's kBusy keeps that connection until the exit); its next
  // holder then took the client id over once. Never more than once per slot.
  EXPECT_LE(takeovers(), static_cast<size_t>(kSlots)) << read_file(broker_.log_path());
  const std::string logs = read_file(log("a")) + read_file(log("c2"));
  EXPECT_EQ(occurrences(logs, "FLEET LEASE LOST"), 2u) << "each member once, at the restart";
}

TEST_P(FleetPgTest, MemberCutFromPostgresStopsServingAndTheOthersTakeItsSlots) {
  constexpr int kTotal = 900;
  CutProxy proxy(CutProxy::Upstream{pg_.socket_path(), 0});
  const std::string cut_uri = "postgresql:///ledger?host=" + proxy.socket_dir() +
                              "&port=" + std::to_string(proxy.port()) + "&user=postgres";
  auto a = start_member("a", cut_uri);
  auto b = start_member("b");
  auto c = start_member("c");
  wait_fleet(3);
  TestPublisher pub(broker_.uri(), mqtt5());
  publish(pub, 0, 300);
  ASSERT_TRUE(wait_until([&] { return entries() >= 100; }, std::chrono::seconds(30))) << all_logs();
  const size_t takeovers_before = takeovers();

  // a's every connection to PostgreSQL goes silent (a partition); its broker link stays.
  const auto before_cut = consuming_counts();
  proxy.freeze(true);
  publish(pub, 300, 600);
  ASSERT_TRUE(wait_until([&] { return occurrences(read_file(log("a")), "half a lease") >= 1; },
                         std::chrono::seconds(10)))
      << all_logs();
  // b and c hold all six once the server ended a's lease session (one lease of silence).
  ASSERT_TRUE(wait_until(
      [&] {
        const auto now = consuming_counts();
        int again = 0;
        for (const auto& [k, v] : now) again += v > before_cut.at(k) ? 1 : 0;
        return members() == 2 && slots_held() == kSlots && again >= 2;
      },
      std::chrono::seconds(30)))
      << all_logs();
  // The stream goes on without a. (A message that a's open transaction had claimed waits
  // at its new holder until a's server session ends: not before the cut ends here, so
  // that slot's queue waits behind it.)
  const int64_t at_takeover = entries();
  publish(pub, 600, 800);
  ASSERT_TRUE(wait_until([&] { return entries() >= at_takeover + 100; }, std::chrono::seconds(60)))
      << entries() << "\n"
      << all_logs();

  // a comes back: it rejoins and the slots spread over three members again.
  proxy.freeze(false);
  wait_fleet(3);
  publish(pub, 800, kTotal);
  ASSERT_TRUE(wait_until([&] { return entries() >= kTotal; }, std::chrono::seconds(60)))
      << entries() << "\n"
      << all_logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Cut again, a is asked to stop: a lease round may wait on a server that does not
  // answer (the proxy's kernel acknowledges every byte, so TCP's timeouts never fire).
  // Fleet::stop breaks that connection after a lease and leaves without waiting for an
  // answer. (The inbox's own connection waits too, for the consumer's requeue poll: the
  // process exits once the proxy thaws; docs/fleet.md#stopping.)
  proxy.freeze(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs / 2));  // a round is waiting
  a->signal(SIGTERM);
  EXPECT_TRUE(wait_until(
      [&] { return occurrences(read_file(log("a")), "fleet ledger: left the group") > 0; },
      std::chrono::seconds(3 * kLeaseMs / 1000 + 10)))
      << "a cut member's Fleet::stop did not return\n"
      << all_logs();
  EXPECT_EQ(occurrences(read_file(log("a")), "breaking its connection"), 1u) << all_logs();
  proxy.freeze(false);
  const int st = a->wait(std::chrono::seconds(20));
  EXPECT_NE(st, -1) << all_logs();
  term(*b);
  term(*c);
  expect_applied_once(kTotal);
  // At most one takeover per slot a held (a message stuck in a's commit kept that
  // connection open until the new holder's CONNECT), never the client id taken back.
  const size_t took = takeovers() - takeovers_before;
  std::printf("[ figures ] broker takeovers while a was cut: %zu\n", took);
  EXPECT_LE(took, static_cast<size_t>(kSlots / 3)) << read_file(broker_.log_path());
}

// A member frozen (SIGSTOP) for two leases: its kernel keeps its TCP connections open, so
// only the server's idle_session_timeout ends its lease session; the others then take
// its slots, and the broker takes those client ids over from the frozen process (once
// each: it still holds the connections). Resumed, the member finds its lease stale and
// its connections gone, and reconnects none of them (SubscriberOptions::may_connect):
// the client ids are not taken back. It rejoins, and the slots spread over three again.
TEST_P(FleetPgTest, MemberFrozenForTwoLeasesDoesNotTakeItsSlotsBack) {
  constexpr int kTotal = 900;
  auto a = start_member("a");
  auto b = start_member("b");
  auto c = start_member("c");
  wait_fleet(3);
  TestPublisher pub(broker_.uri(), mqtt5());
  publish(pub, 0, 300);
  ASSERT_TRUE(wait_until([&] { return entries() >= 100; }, std::chrono::seconds(30))) << all_logs();
  const size_t takeovers_before = takeovers();
  const int64_t a_slots =
      q("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid "
        "WHERE l." FLEET_LOCKS "AND l.objid <> 2147483647 AND s.application_name LIKE '% " +
        std::to_string(a->pid()) + "@%'");
  ASSERT_GT(a_slots, 0);

  a->signal(SIGSTOP);
  publish(pub, 300, 600);
  ASSERT_TRUE(wait_until([&] { return members() == 2 && slots_held() == kSlots; },
                         std::chrono::seconds(30)))
      << all_logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs));
  a->signal(SIGCONT);
  wait_fleet(3);
  publish(pub, 600, kTotal);
  ASSERT_TRUE(wait_until([&] { return entries() >= kTotal; }, std::chrono::seconds(60)))
      << entries() << "\n"
      << all_logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  term(*a);
  term(*b);
  term(*c);
  expect_applied_once(kTotal);
  const size_t took = takeovers() - takeovers_before;
  std::printf("[ figures ] a held %lld slots when frozen; broker takeovers: %zu\n",
              static_cast<long long>(a_slots), took);
  EXPECT_LE(took, static_cast<size_t>(a_slots)) << read_file(broker_.log_path());
}

TEST_P(FleetPgTest, OneIdAtTwoMembersAtOnceIsAppliedOnce) {
  auto a = start_member("a");
  auto b = start_member("b");
  wait_fleet(2);
  // `mqtt-inbox fleet` shows the two members and who holds each slot, without joining.
  {
    const std::string out = dir_.file("fleet.json");
    Child tool(with_emulator({built_program("mqtt-inbox"), "--json", "fleet", uri_, "--group",
                              "ledger", "--slots", std::to_string(kSlots)}),
               out);
    const int st = tool.wait(std::chrono::seconds(20));
    ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_file(out);
    const nlohmann::json j = nlohmann::json::parse(read_file(out));
    ASSERT_EQ(j["members"].size(), 2u) << j.dump(2);
    std::set<int> holders;
    for (const auto& m : j["members"]) {
      EXPECT_EQ(m["slots_held"], kSlots / 2) << j.dump(2);
      EXPECT_NE(m["holder"].get<std::string>().find("mqtt-inbox fleet ledger "), std::string::npos);
      holders.insert(m["pid"].get<int>());
    }
    ASSERT_EQ(j["slots"].size(), static_cast<size_t>(kSlots)) << j.dump(2);
    for (const auto& sl : j["slots"]) {
      EXPECT_TRUE(holders.count(sl["pid"].get<int>())) << j.dump(2);
      EXPECT_GE(sl["renewed_ms_ago"].get<int64_t>(), 0);
      EXPECT_LT(sl["renewed_ms_ago"].get<int64_t>(), kLeaseMs);
    }
    EXPECT_EQ(members(), 2) << "the tool must not join the group";
  }
  // Each credit is sent twice in a row: round robin puts the copies on neighbouring slots,
  // and one pair in three (slots 2 and 3, or 5 and 0) spans the two members, which then
  // apply the same id at the same time.
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 300; ++i)
      for (int k = 0; k < 2; ++k)
        pub.credit("credits/x", "c-" + std::to_string(i), "acct-" + std::to_string(i % 7),
                   1 + i % 13);
  }
  ASSERT_TRUE(wait_until([&] { return entries() >= 300; }, std::chrono::seconds(60))) << all_logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  term(*a);
  term(*b);
  expect_applied_once(300);
  // The 600 copies split into 300 applied and 300 duplicates over the two members (their
  // counters, printed at their stop), and some ids had a copy at each: a member whose
  // duplicates differ from what it applied saw copies of ids the other applied.
  const auto ca = counters(read_file(log("a"))), cb = counters(read_file(log("b")));
  EXPECT_GT(ca.first + ca.second, 0) << read_file(log("a"));
  EXPECT_GT(cb.first + cb.second, 0) << read_file(log("b"));
  EXPECT_EQ(ca.first + cb.first, 300);
  EXPECT_EQ(ca.second + cb.second, 300);
  // The ids each member saw (the consumer's debug line names each message's id; "?" for
  // one it skipped before reading the id, such as a retained message): some
  // must have reached both. (Equal applied and duplicate counts do not tell: the members
  // may win the race for the shared ids exactly half the time each.)
  const auto ids = [&](const std::string& member) {
    std::set<std::string> out;
    const std::string text = read_file(log(member)), needle = "consumer 'ledger': message '";
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      const size_t from = at + needle.size(), to = text.find('\'', from);
      if (to != std::string::npos && to > from + 1) out.insert(text.substr(from, to - from));
    }
    return out;
  };
  const std::set<std::string> at_a = ids("a"), at_b = ids("b");
  size_t both = 0;
  for (const std::string& id : at_a) both += at_b.count(id);
  EXPECT_EQ(at_a.size() + at_b.size() - both, 300u);
  EXPECT_GT(both, 0u) << "no id reached both members: the case was not exercised";
  std::printf(
      "[ figures ] member a: processed %lld, duplicates %lld; b: %lld, %lld; ids at both: %zu\n",
      static_cast<long long>(ca.first), static_cast<long long>(ca.second),
      static_cast<long long>(cb.first), static_cast<long long>(cb.second), both);
}

INSTANTIATE_TEST_SUITE_P(Mqtt, FleetPgTest, ::testing::Values("3.1.1", "5"), [](const auto& p) {
  return std::string(p.param) == "5" ? "V5" : "V3_1_1";
});

// A broker that refuses the slots' client (credentials, here): a member does not stay up
// for ever, as one consumer does not (service_startup_test): once the broker refused
// every attempt of every slot it serves for --refused-limit-ms, it stops cleanly with
// exit 7.
TEST_P(FleetPgTest, BrokerRefusingTheSlotsEndsWithExit7) {
  Broker closed(Broker::Config{}, {"allow_anonymous false\n"});
  std::vector<std::string> argv = member_argv("d");
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--broker")
      argv[i + 1] = "tcp://127.0.0.1:" + std::to_string(closed.listener_port(0));
  argv.insert(argv.end(), {"--refused-limit-ms", "3000"});
  // Under a service manager's eyes (as service_startup_test): STATUS names the fleet and
  // the slot's refusal.
  NotifySocket notify(dir_.file("notify.sock"));
  ::setenv("NOTIFY_SOCKET", notify.path().c_str(), 1);
  Child d(with_emulator(argv), log("d"));
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(
      notify.wait_status("fleet: slots 0,1,2,3,4,5 of 6, 1 member(s)", std::chrono::seconds(30)))
      << notify.dump();
  EXPECT_TRUE(notify.wait_status("not authorized", std::chrono::seconds(30))) << notify.dump();
  const int st = d.wait(std::chrono::seconds(40));
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 7) << st << "\n" << all_logs();
  const std::string l = read_file(log("d"));
  EXPECT_NE(l.find("the broker refused this member's slots for 3 s"), std::string::npos) << l;
  EXPECT_NE(l.find("fleet ledger: left the group"), std::string::npos) << l;
}

// What a fleet refuses before anything connects: an SQLite inbox (the leases must be
// reachable by every member), exit 1 with the reason.
TEST(FleetStartup, AFleetOnSqliteIsRefused) {
  TempDir dir;
  const std::string l = dir.file("sqlite.log");
  Child child(with_emulator({built_program("ledger_consumer"), "--broker", "tcp://127.0.0.1:1",
                             "--client-id", "ledger", "--topic", "credits/#", "--db",
                             dir.file("ledger.db"), "--fleet-group", "ledger"}),
              l);
  const int st = child.wait(std::chrono::seconds(20));
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) != 0) << st;
  EXPECT_NE(read_file(l).find("open the inbox on PostgreSQL"), std::string::npos) << read_file(l);
}

}  // namespace
}  // namespace mqtt_inbox::test

// Exactly-once for event_consumer --db postgresql://... against a real mosquitto on MQTT
// 3.1.1 and 5 and a real private PostgreSQL cluster (support/postgres.h, fsync on), as
// ledger_pg_crash_test does for ledger_consumer:
// - events published straight to it, each twice, the consumer SIGKILLed twice mid-stream
//   and restarted, old ids sent again: one row in event_sources per event and the exact
//   per-account count, total and last balance in event_accounts, in PostgreSQL;
// - bad events dead-lettered as undecodable_payload in PostgreSQL, the stream going on;
// - the downstream hop of the two-hop stream (tests/crash/two_hop_test.cpp) on PostgreSQL:
//   ledger_consumer on SQLite with --emit-topic (the outbox is SQLite's), event_consumer on
//   PostgreSQL SIGKILLed mid-stream: one event effect per credit, checked against the
//   ledger's SQLite file;
// - both hops on PostgreSQL: ledger_consumer --db postgresql:// --emit-topic (the outbox on
//   PostgreSQL) SIGKILLed mid-stream, event_consumer on PostgreSQL: every event once;
// - what the program refuses at start-up on PostgreSQL: a password in the URI (exit 1).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "support/ledger_fixture.h"
#include "support/postgres.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

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

// An event as ledger_consumer --emit-topic publishes it.
std::string event_payload(const std::string& id, const std::string& source,
                          const std::string& account, int64_t amount, int64_t balance) {
  return R"({"message_id":")" + id + R"(","source_message_id":")" + source + R"(","account":")" +
         account + R"(","amount":)" + std::to_string(amount) + R"(,"balance":)" +
         std::to_string(balance) + "}";
}

class EventPgCrashTest : public ::testing::TestWithParam<const char*> {
 protected:
  EventPgCrashTest() {
    pg_.create_database("events");
    uri_ = pg_.uri("events");
  }
  bool mqtt5() const { return std::string(GetParam()) == "5"; }
  std::string log_text(const std::string& log) const { return read_file(dir_.file(log)); }

  // A program connected (the library logs "consuming: " once subscribed), unless
  // `wait_for_subscription` is false (a run to be cut mid-stream by a queued stream).
  std::unique_ptr<Child> start(const std::string& program, const std::string& topic,
                               const std::string& db, const std::string& log,
                               std::vector<std::string> extra = {},
                               bool wait_for_subscription = true) {
    const size_t before = occurrences(log_text(log), "consuming: ");
    std::vector<std::string> argv = {built_program(program),
                                     "--broker",
                                     broker_.uri(),
                                     "--client-id",
                                     "pg-" + program,
                                     "--client-id-lock-dir",
                                     dir_.path(),
                                     "--topic",
                                     topic,
                                     "--db",
                                     db,
                                     "--mqtt-version",
                                     GetParam()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto child = std::make_unique<Child>(with_emulator(argv), dir_.file(log));
    if (!wait_for_subscription) return child;
    EXPECT_TRUE(wait_until(
        [&] { return occurrences(log_text(log), "consuming: ") > before || !child->running(); },
        std::chrono::seconds(15)))
        << log_text(log);
    return child;
  }
  std::unique_ptr<Child> start_events(bool wait_for_subscription = true) {
    return start("event_consumer", "events/#", uri_, "events.log", {}, wait_for_subscription);
  }
  int64_t q(const std::string& sql) const {
    const std::string v = pg_.query_value(sql, "events");
    return v.empty() ? 0 : std::stoll(v);
  }
  int64_t events() const { return q("SELECT count(*) FROM event_sources"); }
  void sigkill_when(Child& child, int64_t at_least) {
    ASSERT_TRUE(wait_until([&] { return events() >= at_least; }, std::chrono::seconds(30)))
        << events() << "\n"
        << log_text("events.log");
    child.signal(SIGKILL);
    ASSERT_NE(child.wait(std::chrono::seconds(10)), -1);
  }
  void term(Child& child, const std::string& log) {
    child.signal(SIGTERM);
    const int st = child.wait(std::chrono::seconds(20));
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << log_text(log);
  }

  Postgres pg_;
  Broker broker_;
  TempDir dir_;
  std::string uri_;
};

TEST_P(EventPgCrashTest, SigkillsMidStreamApplyEveryEventOnce) {
  constexpr int kEvents = 800, kAccounts = 5;
  // The session exists before anything is published; the first run also creates the
  // business tables and the inbox's schema.
  {
    auto first = start_events();
    term(*first, "events.log");
  }
  std::map<std::string, int64_t> total, count, last;
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < kEvents; ++i) {
      const std::string account = "acct-" + std::to_string(i % kAccounts);
      const std::string id = "cr-" + std::to_string(i) + "/credited";
      const int64_t amount = 1 + i % 11;
      total[account] += amount;
      ++count[account];
      last[account] = total[account];
      const std::string payload =
          event_payload(id, "cr-" + std::to_string(i), account, amount, total[account]);
      pub.publish("events/credited", payload, {{"message-id", id}});
      pub.publish("events/credited", payload, {{"message-id", id}});  // a retry
    }
  }
  // The queued stream, cut twice by SIGKILL wherever the consumer is.
  auto run1 = start_events(false);
  sigkill_when(*run1, 100);
  const int64_t at_first_kill = events();
  auto run2 = start_events(false);
  sigkill_when(*run2, at_first_kill + 150);
  const int64_t at_second_kill = events();
  EXPECT_LT(at_second_kill, kEvents) << "the kills came after the stream: nothing was cut";

  auto run3 = start_events();
  {
    // Old ids again (same payloads), then a last event behind them on the same topic.
    TestPublisher pub(broker_.uri(), mqtt5());
    int64_t replay_total = 0;
    for (int i = 0; i < 30; ++i) {
      const std::string account = "acct-" + std::to_string(i % kAccounts);
      const std::string id = "cr-" + std::to_string(i) + "/credited";
      replay_total += 1 + i % 11;
      pub.publish("events/credited",
                  event_payload(id, "cr-" + std::to_string(i), account, 1 + i % 11, replay_total),
                  {{"message-id", id}});
    }
    pub.publish("events/credited", event_payload("end/credited", "end", "acct-end", 1, 1),
                {{"message-id", "end/credited"}});
  }
  ASSERT_TRUE(wait_until(
      [&] { return q("SELECT count(*) FROM event_sources WHERE source_message_id = 'end'") == 1; },
      std::chrono::seconds(60)))
      << events() << "\n"
      << log_text("events.log");
  term(*run3, "events.log");

  EXPECT_EQ(events(), kEvents + 1);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM event_sources"), kEvents + 1);
  EXPECT_EQ(q("SELECT count(*) FROM event_sources"
              " WHERE message_id = source_message_id || '/credited'"),
            kEvents + 1);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_processed WHERE consumer_name = 'events'"),
            kEvents + 1);
  for (const auto& [account, want] : total) {
    const std::string where = " FROM event_accounts WHERE account = '" + account + "'";
    EXPECT_EQ(q("SELECT total" + where), want) << account;
    EXPECT_EQ(q("SELECT events" + where), count[account]) << account;
    EXPECT_EQ(q("SELECT last_balance" + where), last[account]) << account;  // FIFO on one topic
  }
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_attempts"), 0);
  std::printf("event_consumer on PostgreSQL killed at %lld and %lld of %d events\n",
              static_cast<long long>(at_first_kill), static_cast<long long>(at_second_kill),
              kEvents);
}

// Bad events: decode_event throws UndecodablePayload, the event is dead-lettered at once
// in PostgreSQL with its reason and acked, and what follows is applied.
TEST_P(EventPgCrashTest, BadEventsEndAsUndecodableDeadLettersInPostgres) {
  {
    auto first = start_events();
    term(*first, "events.log");
  }
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 3; ++i) {
      const std::string id = "e-" + std::to_string(i);
      pub.publish("events/p", event_payload(id, "s-" + std::to_string(i), "acct", 10, 10 * (i + 1)),
                  {{"message-id", id}});
    }
    pub.publish("events/p",
                R"({"message_id":"bad-1","source_message_id":"s","account":"acct","amount":1})",
                {{"message-id", "bad-1"}});  // no balance
    pub.publish("events/p",
                R"({"message_id":"bad-2","source_message_id":"","account":"acct","amount":1,)"
                R"("balance":1})",
                {{"message-id", "bad-2"}});
    for (int i = 3; i < 6; ++i) {
      const std::string id = "e-" + std::to_string(i);
      pub.publish("events/p", event_payload(id, "s-" + std::to_string(i), "acct", 10, 10 * (i + 1)),
                  {{"message-id", id}});
    }
  }
  auto run = start_events(false);
  ASSERT_TRUE(wait_until([&] { return events() == 6; }, std::chrono::seconds(30)))
      << log_text("events.log");
  ASSERT_TRUE(
      wait_until([&] { return q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters") == 2; },
                 std::chrono::seconds(10)));
  term(*run, "events.log");

  EXPECT_EQ(q("SELECT total FROM event_accounts WHERE account = 'acct'"), 60);
  EXPECT_EQ(q("SELECT last_balance FROM event_accounts WHERE account = 'acct'"), 60);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'bad-1'"
              " AND reason = 'undecodable_payload'"
              " AND reason_text LIKE '%''balance'' is missing or not a 64-bit integer%'"),
            1)
      << pg_.query_value(
             "SELECT string_agg(message_id || ' ' || reason || ': ' || reason_text, "
             "E'\\n') FROM mqtt_inbox.inbox_dead_letters",
             "events");
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'bad-2'"
              " AND reason = 'undecodable_payload'"
              " AND reason_text LIKE '%''source_message_id'' is missing or not a non-empty%'"),
            1);
}

// The downstream hop on PostgreSQL: the ledger on SQLite relays one event per credit from
// its outbox; event_consumer on PostgreSQL applies them and is SIGKILLed mid-stream.
TEST_P(EventPgCrashTest, DownstreamHopOnPostgresAppliesOneEventPerCreditAcrossAKill) {
  constexpr int kCredits = 300;
  const std::string ledger_db = dir_.file("ledger.db");
  auto downstream = start_events();
  auto upstream = start("ledger_consumer", "credits/#", ledger_db, "ledger.log",
                        {"--emit-topic", "events/credited"});
  std::map<std::string, int64_t> balance;
  TestPublisher pub(broker_.uri(), mqtt5());
  auto publish = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      const std::string account = "acct-" + std::to_string(i % 5);
      pub.credit("credits/two-hop", "cr-" + std::to_string(i), account, i % 7 + 1);
      balance[account] += i % 7 + 1;
    }
  };
  // The downstream consumer dies while the first half streams through; the second half is
  // published while it is down, so the relay goes on sending into its queued session.
  publish(0, kCredits / 2);
  ASSERT_TRUE(wait_until([&] { return events() >= 60; }, std::chrono::seconds(60)))
      << events() << "\n"
      << log_text("events.log");
  downstream->signal(SIGKILL);
  ASSERT_NE(downstream->wait(std::chrono::seconds(10)), -1);
  const int64_t at_kill = events();
  publish(kCredits / 2, kCredits);
  downstream = start_events();
  ASSERT_TRUE(wait_until([&] { return events() >= kCredits; }, std::chrono::seconds(90)))
      << events() << "\n"
      << log_text("events.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a late extra would show
  term(*upstream, "ledger.log");
  term(*downstream, "events.log");
  std::printf("event_consumer on PostgreSQL killed at %lld of %d events\n",
              static_cast<long long>(at_kill), kCredits);

  EXPECT_EQ(query_int(ledger_db, "SELECT count(*) FROM ledger_entries"), kCredits);
  EXPECT_EQ(events(), kCredits);
  EXPECT_EQ(q("SELECT count(DISTINCT source_message_id) FROM event_sources"), kCredits);
  EXPECT_EQ(q("SELECT count(*) FROM event_sources"
              " WHERE message_id = source_message_id || '/credited'"),
            kCredits);
  for (const auto& [account, want] : balance) {
    EXPECT_EQ(
        query_int(ledger_db, "SELECT balance FROM accounts WHERE account = '" + account + "'"),
        want);
    const std::string where = " FROM event_accounts WHERE account = '" + account + "'";
    EXPECT_EQ(q("SELECT total" + where), want) << account;
    EXPECT_EQ(q("SELECT last_balance" + where), want) << account;
    EXPECT_EQ(q("SELECT events" + where),
              query_int(ledger_db,
                        "SELECT count(*) FROM ledger_entries WHERE account = '" + account + "'"))
        << account;
  }
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
}

// Both hops on PostgreSQL: ledger_consumer --db postgresql:// --emit-topic enqueues one
// event per credit in its PgHandler's transaction (the outbox on PostgreSQL) and its relay
// publishes them; the upstream is SIGKILLed mid-stream (rows in flight, credits unacked)
// and restarted. Every credit applied once upstream, every event once downstream, by id.
TEST_P(EventPgCrashTest, BothHopsOnPostgresUpstreamKilledMidStreamEveryEventOnce) {
  constexpr int kCredits = 300;
  pg_.create_database("ledger");
  const std::string ledger_uri = pg_.uri("ledger");
  auto lq = [&](const std::string& sql) {
    const std::string v = pg_.query_value(sql, "ledger");
    return v.empty() ? int64_t{0} : std::stoll(v);
  };
  auto downstream = start_events();
  auto upstream = start("ledger_consumer", "credits/#", ledger_uri, "ledger.log",
                        {"--emit-topic", "events/credited"});
  std::map<std::string, int64_t> balance;
  TestPublisher pub(broker_.uri(), mqtt5());
  auto publish = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      const std::string account = "acct-" + std::to_string(i % 5);
      pub.credit("credits/two-hop", "cr-" + std::to_string(i), account, i % 7 + 1);
      balance[account] += i % 7 + 1;
    }
  };
  publish(0, kCredits / 2);
  // Killed once the relay is under way: events have arrived downstream, and (marks linger
  // up to 200 ms) most of them are not yet marked sent, so they go out again.
  ASSERT_TRUE(wait_until([&] { return events() >= 20; }, std::chrono::seconds(60)))
      << log_text("ledger.log");
  upstream->signal(SIGKILL);
  ASSERT_NE(upstream->wait(std::chrono::seconds(10)), -1);
  const int64_t at_kill = lq("SELECT count(*) FROM ledger_entries");
  const int64_t sent_at_kill =
      lq("SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE state = 'sent'");
  const int64_t events_at_kill = events();
  publish(kCredits / 2, kCredits);
  upstream = start("ledger_consumer", "credits/#", ledger_uri, "ledger.log",
                   {"--emit-topic", "events/credited"});
  ASSERT_TRUE(wait_until([&] { return events() >= kCredits; }, std::chrono::seconds(90)))
      << events() << "\n"
      << log_text("ledger.log");
  ASSERT_TRUE(wait_until(
      [&] {
        return lq("SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE state = 'sent'") ==
               kCredits;
      },
      std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a late extra would show
  term(*upstream, "ledger.log");
  term(*downstream, "events.log");
  std::printf(
      "ledger_consumer on PostgreSQL killed at %lld of %d credits (%lld events received "
      "downstream, %lld marked sent)\n",
      static_cast<long long>(at_kill), kCredits, static_cast<long long>(events_at_kill),
      static_cast<long long>(sent_at_kill));

  EXPECT_EQ(lq("SELECT count(*) FROM ledger_entries"), kCredits);
  EXPECT_EQ(lq("SELECT count(DISTINCT message_id) FROM ledger_entries"), kCredits);
  EXPECT_EQ(lq("SELECT count(*) FROM mqtt_inbox.outbox_messages"), kCredits);
  EXPECT_EQ(lq("SELECT count(*) FROM mqtt_inbox.outbox_usage WHERE rows <> 0"), 0);
  EXPECT_EQ(events(), kCredits);
  EXPECT_EQ(q("SELECT count(DISTINCT source_message_id) FROM event_sources"), kCredits);
  EXPECT_EQ(q("SELECT count(*) FROM event_sources"
              " WHERE message_id = source_message_id || '/credited'"),
            kCredits);
  for (const auto& [account, want] : balance) {
    EXPECT_EQ(lq("SELECT balance FROM accounts WHERE account = '" + account + "'"), want);
    const std::string where = " FROM event_accounts WHERE account = '" + account + "'";
    EXPECT_EQ(q("SELECT total" + where), want) << account;
    EXPECT_EQ(q("SELECT last_balance" + where), want) << account;
  }
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  EXPECT_EQ(lq("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
}

INSTANTIATE_TEST_SUITE_P(Mqtt, EventPgCrashTest, ::testing::Values("3.1.1", "5"),
                         [](const auto& p) {
                           return std::string(p.param) == "5" ? "V5" : "V3_1_1";
                         });

// What event_consumer refuses on PostgreSQL before anything connects: exit 1, the bad
// configuration code of examples/exit_codes.h, without repeating the password.
TEST(EventPgStartup, APasswordInTheUriIsRefusedWithExit1) {
  TempDir dir;
  const std::string log = dir.file("password.log");
  Child child(with_emulator({built_program("event_consumer"), "--broker", "tcp://127.0.0.1:1",
                             "--client-id", "pg-refused", "--topic", "events/#", "--db",
                             "postgresql://alice:hunter2@db.invalid/events"}),
              log);
  const int st = child.wait(std::chrono::seconds(20));
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  EXPECT_NE(read_file(log).find("holds a password"), std::string::npos) << read_file(log);
  EXPECT_EQ(read_file(log).find("hunter2"), std::string::npos) << read_file(log);
}

}  // namespace
}  // namespace mqtt_inbox::test

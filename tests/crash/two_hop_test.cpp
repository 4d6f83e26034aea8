// The two-hop stream of scripts/demo.sh, as a test: examples/ledger_consumer --emit-topic
// applies credits and relays one event per applied credit from its outbox;
// examples/event_consumer applies those events to a database of its own. Each program is
// SIGKILLed mid-stream, at a different moment, and restarted. Real mosquitto, real
// files; the assertions read both databases: each credit applied once upstream, and
// exactly one event effect downstream per credit. On the programs' default MQTT 3.1.1
// (the event's id travels in its JSON) and on 5.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <map>
#include <thread>

#include "support/example_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

// query_int, but 0 while the file or its tables do not exist yet.
int64_t count_or_zero(const std::string& db, const std::string& sql) {
  try {
    return query_int(db, sql);
  } catch (const SQLite::Exception&) {
    return 0;
  }
}

// One integer from the downstream file with the upstream one attached as "up".
int64_t across(const std::string& down, const std::string& up, const std::string& sql) {
  SQLite::Database db(down, SQLite::OPEN_READONLY, 5000);
  db.exec("ATTACH DATABASE '" + up + "' AS up");
  SQLite::Statement q(db, sql);
  q.executeStep();
  return q.getColumn(0).getInt64();
}

class TwoHopTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::unique_ptr<Child> start(const std::string& program, const std::string& topic,
                               const std::string& db, const std::string& log,
                               std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {built_program(program),
                                     "--broker",
                                     broker_.uri(),
                                     "--client-id",
                                     program + "-" + std::to_string(::getpid()),
                                     "--client-id-lock-dir",
                                     dir_.path(),
                                     "--topic",
                                     topic,
                                     "--db",
                                     db,
                                     "--mqtt-version",
                                     GetParam(),
                                     "--log-level",
                                     "debug"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto child = std::make_unique<Child>(with_emulator(argv), dir_.file(log));
    // Subscribed (or the session holds the subscription) before anything is published
    // for it, so the broker queues everything for this client from here on.
    EXPECT_TRUE(wait_until(
        [&] { return read_text(dir_.file(log)).find("consuming: ") != std::string::npos; },
        std::chrono::seconds(20)))
        << read_text(dir_.file(log));
    return child;
  }
  std::unique_ptr<Child> start_ledger(const std::string& log) {
    return start("ledger_consumer", "credits/#", ledger_db_, log,
                 {"--emit-topic", "events/credited"});
  }
  std::unique_ptr<Child> start_events(const std::string& log) {
    return start("event_consumer", "events/#", events_db_, log);
  }
  int64_t credits() { return count_or_zero(ledger_db_, "SELECT count(*) FROM ledger_entries"); }
  int64_t events() { return count_or_zero(events_db_, "SELECT count(*) FROM event_sources"); }
  static void kill_now(std::unique_ptr<Child>& c) {
    c->signal(SIGKILL);
    c->wait(std::chrono::seconds(10));
    c.reset();
  }
  static void stop(std::unique_ptr<Child>& c) {
    c->signal(SIGTERM);
    const int st = c->wait(std::chrono::seconds(20));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
    c.reset();
  }

  TempDir dir_;
  Broker broker_;
  const std::string ledger_db_ = dir_.file("ledger.db");
  const std::string events_db_ = dir_.file("events.db");
};

TEST_P(TwoHopTest, EachCreditAppliedOnceAndOneEventEffectDownstreamAcrossKillsOfBoth) {
  constexpr int kCredits = 300;
  auto downstream = start_events("events-1.log");
  auto upstream = start_ledger("ledger-1.log");
  TestPublisher pub(broker_.uri());
  std::map<std::string, int64_t> balance;
  auto publish = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      const std::string account = "acct-" + std::to_string(i % 5);
      pub.credit("credits/two-hop", "cr-" + std::to_string(i), account, i % 7 + 1);
      balance[account] += i % 7 + 1;
    }
  };

  // Upstream dies first, mid-stream, with credits and outbox rows still to relay; the
  // rest is published while it is down.
  publish(0, 150);
  ASSERT_TRUE(wait_until([&] { return credits() >= 50; }, std::chrono::seconds(60))) << credits();
  kill_now(upstream);
  const int64_t credits_at_ledger_kill = credits();
  publish(150, kCredits);
  upstream = start_ledger("ledger-2.log");

  // Downstream dies later, while the relay is still sending.
  ASSERT_TRUE(wait_until([&] { return events() >= 170; }, std::chrono::seconds(60))) << events();
  kill_now(downstream);
  const int64_t events_at_events_kill = events();
  downstream = start_events("events-2.log");

  EXPECT_TRUE(wait_until([&] { return credits() >= kCredits && events() >= kCredits; },
                         std::chrono::seconds(90)))
      << credits() << " credits, " << events() << " events";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a late extra would show
  stop(upstream);
  stop(downstream);
  // Both kills hit mid-stream: before the ledger had applied what was published before
  // it, and before the event consumer had applied every event.
  EXPECT_LT(credits_at_ledger_kill, 150);
  std::printf("ledger_consumer killed at %lld of %d credits, event_consumer at %lld events\n",
              static_cast<long long>(credits_at_ledger_kill), kCredits,
              static_cast<long long>(events_at_events_kill));
  EXPECT_LT(events_at_events_kill, kCredits);

  // Upstream: each credit applied once, the balances exact, every event relayed.
  EXPECT_EQ(query_int(ledger_db_, "SELECT count(*) FROM ledger_entries"), kCredits);
  EXPECT_EQ(query_int(ledger_db_, "SELECT count(DISTINCT message_id) FROM ledger_entries"),
            kCredits);
  for (const auto& [account, expected] : balance)
    EXPECT_EQ(
        query_int(ledger_db_, "SELECT balance FROM accounts WHERE account = '" + account + "'"),
        expected)
        << account;
  EXPECT_EQ(query_int(ledger_db_, "SELECT count(*) FROM outbox_messages WHERE state = 'sent'"),
            kCredits);

  // Downstream: one effect per credit, no duplicates, the ids derived from the credits.
  EXPECT_EQ(query_int(events_db_, "SELECT count(*) FROM event_sources"), kCredits);
  EXPECT_EQ(query_int(events_db_, "SELECT count(DISTINCT source_message_id) FROM event_sources"),
            kCredits);
  EXPECT_EQ(query_int(events_db_,
                      "SELECT count(*) FROM event_sources"
                      " WHERE message_id = source_message_id || '/credited'"),
            kCredits);
  // The set of source ids is the set of credit ids, with the same account and amount.
  EXPECT_EQ(across(events_db_, ledger_db_,
                   "SELECT count(*) FROM event_sources e JOIN up.ledger_entries l"
                   " ON l.message_id = e.source_message_id AND l.account = e.account"
                   " AND l.amount = e.amount"),
            kCredits);
  // Per account: the event count equals the credit count, the amounts add up to the
  // balance, and the last event carries the final balance (FIFO on the one topic).
  EXPECT_EQ(across(events_db_, ledger_db_,
                   "SELECT count(*) FROM event_accounts e JOIN up.accounts a USING (account)"
                   " WHERE e.total = a.balance AND e.last_balance = a.balance AND e.events ="
                   " (SELECT count(*) FROM up.ledger_entries l WHERE l.account = e.account)"),
            static_cast<int64_t>(balance.size()));
  EXPECT_EQ(query_int(events_db_, "SELECT count(*) FROM event_accounts"),
            static_cast<int64_t>(balance.size()));
  // Nothing was dead-lettered on either side.
  EXPECT_EQ(query_int(ledger_db_, "SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(query_int(events_db_, "SELECT count(*) FROM inbox_dead_letters"), 0);
}

INSTANTIATE_TEST_SUITE_P(Versions, TwoHopTest, ::testing::Values("3.1.1", "5"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param) == "5" ? std::string("Mqtt5")
                                                              : std::string("Mqtt311");
                         });

}  // namespace
}  // namespace mqtt_inbox::test

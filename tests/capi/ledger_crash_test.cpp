// Exactly-once for the C example (examples/c/ledger_consumer.c, compiled as C99) under the
// crashes of docs/guarantees.md section 5, against a real mosquitto on MQTT 3.1.1 and 5:
// the consumer process SIGKILLed twice mid-stream at whatever point it is (before a commit,
// between commit and PUBACK, after), the broker restarted in between, every credit
// published twice and some a third time after the restart. Every credit applied once: the
// balances, the ledger entries and the claims say so. And poison through the C handler: a
// message whose handler kills the process every time ends as a handler_crashed dead
// letter after max_attempts runs, and the stream goes on. GoogleTest only runs the
// children and reads the file; the code under test is C.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include "support/ledger_fixture.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

class CLedgerCrashTest : public ::testing::TestWithParam<const char*> {
 protected:
  bool mqtt5() const { return std::string(GetParam()) == "5"; }
  std::string db() const { return dir_.file("ledger.db"); }
  std::string log() const { return dir_.file("consumer.log"); }
  std::string log_text() const {
    std::ifstream f(log());
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  size_t count(const std::string& needle) const {
    const std::string t = log_text();
    size_t n = 0;
    for (size_t at = t.find(needle); at != std::string::npos; at = t.find(needle, at + 1)) ++n;
    return n;
  }
  // The C example, connected (the library logs "consuming: " once subscribed).
  std::unique_ptr<Child> start_example(bool wait_for_subscription = true) {
    const size_t before = count("consuming: ");
    auto child = std::make_unique<Child>(
        with_emulator({MQTT_INBOX_C_LEDGER_CONSUMER, "--broker", broker_.uri(), "--client-id",
                       "c-ledger", "--topic", "credits/#", "--db", db(), "--mqtt-version",
                       GetParam(), "--client-id-lock-dir", dir_.path()}),
        log());
    // Queued messages arrive before the SUBSCRIBE completes: a run that is to be cut
    // mid-stream does not wait for it.
    if (!wait_for_subscription) return child;
    EXPECT_TRUE(wait_until([&] { return count("consuming: ") > before || !child->running(); },
                           std::chrono::seconds(15)))
        << log_text();
    return child;
  }
  // A C test child (subscriber_child.c) with `extra` switches, on the same file and session.
  std::unique_ptr<Child> start_child(std::vector<std::string> extra) {
    std::vector<std::string> argv = {
        MQTT_INBOX_C_SUBSCRIBER_CHILD, broker_.uri(), "c-ledger", "credits/#", db(), GetParam()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(with_emulator(argv), log());
  }
  int64_t q(const std::string& sql) const { return query_int(db(), sql); }
  int64_t entries() const { return q("SELECT count(*) FROM ledger_entries"); }
  void sigkill_when(Child& child, int64_t at_least) {
    ASSERT_TRUE(wait_until([&] { return entries() >= at_least; }, std::chrono::seconds(30)))
        << log_text();
    child.signal(SIGKILL);
    ASSERT_NE(child.wait(std::chrono::seconds(10)), -1);
  }
  void term(Child& child) {
    child.signal(SIGTERM);
    const int st = child.wait(std::chrono::seconds(20));
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << log_text();
  }

  Broker broker_;
  TempDir dir_;
};

TEST_P(CLedgerCrashTest, SigkillsMidStreamAndABrokerRestartApplyEveryCreditOnce) {
  constexpr int kFirst = 1000, kSecond = 200;
  int64_t expected = 0;
  // The session exists before anything is published, so the broker queues for it.
  {
    auto first = start_example();
    term(*first);
  }
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < kFirst; ++i) {
      const std::string id = "c-" + std::to_string(i);
      pub.credit("credits/a", id, "acct-" + std::to_string(i % 7), 1 + i % 13);
      pub.credit("credits/a", id, "acct-" + std::to_string(i % 7), 1 + i % 13);  // a retry
      expected += 1 + i % 13;
    }
  }
  // The queued stream, cut twice by SIGKILL wherever the consumer is.
  auto run1 = start_example(false);
  sigkill_when(*run1, 100);
  const int64_t at_first_kill = entries();
  auto run2 = start_example(false);
  sigkill_when(*run2, at_first_kill + 150);
  const int64_t at_second_kill = entries();
  EXPECT_LT(at_second_kill, kFirst) << "the kills came after the stream: nothing was cut";

  // The broker restarts under a running consumer, which reconnects to its session.
  auto run3 = start_example();
  broker_.stop();
  broker_.start();
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = kFirst; i < kFirst + kSecond; ++i) {
      const std::string id = "c-" + std::to_string(i);
      pub.credit("credits/b", id, "acct-" + std::to_string(i % 7), 1 + i % 13);
      pub.credit("credits/b", id, "acct-" + std::to_string(i % 7), 1 + i % 13);
      expected += 1 + i % 13;
    }
    // Producers that re-send old ids after the restart, then a last credit: in order
    // behind them, so once it is applied the re-sent ones have been seen.
    for (int i = 0; i < 50; ++i)
      pub.credit("credits/a", "c-" + std::to_string(i), "acct-" + std::to_string(i % 7),
                 1 + i % 13);
    pub.credit("credits/a", "end", "acct-end", 1);
  }
  ASSERT_TRUE(wait_until(
      [&] { return q("SELECT count(*) FROM ledger_entries WHERE message_id = 'end'") == 1; },
      std::chrono::seconds(60)))
      << entries() << "\n"
      << log_text();
  term(*run3);

  EXPECT_EQ(entries(), kFirst + kSecond + 1);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), kFirst + kSecond + 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), kFirst + kSecond + 1);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts WHERE account <> 'acct-end'"), expected);
  for (int a = 0; a < 7; ++a) {
    int64_t want = 0;
    for (int i = 0; i < kFirst + kSecond; ++i)
      if (i % 7 == a) want += 1 + i % 13;
    EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct-" + std::to_string(a) + "'"),
              want)
        << "acct-" << a;
  }
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
}

// Poison through the C handler: p-3 kills the process inside its handler on every run.
// Each death is counted durably; after max_attempts (5) the next run dead-letters it as
// handler_crashed without running the handler, acks it, and applies what follows it.
// Bad input through the handler's codes: undecodable_payload and invalid_payload.
TEST_P(CLedgerCrashTest, PoisonAndBadInputEndAsNamedDeadLetters) {
  {
    auto first = start_example();
    term(*first);
  }
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 6; ++i) pub.credit("credits/p", "p-" + std::to_string(i), "acct", 10);
    pub.publish("credits/p", R"({"message_id":"bad-1","account":"acct","amount":"ten"})",
                {{"message-id", "bad-1"}});
    pub.credit("credits/p", "neg-1", "acct", -4);
  }
  int deaths = 0;
  for (int run = 0; run < 8; ++run) {
    auto child = start_child({"--crash-in-handler", "p-3"});
    const bool ended =
        wait_until([&] { return !child->running() || entries() == 5; }, std::chrono::seconds(20));
    ASSERT_TRUE(ended) << log_text();
    if (!child->running()) {
      ++deaths;
      continue;
    }
    ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM inbox_dead_letters") == 3; },
                           std::chrono::seconds(10)))
        << log_text();
    term(*child);
    break;
  }
  EXPECT_EQ(deaths, 5);
  EXPECT_EQ(entries(), 5);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct'"), 50);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'p-3'"
              " AND reason = 'handler_crashed' AND attempts = 5"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'bad-1'"
              " AND reason = 'undecodable_payload'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'neg-1'"
              " AND reason = 'invalid_payload' AND reason_text = 'amount -4 is not a credit'"),
            1);
}

INSTANTIATE_TEST_SUITE_P(Mqtt, CLedgerCrashTest, ::testing::Values("3.1.1", "5"),
                         [](const auto& p) {
                           return std::string(p.param) == "5" ? "V5" : "V3_1_1";
                         });

}  // namespace
}  // namespace mqtt_inbox::test

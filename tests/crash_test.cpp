// Crashes at the points of guarantees.md section 5, with a real child process, a real
// mosquitto and a real SQLite file. The child is the ledger consumer with fault switches
// (support/crash_consumer.cpp); the test reads the database and the child's counters.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override { db_path_ = dir_.file("ledger.db"); }

  std::unique_ptr<Child> start_consumer(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {built_program("crash_consumer"), broker_.uri(), "crash-client",
                                     "credits/#", db_path_, "--mqtt-version", "5"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(argv, log_path());
  }
  std::string log_path() const { return dir_.file("consumer.log"); }
  std::string log_text() const {
    std::ifstream f(log_path());
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  // Stops the child with SIGTERM and returns the counter printed by it.
  int64_t stop_and_count(Child& child, const std::string& counter) {
    child.signal(SIGTERM);
    EXPECT_NE(child.wait(std::chrono::seconds(20)), -1);
    std::smatch m;
    const std::string text = log_text();
    const std::regex re("counters: .*" + counter + "=(\\d+)");
    std::string last;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
      last = (*it)[1];
    return last.empty() ? -1 : std::stoll(last);
  }
  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }
  void publish_credits(int n) {
    TestPublisher pub(broker_.uri(), true);
    for (int i = 0; i < n; ++i) pub.credit("credits/x", "c-" + std::to_string(i), "acct", 10 + i);
  }
  static int64_t expected_total(int n) { return 10LL * n + n * (n - 1LL) / 2; }

  Broker broker_;
  TempDir dir_;
  std::string db_path_;
};

// Killed after the commit of c-5 and before its callback returned (no PUBACK): the broker
// redelivers c-5 to the restarted consumer, which recognises it as a duplicate.
TEST_F(CrashTest, KilledBetweenCommitAndAckIsRedeliveredAndAppliedOnce) {
  {
    auto first = start_consumer();  // create the session and subscription
    ASSERT_TRUE(wait_until([&] { return log_text().find("subscribing") != std::string::npos; },
                           std::chrono::seconds(10)));
    first->signal(SIGTERM);
    first->wait(std::chrono::seconds(10));
  }
  auto child = start_consumer({"--crash-after-commit", "c-5"});
  publish_credits(10);
  const int st = child->wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1) << "consumer did not crash";
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-5'"), 1);

  auto restarted = start_consumer();
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 10; },
                         std::chrono::seconds(20)));
  EXPECT_GE(stop_and_count(*restarted, "duplicates"), 1);  // c-5 came back and was skipped
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-5'"), 1);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), expected_total(10));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 10);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
}

// Killed inside the handler of c-3, before any commit: c-3 is redelivered and applied
// once; the attempt from the dead process was counted durably.
TEST_F(CrashTest, KilledInsideHandlerIsRedeliveredAndAppliedOnce) {
  {
    auto first = start_consumer();
    ASSERT_TRUE(wait_until([&] { return log_text().find("subscribing") != std::string::npos; },
                           std::chrono::seconds(10)));
    first->signal(SIGTERM);
    first->wait(std::chrono::seconds(10));
  }
  auto child = start_consumer({"--crash-in-handler", "c-3"});
  publish_credits(10);
  const int st = child->wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1) << "consumer did not crash";
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-3'"), 0);
  EXPECT_EQ(q("SELECT attempts FROM inbox_attempts WHERE message_id = 'c-3' AND state = 'running'"), 1);

  auto restarted = start_consumer();
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 10; },
                         std::chrono::seconds(20)));
  stop_and_count(*restarted, "processed");
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-3'"), 1);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), expected_total(10));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
}

}  // namespace
}  // namespace mqtt_inbox::test

// Crashes at the points of guarantees.md section 5, with a real child process, a real
// mosquitto and a real SQLite file. The child is the ledger consumer with fault switches
// (support/crash_consumer.cpp); the test reads the database and the child's counters.
#include "support/child_consumer.h"
#include "support/core_cases.h"

namespace mqtt_inbox::test {
namespace {

class CrashTest : public ChildConsumerTest {
 protected:
  void publish_credits(int n) {
    TestPublisher pub(broker_.uri(), true);
    for (int i = 0; i < n; ++i) pub.credit("credits/x", "c-" + std::to_string(i), "acct", 10 + i);
  }
  static int64_t expected_total(int n) { return 10LL * n + n * (n - 1LL) / 2; }
};

// Killed after the commit of c-5 and before its callback returned (no PUBACK): the broker
// redelivers c-5 to the restarted consumer, which recognises it as a duplicate. One of
// the core cases (support/core_cases.h), also run against RabbitMQ (rabbitmq_test).
TEST_F(CrashTest, KilledBetweenCommitAndAckIsRedeliveredAndAppliedOnce) {
  core_case_exactly_once_under_sigkill(children_);
}

// Killed inside the handler of c-3, before any commit: c-3 is redelivered and applied
// once; the attempt from the dead process was counted durably.
TEST_F(CrashTest, KilledInsideHandlerIsRedeliveredAndAppliedOnce) {
  create_session();
  auto child = start_consumer({"--crash-in-handler", "c-3"});
  publish_credits(10);
  const int st = child->wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1) << "consumer did not crash";
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-3'"), 0);
  // The dead process counted its attempt outside the database (the running-attempt marker
  // in the lock file, so a first delivery costs one transaction); the next open records it
  // as a 'running' attempt, before anything is delivered.
  {
    std::unique_ptr<Inbox> reopened;
    ASSERT_TRUE(Inbox::open(db_path_, {}, &reopened).ok());
  }
  EXPECT_EQ(q("SELECT attempts FROM inbox_attempts WHERE message_id = 'c-3' AND state = 'running'"),
            1);

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

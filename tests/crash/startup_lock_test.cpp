// Issue 13, part 1, as a user meets it: the example consumer is started (and killed,
// and restarted, as a supervisor would) while another process holds the database's
// write lock. It must wait instead of exiting, must not connect to the broker before the
// store is ready (redeliveries arrive right after CONNACK), and must then apply every
// credit exactly once. A start-up deadline ends the wait with exit code 4.
#include <signal.h>

#include "support/example_fixture.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class StartupLockTest : public ExampleProgramTest {};

// The run: 1,500 credits queued at the broker; a lock held for ~13 s; the
// consumer started during it, SIGKILLed after 1.5 s and restarted four times, and a last
// start that must outlive the lock (on the old code it exited after the 5 s busy timeout
// with "database is locked", and the stream stalled for good).
TEST_F(StartupLockTest, LedgerConsumerRestartedDuringALockAppliesEveryCreditOnce) {
  create_session([&](const std::string& log) { return start_ledger(log); });
  const size_t connections_before = broker_connections();
  ASSERT_EQ(connections_before, 1u);

  WriteLockHolder lock(db_, dir_.path());
  ASSERT_TRUE(lock.held());
  constexpr int kCredits = 1500;
  const int64_t total = publish("credits/s", kCredits, "s");
  ASSERT_GT(total, 0) << read_text(dir_.file("publisher.log"));

  for (int i = 0; i < 4; ++i) {
    auto c = start_ledger("run-" + std::to_string(i) + ".log");
    std::this_thread::sleep_for(milliseconds(1500));
    ASSERT_TRUE(c->running()) << "the consumer exited while the store was locked:\n"
                              << read_text(dir_.file("run-" + std::to_string(i) + ".log"));
    c->signal(SIGKILL);
    c->wait(seconds(5));
  }
  auto last = start_ledger("last.log");
  // Longer than the 5 s busy timeout of one attempt: the wait goes on.
  std::this_thread::sleep_for(milliseconds(7000));
  ASSERT_TRUE(last->running()) << "the consumer exited while the store was locked:\n"
                               << read_text(dir_.file("last.log"));
  EXPECT_NE(read_text(dir_.file("last.log")).find("at start-up"), std::string::npos)
      << "the start-up wait was not logged";
  EXPECT_EQ(broker_connections(), connections_before)
      << "a consumer connected to the broker before the store was ready";
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 0);

  lock.release();
  ASSERT_TRUE(
      wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == kCredits; }, seconds(90)))
      << "ledger rows: " << q("SELECT count(*) FROM ledger_entries") << "\n"
      << read_text(dir_.file("last.log"));
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), kCredits);
  EXPECT_EQ(q("SELECT sum(amount) FROM ledger_entries"), total);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), total);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), kCredits);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(broker_connections(), connections_before + 1);
  last->signal(SIGTERM);
  const int st = last->wait(seconds(20));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
}

// With --startup-deadline-ms the wait ends with exit code 4 about then, without having
// connected; the messages stay at the broker for the next run.
TEST_F(StartupLockTest, StartupDeadlineEndsTheWaitWithExitCode4) {
  create_session([&](const std::string& log) { return start_ledger(log); });
  WriteLockHolder lock(db_, dir_.path());
  ASSERT_TRUE(lock.held());
  ASSERT_GT(publish("credits/d", 20, "d"), 0);

  const auto t0 = std::chrono::steady_clock::now();
  auto c = start_ledger("deadline.log", {"--startup-deadline-ms", "1500"});
  const int st = c->wait(seconds(20));
  const auto took = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  ASSERT_NE(st, -1);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 4) << "status " << st << "\n"
                                                     << read_text(dir_.file("deadline.log"));
  EXPECT_GE(took.count(), 1500);
  EXPECT_LT(took.count(), 4500) << "the deadline was not kept\n"
                                << read_text(dir_.file("deadline.log"));
  EXPECT_NE(read_text(dir_.file("deadline.log")).find("not ready after"), std::string::npos);
  EXPECT_EQ(broker_connections(), 1u) << "connected although the store was not ready";

  // The next run, with the lock gone, gets all 20.
  lock.release();
  auto next = start_ledger("next.log");
  EXPECT_TRUE(
      wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 20; }, seconds(30)));
  next->signal(SIGTERM);
  next->wait(seconds(20));
}

}  // namespace
}  // namespace mqtt_inbox::test

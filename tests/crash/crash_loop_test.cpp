// Which deliveries may already have run, proved with processes killed inside the handler.
// A first delivery commits no attempt row (one write transaction per message): while a
// handler runs, its message id sits in the running-attempt marker of the lock file, and
// the next open counts a marker left by a dead process. So counting must not depend on
// the DUP flag (some brokers resend without it, a producer may publish the same id again)
// nor on the kind of the earlier attempts (failed in-process, or killed).
#include <chrono>
#include <functional>
#include <regex>
#include <thread>

#include "support/child_consumer.h"

namespace mqtt_inbox::test {
namespace {

class CrashLoopTest : public ChildConsumerTest {
 protected:
  // Runs consumers killed on `poison` until one survives (or `max_runs`); returns the
  // number of runs that died. Before each run, `before_run(run)` may publish.
  int crash_until_survived(const std::vector<std::string>& args,
                           const std::function<void(int)>& before_run,
                           const std::function<bool()>& survived_when, int max_runs = 6) {
    int crashes = 0;
    for (int run = 0; run < max_runs; ++run) {
      before_run(run);
      auto child = start_consumer(args);
      const bool done = wait_until([&] { return !child->running() || survived_when(); },
                                   std::chrono::seconds(20));
      EXPECT_TRUE(done) << "run " << run << " neither died nor finished";
      if (!child->running()) {
        ++crashes;
        continue;
      }
      stop_and_count(*child, "dead_lettered");
      break;
    }
    return crashes;
  }

  // A new persistent session for the children's client id (the log is shared by all runs, so wait
  // for this run's own "consuming: " line).
  void create_fresh_session() {
    const size_t before = log_count("consuming: ");
    auto first = start_consumer();
    ASSERT_TRUE(
        wait_until([&] { return log_count("consuming: ") > before; }, std::chrono::seconds(10)));
    first->signal(SIGTERM);
    ASSERT_NE(first->wait(std::chrono::seconds(10)), -1);
  }

  // "crash inside the handler on ID (attempt N, dup D)" lines, as (attempt, dup) pairs.
  std::vector<std::pair<int, int>> crash_lines(const std::string& id) {
    const std::string text = log_text();
    const std::regex re("crash inside the handler on " + id + R"( \(attempt (\d+), dup (\d)\))");
    std::vector<std::pair<int, int>> out;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
         ++it)
      out.emplace_back(std::stoi((*it)[1]), std::stoi((*it)[2]));
    return out;
  }
};

// A broker that never sets DUP: every delivery of the poison message is a first delivery
// as far as the wire shows (a fresh session each run, and the same id published again each
// time, DUP=0). The attempts still add up across the dead processes, and the loop ends in
// a handler_crashed dead letter after max_attempts runs.
TEST_F(CrashLoopTest, CrashLoopWithoutDupFlagEndsInHandlerCrashed) {
  int run_id = 0;
  const auto publish_fresh = [&](int run) {
    children_.set_client_id("fresh-session-" + std::to_string(run));
    run_id = run;
    create_fresh_session();  // a new, empty session: nothing can come back with DUP set
    TestPublisher pub(broker_.uri());
    pub.credit("credits/k", "k-2", "acct", 2);  // the same id, published again: DUP=0
    pub.credit("credits/k", "after-" + std::to_string(run), "acct", 100);
  };
  const int crashes = crash_until_survived(
      {"--crash-in-handler", "k-2", "--max-attempts", "3"}, publish_fresh, [&] {
        return q("SELECT count(*) FROM ledger_entries WHERE message_id = 'after-" +
                 std::to_string(run_id) + "'") == 1;
      });
  EXPECT_EQ(crashes, 3);
  const auto lines = crash_lines("k-2");
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].first, static_cast<int>(i) + 1) << "attempt numbers continue";
    EXPECT_EQ(lines[i].second, 0) << "every delivery had DUP=0";
  }
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'k-2'"
              " AND reason = 'handler_crashed' AND attempts = 3"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'k-2'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'after-3'"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
}

// The issue's simulation on one session: after the first crash the same id is published
// again with DUP=0, next to the broker's own redelivery (DUP=1). The redeliveries are
// counted, the loop ends after max_attempts runs, and the fresh copy that arrives after
// the dead letter is recognised (already dead-lettered) without running the handler.
TEST_F(CrashLoopTest, RepublishedIdAfterACrashDoesNotRestartTheCount) {
  create_session();
  {
    TestPublisher pub(broker_.uri());
    for (int i = 0; i < 5; ++i) pub.credit("credits/k", "k-" + std::to_string(i), "acct", 1 + i);
  }
  const auto republish_after_first_crash = [&](int run) {
    if (run != 1) return;
    TestPublisher pub(broker_.uri());
    pub.credit("credits/k", "k-2", "acct", 3);  // DUP=0: a fresh publish of the same id
  };
  const int crashes = crash_until_survived(
      {"--crash-in-handler", "k-2", "--max-attempts", "3"}, republish_after_first_crash, [&] {
        return q("SELECT count(*) FROM ledger_entries") == 4 &&
               q("SELECT redeliveries FROM inbox_dead_letters WHERE message_id = 'k-2'") >= 1;
      });
  EXPECT_EQ(crashes, 3);
  const auto lines = crash_lines("k-2");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], std::make_pair(1, 0));  // the first delivery: DUP=0, no row committed
  EXPECT_EQ(lines[1].first, 2);
  EXPECT_EQ(lines[2].first, 3);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'k-2'"
              " AND reason = 'handler_crashed' AND attempts = 3"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 1);  // the copy bumped it
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 1 + 2 + 4 + 5);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'k-2'"), 0);
}

// Attempts of both kinds add up: attempt 1 throws (recorded at once, in-process), attempt
// 2 kills the process (recorded from the marker at the next open), attempt 3 kills it
// again; the next delivery is dead-lettered as handler_crashed after 3 attempts.
TEST_F(CrashLoopTest, FailedAndCrashedAttemptsAddUp) {
  create_session();
  {
    TestPublisher pub(broker_.uri());
    for (int i = 0; i < 5; ++i) pub.credit("credits/k", "k-" + std::to_string(i), "acct", 1 + i);
  }
  const int crashes = crash_until_survived(
      {"--crash-in-handler", "k-2", "--fail-attempts", "1", "--max-attempts", "3"}, [](int) {},
      [&] { return q("SELECT count(*) FROM ledger_entries") == 4; });
  EXPECT_EQ(crashes, 2);
  EXPECT_EQ(log_count("failure inside the handler on k-2 (attempt 1"), 1u);
  const auto lines = crash_lines("k-2");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].first, 2);
  EXPECT_EQ(lines[1].first, 3);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'k-2'"
              " AND reason = 'handler_crashed' AND attempts = 3"),
            1);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 1 + 2 + 4 + 5);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
}

// A process killed inside a handler on the first delivery after a clean start, DUP=0,
// with no attempt row committed: the next process counts it and runs the message as
// attempt 2, applies it once, and leaves no attempt row behind.
TEST_F(CrashLoopTest, OneCrashThenSuccessAppliesOnceAsAttemptTwo) {
  create_session();
  {
    TestPublisher pub(broker_.uri());
    for (int i = 0; i < 3; ++i) pub.credit("credits/k", "k-" + std::to_string(i), "acct", 1 + i);
  }
  auto first = start_consumer({"--crash-in-handler", "k-1"});
  ASSERT_NE(first->wait(std::chrono::seconds(20)), -1) << "the consumer did not crash";
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);  // nothing committed for it
  ASSERT_EQ(crash_lines("k-1"), (std::vector<std::pair<int, int>>{{1, 0}}));

  auto second = start_consumer();
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 3; },
                         std::chrono::seconds(20)));
  stop_and_count(*second, "processed");
  EXPECT_EQ(log_count("died inside the handler of message 'k-1'"), 1u);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'k-1'"), 1);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 1 + 2 + 3);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
}

// An operator requeues a dead letter whose handler still kills the process. The replay
// (the running Consumer's requeue thread) dies inside the handler; the next open puts the
// row back to 'dead' (handler_crashed, one more attempt) instead of leaving it 'requeued',
// which every later start would replay, and die of: a requeue cannot make a crash loop.
TEST_F(CrashLoopTest, RequeuedDeadLetterWhoseReplayCrashesIsDeadAgainNotReplayedAtEveryStart) {
  create_session();
  {
    TestPublisher pub(broker_.uri());
    for (int i = 0; i < 4; ++i) pub.credit("credits/k", "k-" + std::to_string(i), "acct", 1 + i);
  }
  const std::string dead_k2 = "SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'k-2'";
  // 1. k-2 kills the process once; with max_attempts 1 its redelivery is dead-lettered.
  const int crashes = crash_until_survived(
      {"--crash-in-handler", "k-2", "--max-attempts", "1"}, [](int) {},
      [&] { return q("SELECT count(*) FROM ledger_entries") == 3 && q(dead_k2) == 1; });
  EXPECT_EQ(crashes, 1);
  ASSERT_EQ(q(dead_k2 + " AND status = 'dead' AND reason = 'handler_crashed' AND attempts = 1"), 1);

  // 2. The operator requeues it (the admin tool's connection) while the service is down.
  {
    InboxOptions o;
    o.exclusive = false;
    std::unique_ptr<Inbox> tool;
    ASSERT_TRUE(Inbox::open(children_.db_path(), o, &tool).ok());
    ASSERT_TRUE(tool->requeue_dead_letter(q("SELECT id FROM inbox_dead_letters")).ok());
  }

  // 3. The service starts, replays it, and dies inside the handler again.
  auto replaying = start_consumer({"--crash-in-handler", "k-2", "--requeue-poll-ms", "50"});
  ASSERT_NE(replaying->wait(std::chrono::seconds(20)), -1) << "the replay did not crash\n"
                                                           << log_text();
  EXPECT_EQ(crash_lines("k-2").size(), 2u);
  EXPECT_EQ(q(dead_k2 + " AND status = 'requeued'"), 1);  // nothing committed

  // 4. The next start puts it back to 'dead' and does not replay it: it keeps running.
  auto next = start_consumer({"--crash-in-handler", "k-2", "--requeue-poll-ms", "50"});
  ASSERT_TRUE(wait_until([&] { return q(dead_k2 + " AND status = 'dead'") == 1; },
                         std::chrono::seconds(20)))
      << log_text();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // 20 requeue polls
  EXPECT_TRUE(next->running()) << "the requeued poison was replayed again\n" << log_text();
  stop_and_count(*next, "processed");
  EXPECT_EQ(crash_lines("k-2").size(), 2u);
  EXPECT_EQ(log_count("while replaying the requeued dead letter of message 'k-2'"), 1u);
  EXPECT_EQ(q(dead_k2 + " AND status = 'dead' AND reason = 'handler_crashed' AND attempts = 2"
                        " AND reason_text LIKE '%replaying this requeued dead letter%'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'k-2'"), 0);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 1 + 2 + 4);
}

}  // namespace
}  // namespace mqtt_inbox::test

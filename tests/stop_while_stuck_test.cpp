// Issue 13, part 6: stopping while stuck. A message is waiting for a store that another
// process keeps locked; SIGTERM must end the example program within stop_timeout_ms plus
// one second, with exit code 3 and without acknowledging the message: the next run gets
// it again (redelivery) and applies it once. For ledger_consumer (the message is
// committed in the callback) and sensor_gateway (store-then-process: the message is
// stored in the callback, and its workers wait for the same lock).
#include <signal.h>

#include "support/example_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kStopTimeoutMs = 1500;

class StopWhileStuckTest : public ExampleProgramTest {
 protected:
  // SIGTERM to a program whose callback waits for the store: it must be gone within
  // stop_timeout_ms + 1 s, with exit code 3.
  void expect_prompt_exit_3(Child& c, const std::string& log) {
    const auto t0 = std::chrono::steady_clock::now();
    c.signal(SIGTERM);
    const int st = c.wait(seconds(30));
    const auto took =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
    ASSERT_NE(st, -1) << "still running 30 s after SIGTERM";
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3) << "status " << st << "\n"
                                                       << read_text(dir_.file(log));
    EXPECT_LE(took.count(), kStopTimeoutMs + 1000) << "took " << took.count() << " ms\n"
                                                   << read_text(dir_.file(log));
  }
};

TEST_F(StopWhileStuckTest, LedgerConsumerExitsWithin1sOfTheStopTimeoutWithoutAck) {
  create_session([&](const std::string& log) { return start_ledger(log); });
  const std::vector<std::string> args = {"--stop-timeout-ms", std::to_string(kStopTimeoutMs)};
  auto c = start_ledger("run.log", args);
  ASSERT_GT(publish("credits/t", 3, "t", "pub-1.log"), 0);
  ASSERT_TRUE(
      wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 3; }, seconds(30)));

  WriteLockHolder lock(db_, dir_.path());
  ASSERT_TRUE(lock.held());
  ASSERT_GT(publish("credits/t", 1, "stuck", "pub-2.log"), 0);
  ASSERT_TRUE(wait_until(
      [&] {
        return read_text(dir_.file("run.log")).find("message not acked") != std::string::npos;
      },
      seconds(30)))
      << "the message never waited for the store:\n"
      << read_text(dir_.file("run.log"));
  expect_prompt_exit_3(*c, "run.log");
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id LIKE 'stuck-%'"), 0);

  // Not acked: the next run gets it again.
  lock.release();
  auto next = start_ledger("next.log", args);
  EXPECT_TRUE(
      wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 4; }, seconds(30)));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id LIKE 'stuck-%'"), 1);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), 4);
  next->signal(SIGTERM);
  const int st = next->wait(seconds(20));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

TEST_F(StopWhileStuckTest, SensorGatewayExitsWithin1sOfTheStopTimeoutWithoutAck) {
  const std::vector<std::string> args = {"--stop-timeout-ms", std::to_string(kStopTimeoutMs)};
  create_session([&](const std::string& log) { return start_gateway(log, args); });
  auto g = start_gateway("run.log", args);
  auto reading = [&](const std::string& device, const std::string& id, double value) {
    TestPublisher pub(broker_.uri(), true);
    pub.publish("sensors/" + device + "/reading",
                "{\"message_id\":\"" + id + "\",\"value\":" + std::to_string(value) + "}",
                {{"message-id", id}});
  };
  reading("d1", "r-1", 1.5);
  reading("d1", "r-2", 2.5);
  ASSERT_TRUE(wait_until([&] { return q("SELECT coalesce(sum(readings), 0) FROM devices") == 2; },
                         seconds(30)));

  WriteLockHolder lock(db_, dir_.path());
  ASSERT_TRUE(lock.held());
  reading("d1", "r-stuck", 9.5);
  ASSERT_TRUE(wait_until(
      [&] {
        return read_text(dir_.file("run.log")).find("message not acked") != std::string::npos;
      },
      seconds(30)))
      << "the message never waited for the store:\n"
      << read_text(dir_.file("run.log"));
  expect_prompt_exit_3(*g, "run.log");
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'r-stuck'"), 0);

  lock.release();
  auto next = start_gateway("next.log", args);
  EXPECT_TRUE(wait_until([&] { return q("SELECT coalesce(sum(readings), 0) FROM devices") == 3; },
                         seconds(30)));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(q("SELECT readings FROM devices WHERE device = 'd1'"), 3);
  EXPECT_EQ(q("SELECT latest_value = 9.5 FROM devices WHERE device = 'd1'"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'r-stuck'"), 1);
  next->signal(SIGTERM);
  const int st = next->wait(seconds(20));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

}  // namespace
}  // namespace mqtt_inbox::test

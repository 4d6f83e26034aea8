// Poison messages and bad input through a real mosquitto into a real SQLite file: what
// cannot be processed ends in the dead letters with a named reason, is acked, and never
// blocks the messages behind it.
#include <map>
#include <thread>

#include "support/child_consumer.h"

namespace mqtt_inbox::test {
namespace {

class PoisonTest : public ChildConsumerTest {};

std::string credit_json(const std::string& id, long long amount) {
  return R"({"message_id":")" + id + R"(","account":"acct","amount":)" + std::to_string(amount) +
         "}";
}

// A credit padded to exactly `size` bytes (a valid credit as long as size allows).
std::string padded_credit(const std::string& id, size_t size) {
  std::string head = R"({"message_id":")" + id + R"(","account":"acct","amount":1,"pad":")";
  const std::string tail = "\"}";
  return head + std::string(size - head.size() - tail.size(), 'p') + tail;
}

TEST_F(PoisonTest, PoisonMessageIsDeadLetteredAfterAttemptsAndStreamGoesOn) {
  create_session();
  {
    TestPublisher pub(broker_.uri());
    pub.credit("credits/p", "poison-0", "acct", 1000);
    for (int i = 1; i <= 10; ++i) pub.credit("credits/p", "ok-" + std::to_string(i), "acct", i);
  }
  auto child = start_consumer({"--fail-handler", "poison-0", "--max-attempts", "3"});
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 10; },
                         std::chrono::seconds(20)));
  EXPECT_EQ(stop_and_count(*child, "dead_lettered"), 1);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 55);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'poison-0'"
              " AND reason = 'handler_failed' AND attempts = 3"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE message_id = 'poison-0'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);

  // It was acked: the next run of the same session receives nothing.
  auto again = start_consumer();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(stop_and_count(*again, "processed"), 0);
  EXPECT_EQ(log_count("): already_dead_lettered"), 0u);
}

// The handler kills the process on one message, every time. Each restart gets the
// message again; the attempts are counted durably, and after max_attempts the message is
// dead-lettered without the handler running, and the messages behind it are processed.
TEST_F(PoisonTest, CrashLoopEndsInDeadLetterAfterConfiguredRestarts) {
  create_session();
  {
    TestPublisher pub(broker_.uri());
    for (int i = 0; i < 5; ++i) pub.credit("credits/k", "k-" + std::to_string(i), "acct", 1 + i);
  }
  int crashes = 0;
  for (int run = 0; run < 6; ++run) {
    auto child = start_consumer({"--crash-in-handler", "k-2", "--max-attempts", "3"});
    const bool done = wait_until(
        [&] { return !child->running() || q("SELECT count(*) FROM ledger_entries") == 4; },
        std::chrono::seconds(20));
    ASSERT_TRUE(done);
    if (!child->running()) {
      ++crashes;
      continue;
    }
    stop_and_count(*child, "dead_lettered");
    break;
  }
  EXPECT_EQ(crashes, 3);
  EXPECT_EQ(log_count("crash inside the handler on k-2"), 3u);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'k-2'"
              " AND reason = 'handler_crashed' AND attempts = 3"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 4);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 1 + 2 + 4 + 5);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'k-2'"), 0);
}

// Every kind of bad input from issue 3 through the real broker. Each one ends processed or
// dead-lettered with the expected reason; none is dropped, none blocks the stream.
TEST_F(PoisonTest, BadInputIsProcessedOrDeadLetteredNeverDropped) {
  const size_t max = 64 * 1024;
  create_session();
  struct Case {
    std::string id_property;  // "" = none
    std::string payload;
    std::string expect;  // "processed" or a reason code
  };
  std::vector<Case> cases = {
      {"zero-len", "", "undecodable_payload"},
      {"one-byte", "x", "undecodable_payload"},
      {"", "", "undecodable_payload"},
      {"under-max", padded_credit("under-max", max - 1), "processed"},
      {"at-max", padded_credit("at-max", max), "processed"},
      {"over-max", padded_credit("over-max", max + 1), "payload_too_large"},
      {"", R"({"message_id":"trunc","account":"acct","amount":)", "undecodable_payload"},
      {"", R"({"message_id":7,"account":"acct","amount":1})", "invalid_id"},
      {"", R"({"message_id":"wrong-amount","account":"acct","amount":"1"})", "undecodable_payload"},
      {"", R"({"message_id":"float-amount","account":"acct","amount":1.5})", "undecodable_payload"},
      {"bad-utf8",
       std::string("{\"message_id\":\"bad-utf8\",\"account\":\"\xff\xfe\",\"amount\":1}"),
       "undecodable_payload"},
      {"", std::string("\xc3\x28\xa0\xa1", 4), "undecodable_payload"},
      {"", R"({"message_id":"","account":"acct","amount":1})", "invalid_id"},
      {"", R"({"message_id":"  \t ","account":"acct","amount":1})", "invalid_id"},
      {"", R"({"message_id":"ctl\u0001x","account":"acct","amount":1})", "invalid_id"},
      {"", "{\"message_id\":\"" + std::string(5000, 'L') + "\",\"account\":\"acct\",\"amount\":1}",
       "invalid_id"},
      {"", R"({"account":"acct","amount":1})", "missing_id"},
      {"", R"({"account":"acct","amount":2})", "missing_id"},  // not collapsed with the one above
      {"last-good", credit_json("last-good", 5), "processed"},
  };
  {
    TestPublisher pub(broker_.uri());
    for (const Case& c : cases) {
      if (c.id_property.empty()) {
        pub.publish("credits/bad", c.payload);
      } else {
        pub.publish("credits/bad", c.payload, {{"message-id", c.id_property}});
      }
    }
  }
  auto child = start_consumer({"--max-payload", std::to_string(max)});
  ASSERT_TRUE(wait_until(
      [&] { return q("SELECT count(*) FROM ledger_entries WHERE message_id = 'last-good'") == 1; },
      std::chrono::seconds(30)));
  stop_and_count(*child, "processed");

  std::map<std::string, int64_t> expected;
  for (const Case& c : cases) ++expected[c.expect];
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), expected["processed"]);
  int64_t dead = 0;
  for (const auto& [reason, n] : expected) {
    if (reason == "processed") continue;
    dead += n;
    EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = '" + reason + "'"), n)
        << reason;
  }
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), dead);
  // Every published message has a record: processed, or dead-lettered.
  EXPECT_EQ(expected["processed"] + dead, static_cast<int64_t>(cases.size()));
  // The oversized payload is kept whole (it is under dead_letter_payload_bytes).
  EXPECT_EQ(q("SELECT length(payload) FROM inbox_dead_letters WHERE message_id = 'over-max'"),
            static_cast<int64_t>(max + 1));
}

}  // namespace
}  // namespace mqtt_inbox::test

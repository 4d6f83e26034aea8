// The C API's subscriber against a real mosquitto, MQTT 3.1.1 and 5: the C consumer
// (subscriber_child.c, compiled as C) receives credits published with duplicates, bad
// input and messages queued while it was offline, and stops on SIGTERM (through
// mqtt_inbox_subscriber_request_stop from its signal handler) or from a second thread.
// GoogleTest only runs the child and reads the file; the code under test is C.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "support/ledger_fixture.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

class CSubscriberTest : public ::testing::TestWithParam<const char*> {
 protected:
  bool mqtt5() const { return std::string(GetParam()) == "5"; }
  std::string db() const { return dir_.file("ledger.db"); }
  std::string log() const { return dir_.file("child.log"); }
  std::string log_text() const {
    std::ifstream f(log());
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  std::unique_ptr<Child> start(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {built_program("capi_subscriber_child"),
                                     broker_.uri(),
                                     "c-client",
                                     "credits/#",
                                     db(),
                                     GetParam()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto child = std::make_unique<Child>(with_emulator(argv), log());
    consuming_seen_ += 1;
    EXPECT_TRUE(
        wait_until([&] { return count("consuming") >= consuming_seen_; }, std::chrono::seconds(15)))
        << log_text();
    return child;
  }
  size_t count(const std::string& needle) const {
    const std::string t = log_text();
    size_t n = 0;
    for (size_t at = t.find(needle); at != std::string::npos; at = t.find(needle, at + 1)) ++n;
    return n;
  }
  // SIGTERM; the child must exit 0 after a clean stop. Returns its last stats counter.
  int64_t term_and_stat(Child& child, const std::string& counter) {
    child.signal(SIGTERM);
    const int st = child.wait(std::chrono::seconds(20));
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << log_text();
    std::smatch m;
    const std::string t = log_text();
    std::string last;
    const std::regex re("\"" + counter + "\":(\\d+)");
    for (auto it = std::sregex_iterator(t.begin(), t.end(), re); it != std::sregex_iterator(); ++it)
      last = (*it)[1];
    return last.empty() ? -1 : std::stoll(last);
  }
  int64_t q(const std::string& sql) const { return query_int(db(), sql); }

  Broker broker_;
  TempDir dir_;
  size_t consuming_seen_ = 0;
};

// 40 credits, each published twice and every fourth a third time (a producer that
// retried), plus one undecodable and one rejected credit: each credit applied once, the
// duplicates skipped, the bad ones dead-lettered with their reason.
TEST_P(CSubscriberTest, DuplicatesAreAppliedOnceAndBadInputIsDeadLettered) {
  auto child = start();
  TestPublisher pub(broker_.uri(), mqtt5());
  int64_t expected = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string id = "c-" + std::to_string(i);
    pub.credit("credits/a", id, "acct-" + std::to_string(i % 3), 10 + i);
    pub.credit("credits/a", id, "acct-" + std::to_string(i % 3), 10 + i);
    if (i % 4 == 0) pub.credit("credits/b", id, "acct-" + std::to_string(i % 3), 10 + i);
    expected += 10 + i;
  }
  pub.publish("credits/a", R"({"message_id":"bad-1","account":"x","amount":"ten"})",
              {{"message-id", "bad-1"}});
  pub.credit("credits/a", "neg-1", "x", -3);
  pub.credit("credits/a", "last", "acct-0", 1);
  expected += 1;
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 41; },
                         std::chrono::seconds(20)))
      << log_text();
  EXPECT_EQ(term_and_stat(*child, "duplicates"), 50);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 41);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), 41);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), expected);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 2);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'bad-1'"
              " AND reason = 'undecodable_payload'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'neg-1'"
              " AND reason = 'invalid_payload'"),
            1);
}

// Messages published while the C consumer is stopped wait in its persistent session
// and are applied once when it comes back.
TEST_P(CSubscriberTest, MessagesQueuedWhileStoppedAreAppliedOnceAfterARestart) {
  {
    auto first = start();
    EXPECT_EQ(term_and_stat(*first, "processed"), 0);
  }
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 20; ++i) pub.credit("credits/q", "q-" + std::to_string(i), "acct", 1);
  }
  auto second = start();
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 20; },
                         std::chrono::seconds(20)))
      << log_text();
  EXPECT_EQ(term_and_stat(*second, "processed"), 20);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct'"), 20);
}

// mqtt_inbox_subscriber_stop from a second thread ends mqtt_inbox_subscriber_run in the
// main thread, and the program exits cleanly.
TEST_P(CSubscriberTest, StopFromAnotherThreadEndsRun) {
  auto child = start({"--stop-from-thread", "300"});
  const int st = child->wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1) << log_text();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log_text();
  EXPECT_EQ(count("stopped"), 1u) << log_text();
}

// A stop from inside the handler, on Paho's receive thread, is refused at once with a
// message that says so (it would wait for this very thread: before, the whole
// stop_timeout_ms, 10 s, blaming the store); the handler asks for the stop instead, and
// the program ends cleanly with the message applied once.
TEST_P(CSubscriberTest, AStopFromInsideTheHandlerIsRefusedAtOnce) {
  auto child = start({"--stop-in-handler", "1"});
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    pub.credit("credits/a", "s-1", "acct-s", 5);
  }
  const int st = child->wait(std::chrono::seconds(20));
  ASSERT_NE(st, -1) << log_text();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log_text();
  std::smatch m;
  const std::string t = log_text();
  ASSERT_TRUE(std::regex_search(t, m, std::regex("stop in handler: misuse after (\\d+) ms: (.*)")))
      << t;
  EXPECT_LT(std::stoll(m[1]), 1000) << t;
  EXPECT_NE(m[2].str().find("from inside a handler"), std::string::npos) << t;
  EXPECT_NE(m[2].str().find("mqtt_inbox_subscriber_request_stop"), std::string::npos) << t;
  EXPECT_EQ(count("stopped"), 1u) << t;
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct-s'"), 5);
}

// --emit-topic: each credit enqueues its credited event in the handler's transaction and
// the C relay publishes it; a downstream inbox applies each event once, under the id
// derived from its credit, with the balance after it. Credits are published twice.
TEST_P(CSubscriberTest, EventsEnqueuedByTheHandlerArePublishedOnceByTheRelay) {
  std::unique_ptr<Inbox> down;
  ASSERT_TRUE(Inbox::open(dir_.file("down.db"), {}, &down).ok());
  ASSERT_TRUE(
      down->setup_sql("CREATE TABLE received (message_id TEXT NOT NULL, payload TEXT)").ok());
  std::unique_ptr<Consumer> events;
  ASSERT_TRUE(Consumer::create(
                  down.get(), "events",
                  [](SQLite::Database& db, const Delivery& d) {
                    SQLite::Statement ins(db, "INSERT INTO received VALUES (?, ?)");
                    ins.bind(1, d.message_id);
                    ins.bind(2, d.message.payload);
                    ins.exec();
                  },
                  {}, &events)
                  .ok());
  SubscriberOptions so;
  so.broker_uri = broker_.uri();
  so.client_id = "events-down";
  so.client_id_lock_dir = "";
  so.mqtt_version = MqttVersion::kV5;
  std::unique_ptr<Subscriber> sub;
  ASSERT_TRUE(Subscriber::create(so, &sub).ok());
  ASSERT_TRUE(sub->subscribe("events/#", events.get()).ok());
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(sub->wait_connected(10000));

  auto child = start({"--emit-topic", "events/credited"});
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 20; ++i) {
      pub.credit("credits/e", "e-" + std::to_string(i), "acct", 1);
      pub.credit("credits/e", "e-" + std::to_string(i), "acct", 1);
    }
  }
  const std::string down_db = dir_.file("down.db");
  ASSERT_TRUE(wait_until([&] { return query_int(down_db, "SELECT count(*) FROM received") >= 20; },
                         std::chrono::seconds(20)))
      << log_text();
  // The relay marks a row sent after its PUBACK, which may come after the downstream
  // received it; a row still pending at the stop would be published again by the next run.
  EXPECT_TRUE(wait_until(
      [&] { return q("SELECT count(*) FROM outbox_messages WHERE state = 'sent'") == 20; },
      std::chrono::seconds(10)));
  term_and_stat(*child, "processed");
  ASSERT_TRUE(sub->stop().ok());
  EXPECT_EQ(query_int(down_db, "SELECT count(*) FROM received"), 20);
  EXPECT_EQ(
      query_int(down_db, "SELECT count(*) FROM received WHERE message_id LIKE 'e-%/credited'"), 20);
  EXPECT_EQ(query_int(down_db,
                      "SELECT count(*) FROM received WHERE message_id = 'e-19/credited'"
                      " AND json_extract(payload, '$.balance') = 20"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages"), 20);
}

INSTANTIATE_TEST_SUITE_P(Mqtt, CSubscriberTest, ::testing::Values("3.1.1", "5"), [](const auto& p) {
  return std::string(p.param) == "5" ? "V5" : "V3_1_1";
});

}  // namespace
}  // namespace mqtt_inbox::test

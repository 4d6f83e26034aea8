// The MQTT layer against a real mosquitto on 127.0.0.1: persistent sessions, refused
// configurations, duplicates and redelivery, messages without ids.
#include <mqtt_inbox/subscriber.h>

#include <thread>

#include "support/core_cases.h"
#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

TEST(TopicMatch, FollowsMqttRules) {
  EXPECT_TRUE(topic_matches("a/b", "a/b"));
  EXPECT_FALSE(topic_matches("a/b", "a/c"));
  EXPECT_TRUE(topic_matches("a/+", "a/b"));
  EXPECT_FALSE(topic_matches("a/+", "a/b/c"));
  EXPECT_TRUE(topic_matches("a/#", "a"));
  EXPECT_TRUE(topic_matches("a/#", "a/b/c"));
  EXPECT_TRUE(topic_matches("#", "x/y"));
  EXPECT_FALSE(topic_matches("#", "$SYS/x"));
  EXPECT_TRUE(topic_matches("+/+", "a/"));
  EXPECT_TRUE(topic_matches("$share/g/a/+", "a/b"));
  EXPECT_FALSE(topic_matches("a/b", "a/b/c"));
  EXPECT_TRUE(topic_matches("a/+/c", "a/b/c"));
  EXPECT_FALSE(topic_matches("a/+/c", "a/b/d"));
  EXPECT_FALSE(topic_matches("a/#", "b/a"));
  EXPECT_TRUE(topic_matches("+/+", "/"));  // two empty levels
  EXPECT_FALSE(topic_matches("+", "a/b"));
  EXPECT_TRUE(topic_matches("a/b/#", "a/b"));
  EXPECT_FALSE(topic_matches("a/b/c", "a/b"));
  EXPECT_FALSE(topic_matches("$share/g", "g"));  // no filter after the group
  EXPECT_TRUE(topic_matches("$share/g/#", "x/y"));
  EXPECT_FALSE(topic_matches("+/x", "$SYS/x"));  // MQTT 3.1.1 section 4.7.2
  EXPECT_TRUE(topic_matches("$SYS/#", "$SYS/broker/uptime"));
}

TEST(SubscriberConfig, RefusesSettingsThatVoidRedelivery) {
  std::unique_ptr<Subscriber> s;
  SubscriberOptions o;
  o.broker_uri = "tcp://127.0.0.1:1";
  o.client_id = "c";
  o.clean_session = true;
  Status st = Subscriber::create(o, &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("void redelivery"), std::string::npos) << st.message();

  o.clean_session = false;
  o.mqtt_version = MqttVersion::kV5;
  o.session_expiry_s = 0;
  st = Subscriber::create(o, &s);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("session_expiry_s=0"), std::string::npos) << st.message();

  o.session_expiry_s = 60;
  o.client_id = "";
  EXPECT_EQ(Subscriber::create(o, &s).code(), Status::Code::kInvalidArgument);

  o.client_id = "c";
  ASSERT_TRUE(Subscriber::create(o, &s).ok());
  EXPECT_EQ(s->start().code(), Status::Code::kInvalidArgument);  // no subscription yet
}

class SubscriberTest : public ::testing::TestWithParam<MqttVersion> {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("ledger.db");
    inbox_ = open_ledger_inbox(db_path_);
    ConsumerOptions co;
    co.retry_backoff_initial = std::chrono::milliseconds(1);
    co.retry_backoff_max = std::chrono::milliseconds(2);
    ASSERT_TRUE(
        Consumer::create(inbox_.get(), "ledger", ledger::apply_credit, co, &consumer_).ok());
  }

  std::unique_ptr<Subscriber> make_subscriber(const std::string& client_id) {
    SubscriberOptions o;
    o.broker_uri = broker_.uri();
    o.client_id = client_id;
    o.client_id_lock_dir = dir_.path();  // the mqtt311 and mqtt5 variants run in parallel
    o.mqtt_version = GetParam();
    o.reconnect_backoff_initial_ms = 50;
    o.reconnect_backoff_max_ms = 200;
    std::unique_ptr<Subscriber> s;
    EXPECT_TRUE(Subscriber::create(o, &s).ok());
    EXPECT_TRUE(s->subscribe("credits/#", consumer_.get()).ok());
    return s;
  }

  bool mqtt5() const { return GetParam() == MqttVersion::kV5; }
  BrokerUnderTest broker_under_test() {
    return {"mosquitto", broker_.uri(), GetParam(), [this] { broker_.stop(); },
            [this] { broker_.start(); }};
  }
  int64_t ledger_rows() { return query_int(db_path_, "SELECT count(*) FROM ledger_entries"); }
  int64_t total_balance() { return query_int(db_path_, "SELECT sum(balance) FROM accounts"); }

  Broker broker_;
  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
};

TEST_P(SubscriberTest, AppliesStreamWithDuplicatesExactlyOnce) {
  auto sub = make_subscriber("ledger-dups");
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(sub->wait_connected(10000));
  TestPublisher pub(broker_.uri(), mqtt5());
  long long expected = 0;
  for (int i = 0; i < 40; ++i) {
    pub.credit("credits/a", "c-" + std::to_string(i), "acct-" + std::to_string(i % 3), i + 1);
    expected += i + 1;
    if (i % 3 == 0)
      pub.credit("credits/a", "c-" + std::to_string(i), "acct-" + std::to_string(i % 3), i + 1);
  }
  ASSERT_TRUE(
      wait_until([&] { return consumer_->counters().duplicates == 14; }, std::chrono::seconds(20)));
  EXPECT_EQ(ledger_rows(), 40);
  EXPECT_EQ(total_balance(), expected);
  EXPECT_EQ(consumer_->counters().processed, 40);
  EXPECT_EQ(sub->messages_received(), 54);
  EXPECT_TRUE(sub->stop().ok());
}

// Messages published while the consumer is offline are kept by the broker in the
// persistent session and delivered when it comes back. A core case
// (support/core_cases.h), also run against RabbitMQ (rabbitmq_test).
TEST_P(SubscriberTest, PersistentSessionDeliversWhatArrivedWhileOffline) {
  core_case_offline_messages_are_delivered(broker_under_test(), "core");
}

// Messages without a usable id are dead-lettered with a reason, then acked: a restart
// with the same session receives nothing again.
TEST_P(SubscriberTest, MessagesWithoutIdAreDeadLetteredThenAcked) {
  {
    auto sub = make_subscriber("ledger-noid");
    ASSERT_TRUE(sub->start().ok());
    ASSERT_TRUE(sub->wait_connected(10000));
    TestPublisher pub(broker_.uri(), mqtt5());
    pub.publish("credits/c", R"({"account":"a","amount":1})");
    pub.publish("credits/c", R"({"account":"a","amount":1})");
    pub.publish("credits/c", std::string("\xff\x00\x01", 3));
    pub.publish("credits/c", R"({"message_id":"   ","account":"a","amount":1})");
    ASSERT_TRUE(wait_until([&] { return consumer_->counters().dead_lettered == 4; },
                           std::chrono::seconds(20)));
    ASSERT_TRUE(sub->stop().ok());
  }
  EXPECT_EQ(
      query_int(db_path_, "SELECT count(*) FROM inbox_dead_letters WHERE reason = 'missing_id'"),
      2);
  EXPECT_EQ(
      query_int(db_path_,
                "SELECT count(*) FROM inbox_dead_letters WHERE reason = 'undecodable_payload'"),
      1);
  EXPECT_EQ(
      query_int(db_path_, "SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_id'"),
      1);
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM accounts"), 0);

  auto sub = make_subscriber("ledger-noid");
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(sub->wait_connected(10000));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(sub->messages_received(), 0);  // all four were acked after dead-lettering
  EXPECT_TRUE(sub->stop().ok());
}

// The broker restarts and keeps the sessions (persistence on): a connected subscriber
// reconnects by itself, and messages queued for an offline one survive. A core case.
TEST_P(SubscriberTest, ReconnectsAfterBrokerRestart) {
  core_case_broker_restart_keeps_sessions(broker_under_test(), "core");
}

// One consumer per client id on a host: a second process (here: a second Subscriber)
// with the same id gets a clear error instead of taking the session over.
TEST_P(SubscriberTest, SecondSubscriberWithSameClientIdIsRefused) {
  auto first = make_subscriber("ledger-twice");
  ASSERT_TRUE(first->start().ok());
  auto second = make_subscriber("ledger-twice");
  const Status s = second->start();
  EXPECT_EQ(s.code(), Status::Code::kBusy) << s.to_string();
  EXPECT_NE(s.message().find("ledger-twice"), std::string::npos);
  EXPECT_TRUE(first->wait_connected(10000));
  EXPECT_TRUE(first->stop().ok());
}

// Two clients with one id on different hosts (simulated with separate lock folders) take
// the session from each other. When the other one goes away, ours comes back with the
// session and applies what was published, once.
TEST_P(SubscriberTest, RecoversTheSessionAfterATakeover) {
  TempDir other_host;
  auto make = [&](const std::string& lock_dir) {
    SubscriberOptions o;
    o.broker_uri = broker_.uri();
    o.client_id = "ledger-takeover";
    o.client_id_lock_dir = lock_dir;
    o.mqtt_version = GetParam();
    o.reconnect_backoff_initial_ms = 100;
    o.reconnect_backoff_max_ms = 800;
    std::unique_ptr<Subscriber> s;
    EXPECT_TRUE(Subscriber::create(o, &s).ok());
    EXPECT_TRUE(s->subscribe("credits/#", consumer_.get()).ok());
    return s;
  };
  auto a = make(dir_.path());
  ASSERT_TRUE(a->start().ok());
  ASSERT_TRUE(a->wait_connected(10000));
  {
    auto b = make(other_host.path());
    ASSERT_TRUE(b->start().ok());
    ASSERT_TRUE(b->wait_connected(10000));
    ASSERT_TRUE(wait_until([&] { return !a->is_connected(); }, std::chrono::seconds(10)));
    EXPECT_TRUE(b->stop().ok());
  }
  ASSERT_TRUE(a->wait_connected(15000));
  EXPECT_GE(a->connects(), 2);
  TestPublisher pub(broker_.uri(), mqtt5());
  for (int i = 0; i < 5; ++i) pub.credit("credits/t", "t-" + std::to_string(i), "z", 7);
  ASSERT_TRUE(wait_until([&] { return ledger_rows() == 5; }, std::chrono::seconds(20)));
  EXPECT_EQ(total_balance(), 35);
  EXPECT_TRUE(a->stop().ok());
}

INSTANTIATE_TEST_SUITE_P(Versions, SubscriberTest,
                         ::testing::Values(MqttVersion::kV3_1_1, MqttVersion::kV5),
                         [](const ::testing::TestParamInfo<MqttVersion>& p) {
                           return p.param == MqttVersion::kV5 ? "mqtt5" : "mqtt311";
                         });

}  // namespace
}  // namespace mqtt_inbox::test

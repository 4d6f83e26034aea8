// The integration suite's core cases (support/core_cases.h) against a second broker:
// RabbitMQ 3.10's MQTT plugin, which speaks MQTT 3.1.1 only. One private node serves the
// whole file (a node takes 10-50 s to start), so ctest runs this binary as one test.
// Also the subscription behaviour that matters most on a 3.1.1 broker: no SUBSCRIBE on
// reconnect while the session holds the configured filters (RabbitMQ resends retained
// messages on every SUBSCRIBE of their exact topic).
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/core_cases.h"
#include "support/rabbitmq.h"

namespace mqtt_inbox::test {
namespace {

class RabbitMqTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    suite_start_ = std::chrono::steady_clock::now();
    try {
      node_ = new RabbitMq();
      std::printf("[rabbitmq] node up in %.1f s at %s\n", node_->last_start_seconds(),
                  node_->uri().c_str());
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    delete node_;
    node_ = nullptr;
    std::printf(
        "[rabbitmq] suite with its node: %.1f s\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - suite_start_).count());
  }
  void SetUp() override {
    // No silent skip: the suite installs rabbitmq-server (scripts/lib.sh).
    ASSERT_NE(node_, nullptr) << "no RabbitMQ node: " << error_;
  }

  BrokerUnderTest broker() {
    RabbitMq* n = node_;
    return {"rabbitmq",
            n->uri(),
            MqttVersion::kV3_1_1,
            [n] { n->stop(); },
            [n] {
              n->start();
              std::printf("[rabbitmq] restarted in %.1f s\n", n->last_start_seconds());
            },
            180000};
  }

  static RabbitMq* node_;
  static std::string error_;
  static std::chrono::steady_clock::time_point suite_start_;
};

RabbitMq* RabbitMqTest::node_ = nullptr;
std::string RabbitMqTest::error_;
std::chrono::steady_clock::time_point RabbitMqTest::suite_start_;

TEST_F(RabbitMqTest, ExactlyOnceUnderSigkill) {
  TempDir dir;
  core_case_exactly_once_under_sigkill(
      ChildConsumers(dir.path(), node_->uri(), "3.1.1", "rmq-crash"));
}

TEST_F(RabbitMqTest, PersistentSessionDeliversWhatArrivedWhileOffline) {
  core_case_offline_messages_are_delivered(broker(), "rmq-offline");
}

TEST_F(RabbitMqTest, BrokerRestartKeepsSessions) {
  core_case_broker_restart_keeps_sessions(broker(), "rmq-restart");
}

// Issue 27 item 4 on RabbitMQ (MQTT 3.1.1): the session expires while the consumer is
// down. RabbitMQ keeps a persistent session as a durable queue that expires after
// mqtt.subscription_ttl unused (default 1 day). That setting is node-wide, and the cases
// above keep sessions offline across a node restart (15-50 s here), so a TTL short
// enough to wait for would expire theirs; a queue policy "expires" does the same thing to
// this case's queue alone (RabbitMQ uses the lower of the two), without a second node.
TEST_F(RabbitMqTest, SessionThatExpiredWhileStoppedIsReportedAsLost) {
  node_->ctl({"set_policy", "--apply-to", "queues", "rmq-expiry-ttl",
              "^mqtt-subscription-rmq-expiry-lost", R"({"expires":2000})"});
  core_case_session_lost_while_stopped(broker(), "rmq-expiry", [](const std::string&) {
    std::this_thread::sleep_for(std::chrono::seconds(5));  // 2 s unused, and the sweep
  });
}

// probe-broker --shared on a broker without shared subscriptions (RabbitMQ 3.10's MQTT
// plugin: issue 31's broker table): its session check passes, and the shared check says
// that nothing arrives through $share/... (exit 2), not "parked" or "redistributed".
TEST_F(RabbitMqTest, ProbeBrokerSharedSaysThereAreNoSharedSubscriptions) {
  TempDir dir;
  const std::string log = dir.file("probe.log");
  Child probe(
      {built_program("mqtt-inbox"), "probe-broker", "--broker", node_->uri(), "--mqtt-version",
       "3.1.1", "--shared", "--count", "4", "--timeout-ms", "5000", "--json"},
      log);
  const int st = probe.wait(std::chrono::seconds(120));
  ASSERT_NE(st, -1) << "probe-broker did not end";
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  const std::string out = text.str();
  const nlohmann::json j =
      nlohmann::json::parse(out.substr(std::min(out.find('{'), out.size())), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["verdict"], "ok") << j.dump(2);  // sessions and queued messages are kept
  EXPECT_EQ(j["shared_subscription"]["verdict"], "unsupported") << j.dump(2);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << out;
}

}  // namespace
}  // namespace mqtt_inbox::test

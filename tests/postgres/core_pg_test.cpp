// The core cases (support/core_cases.h) on the PostgreSQL store: the same cases that run
// on SQLite against mosquitto (crash_test, subscriber_test) and RabbitMQ (rabbitmq_test),
// here against a real mosquitto on MQTT 3.1.1 and 5 with the ledger in a private
// PostgreSQL cluster (support/pg_store_under_test.h: a database per inbox, fsync on). One
// cluster and one broker per test process; the cases assert on the balances, the ledger
// entries and the claims in PostgreSQL. The SIGKILL case's child is crash_consumer with a
// postgresql:// DB.
#include <gtest/gtest.h>
#include <mqtt/async_client.h>

#include "support/core_cases.h"
#include "support/pg_store_under_test.h"

namespace mqtt_inbox::test {
namespace {

class CorePgTest : public ::testing::TestWithParam<MqttVersion> {
 protected:
  static void SetUpTestSuite() {
    pg_ = new Postgres();
    broker_ = new Broker();
  }
  static void TearDownTestSuite() {
    delete broker_;
    broker_ = nullptr;
    delete pg_;
    pg_ = nullptr;
  }

  bool mqtt5() const { return GetParam() == MqttVersion::kV5; }
  // Client ids and topics under a prefix per case and version.
  std::string prefix(const std::string& name) const {
    return "pg-" + name + (mqtt5() ? "-v5" : "-v311");
  }
  BrokerUnderTest broker() const {
    return {"mosquitto", broker_->uri(), GetParam(), [] { broker_->stop(); },
            [] { broker_->start(); }};
  }

  static Postgres* pg_;
  static Broker* broker_;
  StoreUnderTest store_ = postgres_store(*pg_);
};

Postgres* CorePgTest::pg_ = nullptr;
Broker* CorePgTest::broker_ = nullptr;

TEST_P(CorePgTest, ExactlyOnceUnderSigkill) {
  TempDir dir;
  ChildConsumers children(dir.path(), broker_->uri(), mqtt5() ? "5" : "3.1.1", prefix("crash"));
  children.use_store(store_);
  core_case_exactly_once_under_sigkill(children);
}

TEST_P(CorePgTest, PersistentSessionDeliversWhatArrivedWhileOffline) {
  core_case_offline_messages_are_delivered(broker(), prefix("offline"), store_);
}

TEST_P(CorePgTest, BrokerRestartKeepsSessions) {
  core_case_broker_restart_keeps_sessions(broker(), prefix("restart"), store_);
}

// mosquitto ends a session when a client connects with its id and a clean session (3.1.1
// clean session; MQTT 5 clean start, session expiry 0), then leaves.
TEST_P(CorePgTest, SessionLostWhileStoppedIsReportedAndTheFilterSubscribedAgain) {
  const bool v5 = mqtt5();
  core_case_session_lost_while_stopped(
      broker(), prefix("lost"),
      [&](const std::string& client_id) {
        mqtt::async_client intruder(broker_->uri(), client_id,
                                    mqtt::create_options(v5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1),
                                    nullptr);
        auto opts = mqtt::connect_options_builder()
                        .mqtt_version(v5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1)
                        .clean_session(!v5)
                        .clean_start(v5)
                        .finalize();
        const auto tok = intruder.connect(opts);
        tok->wait();
        EXPECT_FALSE(tok->get_connect_response().is_session_present());
        intruder.disconnect()->wait();
      },
      store_);
}

INSTANTIATE_TEST_SUITE_P(Mqtt, CorePgTest,
                         ::testing::Values(MqttVersion::kV3_1_1, MqttVersion::kV5),
                         [](const auto& p) {
                           return p.param == MqttVersion::kV5 ? "V5" : "V3_1_1";
                         });

}  // namespace
}  // namespace mqtt_inbox::test

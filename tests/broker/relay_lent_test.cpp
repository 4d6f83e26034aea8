// The outbox relay on a Subscriber's connection (Relay::create(outbox, subscriber, ...)),
// against a real mosquitto on 127.0.0.1 that accepts no more connections than the test
// makes itself, so a relay that opened its own would be refused: a handler's events,
// enqueued in its claim transaction, reach a downstream inbox exactly once, in per-key
// order, across a broker restart that the Subscriber reconnects from; and the relay's
// figures (PUBACKs by reason code, publish-to-PUBACK latency, time offline) in
// counters() and in its Prometheus textfile agree with what happened.
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "mqtt_inbox/relay.h"
#include "support/publisher.h"
#include "support/relay_fixture.h"

namespace mqtt_inbox::test {
namespace {

// downstream subscriber + upstream subscriber (shared with the relay) + test publisher.
class RelayLentTest : public RelayFixture {
 protected:
  RelayLentTest() : RelayFixture(three_connections()) {}

  static Broker::Config three_connections() {
    Broker::Config c = broker_config();
    c.max_connections = 3;
    return c;
  }

  // The upstream consumer: each command "n" becomes one event {"key", "n"} on
  // events/k<n % 3>, enqueued in the claim's transaction under an id derived from the
  // command's.
  void start_upstream(bool relay_first, int max_inflight = 64,
                      MqttVersion version = MqttVersion::kV5, int poll_interval_ms = 20) {
    auto handler = [this](SQLite::Database& db, const Delivery& d) {
      const int n = std::stoi(d.message.payload);
      OutgoingMessage m;
      m.topic = "events/k" + std::to_string(n % 3);
      m.payload = nlohmann::json{{"key", "k" + std::to_string(n % 3)}, {"n", n}}.dump();
      m.message_id = derived_message_id(d.message_id, "event");
      outbox_->enqueue_or_throw(db, m);
    };
    ASSERT_TRUE(Consumer::create(up_.get(), "commands", handler, {}, &up_consumer_).ok());
    SubscriberOptions so;
    so.broker_uri = broker_.uri();
    so.client_id = "gateway";
    so.mqtt_version = version;
    so.client_id_lock_dir = dir_.path();
    so.reconnect_backoff_initial_ms = 50;
    so.reconnect_backoff_max_ms = 300;
    ASSERT_TRUE(Subscriber::create(so, &up_sub_).ok());
    ASSERT_TRUE(up_sub_->subscribe("commands/#", up_consumer_.get()).ok());
    RelayOptions ro;
    ro.poll_interval_ms = poll_interval_ms;
    ro.max_inflight = max_inflight;
    ro.prometheus_textfile = dir_.file("relay.prom");
    ro.metrics_period_ms = 50;
    const Status s = Relay::create(outbox_.get(), up_sub_.get(), ro, &relay_);
    ASSERT_TRUE(s.ok()) << s.to_string();
    if (relay_first) {
      ASSERT_TRUE(relay_->start().ok());
    }
    ASSERT_TRUE(up_sub_->start().ok());
    if (!relay_first) {
      ASSERT_TRUE(relay_->start().ok());
    }
    ASSERT_TRUE(up_sub_->wait_connected(10000));
  }

  void send_commands(TestPublisher& pub, int from, int to) {
    for (int n = from; n < to; ++n)
      pub.publish("commands/c", std::to_string(n), {{"message-id", "cmd-" + std::to_string(n)}});
  }

  void TearDown() override {
    if (relay_) {
      EXPECT_TRUE(relay_->stop().ok());
    }
    relay_.reset();  // before the Subscriber it publishes on
    if (up_sub_) {
      EXPECT_TRUE(up_sub_->stop().ok());
    }
  }

  std::unique_ptr<Consumer> up_consumer_;
  std::unique_ptr<Subscriber> up_sub_;
  std::unique_ptr<Relay> relay_;
};

// One publish in flight; the next test has a full window in flight at the outage.
TEST_F(RelayLentTest, HandlerEventsArriveOnceInOrderAcrossABrokerRestart) {
  start_upstream(/*relay_first=*/true, /*max_inflight=*/1);
  {
    TestPublisher pub(broker_.uri());
    send_commands(pub, 0, 200);
    expect_delivered_once(200);
  }
  const RelayCounters before = relay_->counters();
  EXPECT_EQ(before.connects, 1);
  EXPECT_TRUE(before.connected);
  EXPECT_EQ(before.acks_by_reason.at(0x00), 200);  // mosquitto: a subscriber matched each
  EXPECT_EQ(before.puback_latency_count, 200);
  EXPECT_EQ(before.puback_latency_samples, 200);
  EXPECT_GT(before.puback_latency_p50_ms, 0);
  EXPECT_LE(before.puback_latency_p50_ms, before.puback_latency_p99_ms);
  EXPECT_GT(before.receive_maximum, 0);

  // Rows committed while the broker is away wait in the outbox; the Subscriber
  // reconnects, and the relay publishes them on its new connection.
  broker_.stop();
  EXPECT_TRUE(wait_until([&] { return !relay_->is_connected(); }, std::chrono::seconds(10)));
  enqueue_events(200, 260, 3);  // store-and-forward rows, not from a handler
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(up_count("state = 'pending'"), 60);  // nothing to publish on: they wait
  broker_.start();
  ASSERT_TRUE(up_sub_->wait_connected(20000));
  {
    TestPublisher pub(broker_.uri());
    send_commands(pub, 260, 300);
    expect_delivered_once(300);
  }
  const RelayCounters after = relay_->counters();
  // One connection, the subscriber's: the relay published on each of its connections
  // (the broker admits no fourth), and counted the outage.
  EXPECT_GE(after.connects, 2);
  EXPECT_LE(after.connects, up_sub_->connects());
  EXPECT_GE(after.offline_ms, 300);  // at least the 300 ms the test waited, broker down
  EXPECT_GE(after.acks_by_reason.at(0x00), 300);
  EXPECT_EQ(query_int(up_path_,
                      "SELECT count(*) FROM inbox_processed WHERE consumer_name = "
                      "'commands'"),
            240);
}

// A full window (64) in flight when the broker goes away mid-stream: what the relay
// publishes again after the next CONNACK reaches the broker in per-key order, each event
// is applied once downstream, and the subscriber gets back on line. It found the fault
// the subscriber's new Paho client at each reconnect fixes (mqtt/subscriber.cpp,
// renew_client()): a reused client resent its in-flight publishes, in about one run in
// seven under CPU load one of them malformed, and mosquitto closed every reconnect.
TEST_F(RelayLentTest, WindowInFlightAcrossAnOutageKeepsPerKeyOrder) {
  start_upstream(/*relay_first=*/true, /*max_inflight=*/64);
  enqueue_events(0, 4000, 3);  // store-and-forward rows: the relay publishes at full speed
  ASSERT_TRUE(
      wait_until([&] { return up_count("state = 'sent'") >= 300; }, std::chrono::seconds(30)));
  broker_.stop();  // mid-stream: publishes in flight, rows still pending
  EXPECT_TRUE(wait_until([&] { return !relay_->is_connected(); }, std::chrono::seconds(10)));
  ASSERT_GT(up_count("state = 'pending'"), 0) << "the relay was done before the outage";
  broker_.start();
  EXPECT_TRUE(up_sub_->wait_connected(20000));
  expect_delivered_once(4000);
  EXPECT_GE(relay_->counters().connects, 2);
  std::stringstream broker_log;
  broker_log << std::ifstream(broker_.log_path()).rdbuf();
  EXPECT_EQ(broker_log.str().find("malformed"), std::string::npos);
  if (HasFailure()) std::cerr << "---- mosquitto log\n" << broker_log.str();
}

TEST_F(RelayLentTest, PrometheusTextfileCarriesTheRelaysFigures) {
  start_upstream(/*relay_first=*/false);  // the subscriber was up before the relay attached
  {
    TestPublisher pub(broker_.uri());
    send_commands(pub, 0, 50);
    expect_delivered_once(50);
  }
  const std::string path = dir_.file("relay.prom");
  std::string text;
  ASSERT_TRUE(wait_until(
      [&] {
        std::ifstream f(path);
        std::stringstream ss;
        ss << f.rdbuf();
        text = ss.str();
        return text.find("mqtt_inbox_relay_pubacks_total{reason_code=\"0x00\"} 50\n") !=
               std::string::npos;
      },
      std::chrono::seconds(10)))
      << text;
  for (const char* line : {"mqtt_inbox_relay_connected 1\n", "mqtt_inbox_relay_connects_total 1\n",
                           "mqtt_inbox_relay_puback_latency_seconds_count 50\n",
                           "mqtt_inbox_relay_dead_lettered_total{reason=\"expired\"} 0\n",
                           "# TYPE mqtt_inbox_relay_puback_latency_seconds summary\n",
                           "mqtt_inbox_relay_puback_latency_seconds{quantile=\"0.99\"} "})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nin\n" << text;
  EXPECT_EQ(prometheus_text(relay_->counters()).find("mqtt_inbox_relay_published_total 50\n") !=
                std::string::npos,
            true);
}

// Issue 27 on the subscriber's connection, on both MQTT versions: a broker restart
// (persistence on) with a full window in flight and unread. The failed tokens (the
// subscriber destroys its client before it reconnects: MQTT 3.1.1 reports reason code 255
// for each) are published again, never dead letters.
class RelayLentVersionTest : public RelayLentTest,
                             public ::testing::WithParamInterface<MqttVersion> {};

TEST_P(RelayLentVersionTest, BrokerRestartWithAFullWindowInFlightLosesNothing) {
  start_upstream(/*relay_first=*/true, /*max_inflight=*/16, GetParam());
  enqueue_events(0, 100, 4);
  expect_delivered_once(100);
  broker_.pause();
  enqueue_events(100, 400, 4);
  ASSERT_TRUE(wait_until([&] { return relay_->counters().max_inflight_seen >= 16; },
                         std::chrono::seconds(20)));
  const int64_t published_before = relay_->counters().published;
  broker_.stop();  // SIGTERM before SIGCONT: it exits without reading the window
  EXPECT_TRUE(wait_until([&] { return !relay_->is_connected(); }, std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(up_count("state = 'dead'"), 0);
  broker_.start();
  ASSERT_TRUE(up_sub_->wait_connected(20000));
  expect_delivered_once(400);
  EXPECT_EQ(up_count("state = 'dead'"), 0);
  const RelayCounters c = relay_->counters();
  EXPECT_EQ(c.rejected, 0);
  EXPECT_GE(c.connects, 2);
  EXPECT_GE(c.published, published_before + 16) << "published " << c.published;
}

// MQTT 3.1.1 on the subscriber's connection, no limit stated: the oversized event ends the
// subscriber's connection each time; it alone becomes a dead letter connection_dropped,
// the 40 small ones arrive, and the subscriber is back on line.
TEST_P(RelayLentVersionTest, OversizedRowIsDeadLetteredAloneAndTheRestArrive) {
  start_upstream(/*relay_first=*/true, /*max_inflight=*/8, GetParam());
  up_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    for (int n = 0; n < 41; ++n) {
      const std::string key = "k" + std::to_string(n % 3);
      const bool big = n == 20;
      const OutgoingMessage m =
          event(big ? 1000 : n, key, "events/" + key, big ? kMaxPacket + 100 : 0);
      ASSERT_TRUE(outbox_->enqueue(db, m).ok());
    }
    db.exec("COMMIT");
  });
  expect_delivered_once(40);
  const bool v5 = GetParam() == MqttVersion::kV5;
  // MQTT 5: refused before it is sent (the broker announced its limit); 3.1.1: found by
  // the connections it ended.
  EXPECT_EQ(up_count("message_id = 'evt-1000' AND state = 'dead' AND dead_reason = '" +
                     std::string(v5 ? "payload_too_large" : "connection_dropped") + "'"),
            1);
  EXPECT_EQ(up_count("state = 'dead'"), 1);
  EXPECT_EQ(relay_->counters().connection_dropped, v5 ? 0 : 1);
  EXPECT_TRUE(up_sub_->wait_connected(20000));
}

INSTANTIATE_TEST_SUITE_P(Versions, RelayLentVersionTest,
                         ::testing::Values(MqttVersion::kV3_1_1, MqttVersion::kV5),
                         [](const ::testing::TestParamInfo<MqttVersion>& i) {
                           return i.param == MqttVersion::kV5 ? std::string("Mqtt5")
                                                              : std::string("Mqtt311");
                         });

// A handler's claim transaction that enqueued wakes the relay at its commit: with a poll of
// a minute, its events still arrive within a second.
TEST_F(RelayLentTest, AHandlersCommitWakesTheRelay) {
  start_upstream(/*relay_first=*/true, /*max_inflight=*/64, MqttVersion::kV5,
                 /*poll_interval_ms=*/60000);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // asleep in its poll
  TestPublisher pub(broker_.uri());
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    send_commands(pub, round * 10, round * 10 + 10);
    EXPECT_TRUE(wait_until([&] { return received() >= round * 10 + 10; }, std::chrono::seconds(1)))
        << "round " << round << ": received " << received();
    EXPECT_LT(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count(),
        1000)
        << "round " << round;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  expect_delivered_once(30);
}

TEST_F(RelayLentTest, RefusesConnectionSettingsAndASecondRelay) {
  start_upstream(/*relay_first=*/true);
  std::unique_ptr<Relay> r;
  RelayOptions o;
  o.broker_uri = broker_.uri();  // the subscriber's, not the relay's
  EXPECT_EQ(Relay::create(outbox_.get(), up_sub_.get(), o, &r).code(),
            Status::Code::kInvalidArgument);
  o = RelayOptions{};
  o.client_id = "relay";
  EXPECT_EQ(Relay::create(outbox_.get(), up_sub_.get(), o, &r).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(Relay::create(outbox_.get(), nullptr, RelayOptions{}, &r).code(),
            Status::Code::kInvalidArgument);
  ASSERT_TRUE(Relay::create(outbox_.get(), up_sub_.get(), RelayOptions{}, &r).ok());
  EXPECT_EQ(r->start().code(), Status::Code::kInvalidArgument);  // relay_ has the connection
}

}  // namespace
}  // namespace mqtt_inbox::test

// The outbox relay connects as the subscriber does (relay.h, src/mqtt/connect.h):
// against the real mosquitto of the TLS fixture (support/tls_fixture.h), TLS with chain
// and host name verified, a user name with a password file read again before every
// CONNECT, the refusals named, and examples/ledger_consumer --emit-topic with the
// subscriber's connection flags. Assertions read the outbox table (rows marked sent) and a
// downstream inbox fed by a subscriber of the topic (events applied once each).
//
// Every test ends by checking that no password reached any log (the fixture's TearDown).
#include <mqtt_inbox/outbox.h>
#include <mqtt_inbox/relay.h>

#include <nlohmann/json.hpp>

#include "support/tls_fixture.h"

namespace mqtt_inbox::test {
namespace {

class RelayTlsTest : public TlsTest {
 protected:
  void SetUp() override {
    TlsTest::SetUp();
    up_path_ = dir_.file("up.db");
    down_path_ = dir_.file("down.db");
  }

  void TearDown() override {
    if (relay_) {
      EXPECT_TRUE(relay_->stop().ok());
    }
    if (down_sub_) {
      EXPECT_TRUE(down_sub_->stop().ok());
    }
    TlsTest::TearDown();
  }

  // Downstream: a subscriber of events/# on the broker's anonymous plaintext listener,
  // applying each event once into down.db's table `events`.
  void start_downstream() {
    down_ = open_ledger_inbox(down_path_);
    ASSERT_TRUE(down_);
    down_->with_connection([](SQLite::Database& db) {
      db.exec("CREATE TABLE events (message_id TEXT NOT NULL, payload TEXT NOT NULL)");
    });
    auto apply = [](SQLite::Database& db, const Delivery& d) {
      SQLite::Statement ins(db, "INSERT INTO events (message_id, payload) VALUES (?, ?)");
      ins.bind(1, d.message_id);
      ins.bind(2, d.message.payload);
      ins.exec();
    };
    ASSERT_TRUE(Consumer::create(down_.get(), "events", apply, {}, &down_consumer_).ok());
    SubscriberOptions so;
    so.broker_uri = broker_.uri();
    so.client_id = "relay-tls-downstream";
    so.client_id_lock_dir = dir_.path();
    so.mqtt_version = MqttVersion::kV5;
    so.reconnect_backoff_initial_ms = 50;
    so.reconnect_backoff_max_ms = 300;
    ASSERT_TRUE(Subscriber::create(so, &down_sub_).ok());
    ASSERT_TRUE(down_sub_->subscribe("events/#", down_consumer_.get()).ok());
    ASSERT_TRUE(down_sub_->start().ok());
    ASSERT_TRUE(down_sub_->wait_connected(10000));
  }

  // Upstream: an outbox on up.db holding `n` events, e-0 .. e-(n-1).
  void enqueue(int n) {
    if (!up_) {
      up_ = open_ledger_inbox(up_path_);
      ASSERT_TRUE(up_);
      ASSERT_TRUE(Outbox::create(up_.get(), {}, &outbox_).ok());
    }
    up_->with_connection([&](SQLite::Database& db) {
      db.exec("BEGIN IMMEDIATE");
      for (int i = 0; i < n; ++i) {
        OutgoingMessage m;
        m.topic = "events/tls";
        m.message_id = "e-" + std::to_string(i);
        m.payload = nlohmann::json{{"n", i}}.dump();
        ASSERT_TRUE(outbox_->enqueue(db, m).ok());
      }
      db.exec("COMMIT");
    });
  }

  RelayOptions relay_options(const std::string& broker_uri) {
    RelayOptions o;
    o.broker_uri = broker_uri;
    o.client_id = "relay-tls";
    o.client_id_lock_dir = dir_.path();
    o.tls.ca_file = pki_->ca_cert();
    o.poll_interval_ms = 20;
    o.connect_timeout_ms = 5000;
    o.reconnect_backoff_initial_ms = 50;
    o.reconnect_backoff_max_ms = 400;
    o.logger = log_;
    return o;
  }

  void start_relay(const RelayOptions& o) {
    const Status s = Relay::create(outbox_.get(), o, &relay_);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_TRUE(relay_->start().ok());
  }

  int64_t up(const std::string& where) {
    return query_int(up_path_, "SELECT count(*) FROM outbox_messages WHERE " + where);
  }
  int64_t received() { return query_int(down_path_, "SELECT count(*) FROM events"); }

  // Every one of `n` rows marked sent upstream, and applied once downstream under its id.
  void expect_delivered(int n) {
    EXPECT_TRUE(wait_until([&] { return up("state = 'sent'") == n && received() == n; },
                           std::chrono::seconds(30)))
        << "sent " << up("state = 'sent'") << ", received " << received() << "\n"
        << read_file(log_path());
    EXPECT_EQ(up("state = 'pending'"), 0);
    EXPECT_EQ(query_int(down_path_, "SELECT count(DISTINCT message_id) FROM events"), n);
    EXPECT_EQ(query_int(down_path_, "SELECT count(*) FROM events WHERE message_id LIKE 'e-%'"), n);
  }

  std::string up_path_, down_path_;
  std::unique_ptr<Inbox> up_, down_;
  std::unique_ptr<Outbox> outbox_;
  std::unique_ptr<Consumer> down_consumer_;
  std::unique_ptr<Subscriber> down_sub_;
  std::unique_ptr<Relay> relay_;
};

// TLS with the chain and the host name verified, and a password file: a wrong password is
// refused by name (CONNACK "not authorized"), nothing is sent; once the file holds the
// right one the next CONNECT reads it, and every row is published and marked sent.
TEST_F(RelayTlsTest, PublishesOverVerifiedTlsWithAPasswordFileReadBeforeEachConnect) {
  start_downstream();
  enqueue(40);
  const std::string password_file = dir_.file("relay.password");
  write_file(password_file, "wrong-Pa55-for-relay\n");
  RelayOptions o = relay_options(uri(kTlsPassword));
  o.username = "alice";
  o.password_provider = password_from_file(password_file);
  start_relay(o);
  ASSERT_TRUE(wait_until(
      [&] { return relay_->health().last_failure == ConnectionHealth::Failure::kRefused; },
      std::chrono::seconds(20)))
      << relay_->health().last_error;
  ConnectionHealth h = relay_->health();
  EXPECT_EQ(h.connack_code, 0x87);
  EXPECT_NE(h.connack_reason.find("not authorized"), std::string::npos) << h.connack_reason;
  EXPECT_FALSE(relay_->is_connected());
  EXPECT_EQ(relay_->counters().published, 0);
  EXPECT_EQ(up("state = 'pending'"), 40);

  write_file(password_file, std::string(kPassword) + "\n");
  expect_delivered(40);
  h = relay_->health();
  EXPECT_TRUE(h.connected);
  EXPECT_GE(h.connects, 1);
  EXPECT_GE(h.connect_attempts, 2);
  const std::string log = read_file(log_path());
  EXPECT_NE(log.find("host name checked"), std::string::npos) << log;
  EXPECT_NE(log.find("not authorized"), std::string::npos) << log;
  EXPECT_NE(log.find("outbox relay: connected to " + uri(kTlsPassword)), std::string::npos) << log;
  EXPECT_NE(read_file(broker_.log_path()).find("u'alice'"), std::string::npos);
  EXPECT_EQ(log.find("wrong-Pa55-for-relay"), std::string::npos)
      << "a wrong password is a secret too";
  EXPECT_EQ(h.last_error.find("wrong-Pa55-for-relay"), std::string::npos);
}

// A broker whose certificate names another host: refused with the reason (host name
// mismatch) in health() and the log, nothing published, nothing marked sent.
TEST_F(RelayTlsTest, WrongHostNameIsRefusedAndNothingIsMarkedSent) {
  enqueue(10);
  start_relay(relay_options(uri(kOtherName)));
  ASSERT_TRUE(wait_until([&] { return relay_->health().consecutive_failures >= 2; },
                         std::chrono::seconds(30)))
      << relay_->health().last_error;
  const ConnectionHealth h = relay_->health();
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kTls) << h.last_error;
  EXPECT_NE(h.last_error.find("hostname mismatch"), std::string::npos) << h.last_error;
  EXPECT_NE(h.last_error.find("DNS:broker.invalid"), std::string::npos) << h.last_error;
  EXPECT_EQ(h.connects, 0);
  EXPECT_FALSE(relay_->is_connected());
  EXPECT_EQ(relay_->counters().published, 0);
  EXPECT_EQ(relay_->counters().connects, 0);
  EXPECT_EQ(up("state = 'pending'"), 10);
  EXPECT_EQ(up("state <> 'pending'"), 0);
  EXPECT_NE(read_file(log_path()).find("hostname mismatch"), std::string::npos);
}

// The relay's settings are checked as the subscriber's are, by the same code.
TEST_F(RelayTlsTest, CreateRefusesWhatTheSubscriberRefuses) {
  enqueue(1);
  std::unique_ptr<Relay> r;
  RelayOptions o = relay_options(uri(kTlsPassword));
  o.tls.ca_file = dir_.file("no-such-ca.crt");
  Status s = Relay::create(outbox_.get(), o, &r);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("no-such-ca.crt"), std::string::npos) << s.to_string();
  o = relay_options(broker_.uri());  // TLS settings with a plaintext URI
  s = Relay::create(outbox_.get(), o, &r);
  EXPECT_NE(s.message().find("plaintext"), std::string::npos) << s.to_string();
  o = relay_options(uri(kTlsPassword));
  o.username = "alice";
  o.password = kPassword;
  o.password_provider = password_from_file(pki_->path("alice.password"));
  s = Relay::create(outbox_.get(), o, &r);
  EXPECT_NE(s.message().find("both password and password_provider"), std::string::npos);
  EXPECT_EQ(s.message().find(kPassword), std::string::npos);
  o = relay_options(uri(kTlsPassword));
  o.mqtt_version = MqttVersion::kV3_1_1;
  o.password = kPassword;  // no user name on MQTT 3.1.1
  s = Relay::create(outbox_.get(), o, &r);
  EXPECT_NE(s.message().find("3.1.2.9"), std::string::npos) << s.to_string();
  EXPECT_FALSE(r);
}

// Two relays with one client id on this host: the second start() is refused (kBusy), the
// first keeps its connection.
TEST_F(RelayTlsTest, ClientIdLockRefusesASecondRelayWithTheSameId) {
  enqueue(1);
  RelayOptions o = relay_options(broker_.uri());
  o.tls = {};
  start_relay(o);
  std::unique_ptr<Relay> second;
  ASSERT_TRUE(Relay::create(outbox_.get(), o, &second).ok());
  EXPECT_EQ(second->start().code(), Status::Code::kBusy);
  ASSERT_TRUE(relay_->stop().ok());
  EXPECT_TRUE(second->start().ok());  // released by the clean stop
  EXPECT_TRUE(second->stop().ok());
}

// ledger_consumer --emit-topic over TLS with --password-file: the relay takes the same
// connection flags as the subscriber (it used to copy an empty password and retry
// forever). Each credit's event is published, marked sent and applied downstream once.
TEST_F(RelayTlsTest, LedgerConsumerEmitsOverTlsWithPasswordFile) {
  start_downstream();
  auto consumer =
      ledger_consumer({"--broker", uri(kTlsPassword), "--cafile", pki_->ca_cert(), "--username",
                       "alice", "--password-file", pki_->path("alice.password"), "--mqtt-version",
                       "5", "--emit-topic", "events/credited"});
  ASSERT_TRUE(
      wait_until([&] { return read_file(child_log()).find("consuming: ") != std::string::npos; },
                 std::chrono::seconds(20)))
      << read_file(child_log());
  publish_credits(0, 30);
  EXPECT_TRUE(wait_until(
      [&] {
        return received() == 30 &&
               query_int(db_path_, "SELECT count(*) FROM outbox_messages WHERE state = 'sent'") ==
                   30;
      },
      std::chrono::seconds(30)))
      << "received " << received() << "\n"
      << read_file(child_log());
  consumer->signal(SIGTERM);
  EXPECT_EQ(consumer->wait(std::chrono::seconds(20)), 0);
  EXPECT_EQ(ledger_rows(), 30);
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM outbox_messages"), 30);
  EXPECT_EQ(received(), 30);
  EXPECT_EQ(
      query_int(down_path_, "SELECT count(*) FROM events WHERE message_id LIKE 't-%/credited'"),
      30);
  const std::string log = read_file(child_log());
  EXPECT_NE(log.find("outbox relay: connected to " + uri(kTlsPassword)), std::string::npos) << log;
  EXPECT_EQ(log.find("connect to " + uri(kTlsPassword) + " failed"), std::string::npos) << log;
}

}  // namespace
}  // namespace mqtt_inbox::test

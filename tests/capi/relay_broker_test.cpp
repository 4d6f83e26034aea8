// The C API's relay against a real mosquitto, MQTT 3.1.1 and 5: rows enqueued from C and
// published by a relay made from C (relay_child.c, compiled as C) on a connection of its
// own or on a subscriber's (mqtt_inbox_relay_create_on), with max_packet_size and the TLS
// connection fields of c.h. A downstream inbox applies what arrives; the test asserts on
// its rows, on the upstream outbox's rows and on the broker's log. GoogleTest only runs
// the child and reads the files; the code under test is C.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <regex>
#include <thread>

#include "support/relay_fixture.h"  // apply_event
#include "support/tls_pki.h"

namespace mqtt_inbox::test {
namespace {

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class CRelayTest : public ::testing::TestWithParam<const char*> {
 protected:
  static void SetUpTestSuite() { pki_ = new TestPki(); }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  // The main listener, plaintext; listener 0: TLS with a certificate for broker.invalid
  // only, so a client that checks the host name "localhost" refuses it.
  static Broker::Config config() {
    Broker::Config c;
    c.max_packet_size = 0;
    return c;
  }
  static std::vector<std::string> listeners() {
    return {"cafile " + pki_->ca_cert() + "\ncertfile " + pki_->other_name_cert() + "\nkeyfile " +
            pki_->other_name_key() + "\nallow_anonymous true\n"};
  }

  CRelayTest() : broker_(config(), listeners()) {}

  void SetUp() override {
    down_path_ = dir_.file("down.db");
    down_ = open_ledger_inbox(down_path_);
    ASSERT_TRUE(down_);
    down_->with_connection([](SQLite::Database& db) {
      db.exec(
          "CREATE TABLE received (rid INTEGER PRIMARY KEY, message_id TEXT NOT NULL, "
          "key TEXT NOT NULL, n INTEGER NOT NULL)");
    });
    ASSERT_TRUE(Consumer::create(down_.get(), "events", apply_event, {}, &consumer_).ok());
    SubscriberOptions so;
    so.broker_uri = broker_.uri();
    so.client_id = "downstream";
    so.client_id_lock_dir = "";
    so.mqtt_version = MqttVersion::kV5;
    so.reconnect_backoff_initial_ms = 50;
    so.reconnect_backoff_max_ms = 300;
    ASSERT_TRUE(Subscriber::create(so, &sub_).ok());
    ASSERT_TRUE(sub_->subscribe("events/#", consumer_.get()).ok());
    ASSERT_TRUE(sub_->start().ok());
    ASSERT_TRUE(sub_->wait_connected(10000));
  }
  void TearDown() override {
    if (sub_) {
      EXPECT_TRUE(sub_->stop().ok());
    }
  }

  std::string up() const { return dir_.file("up-" + std::to_string(runs_) + ".db"); }
  std::string log() const { return dir_.file("child-" + std::to_string(runs_) + ".log"); }
  std::string tls_uri() const {
    return "ssl://localhost:" + std::to_string(broker_.listener_port(0));
  }

  // Starts relay_child on a fresh upstream file and waits for "relaying".
  std::unique_ptr<Child> start(const std::string& uri, std::vector<std::string> extra) {
    ++runs_;
    std::vector<std::string> argv = {built_program("capi_relay_child"), uri, up(), GetParam()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto child = std::make_unique<Child>(with_emulator(argv), log());
    EXPECT_TRUE(wait_until([&] { return count_of(read_file(log()), "relaying") == 1; },
                           std::chrono::seconds(15)))
        << read_file(log());
    return child;
  }
  // SIGTERM; the child must exit 0 after a clean stop. Returns its counters' line.
  std::string stop(Child& child) {
    child.signal(SIGTERM);
    const int st = child.wait(std::chrono::seconds(20));
    const std::string text = read_file(log());
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << text;
    std::smatch m;
    return std::regex_search(text, m, std::regex("counters: (.*)")) ? m[1].str() : "";
  }
  int64_t down(const std::string& sql) const { return query_int(down_path_, sql); }
  int64_t upq(const std::string& sql) const { return query_int(up(), sql); }

  // 10 rows and one of 4000 bytes between them, with max_packet_size 2048: the ten arrive
  // once, in order, under their ids; the big one is an outbox dead letter, never sent.
  void expect_big_row_dead_and_the_rest_delivered(Child& child) {
    ASSERT_TRUE(wait_until([&] { return down("SELECT count(*) FROM received") >= 10; },
                           std::chrono::seconds(20)))
        << read_file(log());
    EXPECT_TRUE(wait_until(
        [&] { return upq("SELECT count(*) FROM outbox_messages WHERE state = 'sent'") == 10; },
        std::chrono::seconds(10)));
    const std::string counters = stop(child);
    EXPECT_NE(counters.find("\"too_large\":1"), std::string::npos) << counters;
    EXPECT_EQ(down("SELECT count(*) FROM received"), 10);
    EXPECT_EQ(down("SELECT count(DISTINCT message_id) FROM received WHERE message_id LIKE 'r-%'"),
              10);
    EXPECT_EQ(down("SELECT count(*) FROM received WHERE message_id = 'big-1'"), 0);
    // Per-key order: n rises with rid.
    EXPECT_EQ(down("SELECT count(*) FROM received a JOIN received b ON b.rid = a.rid + 1"
                   " WHERE b.n <= a.n"),
              0);
    EXPECT_EQ(upq("SELECT count(*) FROM outbox_messages WHERE message_id = 'big-1'"
                  " AND state = 'dead' AND dead_reason = 'payload_too_large'"),
              1);
  }

  static TestPki* pki_;
  TempDir dir_;
  Broker broker_;
  std::string down_path_;
  std::unique_ptr<Inbox> down_;
  std::unique_ptr<Consumer> consumer_;
  std::unique_ptr<Subscriber> sub_;
  int runs_ = 0;
};

TestPki* CRelayTest::pki_ = nullptr;

// max_packet_size from C reaches the relay on its own connection. On MQTT 3.1.1 mosquitto
// announces no limit, so the relay's own is the only thing that keeps the big row from
// closing the connection.
TEST_P(CRelayTest, AnOwnRelayMakesARowOverMaxPacketSizeADeadLetterAndSendsTheRest) {
  auto child = start(broker_.uri(), {"--big", "4000", "--max-packet-size", "2048"});
  expect_big_row_dead_and_the_rest_delivered(*child);
  // mosquitto announces no Maximum Packet Size here: the limit was the relay's own.
  EXPECT_NE(read_file(log()).find("\"maximum_packet_size\":0"), std::string::npos);
  EXPECT_GE(count_of(read_file(broker_.log_path()), " as c-relay"), 1u);
}

// mqtt_inbox_relay_create_on: the rows go out on the subscriber's connection (the broker
// sees one client of the child, c-lent, and no relay client), with the publishing options
// (max_packet_size) the C struct gave.
TEST_P(CRelayTest, ALentRelayPublishesOnTheSubscribersConnection) {
  auto child = start(broker_.uri(), {"--lent", "--big", "4000", "--max-packet-size", "2048"});
  expect_big_row_dead_and_the_rest_delivered(*child);
  const std::string broker_log = read_file(broker_.log_path());
  EXPECT_GE(count_of(broker_log, " as c-lent"), 1u) << broker_log;
  EXPECT_EQ(count_of(broker_log, "New client connected"),
            count_of(broker_log, " as c-lent") + count_of(broker_log, " as downstream"))
      << broker_log;
  if (std::string(GetParam()) == "3.1.1") {
    EXPECT_NE(read_file(log()).find("MQTT 3.1.1 subscriber's connection"), std::string::npos);
  }
}

// The broker's certificate names broker.invalid, not localhost. Verified by default: the
// relay does not connect and nothing is sent. tls_insecure_skip_hostname_check: it
// connects, and says INSECURE in the log. tls_insecure_skip_certificate_check, with a CA
// that signed nothing of the broker's: it connects too, and says so louder. On a relay's
// own connection and on a lent one.
TEST_P(CRelayTest, TlsVerifiesByDefaultAndTheInsecureSwitchesConnectLoudly) {
  for (const bool lent : {false, true}) {
    SCOPED_TRACE(lent ? "lent" : "own connection");
    const std::vector<std::string> base = lent ? std::vector<std::string>{"--lent", "--rows", "10"}
                                               : std::vector<std::string>{"--rows", "10"};
    {
      auto args = base;
      args.insert(args.end(), {"--tls-ca", pki_->ca_cert()});
      auto child = start(tls_uri(), args);
      std::this_thread::sleep_for(std::chrono::seconds(3));
      stop(*child);
      EXPECT_EQ(upq("SELECT count(*) FROM outbox_messages WHERE state = 'pending'"), 10);
      EXPECT_EQ(read_file(log()).find("INSECURE"), std::string::npos) << read_file(log());
    }
    {
      auto args = base;
      args.insert(args.end(), {"--tls-ca", pki_->ca_cert(), "--insecure-hostname"});
      auto child = start(tls_uri(), args);
      EXPECT_TRUE(wait_until(
          [&] { return upq("SELECT count(*) FROM outbox_messages WHERE state = 'sent'") == 10; },
          std::chrono::seconds(20)))
          << read_file(log());
      stop(*child);
      EXPECT_NE(read_file(log()).find("INSECURE: the host name of localhost"), std::string::npos)
          << read_file(log());
    }
    {
      auto args = base;
      args.insert(args.end(), {"--tls-ca", pki_->untrusted_ca_cert(), "--insecure-certificate"});
      auto child = start(tls_uri(), args);
      EXPECT_TRUE(wait_until(
          [&] { return upq("SELECT count(*) FROM outbox_messages WHERE state = 'sent'") == 10; },
          std::chrono::seconds(20)))
          << read_file(log());
      stop(*child);
      EXPECT_NE(read_file(log()).find("INSECURE: the certificate of localhost"), std::string::npos)
          << read_file(log());
    }
    // Each run enqueued r-0..r-9 again, in a file of its own: the downstream inbox applied
    // them once (the same ids), whichever run delivered them.
    EXPECT_EQ(down("SELECT count(*) FROM received"), 10);
  }
}

// Backpressure end to end: a class bounded to 3 pending rows and 12 messages fed before
// the relay starts. The handler passes MQTT_INBOX_OUTBOX_FULL on as
// MQTT_INBOX_HANDLER_OUTBOX_FULL: 3 are processed and 9 parked as outbox_full with no
// attempt counted; once the relay has made room, the consumer's requeue thread replays
// them, and every event arrives downstream once.
TEST_P(CRelayTest, MessagesParkedByAFullClassAreReplayedOnceTheRelayMakesRoom) {
  auto child = start(broker_.uri(), {"--feed", "12", "--class-max-rows", "3"});
  EXPECT_NE(read_file(log()).find("fed 3 processed, 9 parked"), std::string::npos)
      << read_file(log());
  ASSERT_TRUE(wait_until([&] { return down("SELECT count(*) FROM received") >= 12; },
                         std::chrono::seconds(30)))
      << read_file(log());
  EXPECT_TRUE(wait_until(
      [&] { return upq("SELECT count(*) FROM outbox_messages WHERE state = 'sent'") == 12; },
      std::chrono::seconds(10)));
  stop(*child);
  EXPECT_EQ(down("SELECT count(*) FROM received"), 12);
  EXPECT_EQ(down("SELECT count(DISTINCT message_id) FROM received WHERE message_id LIKE 'f-%'"),
            12);
  EXPECT_EQ(upq("SELECT count(*) FROM inbox_processed"), 12);
  EXPECT_GE(upq("SELECT count(DISTINCT message_id) FROM inbox_dead_letters"
                " WHERE reason = 'outbox_full'"),
            9);
  EXPECT_EQ(upq("SELECT count(*) FROM inbox_dead_letters WHERE status <> 'replayed'"), 0);
  EXPECT_EQ(upq("SELECT count(*) FROM inbox_dead_letters WHERE attempts <> 0"), 0);
}

INSTANTIATE_TEST_SUITE_P(Mqtt, CRelayTest, ::testing::Values("3.1.1", "5"), [](const auto& p) {
  return std::string(p.param) == "5" ? "V5" : "V3_1_1";
});

}  // namespace
}  // namespace mqtt_inbox::test

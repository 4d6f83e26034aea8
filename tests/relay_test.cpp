// The outbox relay against a real mosquitto on 127.0.0.1: a stream of enqueued rows
// arrives downstream exactly once into a second inbox, in per-key order, through a broker
// outage; a publish the broker refuses (MQTT 5 PUBACK >= 0x80) becomes an outbox dead
// letter while the stream goes on. Assertions read both SQLite files.
#include "mqtt_inbox/relay.h"

#include <sys/wait.h>

#include <csignal>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

// Downstream: applies each event once into `received` (one row per applied event): the
// relay tests' {"key", "n"} events, or ledger_consumer's credited events as (account,
// balance), checked to carry the id derived from their source credit.
void apply_event(SQLite::Database& db, const Delivery& d) {
  const auto j = nlohmann::json::parse(d.message.payload, nullptr, false);
  const bool credited = j.is_object() && j.contains("account") && j.contains("balance") &&
                        j.value("source_message_id", "") + "/credited" == d.message_id;
  if (!credited && (!j.is_object() || !j.contains("key") || !j.contains("n")))
    throw UndecodablePayload("not an event");
  SQLite::Statement ins(db, "INSERT INTO received (message_id, key, n) VALUES (?, ?, ?)");
  ins.bind(1, d.message_id);
  ins.bind(2, j[credited ? "account" : "key"].get<std::string>());
  ins.bind(3, j[credited ? "balance" : "n"].get<int64_t>());
  ins.exec();
}

class RelayTest : public ::testing::Test {
 protected:
  void SetUp() override { start_downstream(broker_.uri()); }

  void start_downstream(const std::string& uri) {
    down_path_ = dir_.file("down.db");
    up_path_ = dir_.file("up.db");
    InboxOptions shared;
    shared.exclusive = false;  // the crash cases relay from a child process
    up_ = open_ledger_inbox(up_path_, shared);
    ASSERT_TRUE(up_);
    ASSERT_TRUE(Outbox::create(up_.get(), {}, &outbox_).ok());
    down_ = open_ledger_inbox(down_path_);
    ASSERT_TRUE(down_);
    down_->with_connection([](SQLite::Database& db) {
      db.exec(
          "CREATE TABLE received (rid INTEGER PRIMARY KEY, message_id TEXT NOT NULL, "
          "key TEXT NOT NULL, n INTEGER NOT NULL)");
    });
    ASSERT_TRUE(Consumer::create(down_.get(), "events", apply_event, {}, &consumer_).ok());
    SubscriberOptions so;
    so.broker_uri = uri;
    so.client_id = "downstream";
    so.client_id_lock_dir = dir_.path();
    so.mqtt_version = MqttVersion::kV5;
    so.reconnect_backoff_initial_ms = 50;
    so.reconnect_backoff_max_ms = 300;
    ASSERT_TRUE(Subscriber::create(so, &sub_).ok());
    ASSERT_TRUE(sub_->subscribe("events/#", consumer_.get()).ok());
    ASSERT_TRUE(sub_->start().ok());
    ASSERT_TRUE(sub_->wait_connected(10000));
  }

  std::unique_ptr<Relay> make_relay(const std::string& uri, int max_inflight = 64) {
    RelayOptions o;
    o.broker_uri = uri;
    o.client_id = "relay";
    o.client_id_lock_dir = dir_.path();
    o.max_inflight = max_inflight;
    o.poll_interval_ms = 20;
    o.reconnect_backoff_initial_ms = 50;
    o.reconnect_backoff_max_ms = 300;
    std::unique_ptr<Relay> r;
    const Status s = Relay::create(outbox_.get(), o, &r);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return r;
  }

  // Enqueues events n = from..to-1 round robin over `keys`, 25 per transaction.
  void enqueue_events(int from, int to, int keys, const std::string& topic_prefix = "events/k") {
    for (int start = from; start < to; start += 25) {
      up_->with_connection([&](SQLite::Database& db) {
        db.exec("BEGIN IMMEDIATE");
        for (int n = start; n < std::min(to, start + 25); ++n) {
          const std::string key = "k" + std::to_string(n % keys);
          OutgoingMessage m;
          m.topic = topic_prefix + std::to_string(n % keys);
          m.payload = nlohmann::json{{"key", key}, {"n", n}}.dump();
          const Status s = outbox_->enqueue(db, m);
          ASSERT_TRUE(s.ok()) << s.to_string();
        }
        db.exec("COMMIT");
      });
    }
  }

  int64_t received() { return query_int(down_path_, "SELECT count(*) FROM received"); }
  int64_t up_count(const std::string& where) {
    return query_int(up_path_, "SELECT count(*) FROM outbox_messages WHERE " + where);
  }

  // Every event applied exactly once downstream, under the id the outbox gave it, in
  // per-key order of first application, and every row marked sent upstream.
  void expect_delivered_once(int64_t n) {
    EXPECT_TRUE(wait_until([&] { return received() >= n && up_count("state = 'pending'") == 0; },
                           std::chrono::seconds(60)))
        << "received " << received() << ", pending " << up_count("state = 'pending'");
    EXPECT_EQ(received(), n);
    EXPECT_EQ(query_int(down_path_, "SELECT count(DISTINCT message_id) FROM received"), n);
    EXPECT_EQ(query_int(down_path_, "SELECT count(DISTINCT n) FROM received"), n);
    EXPECT_EQ(up_count("state = 'sent'"), n);
    // The downstream ids are the outbox's ids.
    SQLite::Database up(up_path_, SQLite::OPEN_READONLY);
    std::map<int64_t, std::string> up_ids;
    {
      SQLite::Statement q(up, "SELECT payload, message_id FROM outbox_messages");
      while (q.executeStep())
        up_ids[nlohmann::json::parse(q.getColumn(0).getString())["n"].get<int64_t>()] =
            q.getColumn(1).getString();
    }
    SQLite::Database down(down_path_, SQLite::OPEN_READONLY);
    SQLite::Statement q(down, "SELECT key, n, message_id FROM received ORDER BY rid");
    std::map<std::string, int64_t> last;
    int64_t checked = 0;
    while (q.executeStep()) {
      const std::string key = q.getColumn(0).getString();
      const int64_t v = q.getColumn(1).getInt64();
      EXPECT_EQ(q.getColumn(2).getString(), up_ids[v]) << "n=" << v;
      auto it = last.find(key);
      if (it != last.end()) {
        EXPECT_GT(v, it->second) << "key " << key << " out of order";
      }
      last[key] = v;
      ++checked;
    }
    EXPECT_EQ(checked, n);
  }

  static Broker::Config broker_config() {
    Broker::Config c;
    c.max_inflight_messages = 500;  // above Paho's default buffer of 100 publishes
    c.max_packet_size = kMaxPacket;  // far above every event but the oversized test's
    return c;
  }

  static constexpr int kMaxPacket = 4096;
  TempDir dir_;
  Broker broker_{broker_config()};
  std::string up_path_, down_path_;
  std::unique_ptr<Inbox> up_, down_;
  std::unique_ptr<Outbox> outbox_;
  std::unique_ptr<Consumer> consumer_;
  std::unique_ptr<Subscriber> sub_;
};

TEST_F(RelayTest, StreamArrivesOnceInPerKeyOrderWithinTheWindow) {
  enqueue_events(0, 300, 3);
  auto relay = make_relay(broker_.uri(), 8);
  ASSERT_TRUE(relay->start().ok());
  expect_delivered_once(300);
  enqueue_events(300, 400, 3);  // rows committed while the relay runs
  relay->notify();
  expect_delivered_once(400);
  const RelayCounters c = relay->counters();
  EXPECT_GE(c.acked, 400);
  EXPECT_LE(c.max_inflight_seen, 8);
  EXPECT_GT(c.max_inflight_seen, 1);  // more than one publish in flight at a time
  EXPECT_GT(c.receive_maximum, 0);
  EXPECT_EQ(consumer_->counters().duplicates, 0);
  ASSERT_TRUE(relay->stop().ok());
}

// A window far above Paho's default buffer (100 publishes): the relay sizes Paho's buffer
// to it, so no publish is refused and the connection is never dropped for it; the window
// is min(max_inflight, the broker's Receive Maximum from CONNACK, MQTT 5.0 section
// 3.2.2.3.3). mosquitto announces its max_inflight_messages there (the fixture's broker:
// 500). (The relay once read the CONNACK's properties through a reference into a
// destroyed temporary and never saw the broker's limit.)
TEST_F(RelayTest, LargeWindowNeverOverrunsPahosBuffer) {
  enqueue_events(0, 300, 1);
  auto relay = make_relay(broker_.uri(), 1000);
  ASSERT_TRUE(relay->start().ok());
  expect_delivered_once(300);
  const RelayCounters c = relay->counters();
  EXPECT_EQ(c.receive_maximum, 500);
  EXPECT_LE(c.max_inflight_seen, 500);
  EXPECT_GT(c.max_inflight_seen, 100);  // beyond Paho's default buffer
  EXPECT_EQ(c.connects, 1);             // no publish refused, no reconnect
  ASSERT_TRUE(relay->stop().ok());
}

// The broker goes away mid-stream and comes back: rows enqueued meanwhile and rows whose
// PUBACK was lost all arrive, once each downstream, in per-key order.
TEST_F(RelayTest, BrokerDownThenBackDeliversEverythingInPerKeyOrder) {
  enqueue_events(0, 200, 4);
  auto relay = make_relay(broker_.uri(), 16);
  ASSERT_TRUE(relay->start().ok());
  ASSERT_TRUE(wait_until([&] { return received() >= 50; }, std::chrono::seconds(30)));
  broker_.stop();
  enqueue_events(200, 400, 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(relay->is_connected());
  broker_.start();
  expect_delivered_once(400);
  EXPECT_GE(relay->counters().connects, 2);
  ASSERT_TRUE(relay->stop().ok());
}

// Rows enqueued while no relay runs stay pending; a relay started later sends them, and
// one stopped mid-stream leaves the rest for the next run (same ids, no loss).
TEST_F(RelayTest, StopAndRestartLosesNothing) {
  enqueue_events(0, 300, 3);
  {
    auto relay = make_relay(broker_.uri(), 4);
    ASSERT_TRUE(relay->start().ok());
    ASSERT_TRUE(wait_until([&] { return received() >= 40; }, std::chrono::seconds(30)));
    ASSERT_TRUE(relay->stop().ok());
  }
  EXPECT_GT(up_count("state = 'pending'"), 0);
  auto relay = make_relay(broker_.uri(), 4);
  ASSERT_TRUE(relay->start().ok());
  expect_delivered_once(300);
  ASSERT_TRUE(relay->stop().ok());
}

// Rows that can never be published become outbox dead letters before they are sent, and
// the rows behind them on the same ordering key flow: one whose message expiry ran out
// while it waited (expired), and one whose PUBLISH is one byte over the broker's Maximum
// Packet Size (payload_too_large). One of exactly that size is delivered, so the relay
// counts a packet as the broker does; had it counted short, mosquitto would have
// disconnected it (0x95) and the resend would block the key at every reconnect.
TEST_F(RelayTest, ExpiredAndOversizedRowsAreDeadLetteredAndTheKeyFlowsOn) {
  // The PUBLISH for topic "events/k0" and an 8-byte id: fixed header (1 + 2-byte remaining
  // length), topic (2 + 9), packet id (2), properties (1-byte length + user property
  // "message-id": 1 + 2 + 10 + 2 + 8 = 23), payload (MQTT 5.0 sections 3.3.1-3.3.3).
  const int fitting_payload = kMaxPacket - (1 + 2 + 11 + 2 + 1 + 23);
  auto event = [](int n, int size) {
    std::string j = nlohmann::json{{"key", "k0"}, {"n", n}, {"pad", ""}}.dump();
    if (size > 0) j.insert(j.size() - 2, std::string(size - static_cast<int>(j.size()), 'x'));
    return j;
  };
  up_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    auto add = [&](const std::string& id, const std::string& payload, uint32_t expiry_s) {
      OutgoingMessage m;
      m.topic = "events/k0";
      m.message_id = id;
      m.payload = payload;
      if (expiry_s) m.message_expiry_interval_s = expiry_s;
      const Status s = outbox_->enqueue(db, m);
      ASSERT_TRUE(s.ok()) << s.to_string();
    };
    add("evt-0000", event(0, 0), 0);
    add("evt-0001", event(1, 0), 1);  // runs out before the relay starts
    add("fit-0002", event(2, fitting_payload), 0);
    add("big-0003", event(3, fitting_payload + 1), 0);
    add("evt-0004", event(4, 0), 3600);
    db.exec("COMMIT");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  auto relay = make_relay(broker_.uri(), 8);
  ASSERT_TRUE(relay->start().ok());
  EXPECT_TRUE(wait_until([&] { return received() >= 3 && up_count("state = 'pending'") == 0; },
                         std::chrono::seconds(30)))
      << "received " << received() << ", pending " << up_count("state = 'pending'");
  ASSERT_TRUE(relay->stop().ok());
  EXPECT_EQ(received(), 3);
  EXPECT_EQ(query_int(down_path_, "SELECT count(*) FROM received WHERE n IN (0, 2, 4)"), 3);
  EXPECT_EQ(up_count("state = 'sent'"), 3);
  EXPECT_EQ(up_count("message_id = 'evt-0001' AND state = 'dead' AND dead_reason = 'expired'"), 1);
  EXPECT_EQ(
      up_count("message_id = 'big-0003' AND state = 'dead' AND dead_reason = 'payload_too_large'"),
      1);
  const RelayCounters c = relay->counters();
  EXPECT_EQ(c.maximum_packet_size, kMaxPacket);
  EXPECT_EQ(c.expired, 1);
  EXPECT_EQ(c.too_large, 1);
  EXPECT_EQ(c.connects, 1);  // never disconnected for a packet too large
  OutboxRow big;
  ASSERT_TRUE(outbox_->get("big-0003", &big).ok());
  EXPECT_NE(big.reason_text.find(std::to_string(kMaxPacket + 1) + " bytes"), std::string::npos)
      << big.reason_text;
}

// ledger_consumer --emit-topic: each applied credit emits one event from the outbox; the
// consumer is SIGKILLed mid-stream and restarted. Downstream applies one event per credit,
// with id "<credit id>/credited", the credit's id as source_message_id, and the balance
// after that credit; upstream every event row is sent.
TEST_F(RelayTest, LedgerConsumerEmitsOneEventPerCreditAcrossAKill) {
  const std::string ledger_db = dir_.file("ledger.db");
  auto start = [&](const std::string& log) {
    return std::make_unique<Child>(
        with_emulator({built_program("ledger_consumer"), "--broker", broker_.uri(), "--client-id",
                       "ledger-emit-" + std::to_string(::getpid()), "--topic", "credits/#", "--db",
                       ledger_db, "--mqtt-version", "5", "--emit-topic", "events/credited"}),
        dir_.file(log));
  };
  auto consumer = start("ledger1.log");
  TestPublisher pub(broker_.uri());
  for (int i = 0; i < 60; ++i) pub.credit("credits/x", "cr-" + std::to_string(i), "acct", 1);
  ASSERT_TRUE(wait_until([&] { return received() >= 10; }, std::chrono::seconds(30)));
  consumer->signal(SIGKILL);
  consumer->wait(std::chrono::seconds(10));
  for (int i = 60; i < 100; ++i) pub.credit("credits/x", "cr-" + std::to_string(i), "acct", 1);
  consumer = start("ledger2.log");
  EXPECT_TRUE(wait_until([&] { return received() >= 100; }, std::chrono::seconds(60)))
      << received();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a late extra would show
  consumer->signal(SIGTERM);
  consumer->wait(std::chrono::seconds(20));
  EXPECT_EQ(received(), 100);
  EXPECT_EQ(query_int(down_path_, "SELECT count(DISTINCT message_id) FROM received"), 100);
  EXPECT_EQ(query_int(down_path_,
                      "SELECT count(*) FROM received WHERE message_id LIKE "
                      "'cr-%/credited'"),
            100);
  // The balance each event carries is the running balance: 1..100, each once.
  EXPECT_EQ(query_int(down_path_, "SELECT count(DISTINCT n) FROM received"), 100);
  EXPECT_EQ(query_int(down_path_, "SELECT min(n) FROM received"), 1);
  EXPECT_EQ(query_int(down_path_, "SELECT max(n) FROM received"), 100);
  EXPECT_EQ(query_int(ledger_db, "SELECT balance FROM accounts WHERE account = 'acct'"), 100);
  EXPECT_EQ(query_int(ledger_db, "SELECT count(*) FROM outbox_messages WHERE state = 'sent'"), 100);
}

// SIGKILL of a relaying child process at each point: after the commit and before the
// publish; after the publish and before the PUBACK is marked; after the PUBACK and before
// the mark. A restarted relay delivers the rest; downstream applies each event exactly
// once, and resends carry the same ids (the downstream inbox drops them as duplicates).
class RelayCrashTest : public RelayTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(RelayCrashTest, KilledRelayResendsWithTheSameIdsAndNothingIsLost) {
  enqueue_events(0, 120, 3);
  const std::string program = built_program("relay_child");
  {
    Child c(with_emulator({program, up_path_, broker_.uri(), GetParam(), "40"}),
            dir_.file("child1.log"));
    const int st = c.wait(std::chrono::seconds(60));
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "status " << st;
  }
  EXPECT_GT(up_count("state = 'pending'"), 0);
  EXPECT_LT(up_count("state = 'sent'"), 120);
  {
    Child c(with_emulator({program, up_path_, broker_.uri(), "none", "0"}),
            dir_.file("child2.log"));
    const int st = c.wait(std::chrono::seconds(60));
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  }
  expect_delivered_once(120);
  // A PUBACKed row whose mark died with the process was published again, same id.
  if (std::string(GetParam()) == "before_mark") {
    EXPECT_GE(consumer_->counters().duplicates, 1);
  }
  EXPECT_GE(up_count("attempts >= 2"), 1);  // at least the row at the kill was sent again
}

INSTANTIATE_TEST_SUITE_P(Points, RelayCrashTest,
                         ::testing::Values("before_publish", "after_publish", "before_mark"));

// MQTT 5: a publish the broker's ACL denies gets PUBACK 0x87 and becomes an outbox dead
// letter with that code; the other rows, of the same key and of others, keep flowing.
TEST(RelayPoison, DeniedPublishIsDeadLetteredAndTheStreamGoesOn) {
  TempDir dir;
  const std::string acl = dir.file("acl");
  std::ofstream(acl) << "topic readwrite events/#\n";
  Broker broker(Broker::Config{}, {"allow_anonymous true\nacl_file " + acl});
  const std::string denied_uri = "tcp://127.0.0.1:" + std::to_string(broker.listener_port(0));
  auto up = open_ledger_inbox(dir.file("up.db"));
  std::unique_ptr<Outbox> outbox;
  ASSERT_TRUE(Outbox::create(up.get(), {}, &outbox).ok());
  up->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    for (const char* t : {"events/a", "secret/a", "events/a", "secret/b", "events/b"}) {
      OutgoingMessage m;
      m.topic = t;
      m.ordering_key = "one key";
      m.payload = t;
      ASSERT_TRUE(outbox->enqueue(db, m).ok());
    }
    db.exec("COMMIT");
  });
  RelayOptions o;
  o.broker_uri = denied_uri;
  o.client_id = "relay";
  o.client_id_lock_dir = dir.path();
  o.poll_interval_ms = 20;
  std::unique_ptr<Relay> relay;
  ASSERT_TRUE(Relay::create(outbox.get(), o, &relay).ok());
  ASSERT_TRUE(relay->start().ok());
  const std::string up_path = dir.file("up.db");
  EXPECT_TRUE(wait_until(
      [&] {
        return query_int(up_path, "SELECT count(*) FROM outbox_messages WHERE state = 'pending'") ==
               0;
      },
      std::chrono::seconds(30)));
  ASSERT_TRUE(relay->stop().ok());
  EXPECT_EQ(query_int(up_path,
                      "SELECT count(*) FROM outbox_messages WHERE state = 'sent' AND "
                      "topic LIKE 'events/%'"),
            3);
  EXPECT_EQ(query_int(up_path,
                      "SELECT count(*) FROM outbox_messages WHERE state = 'dead' AND "
                      "topic LIKE 'secret/%' AND dead_reason = 'rejected_by_broker' "
                      "AND reason_code = 135"),
            2);
  EXPECT_EQ(relay->counters().rejected, 2);
  std::vector<OutboxRow> dead;
  ASSERT_TRUE(outbox->list(OutboxState::kDead, 10, &dead).ok());
  ASSERT_EQ(dead.size(), 2u);
  EXPECT_NE(dead[0].reason_text.find("135"), std::string::npos) << dead[0].reason_text;
}

TEST(RelayConfig, RefusesBadOptions) {
  TempDir dir;
  auto up = open_ledger_inbox(dir.file("up.db"));
  std::unique_ptr<Outbox> outbox;
  ASSERT_TRUE(Outbox::create(up.get(), {}, &outbox).ok());
  std::unique_ptr<Relay> r;
  RelayOptions o;
  o.broker_uri = "tcp://127.0.0.1:1";
  EXPECT_EQ(Relay::create(outbox.get(), o, &r).code(), Status::Code::kInvalidArgument);  // no id
  o.client_id = "relay";
  o.max_inflight = 0;
  EXPECT_EQ(Relay::create(outbox.get(), o, &r).code(), Status::Code::kInvalidArgument);
  o.max_inflight = 10;
  o.broker_uri = "http://127.0.0.1:1";
  EXPECT_EQ(Relay::create(outbox.get(), o, &r).code(), Status::Code::kInvalidArgument);
  o.broker_uri = "ssl://127.0.0.1:1";  // TLS, verified against the system trust store
  EXPECT_TRUE(Relay::create(outbox.get(), o, &r).ok());
  o.broker_uri = "tcp://127.0.0.1:1";
  EXPECT_EQ(Relay::create(nullptr, o, &r).code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Relay::create(outbox.get(), o, &r).ok());
}

}  // namespace
}  // namespace mqtt_inbox::test

// Test support: the outbox relay tests' two inboxes on one mosquitto: an upstream inbox
// with an Outbox whose rows a Relay publishes, and a downstream Subscriber + Consumer that
// applies each event once into its own file, with the checks that read both files
// (every event once, under the outbox's id, in per-key order).
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "mqtt_inbox/relay.h"
#include "support/ledger_fixture.h"

namespace mqtt_inbox::test {

// Downstream: applies each event once into `received` (one row per applied event): the
// relay tests' {"key", "n"} events, or ledger_consumer's credited events as (account,
// balance), checked to carry the id derived from their source credit.
inline void apply_event(SQLite::Database& db, const Delivery& d) {
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

class RelayFixture : public ::testing::Test {
 protected:
  RelayFixture() : RelayFixture(broker_config()) {}
  explicit RelayFixture(const Broker::Config& config) : broker_(config) {}

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

  std::unique_ptr<Relay> make_relay(const std::string& uri, int max_inflight = 64,
                                    MqttVersion version = MqttVersion::kV5,
                                    const std::function<void(RelayOptions&)>& more = {}) {
    RelayOptions o;
    o.mqtt_version = version;
    o.broker_uri = uri;
    o.client_id = "relay";
    o.client_id_lock_dir = dir_.path();
    o.max_inflight = max_inflight;
    o.poll_interval_ms = 20;
    o.reconnect_backoff_initial_ms = 50;
    o.reconnect_backoff_max_ms = 300;
    if (more) more(o);
    std::unique_ptr<Relay> r;
    const Status s = Relay::create(outbox_.get(), o, &r);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return r;
  }

  // An event {"message_id", "key", "n"} of key `key`: the id travels in the payload too,
  // which is where a downstream inbox reads it from a relay on MQTT 3.1.1 (no user
  // properties). `pad` bytes of padding make it larger.
  static OutgoingMessage event(int n, const std::string& key, const std::string& topic,
                               size_t pad = 0) {
    OutgoingMessage m;
    m.topic = topic;
    m.message_id = "evt-" + std::to_string(n);
    nlohmann::json j{{"message_id", m.message_id}, {"key", key}, {"n", n}};
    if (pad) j["pad"] = std::string(pad, 'x');
    m.payload = j.dump();
    return m;
  }

  // Enqueues events n = from..to-1 round robin over `keys`, 25 per transaction.
  void enqueue_events(int from, int to, int keys, const std::string& topic_prefix = "events/k") {
    for (int start = from; start < to; start += 25) {
      up_->with_connection([&](SQLite::Database& db) {
        db.exec("BEGIN IMMEDIATE");
        for (int n = start; n < std::min(to, start + 25); ++n) {
          const std::string key = "k" + std::to_string(n % keys);
          const OutgoingMessage m = event(n, key, topic_prefix + std::to_string(n % keys));
          const Status s = outbox_->enqueue(db, m);
          ASSERT_TRUE(s.ok()) << s.to_string();
        }
        db.exec("COMMIT");
      });
    }
  }

  // Freezes the broker, runs `enqueue` and wakes the relay, and checks that the relay puts
  // exactly `window` publishes in flight and no more while nothing is acknowledged; then
  // lets the broker run again. Deterministic: no PUBACK can arrive early.
  void expect_window_fills(Relay& relay, const std::function<void()>& enqueue, int64_t window) {
    broker_.pause();
    enqueue();
    relay.notify();
    EXPECT_TRUE(wait_until([&] { return relay.counters().max_inflight_seen >= window; },
                           std::chrono::seconds(20)))
        << "in flight at most " << relay.counters().max_inflight_seen;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // room to overshoot
    EXPECT_EQ(relay.counters().max_inflight_seen, window);
    broker_.resume();
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
    c.max_inflight_messages = 500;   // above Paho's default buffer of 100 publishes
    c.max_packet_size = kMaxPacket;  // far above every event but the oversized test's
    return c;
  }

  static constexpr int kMaxPacket = 4096;
  TempDir dir_;
  Broker broker_;
  std::string up_path_, down_path_;
  std::unique_ptr<Inbox> up_, down_;
  std::unique_ptr<Outbox> outbox_;
  std::unique_ptr<Consumer> consumer_;
  std::unique_ptr<Subscriber> sub_;
};

}  // namespace mqtt_inbox::test

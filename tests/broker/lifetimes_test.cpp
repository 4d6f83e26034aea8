// A message's lifetime against a real mosquitto and real SQLite files (issue 42), asserted
// on the ledger (balances, the order of its entries) and the dead letters:
//  - MQTT 5 message expiry: a credit that expires while another connection holds the
//    database's write lock is the dead letter `expired`, never applied, and the credit
//    behind it is applied; in store-then-process, a credit that expires while it waits in
//    the backlog (behind a slow row of its aggregate) is dead-lettered by the worker, and
//    the rows with time left are applied.
//  - "not yet" (RetryLater): a dependency down for longer than the immediate runs and
//    than max_attempts' worth of failures, then back: every credit applied once, in the
//    order published, no dead letter (MQTT 3.1.1 and 5; the Consumer and
//    store-then-process). One that never comes back: dependency_unavailable after the
//    schedule, acked (the broker does not send them again).
//  - the connection while the Consumer holds a message: with keep-alive 2 s mosquitto drops
//    it (measured: printed as [measured]), the subscriber reconnects once the message is
//    applied, the redelivery is a duplicate: still once, still in order.
#include <mqtt_inbox/sqlite.h>
#include <mqtt_inbox/store_then_process.h>
#include <mqtt_inbox/subscriber.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

std::string version_name(const ::testing::TestParamInfo<MqttVersion>& p) {
  return p.param == MqttVersion::kV5 ? "mqtt5" : "mqtt311";
}

std::string text(const std::string& db_path, const std::string& sql) {
  SQLite::Database db(db_path, SQLite::OPEN_READONLY, 5000);
  SQLite::Statement q(db, sql);
  if (!q.executeStep() || q.getColumn(0).isNull()) return "";
  return q.getColumn(0).getString();
}

// Publishes one credit at QoS 1 from another process (mosquitto_pub, which waits for its
// PUBACK), with an MQTT 5 message expiry of `expiry_s` seconds if >= 0. Not an in-process
// client: Paho runs every client of a process on one receive thread, which a consumer
// holding a message blocks, so a publisher here would wait behind the message it sent.
void publish(const Broker& broker, MqttVersion version, const std::string& id,
             const std::string& account, long long amount, int expiry_s = -1) {
  const std::string payload = "{\"message_id\":\"" + id + "\",\"account\":\"" + account +
                              "\",\"amount\":" + std::to_string(amount) + "}";
  std::string cmd = "mosquitto_pub -h 127.0.0.1 -p " + std::to_string(broker.port()) +
                    " -q 1 -t credits/a -m '" + payload + "' -V " +
                    (version == MqttVersion::kV5 ? "mqttv5" : "mqttv311");
  if (version == MqttVersion::kV5) cmd += " -D publish user-property message-id " + id;
  if (expiry_s >= 0) cmd += " -D publish message-expiry-interval " + std::to_string(expiry_s);
  ASSERT_EQ(::system(cmd.c_str()), 0) << cmd;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class LifetimeTest : public ::testing::TestWithParam<MqttVersion> {
 protected:
  void SetUp() override { db_path_ = dir_.file("ledger.db"); }
  // A test that failed while a handler held its message: let it go, or destroying the
  // subscriber would wait for Paho's blocked callback for ever.
  void TearDown() override { down_ = false; }

  void open_inbox(int busy_timeout_ms = 5000) {
    InboxOptions o;
    o.busy_timeout_ms = busy_timeout_ms;
    inbox_ = open_ledger_inbox(db_path_, o);
    ASSERT_TRUE(inbox_);
  }

  // A consumer whose handler says "not yet" while `down_` is set, else applies the credit.
  void make_consumer(ConsumerOptions co) {
    co.retry_backoff_initial = 10ms;
    co.retry_backoff_max = 20ms;
    co.store_backoff_max = 300ms;
    ASSERT_TRUE(Consumer::create(
                    inbox_.get(), "ledger",
                    [this](SQLite::Database& db, const Delivery& d) {
                      if (down_) {
                        if (first_not_yet_ms_ == 0) first_not_yet_ms_ = now_ms();
                        throw RetryLater("meter gateway 10.0.0.7: connection refused");
                      }
                      ledger::apply_credit(db, d);
                    },
                    co, &consumer_)
                    .ok());
  }

  // Kept by the fixture (subs_), so it is destroyed after TearDown.
  Subscriber* make_subscriber(MessageSink* sink, const std::string& client_id,
                              int keep_alive_s = 30) {
    SubscriberOptions o;
    o.broker_uri = broker_.uri();
    o.client_id = client_id;
    o.client_id_lock_dir = dir_.path();
    o.mqtt_version = GetParam();
    o.keep_alive_s = keep_alive_s;
    o.reconnect_backoff_initial_ms = 50;
    o.reconnect_backoff_max_ms = 200;
    std::unique_ptr<Subscriber> s;
    EXPECT_TRUE(Subscriber::create(o, &s).ok());
    EXPECT_TRUE(s->subscribe("credits/#", sink).ok());
    EXPECT_TRUE(s->start().ok());
    EXPECT_TRUE(s->wait_connected(10000));
    subs_.push_back(std::move(s));
    return subs_.back().get();
  }

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  bool mqtt5() const { return GetParam() == MqttVersion::kV5; }
  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }
  std::string order() {
    return text(db_path_,
                "SELECT group_concat(message_id, ',') FROM"
                " (SELECT message_id FROM ledger_entries ORDER BY id)");
  }

  Broker broker_;
  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
  std::vector<std::unique_ptr<Subscriber>> subs_;
  // Declared after a test's own sink (a StoreThenProcess): its subscribers go first.
  struct DropSubscribers {
    LifetimeTest* t;
    ~DropSubscribers() { t->subs_.clear(); }
  };
  std::atomic<bool> down_{false};
  std::atomic<int64_t> first_not_yet_ms_{0};
};

// --- message expiry (MQTT 5 only: 3.1.1 has none) ---

class ExpiryTest : public LifetimeTest {};

TEST_P(ExpiryTest, ACreditThatExpiresWhileTheStoreIsLockedIsNeverApplied) {
  open_inbox(/*busy_timeout_ms=*/200);
  make_consumer({});
  make_subscriber(consumer_.get(), "ledger-expiry");
  // Another connection holds SQLite's write lock for 4 s, longer than e-1's 2 s.
  SQLite::Database locker(db_path_, SQLite::OPEN_READWRITE);
  locker.exec("BEGIN IMMEDIATE");
  publish(broker_, MqttVersion::kV5, "e-1", "ann", 5, 2);
  publish(broker_, MqttVersion::kV5, "e-2", "ann", 7);  // no expiry: waits as long as it takes
  ASSERT_TRUE(wait_until([&] { return consumer_->health().stuck; }, 5s));
  std::this_thread::sleep_for(4s);
  locker.exec("ROLLBACK");
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 1; }, 20s));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'e-1'"
              "   AND reason = 'expired'"),
            1);
  // The interval it arrived with is in the dead letter's properties, the wait in its text.
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'e-1'"
              "   AND properties LIKE '%\"message_expiry_interval_s\":%'"
              "   AND reason_text LIKE 'message expiry interval % s ran out%waited %'"),
            1)
      << text(db_path_, "SELECT reason_text FROM inbox_dead_letters");
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'e-1'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE message_id = 'e-1'"), 0);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'ann'"), 7);
  EXPECT_EQ(consumer_->counters().expired, 1);
}

TEST_P(ExpiryTest, ACreditThatExpiresInTheStoreThenProcessBacklogIsDeadLetteredByTheWorker) {
  open_inbox();
  StoreThenProcessOptions o;
  o.workers = 1;
  o.poll_interval_ms = 20;
  // The first row's prepare step is slow (an HTTP call, say): the rows behind it in its
  // aggregate wait in the backlog.
  o.prepare = [](const StoredDelivery& d) -> std::any {
    if (d.message_id == "slow-1") std::this_thread::sleep_for(3s);
    return {};
  };
  std::unique_ptr<StoreThenProcess> stp;
  const DropSubscribers drop{this};
  ASSERT_TRUE(StoreThenProcess::create(inbox_.get(), "ledger", stored_handler(ledger::apply_credit),
                                       o, &stp)
                  .ok());
  ASSERT_TRUE(stp->start().ok());
  make_subscriber(stp.get(), "ledger-stp-expiry");
  TestPublisher pub(broker_.uri(), true);
  pub.credit("credits/a", "slow-1", "bob", 1);
  pub.credit_expiring("credits/a", "e-1", "bob", 5, 1);   // expires in the backlog
  pub.credit_expiring("credits/a", "e-2", "bob", 7, 60);  // time left
  pub.credit("credits/a", "e-3", "bob", 11);              // no expiry
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM inbox_messages") == 4; }, 10s));
  // Receipt kept each deadline (retention clock) with the row, and the interval in its
  // properties.
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE expires_at IS NOT NULL"), 2);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'e-1'"
              "   AND expires_at BETWEEN received_at + 500 AND received_at + 1500"
              "   AND properties LIKE '%\"message_expiry_interval_s\":%'"),
            1);
  ASSERT_TRUE(wait_until(
      [&] {
        return q("SELECT count(*) FROM inbox_messages WHERE status IN ('pending','processing')") ==
               0;
      },
      30s));
  EXPECT_EQ(text(db_path_, "SELECT status FROM inbox_messages WHERE message_id = 'e-1'"), "dead");
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'e-1'"
              "   AND reason = 'expired' AND reason_text LIKE '%in the backlog%'"),
            1)
      << text(db_path_, "SELECT reason_text FROM inbox_dead_letters");
  EXPECT_EQ(order(), "slow-1,e-2,e-3");
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'bob'"), 19);
  EXPECT_EQ(stp->counters().expired, 1);
  ASSERT_TRUE(stp->stop().ok());
}

INSTANTIATE_TEST_SUITE_P(Versions, ExpiryTest, ::testing::Values(MqttVersion::kV5), version_name);

// --- "not yet": a dependency that is down (MQTT 3.1.1 and 5) ---

TEST_P(LifetimeTest, ADependencyDownForSecondsIsWaitedOutAndEveryCreditAppliedOnceInOrder) {
  open_inbox();
  ConsumerOptions co;
  co.dependency_immediate_attempts = 2;
  co.dependency_backoff_initial = 100ms;
  co.dependency_backoff_max = 400ms;
  co.dependency_wait_max = 60s;
  make_consumer(co);
  make_subscriber(consumer_.get(), "ledger-dependency");
  down_ = true;
  for (int i = 0; i < 10; ++i)
    publish(broker_, GetParam(), "c-" + std::to_string(i), "acct-" + std::to_string(i % 3), i + 1);
  // Longer than the immediate runs, and than max_attempts (5) failures with their backoff
  // would take: a failing handler would have dead-lettered c-0 by now.
  Health held;
  ASSERT_TRUE(wait_until(
      [&] {
        held = consumer_->health();
        return held.dependency.waiting && held.dependency.waited_ms >= 3000;
      },
      15s));
  EXPECT_EQ(held.dependency.message_id, "c-0");
  EXPECT_GE(held.dependency.attempt, 6);
  EXPECT_FALSE(held.stuck);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 0);
  down_ = false;
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 10; }, 20s));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 10);
  EXPECT_EQ(order(), "c-0,c-1,c-2,c-3,c-4,c-5,c-6,c-7,c-8,c-9");
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 55);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
  EXPECT_GE(consumer_->counters().not_yet, 6);
  EXPECT_EQ(consumer_->counters().handler_failures, 0);
  EXPECT_FALSE(consumer_->health().dependency.waiting);
}

TEST_P(LifetimeTest, ADependencyThatNeverComesBackEndsAsDependencyUnavailableAndIsAcked) {
  open_inbox();
  ConsumerOptions co;
  co.dependency_immediate_attempts = 1;
  co.dependency_backoff_initial = 100ms;
  co.dependency_backoff_max = 200ms;
  co.dependency_wait_max = 800ms;
  make_consumer(co);
  {
    Subscriber* sub = make_subscriber(consumer_.get(), "ledger-gone");
    down_ = true;
    for (int i = 0; i < 3; ++i) publish(broker_, GetParam(), "g-" + std::to_string(i), "ann", 1);
    ASSERT_TRUE(wait_until(
        [&] {
          return q("SELECT count(*) FROM inbox_dead_letters"
                   " WHERE reason = 'dependency_unavailable'") == 3;
        },
        20s));
    EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"
                " WHERE reason_text LIKE '%connection refused%'"),
              3);
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 0);
    EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 0);
    ASSERT_TRUE(sub->stop().ok());
  }
  // They were acked: the session holds nothing more, even for a handler that would apply.
  down_ = false;
  make_subscriber(consumer_.get(), "ledger-gone");
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 0);
  EXPECT_EQ(consumer_->counters().already_dead_lettered, 0);
}

// The Consumer holds Paho's callback while it waits, so no PINGREQ leaves: past 1.5 x the
// keep-alive, mosquitto ends the connection (its session stays). Nothing is lost: once the
// dependency is back the held credit commits, its PUBACK goes nowhere, the subscriber
// reconnects, the broker resends it (a duplicate) and the rest of the session's queue.
TEST_P(LifetimeTest, AWaitLongerThanTheKeepAliveCostsAReconnectAndNothingElse) {
  open_inbox();
  ConsumerOptions co;
  co.dependency_immediate_attempts = 1;
  co.dependency_backoff_initial = 200ms;
  co.dependency_backoff_max = 500ms;
  co.dependency_wait_max = 60s;
  make_consumer(co);
  Subscriber* sub = make_subscriber(consumer_.get(), "ledger-keepalive", /*keep_alive_s=*/2);
  down_ = true;
  for (int i = 0; i < 5; ++i) publish(broker_, GetParam(), "k-" + std::to_string(i), "ann", i + 1);
  ASSERT_TRUE(wait_until([&] { return first_not_yet_ms_.load() != 0; }, 10s));
  // When the broker gives up on the connection, measured from the first "not yet".
  int64_t dropped_after_ms = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        if (read_file(broker_.log_path()).find("exceeded timeout") == std::string::npos)
          return false;
        dropped_after_ms = now_ms() - first_not_yet_ms_.load();
        return true;
      },
      20s))
      << read_file(broker_.log_path());
  std::printf(
      "[measured] mosquitto, keep-alive 2 s, %s: the connection was dropped %lld ms "
      "after the handler began holding the message (1.5 x keep-alive = 3000 ms)\n",
      mqtt5() ? "MQTT 5" : "MQTT 3.1.1", static_cast<long long>(dropped_after_ms));
  EXPECT_GE(dropped_after_ms, 500);
  EXPECT_EQ(sub->health().connects, 1);
  down_ = false;
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 5; }, 30s));
  ASSERT_TRUE(wait_until([&] { return sub->health().connects >= 2 && sub->is_connected(); }, 20s));
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(order(), "k-0,k-1,k-2,k-3,k-4");
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'ann'"), 15);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_GE(consumer_->counters().duplicates, 1) << "the held credit came back after reconnect";
}

// Store-then-process reschedules the row instead of holding the session: receipt goes on
// (every credit is stored and acked while the dependency is down), the rows wait in their
// aggregate's order, and are applied once, in order, when it is back.
TEST_P(LifetimeTest, StoreThenProcessReschedulesRowsAndKeepsEachAggregatesOrder) {
  open_inbox();
  StoreThenProcessOptions o;
  o.workers = 2;
  o.poll_interval_ms = 20;
  o.aggregate_key = aggregate_key_from_json_field("account");
  o.consumer.retry_backoff_initial = 10ms;
  o.consumer.retry_backoff_max = 20ms;
  o.consumer.dependency_immediate_attempts = 2;
  o.consumer.dependency_backoff_initial = 100ms;
  o.consumer.dependency_backoff_max = 300ms;
  o.consumer.dependency_wait_max = 60s;
  std::unique_ptr<StoreThenProcess> stp;
  const DropSubscribers drop{this};
  ASSERT_TRUE(StoreThenProcess::create(
                  inbox_.get(), "ledger",
                  [this](SQLite::Database& db, const StoredDelivery& d) {
                    if (down_) throw RetryLater("meter gateway 10.0.0.7: connection refused");
                    const Delivery delivery{d.message, d.message_id, d.attempt};
                    ledger::apply_credit(db, delivery);
                  },
                  o, &stp)
                  .ok());
  ASSERT_TRUE(stp->start().ok());
  make_subscriber(stp.get(), "ledger-stp-dependency");
  TestPublisher pub(broker_.uri(), mqtt5());
  down_ = true;
  for (int i = 0; i < 12; ++i)
    pub.credit("credits/a", "s-" + std::to_string(i), i % 2 ? "odd" : "even", i + 1);
  // Receipt is not held: all twelve are stored (and acked) while the dependency is down.
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM inbox_messages") == 12; }, 10s));
  ASSERT_TRUE(wait_until(
      [&] {
        return q("SELECT max(not_yet) FROM inbox_messages") >= 5 &&
               stp->health().dependency.waiting;
      },
      15s));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE not_yet > 0 AND waiting_since IS NULL"),
            0);
  EXPECT_EQ(q("SELECT max(attempts) FROM inbox_messages"), 0) << "\"not yet\" is no attempt";
  EXPECT_FALSE(stp->health().stuck);
  down_ = false;
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 12; }, 30s));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 12);
  EXPECT_EQ(text(db_path_,
                 "SELECT group_concat(message_id, ',') FROM (SELECT message_id FROM"
                 " ledger_entries WHERE account = 'even' ORDER BY id)"),
            "s-0,s-2,s-4,s-6,s-8,s-10");
  EXPECT_EQ(text(db_path_,
                 "SELECT group_concat(message_id, ',') FROM (SELECT message_id FROM"
                 " ledger_entries WHERE account = 'odd' ORDER BY id)"),
            "s-1,s-3,s-5,s-7,s-9,s-11");
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 78);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'done' AND not_yet = 0"), 12);
  EXPECT_GE(stp->counters().not_yet, 5);
  ASSERT_TRUE(stp->stop().ok());
}

INSTANTIATE_TEST_SUITE_P(Versions, LifetimeTest,
                         ::testing::Values(MqttVersion::kV3_1_1, MqttVersion::kV5), version_name);

}  // namespace
}  // namespace mqtt_inbox::test

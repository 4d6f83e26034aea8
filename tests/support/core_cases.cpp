#include "support/core_cases.h"

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <thread>

namespace mqtt_inbox::test {

namespace {

// An inbox with the ledger's tables at a location of its own in `store` (its own folder
// for SQLite), one Consumer on it, and subscribers for it on demand.
class LedgerRig {
 public:
  LedgerRig(const BrokerUnderTest& broker, const std::string& filter, const StoreUnderTest& store)
      : broker_(broker),
        store_(store),
        filter_(filter),
        location_(store.make_location(dir_.path())) {
    ConsumerOptions co;
    co.retry_backoff_initial = std::chrono::milliseconds(1);
    co.retry_backoff_max = std::chrono::milliseconds(2);
    store_.open_ledger(location_, co, &inbox_, &consumer_);
  }

  std::unique_ptr<Subscriber> subscriber(const std::string& client_id,
                                         std::shared_ptr<spdlog::logger> log = nullptr) {
    SubscriberOptions o;
    o.logger = std::move(log);
    o.broker_uri = broker_.uri;
    o.client_id = client_id;
    o.client_id_lock_dir = dir_.path();
    o.mqtt_version = broker_.version;
    o.reconnect_backoff_initial_ms = 50;
    o.reconnect_backoff_max_ms = 500;
    std::unique_ptr<Subscriber> s;
    EXPECT_TRUE(Subscriber::create(o, &s).ok());
    EXPECT_TRUE(s->subscribe(filter_, consumer_.get()).ok());
    return s;
  }

  int64_t rows() const { return store_.query(location_, "SELECT count(*) FROM ledger_entries"); }
  int64_t balance() const { return store_.query(location_, "SELECT sum(balance) FROM accounts"); }
  Inbox& inbox() const { return *inbox_; }

 private:
  const BrokerUnderTest& broker_;
  const StoreUnderTest& store_;
  std::string filter_;
  TempDir dir_;
  std::string location_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
};

}  // namespace

void core_case_exactly_once_under_sigkill(const ChildConsumers& c) {
  c.create_session();
  if (::testing::Test::HasFatalFailure()) return;
  auto child = c.start_consumer({"--crash-after-commit", "c-5"});
  {
    TestPublisher pub(c.uri(), c.mqtt5());
    for (int i = 0; i < 10; ++i) pub.credit("credits/x", "c-" + std::to_string(i), "acct", 10 + i);
  }
  const int st = child->wait(std::chrono::seconds(30));
  ASSERT_NE(st, -1) << "consumer did not crash";
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_EQ(c.q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-5'"), 1);

  auto restarted = c.start_consumer();
  ASSERT_TRUE(wait_until([&] { return c.q("SELECT count(*) FROM ledger_entries") == 10; },
                         std::chrono::seconds(30)));
  EXPECT_GE(c.stop_and_count(*restarted, "duplicates"), 1);  // c-5 came back and was skipped
  EXPECT_EQ(c.q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-5'"), 1);
  EXPECT_EQ(c.q("SELECT sum(balance) FROM accounts"), 10 * 10 + 45);
  const std::string& inbox = c.store().inbox_tables;
  EXPECT_EQ(c.q("SELECT count(*) FROM " + inbox + "inbox_processed"), 10);
  EXPECT_EQ(c.q("SELECT count(*) FROM " + inbox + "inbox_attempts"), 0);
}

void core_case_offline_messages_are_delivered(const BrokerUnderTest& broker,
                                              const std::string& prefix,
                                              const StoreUnderTest& store) {
  LedgerRig rig(broker, prefix + "/#", store);
  const std::string client = prefix + "-offline";
  {
    auto sub = rig.subscriber(client);
    ASSERT_TRUE(sub->start().ok());
    ASSERT_TRUE(sub->wait_connected(10000));
    ASSERT_TRUE(sub->stop().ok());
  }
  {
    TestPublisher pub(broker.uri, broker.version == MqttVersion::kV5);
    for (int i = 0; i < 25; ++i) pub.credit(prefix + "/b", "off-" + std::to_string(i), "x", 2);
  }
  EXPECT_EQ(rig.rows(), 0);
  auto sub = rig.subscriber(client);
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(wait_until([&] { return rig.rows() == 25; }, std::chrono::seconds(30)))
      << broker.name << ": " << rig.rows() << " of 25 applied";
  EXPECT_EQ(rig.balance(), 50);
  EXPECT_EQ(sub->sessions_lost(), 0);
  EXPECT_TRUE(sub->stop().ok());
}

void core_case_broker_restart_keeps_sessions(const BrokerUnderTest& broker,
                                             const std::string& prefix,
                                             const StoreUnderTest& store) {
  const bool v5 = broker.version == MqttVersion::kV5;
  LedgerRig online(broker, prefix + "/online/#", store),
      offline(broker, prefix + "/offline/#", store);
  auto a = online.subscriber(prefix + "-online");
  ASSERT_TRUE(a->start().ok());
  ASSERT_TRUE(a->wait_connected(10000));
  {
    auto b = offline.subscriber(prefix + "-offline");  // makes its session, then leaves
    ASSERT_TRUE(b->start().ok());
    ASSERT_TRUE(b->wait_connected(10000));
    ASSERT_TRUE(b->stop().ok());
  }
  {
    TestPublisher pub(broker.uri, v5);
    for (int i = 0; i < 5; ++i) pub.credit(prefix + "/offline/q", "q-" + std::to_string(i), "y", 3);
  }

  broker.stop();
  ASSERT_TRUE(wait_until([&] { return !a->is_connected(); }, std::chrono::seconds(10)));
  broker.start();
  ASSERT_TRUE(a->wait_connected(broker.restart_timeout_ms)) << broker.name << " restart";
  {
    TestPublisher pub(broker.uri, v5);
    for (int i = 0; i < 5; ++i) pub.credit(prefix + "/online/r", "r-" + std::to_string(i), "y", 3);
  }
  ASSERT_TRUE(wait_until([&] { return online.rows() == 5; }, std::chrono::seconds(30)));
  EXPECT_EQ(online.balance(), 15);
  EXPECT_GE(a->connects(), 2);
  EXPECT_EQ(a->sessions_lost(), 0);

  auto b = offline.subscriber(prefix + "-offline");
  ASSERT_TRUE(b->start().ok());
  ASSERT_TRUE(wait_until([&] { return offline.rows() == 5; }, std::chrono::seconds(30)))
      << broker.name << ": " << offline.rows() << " of 5 queued messages survived the restart";
  EXPECT_EQ(offline.balance(), 15);
  EXPECT_EQ(b->sessions_lost(), 0);
  EXPECT_TRUE(b->stop().ok());
  EXPECT_TRUE(a->stop().ok());
}

void core_case_session_lost_while_stopped(
    const BrokerUnderTest& broker, const std::string& prefix,
    const std::function<void(const std::string& client_id)>& destroy, const StoreUnderTest& store) {
  const bool v5 = broker.version == MqttVersion::kV5;
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(500);
  auto log = std::make_shared<spdlog::logger>(prefix, ring);
  LedgerRig rig(broker, prefix + "/#", store);
  const std::string client = prefix + "-lost";
  {
    auto sub = rig.subscriber(client, log);
    ASSERT_TRUE(sub->start().ok());
    ASSERT_TRUE(sub->wait_connected(10000));
    TestPublisher pub(broker.uri, v5);
    for (int i = 0; i < 2; ++i) pub.credit(prefix + "/a", "before-" + std::to_string(i), "x", 1);
    ASSERT_TRUE(wait_until([&] { return rig.rows() == 2; }, std::chrono::seconds(30)));
    ASSERT_TRUE(sub->stop().ok());
  }
  {
    TestPublisher pub(broker.uri, v5);
    for (int i = 0; i < 10; ++i) pub.credit(prefix + "/a", "queued-" + std::to_string(i), "x", 10);
  }
  destroy(client);
  auto sub = rig.subscriber(client, log);
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(sub->wait_connected(30000)) << broker.name;
  EXPECT_EQ(sub->sessions_lost(), 1) << broker.name;
  EXPECT_EQ(sub->health().sessions_lost, 1);
  EXPECT_EQ(rig.inbox().stats().sessions_lost, 1);
  size_t warned = 0;
  const std::string warning =
      "SESSION LOST: broker " + broker.uri + " has no session for client '" + client +
      "', but the inbox recorded one holding topic filter(s) '" + prefix + "/#'";
  for (const auto& m : ring->last_raw())
    warned += m.level == spdlog::level::warn &&
              std::string(m.payload.data(), m.payload.size()).find(warning) != std::string::npos;
  EXPECT_EQ(warned, 1u) << broker.name;
  {
    TestPublisher pub(broker.uri, v5);
    for (int i = 0; i < 3; ++i) pub.credit(prefix + "/a", "after-" + std::to_string(i), "x", 100);
  }
  ASSERT_TRUE(wait_until([&] { return rig.rows() == 5; }, std::chrono::seconds(30)))
      << broker.name << ": " << rig.rows() << " rows";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(rig.rows(), 5);
  EXPECT_EQ(rig.balance(), 302);  // 2 before, 3 after; the 10 queued went with the session
  EXPECT_EQ(sub->sessions_lost(), 1);
  EXPECT_TRUE(sub->stop().ok());
}

}  // namespace mqtt_inbox::test

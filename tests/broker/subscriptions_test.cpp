// Subscriptions on long-lived persistent sessions (issue 12 section 4, issue 18 section
// 1) against a real mosquitto and real SQLite files: retained messages across reconnects
// and pruning, stale topic filters, messages with two ids, the MQTT 5 limits a client
// advertises, and the session expiry recorded for the Pruner. Assertions are on the
// ledger's balances, the dead letters and what the broker sent.
#include <mqtt/async_client.h>
#include <mqtt_inbox/service_notifier.h>
#include <mqtt_inbox/subscriber.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

class SubscriptionsTest : public ::testing::TestWithParam<MqttVersion> {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("ledger.db");
    log_ = std::make_shared<spdlog::logger>("subscriptions-test", ring_);
    log_->set_level(spdlog::level::debug);
    InboxOptions io;
    io.logger = log_;
    inbox_ = open_ledger_inbox(db_path_, io);
    ASSERT_TRUE(inbox_);
    make_consumer({});
  }

  void make_consumer(ConsumerOptions co) {
    co.retry_backoff_initial = 1ms;
    co.retry_backoff_max = 2ms;
    consumer_.reset();
    ASSERT_TRUE(
        Consumer::create(inbox_.get(), "ledger", ledger::apply_credit, co, &consumer_).ok());
  }

  SubscriberOptions options(const std::string& client_id) {
    SubscriberOptions o;
    o.broker_uri = broker_.uri();
    o.client_id = client_id;
    o.client_id_lock_dir = dir_.path();
    o.mqtt_version = GetParam();
    o.reconnect_backoff_initial_ms = 50;
    o.reconnect_backoff_max_ms = 200;
    o.logger = log_;
    return o;
  }

  std::unique_ptr<Subscriber> start(const SubscriberOptions& o,
                                    const std::vector<std::string>& filters = {"credits/#"}) {
    std::unique_ptr<Subscriber> s;
    EXPECT_TRUE(Subscriber::create(o, &s).ok());
    for (const auto& f : filters) EXPECT_TRUE(s->subscribe(f, consumer_.get()).ok());
    EXPECT_TRUE(s->start().ok());
    EXPECT_TRUE(s->wait_connected(10000));
    return s;
  }

  // Restarts the broker (persistence on: the session survives) and waits until `sub` has
  // reconnected, i.e. connected and subscribed (or decided not to) again.
  void force_reconnect(Subscriber& sub) {
    const int64_t before = sub.connects();
    broker_.stop();
    ASSERT_TRUE(wait_until([&] { return !sub.is_connected(); }, 10s));
    broker_.start();
    ASSERT_TRUE(wait_until([&] { return sub.connects() > before && sub.is_connected(); }, 15s));
  }

  // What a new process sees: the Inbox (and its counters) opened again on the same file.
  void reopen_inbox() {
    consumer_.reset();
    inbox_.reset();
    InboxOptions io;
    io.logger = log_;
    inbox_ = open_ledger_inbox(db_path_, io);
    ASSERT_TRUE(inbox_);
    make_consumer({});
  }

  // Log lines at `level` that contain `needle`.
  size_t log_count(spdlog::level::level_enum level, const std::string& needle) {
    size_t n = 0;
    for (const auto& m : ring_->last_raw())
      n += m.level == level &&
           std::string(m.payload.data(), m.payload.size()).find(needle) != std::string::npos;
    return n;
  }

  // Another client connects with `client_id` and a clean session (3.1.1 clean session;
  // MQTT 5 clean start, session expiry 0), then leaves: the broker discards the session
  // it held under that id (mosquitto #3551).
  void clean_session_takeover(const std::string& uri, const std::string& client_id) {
    mqtt::async_client intruder(
        uri, client_id, mqtt::create_options(mqtt5() ? MQTTVERSION_5 : MQTTVERSION_3_1_1), nullptr);
    auto opts = mqtt::connect_options_builder()
                    .mqtt_version(mqtt5() ? MQTTVERSION_5 : MQTTVERSION_3_1_1)
                    .clean_session(!mqtt5())
                    .clean_start(mqtt5())
                    .finalize();
    const auto tok = intruder.connect(opts);
    tok->wait();
    EXPECT_FALSE(tok->get_connect_response().is_session_present());
    intruder.disconnect()->wait();
  }

  // Issue 27 item 4: the consumer applies 3 credits and stops; 20 more are queued in its
  // session; `destroy` ends that session at `broker` while the consumer is down; the
  // consumer starts again as a new process would (the Inbox reopened). Then: the loss is
  // warned about (which filters, since when) and counted in the Subscriber, its health,
  // the Inbox's stats and their Prometheus text; the recorded filter is subscribed again
  // and what is published afterwards is applied. The 20 are gone (the broker's doing:
  // this is the loss being reported).
  void expect_session_loss_reported(Broker& broker, SubscriberOptions o,
                                    const std::function<void()>& destroy) {
    o.broker_uri = broker.uri();
    {
      auto sub = start(o);
      TestPublisher pub(broker.uri(), mqtt5());
      for (int i = 0; i < 3; ++i) pub.credit("credits/a", "before-" + std::to_string(i), "acct", 1);
      ASSERT_TRUE(wait_until([&] { return balance() == 3; }, 10s));
      EXPECT_EQ(sub->sessions_lost(), 0);
      ASSERT_TRUE(sub->stop().ok());
    }
    {
      TestPublisher pub(broker.uri(), mqtt5());
      for (int i = 0; i < 20; ++i)
        pub.credit("credits/a", "queued-" + std::to_string(i), "acct", 10);
    }
    destroy();
    reopen_inbox();
    ASSERT_EQ(inbox_->stats().sessions_lost, 0);

    auto sub = start(o);
    ASSERT_TRUE(sub->is_connected());
    EXPECT_EQ(sub->sessions_lost(), 1);
    const ConnectionHealth h = sub->health();
    EXPECT_EQ(h.sessions_lost, 1);
    EXPECT_GT(h.session_lost_ms, 0);
    EXPECT_NE(h.session_lost.find("'credits/#'"), std::string::npos) << h.session_lost;
    EXPECT_EQ(inbox_->stats().sessions_lost, 1);
    const std::string prom = prometheus_text(inbox_->stats());
    EXPECT_NE(prom.find("mqtt_inbox_sessions_lost_total 1\n"), std::string::npos) << prom;
    EXPECT_NE(summary_line(inbox_->stats()).find("sessions_lost=1"), std::string::npos);
    EXPECT_NE(health_source(*sub)().note.find("lost the session 1 time"), std::string::npos);
    // At warn (journal priority 4), once, naming the client, the filter and since when.
    EXPECT_EQ(log_count(spdlog::level::warn, "SESSION LOST: broker " + broker.uri() +
                                                 " has no session for client '" + o.client_id +
                                                 "', but the inbox recorded one holding "
                                                 "topic filter(s) 'credits/#'"),
              1u);
    EXPECT_EQ(log_count(spdlog::level::warn, "the broker last held it at "), 1u);
    EXPECT_EQ(log_count(spdlog::level::info, "a first connection"), 1u);  // the first run's

    SessionRecord rec;  // the filter is held again, and recorded so
    ASSERT_TRUE(inbox_->sessions().load(o.client_id, &rec).ok());
    EXPECT_EQ(rec.topic_filters, std::vector<std::string>{"credits/#"});
    {
      TestPublisher pub(broker.uri(), mqtt5());
      for (int i = 0; i < 5; ++i)
        pub.credit("credits/a", "after-" + std::to_string(i), "acct", 100);
    }
    ASSERT_TRUE(wait_until([&] { return balance() == 503; }, 10s)) << balance();
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(balance(), 503);
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id LIKE 'queued-%'"), 0);
    EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 8);
    EXPECT_EQ(sub->sessions_lost(), 1);
    EXPECT_TRUE(sub->stop().ok());
  }

  bool mqtt5() const { return GetParam() == MqttVersion::kV5; }
  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }
  int64_t balance() { return q("SELECT coalesce(sum(balance), 0) FROM accounts"); }
  size_t log_count(const std::string& needle) {
    size_t n = 0;
    for (const auto& line : ring_->last_formatted()) n += line.find(needle) != std::string::npos;
    return n;
  }

  Broker broker_;
  TempDir dir_;
  std::string db_path_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> ring_ =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(2000);
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
};

// The field report's failing input: a retained credit, three forced reconnects, a forced
// 1 ms prune, one more reconnect. Before, every reconnect re-SUBSCRIBEd, the broker
// resent the retained credit each time, and once its id was pruned it was applied again.
// Even with RetainedPolicy::kProcess (what the handler saw before) the balance stays
// single: the broker never resends it (MQTT 3.1.1: no SUBSCRIBE while the session holds
// the filters; MQTT 5: Retain Handling 1).
TEST_P(SubscriptionsTest, RetainedCreditStaysSingleAcrossReconnectsAndAPrune) {
  ConsumerOptions co;
  co.retained = RetainedPolicy::kProcess;
  make_consumer(co);
  auto sub = start(options("gw-retained"));
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    pub.publish("credits/a", R"({"message_id":"X","account":"acct","amount":100})",
                {{"message-id", "X"}}, /*retain=*/true);
  }
  ASSERT_TRUE(wait_until([&] { return balance() == 100; }, 10s));
  for (int i = 0; i < 3; ++i) force_reconnect(*sub);

  RetentionOptions r;
  r.window = 1ms;
  r.allow_window_below_horizon = true;  // forced
  r.stats_log_period_ms = 0;
  std::unique_ptr<Pruner> pruner;
  ASSERT_TRUE(Pruner::create(inbox_.get(), r, &pruner).ok());
  std::this_thread::sleep_for(10ms);
  PruneResult pr;
  ASSERT_TRUE(pruner->prune_once(&pr).ok());
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 0);  // X is forgotten

  force_reconnect(*sub);
  std::this_thread::sleep_for(500ms);  // a resent retained message arrives right after SUBACK
  EXPECT_EQ(balance(), 100);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 1);
  EXPECT_EQ(sub->messages_received(), 1);  // the broker never resent it
  EXPECT_EQ(sub->connects(), 5);
  EXPECT_TRUE(sub->stop().ok());
}

// A retained credit published before the subscription existed comes with RETAIN=1 at the
// first SUBSCRIBE: by default it is acked unprocessed and counted, and reconnects do not
// bring it back.
TEST_P(SubscriptionsTest, RetainedMessageAtFirstSubscribeIsSkippedByDefault) {
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    pub.publish("credits/b", R"({"message_id":"old","account":"acct","amount":7})",
                {{"message-id", "old"}}, /*retain=*/true);
  }
  auto sub = start(options("gw-skip"));
  ASSERT_TRUE(wait_until([&] { return consumer_->counters().retained_skipped == 1; }, 10s));
  for (int i = 0; i < 2; ++i) force_reconnect(*sub);
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    pub.credit("credits/b", "live-1", "acct", 5);  // a live one is applied
  }
  ASSERT_TRUE(wait_until([&] { return balance() == 5; }, 10s));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(consumer_->counters().retained_skipped, 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE message_id = 'old'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_TRUE(sub->stop().ok());
}

// A filter dropped from the configuration stays in the persistent session until it is
// unsubscribed: before, every message on it became a new dead letter, on every run.
TEST_P(SubscriptionsTest, StaleFilterIsUnsubscribedOnceAndItsMessagesStopComing) {
  {
    auto sub = start(options("gw-stale"), {"credits/#", "alerts/#"});
    ASSERT_TRUE(sub->stop().ok());
  }
  EXPECT_EQ(q("SELECT count(*) FROM inbox_session_filters WHERE client_id = 'gw-stale'"), 2);
  for (int run = 0; run < 2; ++run) {
    auto sub = start(options("gw-stale"), {"credits/#"});
    {
      TestPublisher pub(broker_.uri(), mqtt5());
      pub.credit("alerts/x", "alert-" + std::to_string(run), "alerts-acct", 1);
      pub.credit("credits/x", "credit-" + std::to_string(run), "acct", 10);
    }
    ASSERT_TRUE(wait_until([&] { return balance() == 10 * (run + 1); }, 10s));
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(sub->messages_received(), 1) << "run " << run;  // the alert never came
    ASSERT_TRUE(sub->stop().ok());
  }
  EXPECT_EQ(log_count("unsubscribed topic filter 'alerts/#'"), 1u);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM accounts WHERE account = 'alerts-acct'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_session_filters WHERE client_id = 'gw-stale'"
              " AND topic_filter = 'credits/#'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_session_filters WHERE client_id = 'gw-stale'"), 1);
}

// A kept session with a backlog: the broker sends the queued messages before it answers
// the SUBSCRIBE that follows CONNECT, and Paho hands the SUBACK over on the callback's
// thread, after them. Here the first message stays 2.5 s in the handler (a slow store, a
// dependency wait), and the backlog behind it takes several times connect_timeout_ms more.
// The subscriber waits while the callback is busy: one connection, each credit once. (It
// used to give up after connect_timeout_ms, reconnect, get the in-flight messages again
// and meet the same backlog: the PostgreSQL crash tests under AddressSanitizer.) A filter
// added since the last run makes MQTT 3.1.1 send a SUBSCRIBE too.
TEST_P(SubscriptionsTest, SubscribeBehindABacklogSlowerThanTheConnectTimeoutConnectsOnce) {
  {
    auto sub = start(options("gw-backlog"));
    ASSERT_TRUE(sub->stop().ok());
  }
  constexpr int kBacklog = 30;
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < kBacklog; ++i)
      pub.credit("credits/b", "backlog-" + std::to_string(i), "acct", 1);
  }
  consumer_.reset();
  ASSERT_TRUE(Consumer::create(
                  inbox_.get(), "ledger",
                  [first = true](SQLite::Database& db, const Delivery& d) mutable {
                    std::this_thread::sleep_for(first ? 2500ms : 300ms);
                    first = false;
                    ledger::apply_credit(db, d);
                  },
                  {}, &consumer_)
                  .ok());
  SubscriberOptions o = options("gw-backlog");
  o.connect_timeout_ms = 1000;
  std::unique_ptr<Subscriber> sub;
  ASSERT_TRUE(Subscriber::create(o, &sub).ok());
  for (const char* f : {"credits/#", "alerts/#"})
    ASSERT_TRUE(sub->subscribe(f, consumer_.get()).ok());
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(wait_until([&] { return balance() == kBacklog; }, 30s)) << balance();
  ASSERT_TRUE(wait_until([&] { return sub->is_connected(); }, 10s));
  EXPECT_EQ(sub->connects(), 1);
  EXPECT_EQ(sub->messages_received(), kBacklog);  // none came twice
  EXPECT_EQ(log_count("timed out"), 0u);
  // A wait past 5 s says so, once per connection. (Whether it passes 5 s varies: the
  // SUBACK can come before the last queued messages, and the session record saved after
  // it then waits for the store behind them instead.)
  EXPECT_LE(log_count("waiting"), 1u);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  ASSERT_TRUE(sub->stop().ok());
}

// Issue 18: the session expiry the subscriber uses (MQTT 5: sent; 3.1.1: declared) is
// recorded before it connects, and a Pruner with the default retention is refused for a
// 30-day session. One source of truth: nothing else had to repeat the 30 days.
TEST_P(SubscriptionsTest, ThirtyDaySessionIsRecordedAndRefusesDefaultRetention) {
  SubscriberOptions o = options("gw-30d");
  o.session_expiry_s = 30 * 24 * 3600;
  auto sub = start(o);
  SessionRecord rec;
  ASSERT_TRUE(inbox_->sessions().load("gw-30d", &rec).ok());
  EXPECT_EQ(rec.session_expiry_ms, 30LL * 24 * 3600 * 1000);
  EXPECT_EQ(rec.expiry_source,
            mqtt5() ? SessionExpirySource::kRequested : SessionExpirySource::kDeclared);
  EXPECT_EQ(rec.topic_filters, std::vector<std::string>{"credits/#"});
  std::unique_ptr<Pruner> pruner;
  const Status s = Pruner::create(inbox_.get(), RetentionOptions{}, &pruner);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("gw-30d"), std::string::npos) << s.message();
  EXPECT_TRUE(sub->stop().ok());
}

// Issue 27 item 4, mosquitto #3551: another client connects with the consumer's client id
// and a clean session while the consumer is down, which ends its session.
TEST_P(SubscriptionsTest, SessionEndedByACleanSessionTakeoverIsReportedAsLost) {
  expect_session_loss_reported(broker_, options("gw-takeover"),
                               [&] { clean_session_takeover(broker_.uri(), "gw-takeover"); });
  // Seen a moment ago with a 7-day expiry: the warning rules the expiry out.
  EXPECT_EQ(log_count(spdlog::level::warn,
                      "less than the session expiry has passed, so it did "
                      "not expire"),
            1u);
}

// Issue 27 item 4: the broker restarts without persistence while the consumer is down.
TEST_P(SubscriptionsTest, SessionLostInABrokerRestartWithoutPersistenceIsReportedAsLost) {
  Broker::Config c;
  c.persistence = false;
  Broker volatile_broker(c);
  expect_session_loss_reported(volatile_broker, options("gw-volatile"), [&] {
    volatile_broker.stop();
    volatile_broker.start();
  });
}

// The same broker restart while the consumer runs: the loss is found at the reconnect,
// by the same rule (the record of this process's own connection).
TEST_P(SubscriptionsTest, SessionLostWhileConnectedIsReportedAtTheReconnect) {
  Broker::Config c;
  c.persistence = false;
  Broker volatile_broker(c);
  SubscriberOptions o = options("gw-volatile-live");
  o.broker_uri = volatile_broker.uri();
  auto sub = start(o);
  const int64_t before = sub->connects();
  volatile_broker.stop();
  ASSERT_TRUE(wait_until([&] { return !sub->is_connected(); }, 10s));
  volatile_broker.start();
  ASSERT_TRUE(wait_until([&] { return sub->connects() > before && sub->is_connected(); }, 15s));
  EXPECT_EQ(sub->sessions_lost(), 1);
  EXPECT_EQ(sub->health().sessions_lost, 1);
  EXPECT_EQ(inbox_->stats().sessions_lost, 1);
  EXPECT_EQ(log_count(spdlog::level::warn, "SESSION LOST: "), 1u);
  {
    TestPublisher pub(volatile_broker.uri(), mqtt5());
    pub.credit("credits/a", "after-restart", "acct", 7);
  }
  ASSERT_TRUE(wait_until([&] { return balance() == 7; }, 10s));
  EXPECT_TRUE(sub->stop().ok());
}

// A first connection ever (no record for the client id) is no loss; nor is a restart of
// the consumer with the session kept.
TEST_P(SubscriptionsTest, FirstConnectionAndAKeptSessionAreNotLost) {
  for (int run = 0; run < 2; ++run) {
    auto sub = start(options("gw-first"));
    {
      TestPublisher pub(broker_.uri(), mqtt5());
      pub.credit("credits/a", "first-" + std::to_string(run), "acct", 1);
    }
    ASSERT_TRUE(wait_until([&] { return balance() == run + 1; }, 10s));
    EXPECT_EQ(sub->sessions_lost(), 0);
    EXPECT_EQ(sub->health().sessions_lost, 0);
    EXPECT_TRUE(sub->health().session_lost.empty());
    ASSERT_TRUE(sub->stop().ok());
  }
  EXPECT_EQ(inbox_->stats().sessions_lost, 0);
  EXPECT_NE(prometheus_text(inbox_->stats()).find("mqtt_inbox_sessions_lost_total 0\n"),
            std::string::npos);
  EXPECT_EQ(log_count(spdlog::level::info,
                      "has no session for client 'gw-first' and the inbox "
                      "records none with topic filters: a first connection"),
            1u);
  EXPECT_EQ(log_count(spdlog::level::warn, "SESSION LOST"), 0u);
  EXPECT_EQ(
      log_count(spdlog::level::info, "connected to " + broker_.uri() + " with session present"),
      1u);
}

// What a site sees from the shipped program (ledger_consumer, on this version) under
// systemd: the loss is a journal entry at priority 4 (warning). Its stderr is made the
// journal stream (JOURNAL_STREAM names it; journal_log.h), so each line carries its
// priority as "<N>".
TEST_P(SubscriptionsTest, ShippedConsumerSaysSessionLostInTheJournalAtWarning) {
  if (::access("/run/systemd/journal/socket", W_OK) == 0)
    GTEST_SKIP() << "a real journal socket: the program would log there, not to the stream";
  const std::string log = dir_.file("consumer.log");
  const std::string db = dir_.file("program.db");
  std::ofstream(log).close();
  struct stat st {};
  ASSERT_EQ(::stat(log.c_str(), &st), 0);
  const std::string stream =
      "JOURNAL_STREAM=" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  auto run = [&] {
    return std::make_unique<Child>(
        std::vector<std::string>{"/usr/bin/env", stream, built_program("ledger_consumer"),
                                 "--broker", broker_.uri(), "--client-id", "gw-program",
                                 "--client-id-lock-dir", dir_.path(), "--mqtt-version",
                                 mqtt5() ? "5" : "3.1.1", "--topic", "credits/#", "--db", db},
        log);
  };
  auto read_log = [&] {
    std::ifstream f(log);
    std::stringstream t;
    t << f.rdbuf();
    return t.str();
  };
  auto stop = [&](Child& c) {
    c.signal(SIGTERM);
    ASSERT_EQ(c.wait(20s), 0) << read_log();
  };
  {
    auto c = run();
    ASSERT_TRUE(
        wait_until([&] { return read_log().find("consuming: client") != std::string::npos; }, 20s))
        << read_log();
    stop(*c);
  }
  clean_session_takeover(broker_.uri(), "gw-program");
  auto c = run();
  ASSERT_TRUE(wait_until([&] { return read_log().find("SESSION LOST") != std::string::npos; }, 20s))
      << read_log();
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    pub.credit("credits/a", "after-takeover", "acct", 9);
  }
  ASSERT_TRUE(
      wait_until([&] { return query_int(db, "SELECT count(*) FROM ledger_entries") == 1; }, 20s));
  stop(*c);
  const std::string text = read_log();
  EXPECT_NE(text.find("<6>broker " + broker_.uri() +
                      " has no session for client 'gw-program' "
                      "and the inbox records none"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<4>SESSION LOST: broker " + broker_.uri() +
                      " has no session for client 'gw-program', but the inbox recorded one "
                      "holding topic filter(s) 'credits/#'"),
            std::string::npos)
      << text;
}

INSTANTIATE_TEST_SUITE_P(Versions, SubscriptionsTest,
                         ::testing::Values(MqttVersion::kV3_1_1, MqttVersion::kV5),
                         [](const ::testing::TestParamInfo<MqttVersion>& p) {
                           return p.param == MqttVersion::kV5 ? "mqtt5" : "mqtt311";
                         });

// MQTT 5 only (3.1.1 has no user properties and no packet size limit).
class Mqtt5SubscriptionsTest : public SubscriptionsTest {};

// One message, two ids (the property says one thing, the JSON another): dead-lettered
// as invalid_id with both values, applied under neither.
TEST_P(Mqtt5SubscriptionsTest, MessageWithTwoIdsIsDeadLetteredNotApplied) {
  auto sub = start(options("gw-ids"));
  {
    TestPublisher pub(broker_.uri(), true);
    pub.publish("credits/a", R"({"message_id":"json-1","account":"acct","amount":5})",
                {{"message-id", "prop-1"}});
    pub.credit("credits/a", "ok-1", "acct", 1);
  }
  ASSERT_TRUE(wait_until([&] { return balance() == 1; }, 10s));
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM inbox_dead_letters") == 1; }, 10s));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_id'"
              " AND reason_text LIKE '%prop-1%' AND reason_text LIKE '%json-1%'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 1);
  EXPECT_TRUE(sub->stop().ok());
}

// The documented trade-off of maximum_packet_size: the broker drops a larger message for
// this client (no dead letter; the publisher got its PUBACK), while without the limit
// the library dead-letters it as payload_too_large.
TEST_P(Mqtt5SubscriptionsTest, MaximumPacketSizeMakesTheBrokerDropLargerMessages) {
  ConsumerOptions co;
  co.max_payload_bytes = 512;
  make_consumer(co);
  SubscriberOptions o = options("gw-packet");
  o.maximum_packet_size = 2048;
  o.receive_maximum = 5;
  auto sub = start(o);
  const std::string big =
      R"({"message_id":"big","account":"acct","amount":1,"pad":")" + std::string(4000, 'p') + "\"}";
  const std::string mid =
      R"({"message_id":"mid","account":"acct","amount":1,"pad":")" + std::string(1000, 'p') + "\"}";
  {
    TestPublisher pub(broker_.uri(), true);
    pub.publish("credits/a", big, {{"message-id", "big"}});
    pub.publish("credits/a", mid, {{"message-id", "mid"}});
    pub.credit("credits/a", "small", "acct", 2);
  }
  ASSERT_TRUE(wait_until([&] { return balance() == 2; }, 10s));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(sub->messages_received(), 2);  // "big" never reached this client
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'mid'"
              " AND reason = 'payload_too_large'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'big'"), 0);
  EXPECT_TRUE(sub->stop().ok());
}

// Issue 27 item 4: the session expiry runs out while the consumer is down. MQTT 5 only
// on mosquitto: for 3.1.1 the broker alone sets the expiry (persistent_client_expiration,
// whose smallest unit is an hour); rabbitmq_test covers 3.1.1 expiry on RabbitMQ.
TEST_P(Mqtt5SubscriptionsTest, SessionThatExpiredWhileStoppedIsReportedAsLost) {
  SubscriberOptions o = options("gw-expiry");
  o.session_expiry_s = 2;
  expect_session_loss_reported(broker_, o, [] { std::this_thread::sleep_for(4s); });
  EXPECT_EQ(log_count(spdlog::level::warn,
                      "the session expiry ran out while the client was "
                      "offline"),
            1u);
}

INSTANTIATE_TEST_SUITE_P(Versions, Mqtt5SubscriptionsTest, ::testing::Values(MqttVersion::kV5),
                         [](const ::testing::TestParamInfo<MqttVersion>&) { return "mqtt5"; });

}  // namespace
}  // namespace mqtt_inbox::test

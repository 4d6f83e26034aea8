// Store-then-process on real SQLite files and a real mosquitto: receipt deduplicates,
// workers process in arrival order per aggregate, crashed workers are reaped, replay
// re-runs exactly the rows asked for, and SIGKILLs at random points never change the
// business state from "every message exactly once". Assertions are on business tables.
#include <mqtt_inbox/store_then_process.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "support/child_consumer.h"
#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

// The business table of these tests: one row per handler run, in the order of the runs.
void create_runs_table(SQLite::Database& db) {
  db.exec(
      "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, device TEXT NOT NULL,"
      " message_id TEXT NOT NULL, seq INTEGER NOT NULL, attempt INTEGER NOT NULL)");
}

void record_run(SQLite::Database& db, const StoredDelivery& d) {
  SQLite::Statement q(
      db, "INSERT INTO runs (device, message_id, seq, attempt) VALUES (?1, ?2, ?3, ?4)");
  q.bind(1, d.aggregate_key);
  q.bind(2, d.message_id);
  q.bind(3, d.seq);
  q.bind(4, d.attempt);
  q.exec();
}

Message reading(const std::string& device, const std::string& id, int value = 0) {
  Message m;
  m.topic = "sensors/" + device + "/reading";
  m.payload = "{\"message_id\":\"" + id + "\",\"value\":" + std::to_string(value) + "}";
  return m;
}

std::vector<std::string> column(const std::string& db_path, const std::string& sql) {
  SQLite::Database db(db_path, SQLite::OPEN_READONLY, 5000);
  SQLite::Statement q(db, sql);
  std::vector<std::string> out;
  while (q.executeStep()) out.push_back(q.getColumn(0).getString());
  return out;
}

class StoreThenProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("stp.db");
    inbox_ = open_ledger_inbox(db_path_);
    ASSERT_TRUE(inbox_);
    inbox_->with_connection(create_runs_table);
  }

  StoreThenProcessOptions fast_options() {
    StoreThenProcessOptions o;
    o.consumer.retry_backoff_initial = 20ms;
    o.consumer.retry_backoff_max = 40ms;
    o.consumer.store_backoff_initial = 5ms;
    o.consumer.store_backoff_max = 50ms;
    o.aggregate_key = aggregate_key_from_topic_level(1);
    o.poll_interval_ms = 20;
    o.workers = 3;
    o.batch_size = 4;
    return o;
  }

  std::unique_ptr<StoreThenProcess> make(StoredHandler h, StoreThenProcessOptions o) {
    std::unique_ptr<StoreThenProcess> s;
    const Status st = StoreThenProcess::create(inbox_.get(), "sensors", std::move(h), o, &s);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return s;
  }

  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }
  bool wait_runs(int64_t n, std::chrono::milliseconds t = 15s) {
    return wait_until([&] { return q("SELECT count(*) FROM runs") >= n; }, t);
  }
  bool wait_settled(std::chrono::milliseconds t = 15s) {
    return wait_until(
        [&] {
          return q("SELECT count(*) FROM inbox_messages WHERE status IN "
                   "('pending','processing')") == 0;
        },
        t);
  }

  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
};

TEST_F(StoreThenProcessTest, DuplicateAtReceiptIsDroppedAndProcessedOnce) {
  std::atomic<int> calls{0};
  auto stp = make(
      [&](SQLite::Database& db, const StoredDelivery& d) {
        ++calls;
        record_run(db, d);
      },
      fast_options());
  // Stored before any worker runs: receipt alone decides.
  EXPECT_EQ(stp->handle(reading("d1", "r-1")), Outcome::kProcessed);
  EXPECT_EQ(stp->handle(reading("d1", "r-1")), Outcome::kDuplicate);
  EXPECT_EQ(
      q("SELECT count(*) FROM inbox_messages WHERE message_id = 'r-1' AND status = 'pending'"), 1);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_runs(1));
  ASSERT_TRUE(wait_settled());
  // A redelivery after processing is still a duplicate, and is never run.
  EXPECT_EQ(stp->handle(reading("d1", "r-1")), Outcome::kDuplicate);
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(q("SELECT count(*) FROM runs WHERE message_id = 'r-1'"), 1);
  EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'r-1' AND status = 'done'"),
            1);
  EXPECT_EQ(stp->counters().duplicates, 2);
  EXPECT_EQ(stp->counters().stored, 1);
}

// The same through a real broker: the publisher sends the same id three times.
TEST_F(StoreThenProcessTest, DuplicatesThroughMosquittoAreDropped) {
  Broker broker;
  auto stp = make([&](SQLite::Database& db, const StoredDelivery& d) { record_run(db, d); },
                  fast_options());
  ASSERT_TRUE(stp->start().ok());
  SubscriberOptions so;
  so.broker_uri = broker.uri();
  so.client_id = "stp-dups";
  so.client_id_lock_dir = dir_.path();
  so.mqtt_version = MqttVersion::kV5;
  std::unique_ptr<Subscriber> sub;
  ASSERT_TRUE(Subscriber::create(so, &sub).ok());
  ASSERT_TRUE(sub->subscribe("sensors/#", stp.get()).ok());
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(sub->wait_connected(10000));
  {
    TestPublisher pub(broker.uri(), true);
    for (int i = 0; i < 3; ++i)
      for (const char* id : {"a-1", "a-2"})
        pub.publish("sensors/d1/reading", "{\"value\":1}", {{"message-id", id}});
  }
  ASSERT_TRUE(wait_until([&] { return sub->messages_received() >= 6; }, 10s));
  ASSERT_TRUE(wait_runs(2));
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(sub->stop().ok());
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 2);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM runs"), 2);
  EXPECT_EQ(stp->counters().duplicates, 4);
}

TEST_F(StoreThenProcessTest, BadInputIsDeadLetteredAtReceipt) {
  auto o = fast_options();
  o.consumer.max_payload_bytes = 64;
  o.aggregate_key = [](const Message& m) -> std::string {
    if (m.topic == "sensors/bad-key/reading") throw std::runtime_error("no device");
    return "";
  };
  auto stp = make([&](SQLite::Database& db, const StoredDelivery& d) { record_run(db, d); }, o);
  Message no_id;
  no_id.topic = "sensors/d1/reading";
  no_id.payload = "{\"value\":1}";
  EXPECT_EQ(stp->handle(no_id), Outcome::kDeadLettered);
  Message big = reading("d1", "big-1");
  big.payload += std::string(100, ' ');
  EXPECT_EQ(stp->handle(big), Outcome::kDeadLettered);
  EXPECT_EQ(stp->handle(reading("bad-key", "k-1")), Outcome::kDeadLettered);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'missing_id'"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'payload_too_large'"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'undecodable_payload'"
              " AND message_id = 'k-1'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages"), 0);
}

// A row that fails waits for its retry and blocks the later rows of its aggregate (they
// are processed after it, in order); a poison row is dead-lettered after max_attempts,
// marked 'dead' (a redelivery stays a duplicate), and its aggregate moves on.
TEST_F(StoreThenProcessTest, FailingRowBlocksItsAggregateThenPoisonIsDeadLettered) {
  auto o = fast_options();
  o.consumer.max_attempts = 3;
  auto stp = make(
      [&](SQLite::Database& db, const StoredDelivery& d) {
        if (d.message_id == "a-2" && d.attempt < 3) throw std::runtime_error("flaky");
        if (d.message_id == "b-2") throw std::runtime_error("poison");
        record_run(db, d);
      },
      o);
  for (int i = 1; i <= 4; ++i) {
    ASSERT_EQ(stp->handle(reading("a", "a-" + std::to_string(i))), Outcome::kProcessed);
    ASSERT_EQ(stp->handle(reading("b", "b-" + std::to_string(i))), Outcome::kProcessed);
  }
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_runs(7));
  ASSERT_TRUE(wait_settled());
  EXPECT_EQ(stp->handle(reading("b", "b-2")), Outcome::kDuplicate);
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(column(db_path_, "SELECT message_id FROM runs WHERE device = 'a' ORDER BY id"),
            (std::vector<std::string>{"a-1", "a-2", "a-3", "a-4"}));
  EXPECT_EQ(column(db_path_, "SELECT message_id FROM runs WHERE device = 'b' ORDER BY id"),
            (std::vector<std::string>{"b-1", "b-3", "b-4"}));
  EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'a-2'"), 3);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'b-2' AND status = 'dead'"
              " AND attempts = 3"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'b-2'"
              " AND reason = 'handler_failed' AND attempts = 3"),
            1);
  // a-3 ran only after a-2 finally committed: the retry blocked it.
  EXPECT_LT(q("SELECT id FROM runs WHERE message_id = 'a-2'"),
            q("SELECT id FROM runs WHERE message_id = 'a-3'"));
}

// Three devices, published interleaved with one device's ids counting down (the order
// the publisher happens to send is the order that counts, not the ids), handlers of
// random length on three workers and one flaky row: every device's readings are
// processed in the order received, and the business table records that order.
TEST_F(StoreThenProcessTest, ThreeAggregatesAreProcessedInReceivedOrderEach) {
  Broker broker;
  auto o = fast_options();
  std::mutex rng_mu;
  std::mt19937 rng(42);
  auto stp = make(
      [&](SQLite::Database& db, const StoredDelivery& d) {
        int sleep_ms;
        {
          std::lock_guard<std::mutex> lock(rng_mu);
          sleep_ms = static_cast<int>(rng() % 4);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
        if (d.message_id == "north-3" && d.attempt == 1) throw std::runtime_error("flaky once");
        record_run(db, d);
      },
      o);
  ASSERT_TRUE(stp->start().ok());
  SubscriberOptions so;
  so.broker_uri = broker.uri();
  so.client_id = "stp-order";
  so.client_id_lock_dir = dir_.path();
  so.mqtt_version = MqttVersion::kV5;
  std::unique_ptr<Subscriber> sub;
  ASSERT_TRUE(Subscriber::create(so, &sub).ok());
  ASSERT_TRUE(sub->subscribe("sensors/#", stp.get()).ok());
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(sub->wait_connected(10000));

  // north: 0..9 ascending; south: 9..0 (reversed); east: evens then odds.
  std::map<std::string, std::vector<std::string>> sent;
  std::vector<std::pair<std::string, std::string>> plan;
  for (int i = 0; i < 10; ++i) {
    plan.emplace_back("north", "north-" + std::to_string(i));
    plan.emplace_back("south", "south-" + std::to_string(9 - i));
    plan.emplace_back("east", "east-" + std::to_string(i < 5 ? 2 * i : 2 * (i - 5) + 1));
  }
  // Partly reversed interleaving: the middle third of the plan goes out backwards.
  std::reverse(plan.begin() + 10, plan.begin() + 20);
  {
    TestPublisher pub(broker.uri(), true);
    for (const auto& p : plan) {
      pub.publish("sensors/" + p.first + "/reading", "{\"value\":1}", {{"message-id", p.second}});
      sent[p.first].push_back(p.second);
    }
  }
  ASSERT_TRUE(wait_runs(30));
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(sub->stop().ok());
  ASSERT_TRUE(stp->stop().ok());
  for (const auto& s : sent) {
    EXPECT_EQ(column(db_path_,
                     "SELECT message_id FROM runs WHERE device = '" + s.first + "' ORDER BY id"),
              s.second)
        << s.first;
    // Received order is seq order.
    EXPECT_EQ(column(db_path_, "SELECT message_id FROM inbox_messages WHERE aggregate_key = '" +
                                   s.first + "' ORDER BY seq"),
              s.second)
        << s.first;
  }
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 30);
  EXPECT_EQ(q("SELECT count(*) FROM runs WHERE message_id = 'north-3' AND attempt = 2"), 1);
}

// Replay by receipt time range: exactly the rows received in the range run again (and
// the business table sees them twice); a compacted row cannot be replayed.
TEST_F(StoreThenProcessTest, ReplayOfTimeRangeRerunsExactlyThoseRows) {
  auto stp = make([&](SQLite::Database& db, const StoredDelivery& d) { record_run(db, d); },
                  fast_options());
  ASSERT_TRUE(stp->start().ok());
  auto batch = [&](const std::string& prefix) {
    for (int i = 0; i < 5; ++i)
      ASSERT_EQ(stp->handle(reading("d" + std::to_string(i % 2), prefix + std::to_string(i))),
                Outcome::kProcessed);
    std::this_thread::sleep_for(15ms);
  };
  batch("early-");
  batch("middle-");
  batch("late-");
  ASSERT_TRUE(wait_runs(15));
  ASSERT_TRUE(wait_settled());
  const int64_t since =
      q("SELECT min(received_at) FROM inbox_messages WHERE message_id LIKE 'middle-%'");
  const int64_t before =
      q("SELECT max(received_at) FROM inbox_messages WHERE message_id LIKE 'middle-%'") + 1;
  ASSERT_LT(q("SELECT max(received_at) FROM inbox_messages WHERE message_id LIKE 'early-%'"),
            since);
  ASSERT_GE(q("SELECT min(received_at) FROM inbox_messages WHERE message_id LIKE 'late-%'"),
            before);

  ReplayFilter f;
  f.received_since_ms = since;
  f.received_before_ms = before;
  ReplayResult r;
  ASSERT_TRUE(stp->replay(f, &r).ok());
  EXPECT_EQ(r.reset, 5);
  ASSERT_TRUE(wait_runs(20));
  ASSERT_TRUE(wait_settled());
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 20);
  EXPECT_EQ(q("SELECT count(*) FROM (SELECT message_id FROM runs GROUP BY message_id"
              " HAVING count(*) = 2 AND message_id LIKE 'middle-%')"),
            5);
  EXPECT_EQ(q("SELECT count(*) FROM (SELECT message_id FROM runs GROUP BY message_id"
              " HAVING count(*) = 1)"),
            10);
  // The re-runs happened in order per device, after the first runs.
  EXPECT_EQ(
      column(db_path_, "SELECT message_id FROM runs WHERE id > 15 AND device = 'd0' ORDER BY id"),
      (std::vector<std::string>{"middle-0", "middle-2", "middle-4"}));

  // Replay by message id; then compaction makes rows unreplayable.
  ReplayFilter one;
  one.message_id = "late-1";
  ASSERT_TRUE(stp->replay(one, &r).ok());
  EXPECT_EQ(r.reset, 1);
  ASSERT_TRUE(wait_runs(21));
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp->stop().ok());
  std::unique_ptr<StoreThenProcess> compacting;
  auto o = fast_options();
  o.compact_after_ms = 0;
  compacting = make([](SQLite::Database&, const StoredDelivery&) {}, o);
  std::this_thread::sleep_for(5ms);
  StoredPruneResult pr;
  ASSERT_TRUE(compacting->prune(&pr).ok());
  EXPECT_EQ(pr.compacted, 15);
  EXPECT_EQ(pr.deleted, 0);
  ReplayFilter all;
  ASSERT_TRUE(compacting->replay(all, &r).ok());
  EXPECT_EQ(r.reset, 0);
  EXPECT_EQ(r.not_replayable, 15);
}

TEST_F(StoreThenProcessTest, PruneDeletesFinishedRowsAfterTheDedupWindow) {
  auto o = fast_options();
  o.dedup_retention_ms = 0;
  o.prune_interval_ms = 0;  // only the explicit prune() below
  auto stp = make([&](SQLite::Database& db, const StoredDelivery& d) { record_run(db, d); }, o);
  ASSERT_TRUE(stp->start().ok());
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(stp->handle(reading("d", "p-" + std::to_string(i))), Outcome::kProcessed);
  ASSERT_TRUE(wait_runs(3));
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp->stop().ok());
  std::this_thread::sleep_for(5ms);
  StoredPruneResult pr;
  ASSERT_TRUE(stp->prune(&pr).ok());
  EXPECT_EQ(pr.deleted, 3);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 3);  // business state is never touched
}

// The done rows are store-then-process's memory of ids (issue 18 as a kind): while a
// session the subscriber recorded can still redeliver, prune() deletes none of them, and
// a redelivery stays a duplicate. The explicit override deletes them.
TEST_F(StoreThenProcessTest, PruneKeepsRowsARecordedSessionCanStillRedeliver) {
  auto o = fast_options();
  o.dedup_retention_ms = 0;
  o.prune_interval_ms = 0;
  auto stp = make([&](SQLite::Database& db, const StoredDelivery& d) { record_run(db, d); }, o);
  ASSERT_TRUE(stp->start().ok());
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(stp->handle(reading("d", "k-" + std::to_string(i))), Outcome::kProcessed);
  ASSERT_TRUE(wait_runs(3));
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp->stop().ok());
  SessionRecord rec;
  rec.client_id = "gw-30d";
  rec.session_expiry_ms = 30LL * 24 * 3600 * 1000;
  ASSERT_TRUE(inbox_->sessions().record(rec).ok());
  std::this_thread::sleep_for(5ms);
  StoredPruneResult pr;
  const Status s = stp->prune(&pr);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("gw-30d"), std::string::npos) << s.message();
  EXPECT_EQ(pr.deleted, 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages"), 3);
  EXPECT_EQ(stp->handle(reading("d", "k-1")), Outcome::kDuplicate);

  // The default window (7 days) is refused for the 30-day session too (issue 18).
  stp.reset();
  stp = make([&](SQLite::Database& db, const StoredDelivery& d) { record_run(db, d); },
             fast_options());
  EXPECT_EQ(stp->prune(&pr).code(), Status::Code::kInvalidArgument);

  stp.reset();
  o.allow_dedup_retention_below_session = true;
  stp = make([&](SQLite::Database& db, const StoredDelivery& d) { record_run(db, d); }, o);
  ASSERT_TRUE(stp->prune(&pr).ok());
  EXPECT_EQ(pr.deleted, 3);
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 3);  // business state is never touched
}

// The reaper on a claim whose worker is gone: the batch goes back to pending, and only
// the row that was running gets an attempt.
TEST_F(StoreThenProcessTest, ReaperReturnsExpiredClaimsCountingTheRunningRowOnly) {
  auto o = fast_options();
  o.lease_ms = 50;
  auto stp = make([&](SQLite::Database& db, const StoredDelivery& d) { record_run(db, d); }, o);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(stp->handle(reading("d", "x-" + std::to_string(i))), Outcome::kProcessed);
  // A dead process's batch: claimed, never finished.
  inbox_->with_connection([](SQLite::Database& db) {
    db.exec(
        "UPDATE inbox_messages SET status = 'processing', claimant = 'dead/w0/1',"
        " claimed_at = 1000");
  });
  int64_t reaped = 0;
  ASSERT_TRUE(stp->reap(&reaped).ok());
  EXPECT_EQ(reaped, 3);
  EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'x-0'"), 1);
  EXPECT_EQ(q("SELECT sum(attempts) FROM inbox_messages"), 1);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_runs(3));
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(column(db_path_, "SELECT message_id || ':' || attempt FROM runs ORDER BY id"),
            (std::vector<std::string>{"x-0:2", "x-1:1", "x-2:1"}));
}

// Two-phase handler: the slow part runs in prepare, outside the write lock, and its result
// reaches the handler. A prepare that outlives the lease loses its claim: the reaper
// returns the row, another run processes it, and the late worker drops it: one effect.
TEST_F(StoreThenProcessTest, SlowPrepareThatLosesItsClaimNeverDoublesTheEffect) {
  auto o = fast_options();
  o.lease_ms = 60;
  o.reap_interval_ms = 10;
  o.prepare = [](const StoredDelivery& d) -> std::any {
    if (d.message_id == "slow-1" && d.attempt == 1) std::this_thread::sleep_for(300ms);
    return d.seq * 10;
  };
  auto stp = make(
      [&](SQLite::Database& db, const StoredDelivery& d) {
        if (std::any_cast<int64_t>(d.prepared) != d.seq * 10)
          throw std::runtime_error("prepared lost");
        record_run(db, d);
      },
      o);
  ASSERT_EQ(stp->handle(reading("s", "slow-1")), Outcome::kProcessed);
  ASSERT_EQ(stp->handle(reading("s", "slow-2")), Outcome::kProcessed);
  ASSERT_EQ(stp->handle(reading("t", "fast-1")), Outcome::kProcessed);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_runs(3));
  ASSERT_TRUE(wait_settled());
  std::this_thread::sleep_for(400ms);  // the slow first run has finished by now
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 3);
  EXPECT_EQ(column(db_path_,
                   "SELECT message_id || ':' || attempt FROM runs WHERE device = 's' ORDER BY id"),
            (std::vector<std::string>{"slow-1:2", "slow-2:1"}));
  EXPECT_GE(stp->counters().claims_lost, 1);
  EXPECT_GE(stp->counters().reaped, 1);
}

// ---------------------------------------------------------------- child processes

class StpChildTest : public ChildConsumerTest {
 protected:
  std::unique_ptr<Child> start_stp(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {built_program("stp_consumer"),
                                     broker_.uri(),
                                     "stp-client",
                                     "credits/#",
                                     db_path_,
                                     "--mqtt-version",
                                     "5"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(argv, log_path());
  }
  void create_stp_session() {
    auto first = start_stp();
    ASSERT_TRUE(
        wait_until([&] { return log_text().find("consuming: ") != std::string::npos; }, 10s));
    std::this_thread::sleep_for(300ms);
    first->signal(SIGTERM);
    ASSERT_NE(first->wait(10s), -1);
  }
  // Every credit's business effect exactly once, and each account's credits processed in
  // seq (received) order.
  void expect_exactly_once_in_order(int n, int64_t total) {
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), n);
    EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), n);
    EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), total);
    EXPECT_EQ(q("SELECT count(*) FROM seen"), n);
    EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'done'"), n);
    for (const std::string& acct : column(db_path_, "SELECT DISTINCT account FROM seen")) {
      EXPECT_EQ(column(db_path_,
                       "SELECT message_id FROM seen WHERE account = '" + acct + "' ORDER BY id"),
                column(db_path_, "SELECT message_id FROM inbox_messages WHERE aggregate_key = '" +
                                     acct + "' ORDER BY seq"))
          << acct;
    }
  }
  int64_t stop_count_ = 0;
};

// The process is SIGKILLed inside the handler of c-3 (a worker dies mid-handler, its
// transaction uncommitted). The restarted consumer's reaper returns the claim at once
// (under the exclusive lock it is an orphan), and c-3 is processed exactly once, with the
// orphaned claim counted as an attempt and the unstarted rows of the dead batch not counted.
TEST_F(StpChildTest, WorkerKilledMidHandlerIsReapedAndProcessedOnce) {
  create_stp_session();
  auto child = start_stp({"--crash-in-handler", "c-3", "--workers", "1", "--lease-ms", "1000"});
  {
    TestPublisher pub(broker_.uri(), true);
    for (int i = 0; i < 10; ++i)
      pub.credit("credits/x", "c-" + std::to_string(i), i % 2 ? "odd" : "even", 10 + i);
  }
  const int st = child->wait(20s);
  ASSERT_NE(st, -1) << "consumer did not crash";
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-3'"), 0);
  EXPECT_EQ(
      q("SELECT count(*) FROM inbox_messages WHERE message_id = 'c-3' AND status = 'processing'"),
      1);

  auto restarted = start_stp({"--workers", "2", "--lease-ms", "1000"});
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == 10; }, 20s));
  EXPECT_GE(stop_and_count(*restarted, "reaped"), 1);
  expect_exactly_once_in_order(10, 10 * 10 + 45);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-3'"), 1);
  EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'c-3'"), 2);
  EXPECT_EQ(q("SELECT attempt FROM seen WHERE message_id = 'c-3'"), 2);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id <> 'c-3' AND attempts <> 1"),
            0);
}

// A credit that kills the process in its handler every time, with the default lease of
// 60 s: each restart returns the dead process's claim at once (under the exclusive lock it
// is an orphan) and charges it an attempt, so the third crash is the last and the fourth
// run dead-letters it as handler_crashed without running it. No restart waits for a
// lease: the test would need minutes if it did.
TEST_F(StpChildTest, CrashLoopInTheHandlerIsDeadLetteredWithoutWaitingForLeases) {
  create_stp_session();
  const std::vector<std::string> args = {"--crash-in-handler", "c-3", "--workers", "1",
                                         "--max-attempts",     "3"};
  auto child = start_stp(args);
  {
    TestPublisher pub(broker_.uri(), true);
    for (int i = 0; i < 10; ++i)
      pub.credit("credits/x", "c-" + std::to_string(i), i % 2 ? "odd" : "even", 10 + i);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int crash = 1; crash <= 3; ++crash) {
    const int st = child->wait(15s);
    ASSERT_NE(st, -1) << "no crash " << crash;
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << crash;
    EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'c-3'"), crash - 1);
    child = start_stp(args);
  }
  // All ten stored (the broker redelivers the rest to each new process) and finished.
  ASSERT_TRUE(wait_until(
      [&] {
        return q("SELECT count(*) FROM inbox_messages WHERE status IN ('done', 'dead')") == 10;
      },
      15s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  EXPECT_EQ(stop_and_count(*child, "dead_lettered"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'c-3'"
              " AND reason = 'handler_crashed' AND attempts = 3"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'c-3' AND status = 'dead'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'c-3'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 9);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM seen"), 9);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), 10 * 10 + 45 - 13);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'done'"), 9);
}

// sensor_gateway's field case (issue 27): a consumer killed with rows 'processing', then
// the wall clock set back an hour. Here, with 360 credits for 12 devices, across two kills, the
// clock stepped back at the first and forward at the second, and forward by hours while each
// process runs; each restart also starts its monotonic clock elsewhere (a reboot). With the default
// lease of 60 s: every restart returns the dead process's claims within seconds (nothing stalls),
// no live claim is ever returned (each orphaned claim cost exactly one attempt, and the
// last process lost no claim), and every credit is applied exactly once, in order.
TEST_F(StpChildTest, ClockStepsAcrossKillsNeitherStallNorReapLiveClaims) {
  create_stp_session();
  const std::string wall_offset = dir_.file("wall_offset_ms");
  auto set_wall_offset = [&](int64_t ms) {
    std::ofstream(wall_offset + ".tmp") << ms << "\n";
    ASSERT_EQ(std::rename((wall_offset + ".tmp").c_str(), wall_offset.c_str()), 0);
  };
  auto args = [&](int64_t steady_offset_ms) {
    // The slow part in prepare: claims are held nearly all the time, and receipt is fast.
    return std::vector<std::string>{"--workers",
                                    "2",
                                    "--batch",
                                    "6",
                                    "--prepare-sleep-ms",
                                    "20",
                                    "--wall-offset-file",
                                    wall_offset,
                                    "--steady-offset-ms",
                                    std::to_string(steady_offset_ms)};
  };
  constexpr int64_t kHour = 3'600'000;
  const int n = 360;
  set_wall_offset(0);
  auto child = start_stp(args(0));
  {
    TestPublisher pub(broker_.uri(), true);
    for (int i = 0; i < n; ++i)
      pub.credit("credits/x", "k-" + std::to_string(i), "dev-" + std::to_string(i % 12), i);
  }
  int64_t orphaned_claims = 0;
  // Kills the process while it works and returns the claimants it left behind. A kill that
  // falls between two claims leaves none: then it starts the process again (same clocks)
  // and kills that one.
  auto kill_while_working = [&](int64_t done_before, int64_t steady_offset_ms) {
    std::vector<std::string> claimants;
    for (int tries = 0; claimants.empty() && tries < 5; ++tries) {
      if (tries > 0) child = start_stp(args(steady_offset_ms));
      EXPECT_TRUE(wait_until(
          [&] {
            return q("SELECT count(*) FROM inbox_messages WHERE status = 'done'") >=
                       done_before + 40 &&
                   q("SELECT count(*) FROM inbox_messages WHERE status = 'processing'") > 0;
          },
          20s))
          << "done before " << done_before << ", now "
          << q("SELECT count(*) FROM inbox_messages WHERE status = 'done'") << " done, "
          << q("SELECT count(*) FROM inbox_messages WHERE status = 'processing'") << " processing, "
          << q("SELECT count(*) FROM inbox_messages") << " stored";
      child->signal(SIGKILL);
      EXPECT_NE(child->wait(10s), -1);
      claimants = column(db_path_,
                         "SELECT DISTINCT claimant FROM inbox_messages"
                         " WHERE status = 'processing'");
      done_before = q("SELECT count(*) FROM inbox_messages WHERE status = 'done'");
    }
    EXPECT_FALSE(claimants.empty());
    orphaned_claims += static_cast<int64_t>(claimants.size());
    return claimants;
  };
  auto returned_at_once = [&](const std::vector<std::string>& claimants) {
    std::string in;
    for (const auto& c : claimants) in += (in.empty() ? "'" : ", '") + c + "'";
    // Well inside the 60 s lease, and an hour before the wall clock would have caught up.
    EXPECT_TRUE(wait_until(
        [&] {
          return q("SELECT count(*) FROM inbox_messages WHERE status = 'processing' AND claimant "
                   "IN (" +
                   in + ")") == 0;
        },
        5s))
        << "claims of the killed process still held";
  };

  set_wall_offset(kHour / 2);  // stepped forward while the first process runs
  auto dead = kill_while_working(0, 0);
  set_wall_offset(-kHour);  // set back across the kill
  child = start_stp(args(-50'000'000));
  returned_at_once(dead);
  set_wall_offset(2 * kHour);  // forward while the second runs
  dead = kill_while_working(q("SELECT count(*) FROM inbox_messages WHERE status = 'done'"),
                            -50'000'000);
  set_wall_offset(3 * kHour);  // forward across the second kill
  child = start_stp(args(7'000'000));
  returned_at_once(dead);
  set_wall_offset(-2 * kHour);  // back while the last one runs
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") >= n; }, 30s))
      << q("SELECT count(*) FROM ledger_entries") << " of " << n;
  ASSERT_TRUE(wait_until(
      [&] { return q("SELECT count(*) FROM inbox_messages WHERE status <> 'done'") == 0; }, 10s));
  EXPECT_EQ(stop_and_count(*child, "claims_lost"), 0);
  expect_exactly_once_in_order(n, static_cast<int64_t>(n) * (n - 1) / 2);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  // Each orphaned claim charged its running row one attempt; nothing else was charged, so
  // no live claim was returned.
  EXPECT_EQ(q("SELECT sum(attempts) FROM inbox_messages"), n + orphaned_claims);
  EXPECT_EQ(log_count(", 0 without progress for the lease"),
            log_count("claimed row(s) to pending"));
}

// A stream of credits for five accounts runs through receipt and two workers while the
// consumer is SIGKILLed at random moments (during receipt, claims, handlers, commits) and
// restarted. Afterwards: every credit applied exactly once, in received order per account.
TEST_F(StpChildTest, RandomKillsDuringStreamKeepExactlyOnceAndOrder) {
  create_stp_session();
  const int n = 400;
  const std::vector<std::string> args = {"--workers", "2", "--lease-ms",         "600",
                                         "--batch",   "8", "--handler-sleep-ms", "1"};
  std::atomic<bool> published{false};
  std::thread publisher([&] {
    TestPublisher pub(broker_.uri(), true);
    for (int i = 0; i < n; ++i) {
      pub.credit("credits/x", "s-" + std::to_string(i), "acct-" + std::to_string(i % 5), i);
      std::this_thread::sleep_for(std::chrono::microseconds(3000));
    }
    published = true;
  });
  std::mt19937 rng(std::random_device{}());
  int kills = 0;
  for (; kills < 4; ++kills) {
    auto child = start_stp(args);
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 450));
    child->signal(SIGKILL);
    ASSERT_NE(child->wait(10s), -1);
  }
  publisher.join();
  auto last = start_stp(args);
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") >= n; }, 25s))
      << q("SELECT count(*) FROM ledger_entries") << " of " << n;
  ASSERT_TRUE(wait_until(
      [&] { return q("SELECT count(*) FROM inbox_messages WHERE status <> 'done'") == 0; }, 10s));
  stop_count_ = stop_and_count(*last, "duplicates");
  expect_exactly_once_in_order(n, static_cast<int64_t>(n) * (n - 1) / 2);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  // What the kills hit (for the record; random, so not asserted).
  const int64_t expired = q("SELECT count(*) FROM inbox_messages WHERE attempts > 1");
  std::printf(
      "kills=%d rows with an expired claim=%lld reaper passes that returned rows=%zu "
      "duplicates at receipt (last run)=%lld\n",
      kills, static_cast<long long>(expired), log_count("reaped "),
      static_cast<long long>(stop_count_));
  RecordProperty("kills", kills);
}

}  // namespace
}  // namespace mqtt_inbox::test

// Retention on real SQLite files with an injectable clock: the window, the horizon check,
// batched pruning, wall-clock jumps, file and WAL size, stats.
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "mqtt_inbox/outbox.h"
#include "store/retention_rows.h"
#include "store/store.h"
#include "support/fake_clock.h"
#include "support/ledger_fixture.h"
#include "support/relay_side.h"
#include "support/store_access.h"

namespace mqtt_inbox::test {
namespace {

constexpr int64_t kMinute = 60'000;

RetentionOptions short_retention() {
  RetentionOptions r;
  r.broker_session_expiry = std::chrono::minutes(30);
  r.margin = std::chrono::minutes(10);
  r.window = std::chrono::minutes(60);
  r.dead_letter_window = std::chrono::minutes(120);
  r.stats_log_period_ms = 0;
  return r;
}

int64_t file_size(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? st.st_size : 0;
}

class RetentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("inbox.db");
    reopen();
  }
  void reopen() {
    consumers_.clear();
    pruner_.reset();
    inbox_.reset();
    InboxOptions o;
    o.clock = &clock_;
    inbox_ = open_ledger_inbox(db_path_, o);
    ASSERT_TRUE(inbox_);
  }
  Consumer& consumer(const std::string& name) {
    auto& c = consumers_[name];
    if (!c) {
      EXPECT_TRUE(Consumer::create(inbox_.get(), name, ledger::apply_credit, {}, &c).ok());
    }
    return *c;
  }
  Pruner& pruner(RetentionOptions r = short_retention()) {
    if (!pruner_) {
      const Status s = Pruner::create(inbox_.get(), r, &pruner_);
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    return *pruner_;
  }
  PruneResult prune() {
    PruneResult r;
    const Status s = pruner().prune_once(&r);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return r;
  }
  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }
  // Inserts `count` processed ids for consumer 'ledger' in one transaction: id(i), the
  // given received_at and topic (NULL if empty); then checkpoints (TRUNCATE), so file
  // sizes measured afterwards start from an empty WAL.
  void insert_processed(int count, const std::function<std::string(int)>& id,
                        int64_t received_at = 0, const std::string& topic = "") {
    inbox_->with_connection([&](SQLite::Database& db) {
      db.exec("BEGIN");
      SQLite::Statement ins(db,
                            "INSERT INTO inbox_processed (consumer_name, message_id,"
                            " received_at, topic) VALUES ('ledger', ?1, ?2, nullif(?3, ''))");
      for (int i = 0; i < count; ++i) {
        ins.bind(1, id(i));
        ins.bind(2, received_at);
        ins.bind(3, topic);
        ins.exec();
        ins.reset();
      }
      db.exec("COMMIT");
      db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
    });
  }
  static std::string old_id(int i) { return "old-" + std::to_string(i); }

  FakeClock clock_;
  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
  std::map<std::string, std::unique_ptr<Consumer>> consumers_;
  std::unique_ptr<Pruner> pruner_;
};

// Sent outbox rows are kept for the window after their PUBACK and outbox dead letters for
// dead_letter_window, both on the retention clock (a wall-clock jump ages nothing);
// pending rows are never pruned, however old.
TEST_F(RetentionTest, OutboxSentRowsLiveForTheWindowDeadOnesForTheirsPendingOnesForever) {
  std::unique_ptr<Outbox> o;
  ASSERT_TRUE(Outbox::create(inbox_.get(), {}, &o).ok());
  inbox_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    for (const char* id : {"s-1", "s-2", "d-1", "p-1"}) {
      OutgoingMessage m;
      m.topic = "events/x";
      m.payload = id;
      m.message_id = id;
      ASSERT_TRUE(o->enqueue(db, m).ok());
    }
    db.exec("COMMIT");
  });
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*o).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 4u);
  ASSERT_TRUE(relay_side(*o).mark_sent({{rows[0].seq, 1}, {rows[1].seq, 1}}).ok());
  ASSERT_TRUE(relay_side(*o)
                  .mark_dead({rows[2].seq, 1}, OutboxDeadReason::kRejectedByBroker, 0x87, "acl")
                  .ok());

  clock_.wall += 365LL * 24 * 60 * kMinute;  // NTP steps the wall clock a year forward
  clock_.advance(60 * kMinute - 1);
  PruneResult r = prune();
  EXPECT_EQ(r.outbox_sent_deleted, 0);
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages"), 4);
  clock_.advance(2);
  r = prune();
  EXPECT_EQ(r.outbox_sent_deleted, 2);
  EXPECT_EQ(r.outbox_dead_deleted, 0);
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages WHERE state = 'sent'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages WHERE state = 'dead'"), 1);
  clock_.advance(60 * kMinute);  // dead_letter_window (120 min) + 1 ms after the mark
  r = prune();
  EXPECT_EQ(r.outbox_dead_deleted, 1);
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages WHERE state = 'dead'"), 0);
  clock_.advance(24 * 60 * kMinute);
  prune();
  EXPECT_EQ(
      q("SELECT count(*) FROM outbox_messages WHERE state = 'pending' AND message_id = 'p-1'"), 1);
  EXPECT_EQ(q("SELECT rows FROM outbox_usage WHERE class = ''"), 1);
}

// An outbox class's age bound counts on the retention clock: a wall-clock jump of a year
// ages no row; with kDropOldest the rows past max_age_ms are dropped (counted) when the
// next row comes, with kReject the next row is refused while the old one waits.
TEST_F(RetentionTest, OutboxAgeBoundsCountOnTheRetentionClock) {
  OutboxOptions options;
  options.classes.push_back({"telemetry/", 0, 0, OutboxFullPolicy::kDropOldest, 10 * kMinute});
  options.classes.push_back({"results/", 0, 0, OutboxFullPolicy::kReject, 10 * kMinute});
  std::unique_ptr<Outbox> o;
  ASSERT_TRUE(Outbox::create(inbox_.get(), options, &o).ok());
  auto enqueue = [&](const std::string& topic, const std::string& id) {
    Status s;
    inbox_->with_connection([&](SQLite::Database& db) {
      db.exec("BEGIN IMMEDIATE");
      OutgoingMessage m;
      m.topic = topic;
      m.payload = id;
      m.message_id = id;
      s = o->enqueue(db, m);
      db.exec(s.ok() ? "COMMIT" : "ROLLBACK");
    });
    return s;
  };
  ASSERT_TRUE(enqueue("telemetry/t", "t-1").ok());
  ASSERT_TRUE(enqueue("results/r", "r-1").ok());
  clock_.advance(5 * kMinute);
  ASSERT_TRUE(enqueue("telemetry/t", "t-2").ok());
  clock_.wall += 365LL * 24 * 60 * kMinute;  // a wall-clock step ages nothing
  ASSERT_TRUE(enqueue("telemetry/t", "t-3").ok());
  ASSERT_TRUE(enqueue("results/r", "r-2").ok());
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages WHERE state = 'pending'"), 5);

  {  // The relay counts a message's expiry with waited_ms: the retention clock, not the
     // wall clock, which was just stepped a year.
    std::vector<OutboxRow> waiting;
    ASSERT_TRUE(o->list(OutboxState::kPending, 10, &waiting).ok());
    ASSERT_EQ(waiting.size(), 5u);
    EXPECT_EQ(waiting[0].message_id, "t-1");
    EXPECT_EQ(waiting[0].waited_ms, 5 * kMinute);
    EXPECT_EQ(waiting[4].waited_ms, 0);
  }
  clock_.advance(5 * kMinute + 1);  // t-1 and r-1 are now past 10 minutes
  ASSERT_TRUE(enqueue("telemetry/t", "t-4").ok());
  SQLite::Database db(db_path_, SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("SELECT group_concat(message_id, ',') FROM (SELECT message_id FROM "
                          "outbox_messages WHERE class = 'telemetry/' ORDER BY seq)")
                .getString(),
            "t-2,t-3,t-4");
  EXPECT_EQ(q("SELECT dropped FROM outbox_usage WHERE class = 'telemetry/'"), 1);
  EXPECT_EQ(q("SELECT rows FROM outbox_usage WHERE class = 'telemetry/'"), 3);
  EXPECT_EQ(o->counters().dropped, 1);

  const Status refused = enqueue("results/r", "r-3");
  EXPECT_EQ(refused.code(), Status::Code::kRejected) << refused.to_string();
  EXPECT_NE(refused.message().find("max_age_ms"), std::string::npos) << refused.message();
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages WHERE class = 'results/'"), 2);
  // Once the old row is sent, the class takes rows again.
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*o).fetch_pending(0, 100, &rows).ok());
  for (const auto& r : rows)
    if (r.message_id == "r-1") {
      ASSERT_TRUE(relay_side(*o).mark_sent({{r.seq, 1}}).ok());
    }
  EXPECT_TRUE(enqueue("results/r", "r-3").ok());
  EXPECT_EQ(
      q("SELECT count(*) FROM outbox_messages WHERE class = 'results/' AND state = 'pending'"), 2);

  // The same figures in the stats and the Prometheus textfile.
  ASSERT_TRUE(inbox_->refresh_row_stats().ok());
  const InboxStats st = inbox_->stats();
  EXPECT_EQ(st.outbox.classes.at("telemetry/").pending_rows, 3);
  EXPECT_EQ(st.outbox.classes.at("telemetry/").dropped, 1);
  EXPECT_EQ(st.outbox.classes.at("results/").pending_rows, 2);
  EXPECT_EQ(st.outbox.sent_rows, 1);
  EXPECT_EQ(st.outbox.dead_rows, 0);
  EXPECT_EQ(st.outbox.oldest_pending_age_ms, 5 * kMinute + 1);  // t-2, enqueued at 5 min
  OutboxSummary sum;  // the admin tool's figure is the same, on the same clock
  ASSERT_TRUE(o->summary(&sum).ok());
  EXPECT_EQ(sum.oldest_pending_waited_ms, 5 * kMinute + 1);
  const std::string text = prometheus_text(st);
  for (const char* line : {"mqtt_inbox_outbox_pending_rows{class=\"telemetry/\"} 3\n",
                           "mqtt_inbox_outbox_dropped_total{class=\"telemetry/\"} 1\n",
                           "mqtt_inbox_outbox_pending_rows{class=\"results/\"} 2\n",
                           "mqtt_inbox_outbox_sent_rows 1\n", "mqtt_inbox_outbox_dead_rows 0\n",
                           "mqtt_inbox_outbox_oldest_pending_age_seconds 300.001\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
}

TEST_F(RetentionTest, DuplicateJustInsideWindowIsCaught) {
  EXPECT_EQ(consumer("ledger").handle(credit_message("m-1", "a", 5)), Outcome::kProcessed);
  clock_.advance(60 * kMinute - 1);
  EXPECT_EQ(prune().processed_deleted, 0);
  EXPECT_EQ(consumer("ledger").handle(credit_message("m-1", "a", 5)), Outcome::kDuplicate);
  EXPECT_EQ(q("SELECT balance FROM accounts"), 5);
}

// The documented consequence of a window that is too short for a redelivery: after the
// window the id is forgotten and the same message is applied again.
TEST_F(RetentionTest, RedeliveryAfterWindowIsProcessedAgain) {
  EXPECT_EQ(consumer("ledger").handle(credit_message("m-1", "a", 5)), Outcome::kProcessed);
  clock_.advance(60 * kMinute + 1);
  EXPECT_EQ(prune().processed_deleted, 1);
  EXPECT_EQ(consumer("ledger").handle(credit_message("m-1", "a", 5)), Outcome::kProcessed);
  EXPECT_EQ(q("SELECT balance FROM accounts"), 10);
}

TEST_F(RetentionTest, PrunesExactlyTheExpiredRowsAcrossConsumers) {
  for (int i = 0; i < 10; ++i) {
    consumer("billing").handle(credit_message("b-" + std::to_string(i), "a", 1));
    consumer("audit").handle(credit_message("b-" + std::to_string(i), "a", 1));
    clock_.advance(10 * kMinute);  // rows at 0, 10, ..., 90 minutes
  }
  Message bad;
  bad.topic = "t";
  bad.payload = "{}";
  consumer("audit").handle(bad);  // a dead letter at 100 min: untouched by the id window
  // Now at 100 min: rows older than 40 min (0, 10, 20, 30) expire, 40 stays (not older).
  const PruneResult r = prune();
  EXPECT_EQ(r.processed_deleted, 8);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE consumer_name = 'billing'"), 6);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE consumer_name = 'audit'"), 6);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE message_id IN ('b-3', 'b-4')"), 2);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 1);
  const InboxStats s = inbox_->stats();
  EXPECT_EQ(s.pruned, 8);
  EXPECT_EQ(s.consumers.at("billing").rows, 6);
}

TEST_F(RetentionTest, WindowBelowHorizonIsRefusedOrWarnsWhenOverridden) {
  RetentionOptions r = short_retention();
  r.window = std::chrono::minutes(39);  // horizon 30 + margin 10 = 40
  std::unique_ptr<Pruner> p;
  Status s = Pruner::create(inbox_.get(), r, &p);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("horizon"), std::string::npos) << s.message();

  r.max_offline = std::chrono::hours(2);  // the horizon is the longer of the two
  r.window = std::chrono::minutes(60);
  EXPECT_EQ(Pruner::create(inbox_.get(), r, &p).code(), Status::Code::kInvalidArgument);

  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  auto log = std::make_shared<spdlog::logger>("retention-test", ring);
  InboxOptions o;
  o.clock = &clock_;
  o.logger = log;
  inbox_.reset();
  inbox_ = open_ledger_inbox(db_path_, o);
  r.allow_window_below_horizon = true;
  ASSERT_TRUE(Pruner::create(inbox_.get(), r, &p).ok());
  int warnings = 0;
  for (const auto& line : ring->last_formatted())
    if (line.find("RETENTION OVERRIDE") != std::string::npos) ++warnings;
  EXPECT_EQ(warnings, 1);
  EXPECT_EQ(q("SELECT value FROM inbox_meta WHERE key = 'required_window_ms'"), 130 * kMinute);
}

// A gateway boots at 1970, processes messages, then NTP steps the wall clock 56 years
// forward; later an operator sets it a day back; then it restarts. None of this may
// expire a row early: only running time counts.
TEST_F(RetentionTest, WallClockJumpsNeverExpireRowsEarly) {
  clock_.wall = 5'000;  // 1970
  reopen();
  for (int i = 0; i < 5; ++i)
    consumer("ledger").handle(credit_message("j-" + std::to_string(i), "a", 1));
  clock_.wall += 56LL * 365 * 24 * 60 * kMinute;  // NTP sync
  clock_.advance(kMinute);
  EXPECT_EQ(prune().processed_deleted, 0);
  clock_.wall -= 24 * 60 * kMinute;  // set back a day
  clock_.advance(kMinute);
  EXPECT_EQ(prune().processed_deleted, 0);
  EXPECT_EQ(consumer("ledger").handle(credit_message("j-0", "a", 1)), Outcome::kDuplicate);

  // Restart: the monotonic clock starts over; the retention clock continues.
  consumers_.clear();
  pruner_.reset();
  inbox_.reset();
  clock_.steady = 7;
  reopen();
  EXPECT_EQ(prune().processed_deleted, 0);
  clock_.advance(57 * kMinute);  // 59 min of running time in all: still inside
  EXPECT_EQ(prune().processed_deleted, 0);
  clock_.advance(2 * kMinute);
  EXPECT_EQ(prune().processed_deleted, 5);
}

TEST_F(RetentionTest, PassBudgetLeavesTheRestForTheNextPass) {
  insert_processed(3000, old_id);
  RetentionOptions r = short_retention();
  r.batch_rows = 100;
  r.pass_budget = std::chrono::milliseconds(1);
  r.batch_pause = std::chrono::milliseconds(2);  // on the injected clock: spends the budget
  pruner(r);
  clock_.advance(61 * kMinute);
  int passes = 0;
  int64_t deleted = 0;
  for (;;) {
    const PruneResult pr = prune();
    ++passes;
    deleted += pr.processed_deleted;
    EXPECT_LE(pr.processed_deleted, 100);  // one batch per pass: the budget is respected
    if (!pr.budget_exhausted) break;
    ASSERT_LT(passes, 100);
  }
  EXPECT_GE(passes, 30);
  EXPECT_EQ(deleted, 3000);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 0);
}

// The store's side of a pass (store/retention_rows.h) as the Pruner drives it, which any
// store must meet (a PostgreSQL store runs the same case): batches of at most `limit`
// expired claims, one write each; fewer than `limit` found means none are left; a row at
// or after the cutoff is never touched; a walk that reached the end starts over.
TEST_F(RetentionTest, StoreSweepDeletesExpiredClaimsBatchByBatchAndNothingElse) {
  insert_processed(7, old_id, /*received_at=*/100);
  insert_processed(
      3, [](int i) { return "fresh-" + std::to_string(i); }, 200);
  insert_processed(
      1, [](int) { return std::string("at-cutoff"); }, 150);
  std::unique_ptr<detail::RetentionSweep> sweep;
  ASSERT_TRUE(store_of(*inbox_).retention_rows().open_sweep({}, &sweep).ok());
  auto sweep_all = [&](std::vector<int64_t>* found, int64_t* deleted) {
    *deleted = 0;
    for (int i = 0; i < 10; ++i) {
      detail::RetentionBatch b;
      ASSERT_TRUE(sweep->delete_expired_claims(/*cutoff=*/150, /*limit=*/3, &b).ok());
      ASSERT_LE(b.found, 3);
      if (!b.wrote) {
        EXPECT_EQ(b.found, 0);
        EXPECT_EQ(b.deleted, 0);
        return;
      }
      found->push_back(b.found);
      *deleted += b.deleted;
      sweep->after_batch();
      if (b.found < 3) return;
    }
    ADD_FAILURE() << "the walk did not end";
  };
  std::vector<int64_t> found;
  int64_t deleted = 0;
  sweep_all(&found, &deleted);
  EXPECT_EQ(found, (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(deleted, 7);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE received_at < 150"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 4);

  insert_processed(
      1, [](int) { return std::string("a-late-one"); }, 100);  // sorts first
  found.clear();
  sweep_all(&found, &deleted);
  EXPECT_EQ(found, (std::vector<int64_t>{1}));
  EXPECT_EQ(deleted, 1);
  sweep->finish_pass();
  ASSERT_TRUE(sweep->measure_rows().ok());
  EXPECT_EQ(inbox_->stats().consumers.at("ledger").rows, 4);
}

TEST_F(RetentionTest, LargePruneWithIncrementalVacuumShrinksTheFile) {
  insert_processed(
      50000, [](int i) { return "0f8e7d6c-5b4a-3928-1706-" + std::to_string(100000000 + i); }, 0,
      "sensors/some/longer/topic");
  const int64_t before = file_size(db_path_);
  ASSERT_GT(before, 2 * 1024 * 1024);
  RetentionOptions r = short_retention();
  r.batch_rows = 5000;
  r.pass_budget = std::chrono::hours(1);
  pruner(r);
  clock_.advance(61 * kMinute);
  clock_.steady += r.period.count();  // idle: the pass checkpoints with TRUNCATE
  const PruneResult pr = prune();
  EXPECT_EQ(pr.processed_deleted, 50000);
  EXPECT_GT(pr.pages_freed, 100);
  const int64_t after = file_size(db_path_);
  EXPECT_LT(after, before / 4) << "before " << before << " after " << after;
  EXPECT_EQ(file_size(db_path_ + "-wal"), 0);
}

// A steady stream with another connection reading all the time: checkpoints still run
// between the reader's short transactions, and the WAL stays bounded.
TEST_F(RetentionTest, WalStaysBoundedWithAReaderAttached) {
  consumers_.clear();
  inbox_.reset();
  InboxOptions o;
  o.clock = &clock_;
  o.synchronous = Synchronous::kNormal;  // the WAL's size, not fsync, is under test
  o.wal_autocheckpoint_pages = 200;
  o.journal_size_limit_bytes = 1024 * 1024;
  inbox_ = open_ledger_inbox(db_path_, o);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reads{0};
  std::thread reader([&] {
    SQLite::Database db(db_path_, SQLite::OPEN_READONLY);
    while (!stop) {
      db.execAndGet("SELECT count(*) FROM inbox_processed").getInt64();
      ++reads;
    }
  });
  int64_t max_wal = 0;
  for (int i = 0; i < 4000; ++i) {
    consumer("ledger").handle(
        credit_message("w-" + std::to_string(i), "acct-" + std::to_string(i % 50), 1));
    if (i % 100 == 0) max_wal = std::max(max_wal, file_size(db_path_ + "-wal"));
  }
  stop = true;
  reader.join();
  EXPECT_GT(reads.load(), 10);
  // A reader in a tight loop delays WAL resets, so the file can outgrow one checkpoint
  // interval (800 KiB here); it must stay within a multiple, not grow with the ~100 MiB
  // written through it. On a loaded machine the reader's snapshots last longer and the
  // WAL was seen at 9 MiB, hence the 16 MiB bound: still a sixth of what went through.
  EXPECT_LT(max_wal, 16 * 1024 * 1024) << "WAL grew to " << max_wal;
  clock_.steady += 60'001;  // idle
  prune();
  EXPECT_LE(file_size(db_path_ + "-wal"), 1024 * 1024);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 4000);
}

// Deleting ids scattered over the primary key dirties pages all over it. The pruner
// checkpoints on its own connection after each batch, so the WAL stays about one batch
// long even when nothing else checkpoints (autocheckpoint off here); without those
// checkpoints the same pass grows it by every page it touched.
TEST_F(RetentionTest, CheckpointsBetweenBatchesKeepTheWalShort) {
  auto run = [&](bool checkpoint) {
    consumers_.clear();
    pruner_.reset();
    inbox_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::remove((db_path_ + suffix).c_str());
    InboxOptions o;
    o.clock = &clock_;
    o.wal_autocheckpoint_pages = 0;
    o.journal_size_limit_bytes = -1;  // the WAL file keeps its high-water mark
    inbox_ = open_ledger_inbox(db_path_, o);
    const int64_t received_at = inbox_->retention_clock_ms() - 1;
    uint64_t x = 88172645463325252ull;
    insert_processed(
        20000,
        [&x](int) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift: ids spread over the key
          return std::to_string(x);
        },
        received_at);
    RetentionOptions r = short_retention();
    r.batch_rows = 500;
    r.max_batch_ms = 1000;  // fixed 500-row batches, whatever the machine's speed
    r.pass_budget = std::chrono::hours(1);
    r.checkpoint = checkpoint;
    pruner(r);
    clock_.advance(61 * kMinute);
    // A fresh claim: the inbox is not idle, so the pass ends with PASSIVE, not TRUNCATE,
    // and the WAL file shows its high-water mark.
    EXPECT_EQ(consumer("ledger").handle(credit_message("fresh", "acct-1", 1)), Outcome::kProcessed);
    const PruneResult pr = prune();
    EXPECT_EQ(pr.processed_deleted, 20000);
    EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 1);
    return file_size(db_path_ + "-wal");
  };
  const int64_t without = run(false);
  const int64_t with = run(true);
  std::printf("WAL high-water mark: %lld bytes without, %lld with checkpoints between batches\n",
              static_cast<long long>(without), static_cast<long long>(with));
  // Since schema version 4 the pass deletes in key order (a batch shares leaf pages), so
  // it dirties far fewer pages than the time-ordered deletes this was first written for.
  EXPECT_GT(without, 1024 * 1024) << "the pass should have dirtied many pages";
  EXPECT_LT(with * 4, without) << "with " << with << " without " << without;
}

// The background thread (start/stop) prunes a backlog while another thread applies a
// stream: every new message is applied once, only expired ids go, and stop() joins.
// Under ThreadSanitizer (scripts/test.sh) this is the pruner's race check.
TEST_F(RetentionTest, BackgroundPrunerWorksAlongsideAStream) {
  insert_processed(5000, old_id);
  clock_.advance(61 * kMinute);
  RetentionOptions r = short_retention();
  r.period = std::chrono::milliseconds(5);
  r.batch_rows = 200;
  r.pass_budget = std::chrono::milliseconds(20);  // several passes: the backlog path
  pruner(r);
  ASSERT_TRUE(pruner_->start().ok());
  EXPECT_FALSE(pruner_->start().ok());  // already started
  for (int i = 0; i < 400; ++i)
    ASSERT_EQ(consumer("ledger").handle(credit_message("new-" + std::to_string(i), "acct-1", 2)),
              Outcome::kProcessed);
  for (int i = 0; i < 2000 && q("SELECT count(*) FROM inbox_processed WHERE message_id"
                                " LIKE 'old-%'") > 0;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  pruner_->stop();
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE message_id LIKE 'old-%'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE message_id LIKE 'new-%'"), 400);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct-1'"), 800);
  EXPECT_EQ(inbox_->stats().pruned, 5000);
}

TEST_F(RetentionTest, DeadLettersHaveTheirOwnRetention) {
  Message bad;
  bad.topic = "t";
  bad.payload = "{}";
  consumer("ledger").handle(bad);
  clock_.advance(61 * kMinute);
  consumer("ledger").handle(credit_message("fresh", "a", 1));
  EXPECT_EQ(prune().dead_letters_deleted, 0);  // 61 min < 120 min
  clock_.advance(60 * kMinute + 1);
  const PruneResult r = prune();
  EXPECT_EQ(r.dead_letters_deleted, 1);
  EXPECT_EQ(r.processed_deleted, 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
}

// A 'requeued' dead letter is a message still to apply (its PUBACK has gone): however
// old, no pass deletes it, while a 'dead' one of the same age goes at its window.
TEST_F(RetentionTest, RequeuedDeadLettersAreNeverPruned) {
  for (const char* id : {"dl-dead", "dl-requeued"}) {
    Message bad;  // an id, but no account: undecodable, dead-lettered at once
    bad.topic = "t";
    bad.payload = std::string("{\"message_id\":\"") + id + "\"}";
    EXPECT_EQ(consumer("ledger").handle(bad), Outcome::kDeadLettered);
  }
  consumers_.clear();  // no running Consumer replays the requeued one
  std::vector<DeadLetter> letters;
  ASSERT_TRUE(inbox_->list_dead_letters({}, &letters).ok());
  ASSERT_EQ(letters.size(), 2u);
  for (const DeadLetter& dl : letters) {
    if (dl.message_id == std::optional<std::string>("dl-requeued")) {
      ASSERT_TRUE(inbox_->requeue_dead_letter(dl.id).ok());
    }
  }
  clock_.advance(365LL * 24 * 60 * kMinute);  // a year: far past dead_letter_window
  EXPECT_EQ(prune().dead_letters_deleted, 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE status = 'requeued'"
              " AND message_id = 'dl-requeued'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 1);
  EXPECT_EQ(prune().dead_letters_deleted, 0);
}

// Rows are counted by a measurement (a Pruner pass, Pruner::start, refresh_row_stats);
// before one, the summary line says "unknown" instead of a 0 that reads as "empty".
TEST_F(RetentionTest, RowsAreUnknownUntilMeasuredAndPrunerStartMeasuresAtOnce) {
  for (int i = 0; i < 3; ++i)
    consumer("ledger").handle(credit_message("u-" + std::to_string(i), "a", 1));
  InboxStats s = inbox_->stats();
  EXPECT_EQ(s.rows_measured_at, 0);
  EXPECT_NE(summary_line(s).find(" rows=unknown "), std::string::npos) << summary_line(s);
  EXPECT_EQ(prometheus_text(s).find("mqtt_inbox_rows{"), std::string::npos);

  // The first pass is an hour away: the count can only come from start() itself.
  RetentionOptions r = short_retention();
  r.period = std::chrono::hours(1);
  ASSERT_TRUE(pruner(r).start().ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (inbox_->stats().rows_measured_at == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s = inbox_->stats();
  pruner_->stop();
  EXPECT_NE(s.rows_measured_at, 0);
  EXPECT_EQ(s.consumers.at("ledger").rows, 3);
  EXPECT_EQ(s.pruned, 0);
  EXPECT_NE(summary_line(s).find(" rows=3 "), std::string::npos) << summary_line(s);
  EXPECT_NE(prometheus_text(s).find("mqtt_inbox_rows{consumer=\"ledger\"} 3\n"), std::string::npos);
}

TEST_F(RetentionTest, AMeasuredEmptyInboxHasZeroRowsNotUnknown) {
  EXPECT_NE(summary_line(inbox_->stats()).find(" rows=unknown "), std::string::npos);
  ASSERT_TRUE(inbox_->refresh_row_stats().ok());
  const InboxStats s = inbox_->stats();
  EXPECT_NE(s.rows_measured_at, 0);
  EXPECT_TRUE(s.consumers.empty());
  EXPECT_NE(summary_line(s).find(" rows=0 "), std::string::npos) << summary_line(s);
}

TEST_F(RetentionTest, StatsSnapshotAndExports) {
  for (int i = 0; i < 20; ++i)
    consumer("ledger").handle(credit_message("s-" + std::to_string(i % 15), "a", 1));
  RetentionOptions r = short_retention();
  r.prometheus_textfile = dir_.file("mqtt_inbox.prom");
  pruner(r);
  prune();
  const InboxStats s = inbox_->stats();
  EXPECT_EQ(s.processed, 15);
  EXPECT_EQ(s.duplicates, 5);
  EXPECT_DOUBLE_EQ(s.duplicate_ratio, 0.25);
  EXPECT_GT(s.commit_p50_us, 0);
  EXPECT_GE(s.commit_p99_us, s.commit_p50_us);
  EXPECT_GE(s.commit_max_us, s.commit_p99_us);
  EXPECT_GT(s.db_bytes, 0);
  EXPECT_EQ(s.schema_version, kSchemaVersion);
  EXPECT_EQ(s.consumers.at("ledger").rows, 15);
  const std::string line = summary_line(s);
  EXPECT_NE(line.find("processed=15 duplicates=5 (25.0%)"), std::string::npos) << line;
  std::ifstream f(r.prometheus_textfile);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("mqtt_inbox_processed_total 15\n"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("mqtt_inbox_rows{consumer=\"ledger\"} 15\n"), std::string::npos);
}

}  // namespace
}  // namespace mqtt_inbox::test

namespace mqtt_inbox::test {
namespace {

constexpr int64_t kDay = 24 * 60 * kMinute;

SessionRecord session_of(const std::string& client_id, int64_t expiry_ms,
                         SessionExpirySource source = SessionExpirySource::kRequested) {
  SessionRecord r;
  r.client_id = client_id;
  r.topic_filters = {"credits/#"};
  r.session_expiry_ms = expiry_ms;
  r.expiry_source = source;
  return r;
}

// Issue 18: one source of truth for the session expiry. A subscriber that asks for a
// 30-day session records it in the inbox (as the MQTT Subscriber does before it
// connects); a Pruner with the default options (7-day declared horizon, 8-day window) is
// then refused, whether the expiry was requested (MQTT 5) or declared (MQTT 3.1.1).
TEST_F(RetentionTest, ThirtyDaySessionWithDefaultRetentionIsRefused) {
  std::unique_ptr<Pruner> p;
  ASSERT_TRUE(Pruner::create(inbox_.get(), RetentionOptions{}, &p).ok());  // nothing recorded yet
  p.reset();
  for (const SessionExpirySource source :
       {SessionExpirySource::kRequested, SessionExpirySource::kDeclared}) {
    ASSERT_TRUE(inbox_->sessions().record(session_of("gw-17", 30 * kDay, source)).ok());
    const Status s = Pruner::create(inbox_.get(), RetentionOptions{}, &p);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << to_string(source);
    EXPECT_FALSE(p);
    EXPECT_NE(s.message().find("client 'gw-17'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(to_string(source)), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("720.0 h"), std::string::npos) << s.message();
  }
  int64_t required = 0;
  std::string why;
  ASSERT_TRUE(Pruner::required_window_ms(inbox_.get(), RetentionOptions{}, &required, &why).ok());
  EXPECT_EQ(required, 30 * kDay + 60 * kMinute);  // + the default 1 h margin

  // A window that covers it is accepted; so is the default window for a 7-day session.
  RetentionOptions covering;
  covering.window = std::chrono::hours(31 * 24);
  EXPECT_TRUE(Pruner::create(inbox_.get(), covering, &p).ok());
  ASSERT_TRUE(inbox_->sessions().record(session_of("gw-17", 7 * kDay)).ok());
  EXPECT_TRUE(Pruner::create(inbox_.get(), RetentionOptions{}, &p).ok());

  // The longest record binds, whichever client id it belongs to; forgetting a retired
  // client id releases it.
  ASSERT_TRUE(inbox_->sessions().record(session_of("old-gw", 30 * kDay)).ok());
  EXPECT_EQ(Pruner::create(inbox_.get(), RetentionOptions{}, &p).code(),
            Status::Code::kInvalidArgument);
  bool removed = false;
  ASSERT_TRUE(inbox_->sessions().forget("old-gw", &removed).ok());
  EXPECT_TRUE(removed);
  EXPECT_TRUE(Pruner::create(inbox_.get(), RetentionOptions{}, &p).ok());

  // "Never expires" (MQTT 5 0xFFFFFFFF s) is covered by no finite window.
  ASSERT_TRUE(inbox_->sessions().record(session_of("gw-17", 0xFFFFFFFFLL * 1000)).ok());
  RetentionOptions year;
  year.window = std::chrono::hours(366 * 24);
  EXPECT_EQ(Pruner::create(inbox_.get(), year, &p).code(), Status::Code::kInvalidArgument);
}

// The subscriber records its session when it connects, usually after the application
// made its Pruner: every pass checks again. A pass whose window no longer covers a
// recorded session deletes nothing (the expired ids stay, so their redeliveries are
// still caught), logs an error and returns kInvalidArgument; once the record is covered
// again, the pass prunes. With the override it prunes, with one warning per requirement.
TEST_F(RetentionTest, SessionRecordedAfterThePrunerWasMadeStopsEveryPass) {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto log = std::make_shared<spdlog::logger>("retention-session-test", ring);
  InboxOptions o;
  o.clock = &clock_;
  o.logger = log;
  inbox_.reset();
  inbox_ = open_ledger_inbox(db_path_, o);
  insert_processed(50, old_id, /*received_at=*/0);  // far older than any window

  std::unique_ptr<Pruner> p;
  ASSERT_TRUE(Pruner::create(inbox_.get(), RetentionOptions{}, &p).ok());
  ASSERT_TRUE(inbox_->sessions().record(session_of("gw-17", 30 * kDay)).ok());
  for (int pass = 0; pass < 2; ++pass) {
    PruneResult r;
    const Status s = p->prune_once(&r);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("gw-17"), std::string::npos) << s.message();
    EXPECT_EQ(r.processed_deleted, 0);
  }
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 50);
  int refusals = 0;
  for (const auto& line : ring->last_formatted())
    if (line.find("RETENTION REFUSED, nothing deleted") != std::string::npos) ++refusals;
  EXPECT_EQ(refusals, 2);
  // A redelivery of one of them is still a duplicate.
  Message again = credit_message("old-7", "a", 5);
  EXPECT_EQ(consumer("ledger").handle(again), Outcome::kDuplicate);
  EXPECT_EQ(q("SELECT count(*) FROM accounts"), 0);

  // Back to a 7-day session: the default window covers it again.
  ASSERT_TRUE(inbox_->sessions().record(session_of("gw-17", 7 * kDay)).ok());
  PruneResult r;
  ASSERT_TRUE(p->prune_once(&r).ok());
  EXPECT_EQ(r.processed_deleted, 50);

  // The override prunes below the record, warning once per requirement.
  insert_processed(10, old_id, 0);
  ASSERT_TRUE(inbox_->sessions().record(session_of("gw-17", 30 * kDay)).ok());
  RetentionOptions overridden;
  overridden.allow_window_below_horizon = true;
  overridden.stats_log_period_ms = 0;
  p.reset();
  ASSERT_TRUE(Pruner::create(inbox_.get(), overridden, &p).ok());
  ASSERT_TRUE(p->prune_once(&r).ok());
  EXPECT_EQ(r.processed_deleted, 10);
  ASSERT_TRUE(p->prune_once(&r).ok());
  int overrides = 0;
  for (const auto& line : ring->last_formatted())
    if (line.find("RETENTION OVERRIDE") != std::string::npos &&
        line.find("gw-17") != std::string::npos)
      ++overrides;
  EXPECT_EQ(overrides, 1);
}

}  // namespace
}  // namespace mqtt_inbox::test

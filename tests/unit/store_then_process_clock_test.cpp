// Store-then-process against clock steps, on real SQLite files with an injectable clock
// (no broker): the reaper returns a claim only after a lease without progress on the
// monotonic clock, whatever the wall clock does; claims of a process that is gone come
// back at once under the exclusive lock; a worker whose claim was returned is fenced off by
// the row's claim token (its late commit, failure or dead letter changes nothing); retries
// and retention count on the retention clock. The crash-and-restart cases with a real
// broker and SIGKILL are in store_then_process_test.cpp. The store's side of it
// (store/stp_rows.h) is also tested on its own here: the offer a claim makes and the token
// that fences every write.
#include <mqtt_inbox/store_then_process.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "store/retry.h"
#include "store/sqlite/schema.h"
#include "store/store.h"
#include "store/stp_rows.h"
#include "support/fake_clock.h"
#include "support/ledger_fixture.h"
#include "support/store_access.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

// The expiry decision a worker session asks before marking a row done: never, here.
const auto kNeverExpired = [] { return false; };

constexpr int64_t kLease = 10'000;
constexpr int64_t kHour = 3'600'000;
constexpr int64_t kDay = 24 * kHour;

// A door the test holds shut: a worker that reaches it waits until it is opened.
class Gate {
 public:
  void pass() {
    std::unique_lock<std::mutex> lock(mu_);
    arrived_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  bool wait_arrived(std::chrono::milliseconds t = 10s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, t, [&] { return arrived_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool arrived_ = false, open_ = false;
};

void record_run(SQLite::Database& db, const StoredDelivery& d) {
  SQLite::Statement q(db, "INSERT INTO runs (device, message_id, attempt) VALUES (?1, ?2, ?3)");
  q.bind(1, d.aggregate_key);
  q.bind(2, d.message_id);
  q.bind(3, d.attempt);
  q.exec();
}

Message reading(const std::string& device, const std::string& id) {
  Message m;
  m.topic = "sensors/" + device + "/reading";
  m.payload = "{\"message_id\":\"" + id + "\",\"value\":1}";
  return m;
}

std::vector<std::string> column(const std::string& db_path, const std::string& sql) {
  SQLite::Database db(db_path, SQLite::OPEN_READONLY, 5000);
  SQLite::Statement q(db, sql);
  std::vector<std::string> out;
  while (q.executeStep()) out.push_back(q.getColumn(0).getString());
  return out;
}

class StpClockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("stp.db");
    open_inbox();
  }
  void TearDown() override {
    stps_.clear();
    inbox_.reset();
  }

  void open_inbox(bool exclusive = true) {
    stps_.clear();
    inbox_.reset();
    InboxOptions o;
    o.clock = &clock_;
    o.exclusive = exclusive;
    const Status s = Inbox::open(db_path_, o, &inbox_);
    ASSERT_TRUE(s.ok()) << s.to_string();
    inbox_->with_connection([](SQLite::Database& db) {
      db.exec(
          "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, device TEXT NOT NULL,"
          " message_id TEXT NOT NULL, attempt INTEGER NOT NULL)");
    });
  }

  // The pool reaps only at start and when the test calls reap(): fake time moves only when
  // the test moves it, so every reaper decision below is the test's.
  StoreThenProcessOptions options() {
    StoreThenProcessOptions o;
    o.consumer.retry_backoff_initial = 1000ms;
    o.consumer.retry_backoff_max = 2000ms;
    o.consumer.store_backoff_initial = 5ms;
    o.consumer.store_backoff_max = 50ms;
    o.aggregate_key = aggregate_key_from_topic_level(1);
    o.poll_interval_ms = 10;
    o.workers = 1;
    o.batch_size = 4;
    o.lease_ms = kLease;
    o.reap_interval_ms = 1000 * kHour;
    o.prune_interval_ms = 0;
    return o;
  }

  StoreThenProcess& make(StoredHandler h, const StoreThenProcessOptions& o) {
    std::unique_ptr<StoreThenProcess> s;
    const Status st = StoreThenProcess::create(inbox_.get(), "sensors", std::move(h), o, &s);
    EXPECT_TRUE(st.ok()) << st.to_string();
    stps_.push_back(std::move(s));
    return *stps_.back();
  }

  int64_t reap(StoreThenProcess& stp) {
    int64_t n = -1;
    const Status s = stp.reap(&n);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return n;
  }

  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }
  bool wait_settled(std::chrono::milliseconds t = 10s) {
    return wait_until(
        [&] {
          return q("SELECT count(*) FROM inbox_messages WHERE status IN "
                   "('pending','processing')") == 0;
        },
        t);
  }
  // A crashed process's batch as it leaves it: rows 'processing' under its claimant.
  void claim_as_dead_process(const std::string& where, const std::string& claimant) {
    inbox_->with_connection([&](SQLite::Database& db) {
      SQLite::Statement u(db,
                          "UPDATE inbox_messages SET status = 'processing', claimant = ?1,"
                          " claimed_at = ?2, claim_token = claim_token + 1 WHERE " +
                              where);
      u.bind(1, claimant);
      u.bind(2, clock_.wall_ms());
      u.exec();
    });
  }

  FakeClock clock_;
  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
  std::vector<std::unique_ptr<StoreThenProcess>> stps_;
};

// A worker hangs in its row. Wall-clock steps of a day either way and lease - 1 ms of
// monotonic time do not return its claim; one more ms does (the running row charged one
// attempt), and the hung worker, once it wakes, finds its claim gone and commits nothing.
TEST_F(StpClockTest, ReaperReturnsAClaimOnlyAfterALeaseWithoutProgressWhateverTheWallClock) {
  Gate gate;
  std::atomic<int> hook_calls{0};
  auto o = options();
  o.before_handler_hook = [&](const std::string& id) {
    if (id == "hung" && hook_calls++ == 0) gate.pass();
  };
  StoreThenProcess& stp = make(record_run, o);
  ASSERT_EQ(stp.handle(reading("a", "hung")), Outcome::kProcessed);
  ASSERT_EQ(stp.handle(reading("a", "after")), Outcome::kProcessed);
  ASSERT_TRUE(stp.start().ok());
  ASSERT_TRUE(gate.wait_arrived());

  EXPECT_EQ(reap(stp), 0);  // the reaper has seen the claim now
  clock_.wall += kDay;      // NTP steps the clock a day forward
  EXPECT_EQ(reap(stp), 0);
  clock_.wall -= 2 * kDay;  // an operator sets it back two days
  EXPECT_EQ(reap(stp), 0);
  clock_.steady += kLease - 1;
  EXPECT_EQ(reap(stp), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'processing'"), 2);
  EXPECT_EQ(q("SELECT sum(attempts) FROM inbox_messages"), 0);

  clock_.steady += 1;
  clock_.wall -= kHour;
  EXPECT_EQ(reap(stp), 2);  // the whole batch; only the running row is charged
  EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'hung'"), 1);
  EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'after'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'hung'"
              " AND last_error LIKE 'claim expired%no progress%'"),
            1);

  gate.open();
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp.stop().ok());
  EXPECT_EQ(column(db_path_, "SELECT message_id || ':' || attempt FROM runs ORDER BY id"),
            (std::vector<std::string>{"hung:2", "after:1"}));
  EXPECT_EQ(stp.counters().claims_lost, 1);
  EXPECT_EQ(stp.counters().reaped, 2);
}

// A worker that makes progress is never reaped, however far the wall clock jumps while it
// works: each row takes lease - 1 ms of monotonic time and steps the wall clock a day
// forward or back, and the reaper runs all the while.
TEST_F(StpClockTest, LiveWorkersMakingProgressAreNeverReaped) {
  auto o = options();
  o.reap_interval_ms = 1;  // the maintenance thread reaps whenever fake time has moved
  std::atomic<int> rows{0};
  o.prepare = [&](const StoredDelivery&) -> std::any {
    clock_.wall += (rows++ % 2 ? -kDay : kDay);
    clock_.steady += kLease - 1;
    std::this_thread::sleep_for(5ms);  // let the reaper look while the row runs
    return {};
  };
  StoreThenProcess& stp = make(record_run, o);
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(stp.handle(reading("d" + std::to_string(i % 2), "p-" + std::to_string(i))),
              Outcome::kProcessed);
  ASSERT_TRUE(stp.start().ok());
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp.stop().ok());
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 20);
  EXPECT_EQ(q("SELECT count(*) FROM runs WHERE attempt <> 1"), 0);
  EXPECT_EQ(stp.counters().reaped, 0);
  EXPECT_EQ(stp.counters().claims_lost, 0);
}

// sensor_gateway's case: a process died with the first rows of 12 devices claimed, then
// the clock was set back an hour. Under the exclusive lock those claims are orphans: the
// next start returns them at once, without any time passing on either clock, charging
// each dead batch's running row one attempt, and every device runs in order.
TEST_F(StpClockTest, OrphansFoundAtStartAreReturnedAtOnce) {
  {
    StoreThenProcess& receipt = make(record_run, options());
    for (int i = 0; i < 3; ++i)
      for (int d = 0; d < 12; ++d)
        ASSERT_EQ(receipt.handle(reading("dev" + std::to_string(d),
                                         "m" + std::to_string(d) + "-" + std::to_string(i))),
                  Outcome::kProcessed);
  }
  // Two workers of the dead process, six devices' first rows each.
  claim_as_dead_process("message_id IN ('m0-0', 'm1-0', 'm2-0', 'm3-0', 'm4-0', 'm5-0')",
                        "4242-0badf00d/w0/7");
  claim_as_dead_process("message_id IN ('m6-0', 'm7-0', 'm8-0', 'm9-0', 'm10-0', 'm11-0')",
                        "4242-0badf00d/w1/8");
  ASSERT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'processing'"), 12);
  clock_.wall -= kHour;

  auto o = options();
  o.workers = 2;
  StoreThenProcess& stp = make(record_run, o);
  ASSERT_TRUE(stp.start().ok());
  ASSERT_TRUE(wait_settled());  // no fake time passes: only the orphan rule can do this
  ASSERT_TRUE(stp.stop().ok());
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 36);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM runs"), 36);
  for (int d = 0; d < 12; ++d) {
    const std::string dev = "dev" + std::to_string(d), m = "m" + std::to_string(d) + "-";
    EXPECT_EQ(
        column(db_path_, "SELECT message_id FROM runs WHERE device = '" + dev + "' ORDER BY id"),
        (std::vector<std::string>{m + "0", m + "1", m + "2"}));
  }
  // One attempt charged per dead batch: its lowest seq was the row running.
  EXPECT_EQ(q("SELECT sum(attempts) FROM inbox_messages"), 36 + 2);
  EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'm0-0'"), 2);
  EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'm6-0'"), 2);
  EXPECT_EQ(stp.counters().reaped, 12);
  EXPECT_EQ(stp.counters().claims_lost, 0);
}

// Without the exclusive lock (several processes may work the file) no claim is known to be
// an orphan: another process's claim is returned once this reaper has watched it make no
// progress for a lease on its own monotonic clock, never before, whatever the wall clock.
TEST_F(StpClockTest, NonExclusiveReturnsAnotherProcesssClaimOnlyAfterWatchingItForALease) {
  open_inbox(/*exclusive=*/false);
  StoreThenProcess& stp = make(record_run, options());
  ASSERT_EQ(stp.handle(reading("a", "x-0")), Outcome::kProcessed);
  ASSERT_EQ(stp.handle(reading("a", "x-1")), Outcome::kProcessed);
  claim_as_dead_process("message_id = 'x-0'", "777-12345678/w0/1");
  clock_.steady += 10 * kLease;  // time before this process first looks does not count
  ASSERT_TRUE(stp.start().ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(reap(stp), 0);
  clock_.wall += 365 * kDay;
  clock_.steady += kLease - 1;
  EXPECT_EQ(reap(stp), 0);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 0);  // the aggregate waits behind the claim
  clock_.steady += 1;
  EXPECT_EQ(reap(stp), 1);
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp.stop().ok());
  EXPECT_EQ(column(db_path_, "SELECT message_id || ':' || attempt FROM runs ORDER BY id"),
            (std::vector<std::string>{"x-0:2", "x-1:1"}));
}

// A row that kills its process every time: each restart returns the orphaned claim and
// charges it an attempt, so after max_attempts the row is dead-lettered handler_crashed
// without running again.
TEST_F(StpClockTest, ACrashLoopEndsInADeadLetterAfterMaxAttempts) {
  auto o = options();
  o.consumer.max_attempts = 3;
  {
    StoreThenProcess& receipt = make(record_run, o);
    ASSERT_EQ(receipt.handle(reading("a", "poison")), Outcome::kProcessed);
  }
  for (int crash = 1; crash <= 3; ++crash) {
    // The process died in the handler (the clock set back each time): restart.
    claim_as_dead_process("message_id = 'poison'", "99-0000000" + std::to_string(crash) + "/w0/1");
    clock_.wall -= kHour;
    open_inbox();
    o.workers = 0;
    StoreThenProcess& restarted = make(record_run, o);
    EXPECT_EQ(reap(restarted), 1) << crash;
    EXPECT_EQ(q("SELECT attempts FROM inbox_messages WHERE message_id = 'poison'"), crash);
  }
  o.workers = 1;
  StoreThenProcess& stp = make(record_run, o);
  ASSERT_TRUE(stp.start().ok());
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp.stop().ok());
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'dead' AND attempts = 3"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'poison'"
              " AND reason = 'handler_crashed' AND attempts = 3"),
            1);
}

// The fence. Worker A hangs in its row; the reaper returns the claim; pool B claims the row
// again and commits it. When A wakes, its commit is refused (the row's claim token has
// moved on): the effect is there once, from B's run.
TEST_F(StpClockTest, LateCommitOfAReapedWorkerIsRefused) {
  Gate gate;
  std::atomic<int> hook_calls{0};
  auto o = options();
  o.before_handler_hook = [&](const std::string&) {
    if (hook_calls++ == 0) gate.pass();
  };
  StoreThenProcess& a = make(record_run, o);
  ASSERT_EQ(a.handle(reading("f", "f-1")), Outcome::kProcessed);
  ASSERT_TRUE(a.start().ok());
  ASSERT_TRUE(gate.wait_arrived());
  EXPECT_EQ(q("SELECT claim_token FROM inbox_messages WHERE message_id = 'f-1'"), 1);
  EXPECT_EQ(reap(a), 0);
  clock_.steady += kLease;
  EXPECT_EQ(reap(a), 1);

  StoreThenProcess& b = make(record_run, o);
  ASSERT_TRUE(b.start().ok());
  ASSERT_TRUE(wait_settled());
  EXPECT_EQ(q("SELECT claim_token FROM inbox_messages WHERE message_id = 'f-1'"), 2);
  gate.open();  // A commits now, late
  ASSERT_TRUE(wait_until([&] { return a.counters().claims_lost == 1; }, 10s));
  ASSERT_TRUE(a.stop().ok());
  ASSERT_TRUE(b.stop().ok());
  EXPECT_EQ(column(db_path_, "SELECT message_id || ':' || attempt FROM runs"),
            (std::vector<std::string>{"f-1:2"}));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'f-1' AND status = 'done'"
              " AND attempts = 2"),
            1);
  EXPECT_EQ(a.counters().processed, 0);
  EXPECT_EQ(b.counters().processed, 1);
}

// Every late write of a reaped worker, while its successor still holds the claim: a commit,
// a failure (which would put the row back to 'pending' with an attempt) and a dead letter
// (which would end the row) all change nothing; the successor then commits once.
enum class LateWrite { kCommit, kFailure, kDeadLetter };

class StpLateWriteTest : public StpClockTest, public ::testing::WithParamInterface<LateWrite> {};

TEST_P(StpLateWriteTest, ChangesNothingWhileTheSuccessorHoldsTheClaim) {
  Gate late, successor;
  std::atomic<int> prepare_calls{0};
  auto o = options();
  // The first phase decides, after the claim was returned: the late worker's failure and
  // dead letter are written after it, its commit in the handler transaction.
  o.prepare = [&](const StoredDelivery& d) -> std::any {
    const int call = prepare_calls++;
    if (call == 1) successor.pass();
    if (call != 0) return {};
    late.pass();
    if (GetParam() == LateWrite::kFailure) throw std::runtime_error("late failure");
    if (GetParam() == LateWrite::kDeadLetter) throw UndecodablePayload("late dead letter");
    EXPECT_EQ(d.attempt, 1);
    return {};
  };
  StoredHandler handler = record_run;
  StoreThenProcess& a = make(handler, o);
  ASSERT_EQ(a.handle(reading("g", "g-1")), Outcome::kProcessed);
  ASSERT_TRUE(a.start().ok());
  ASSERT_TRUE(late.wait_arrived());
  EXPECT_EQ(reap(a), 0);
  clock_.steady += kLease;
  EXPECT_EQ(reap(a), 1);
  StoreThenProcess& b = make(handler, o);
  ASSERT_TRUE(b.start().ok());
  ASSERT_TRUE(successor.wait_arrived());

  late.open();
  ASSERT_TRUE(wait_until([&] { return a.counters().claims_lost == 1; }, 10s));
  EXPECT_EQ(
      q("SELECT count(*) FROM inbox_messages WHERE message_id = 'g-1' AND status = 'processing'"
        " AND claim_token = 2 AND attempts = 1"),
      1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 0);

  successor.open();
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(a.stop().ok());
  ASSERT_TRUE(b.stop().ok());
  EXPECT_EQ(column(db_path_, "SELECT message_id || ':' || attempt FROM runs"),
            (std::vector<std::string>{"g-1:2"}));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'done' AND attempts = 2"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(a.counters().handler_failures + a.counters().dead_lettered + a.counters().processed,
            GetParam() == LateWrite::kFailure ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, StpLateWriteTest,
                         ::testing::Values(LateWrite::kCommit, LateWrite::kFailure,
                                           LateWrite::kDeadLetter),
                         [](const ::testing::TestParamInfo<LateWrite>& i) {
                           return std::string(i.param == LateWrite::kCommit    ? "Commit"
                                              : i.param == LateWrite::kFailure ? "Failure"
                                                                               : "DeadLetter");
                         });

// The store's rows on their own (store/stp_rows.h), as any store must keep them: receipt
// stores an id once; a claim offers, aggregate after aggregate, the pending rows of each
// aggregate that has none claimed, in seq order, and takes the row's next token. Once a
// claim is returned and taken again, every write made with the old token changes nothing
// (the handler does not even run) and the new holder's writes all land.
TEST_F(StpClockTest, StoreRowsOfferFreeAggregatesInOrderAndFenceEveryWriteByTheToken) {
  std::unique_ptr<detail::StpConsumerRows> rows;
  ASSERT_TRUE(store_of(*inbox_).stp_rows().open("sensors", &rows).ok());
  bool stored = false;
  for (const auto& [device, id] :
       std::vector<std::pair<std::string, std::string>>{{"a", "a-1"}, {"b", "b-1"}, {"a", "a-2"}}) {
    ASSERT_TRUE(
        rows->store_received(id, device, reading(device, id), "{}", std::nullopt, &stored).ok());
    EXPECT_TRUE(stored) << id;
  }
  ASSERT_TRUE(
      rows->store_received("a-1", "a", reading("a", "a-1"), "{}", std::nullopt, &stored).ok());
  EXPECT_FALSE(stored);
  bool found = false;
  ASSERT_TRUE(rows->is_stored("b-1", &found).ok());
  EXPECT_TRUE(found);
  ASSERT_TRUE(rows->is_stored("c-1", &found).ok());
  EXPECT_FALSE(found);

  std::unique_ptr<detail::StpWorkerSession> late, holder;
  ASSERT_TRUE(rows->open_worker(Synchronous::kNormal, &late).ok());
  ASSERT_TRUE(rows->open_worker(Synchronous::kNormal, &holder).ok());
  std::vector<std::string> offered;
  auto take_all = [&](int64_t, const std::vector<detail::ClaimCandidate>& cands,
                      std::vector<int64_t>* take) {
    for (const detail::ClaimCandidate& c : cands) {
      offered.push_back(c.aggregate_key + ":" + std::to_string(c.seq));
      take->push_back(c.seq);
    }
  };
  std::vector<detail::StoredRow> old_batch, batch;
  ASSERT_TRUE(late->claim("gone/w0/1", 10, take_all, &old_batch).ok());
  EXPECT_EQ(offered, (std::vector<std::string>{"a:1", "a:3", "b:2"}));
  ASSERT_EQ(old_batch.size(), 3u);
  EXPECT_EQ(old_batch[0].message_id, "a-1");
  EXPECT_EQ(old_batch[0].claim.token, 1);
  offered.clear();
  ASSERT_TRUE(holder->claim("live/w0/1", 10, take_all, &batch).ok());
  EXPECT_TRUE(offered.empty());  // both aggregates have a claimed row
  EXPECT_TRUE(batch.empty());

  int64_t returned = 0;
  ASSERT_TRUE(rows->reap(
                      [](const std::vector<detail::LiveClaim>& claims,
                         std::vector<detail::ReturnedClaim>* back) {
                        ASSERT_EQ(claims.size(), 1u);
                        EXPECT_EQ(claims[0].claimant, "gone/w0/1");
                        EXPECT_EQ(claims[0].running_seq, 1);
                        back->push_back({claims[0].claimant, claims[0].running_seq, "returned"});
                      },
                      &returned)
                  .ok());
  EXPECT_EQ(returned, 3);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'a-1' AND attempts = 1"
              " AND last_error = 'returned'"),
            1);
  EXPECT_EQ(q("SELECT sum(attempts) FROM inbox_messages"), 1);
  ASSERT_TRUE(holder->claim("live/w0/1", 10, take_all, &batch).ok());
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch[0].claim.token, 2);
  EXPECT_EQ(batch[0].attempts, 1);

  // Every write of the returned claim: nothing changes.
  int handler_runs = 0;
  const detail::StoredStoreHandler handler(
      StoredHandler([&](SQLite::Database& db, const StoredDelivery& d) {
        ++handler_runs;
        record_run(db, d);
      }));
  const std::any none;
  const Message m = reading("a", "a-1");
  auto delivery = [&](const detail::StoredRow& r, int attempt) {
    return StoredDelivery{m,       r.message_id, r.aggregate_key, r.claim.seq, r.received_at,
                          attempt, none};
  };
  bool held = true;
  ASSERT_TRUE(late->holds(old_batch[0].claim, &held).ok());
  EXPECT_FALSE(held);
  detail::StoredRunResult run;
  ASSERT_TRUE(late->process(old_batch[0].claim, "gone/w0/1", handler, delivery(old_batch[0], 1),
                            kNeverExpired, &run)
                  .ok());
  EXPECT_EQ(run.kind, detail::StoredRunResult::Kind::kLost);
  EXPECT_EQ(handler_runs, 0);
  held = true;
  ASSERT_TRUE(late->retry_later(old_batch[0].claim, 1, "late", detail::RowWait{}, 0,
                                {old_batch[1].claim}, &held)
                  .ok());
  EXPECT_FALSE(held);
  held = true;
  ASSERT_TRUE(late->mark_dead(old_batch[2].claim, 1, "late", &held).ok());
  EXPECT_FALSE(held);
  ASSERT_TRUE(late->release({old_batch[0].claim, old_batch[1].claim, old_batch[2].claim}).ok());
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'processing' AND claim_token = 2"
              " AND claimant = 'live/w0/1'"),
            3);
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE last_error = 'late'"), 0);

  // The holder's writes: a run committed with its 'done' mark, a retry, a dead row.
  ASSERT_TRUE(holder
                  ->process(batch[0].claim, "live/w0/1", handler, delivery(batch[0], 2),
                            kNeverExpired, &run)
                  .ok());
  EXPECT_EQ(run.kind, detail::StoredRunResult::Kind::kDone);
  EXPECT_EQ(handler_runs, 1);
  ASSERT_TRUE(
      holder->retry_later(batch[1].claim, 1, "boom", detail::RowWait{}, 1000, {}, &held).ok());
  EXPECT_TRUE(held);
  ASSERT_TRUE(holder->mark_dead(batch[2].claim, 1, "dead", &held).ok());
  EXPECT_TRUE(held);
  EXPECT_EQ(column(db_path_, "SELECT message_id || ':' || attempt FROM runs"),
            (std::vector<std::string>{"a-1:2"}));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'a-2' AND status ="
              " 'pending' AND attempts = 1 AND next_attempt_at = " +
              std::to_string(inbox_->retention_clock_ms() + 1000)),
            1);
  StoreThenProcessStats st;
  ASSERT_TRUE(rows->count(&st).ok());
  EXPECT_EQ(st.pending, 1);
  EXPECT_EQ(st.processing, 0);
  EXPECT_EQ(st.done, 1);
  EXPECT_EQ(st.dead, 1);
}

// Once the store is found unusable (a corrupt file: the latch), store-then-process
// neither reads nor writes it: its calls return the store's fatal status, and stopping
// and closing it touch nothing (closing used to end the process: the receipt statements
// were finalized through Inbox::with_connection, which throws on a latched store).
TEST_F(StpClockTest, ClosesWithoutTouchingAStoreFoundUnusable) {
  StoreThenProcess& stp = make(record_run, options());
  ASSERT_EQ(stp.handle(reading("h", "h-1")), Outcome::kProcessed);  // prepares receipt's statements
  ASSERT_TRUE(stp.start().ok());
  ASSERT_TRUE(wait_settled());
  store_of(*inbox_).latch_fatal(Status(Status::Code::kCorruption, "test: the file is corrupt"));
  StoreThenProcessStats st;
  EXPECT_EQ(stp.stats(&st).code(), Status::Code::kCorruption);
  ReplayResult rr;
  EXPECT_EQ(stp.replay({}, &rr).code(), Status::Code::kCorruption);
  int64_t reaped = 0;
  EXPECT_EQ(stp.reap(&reaped).code(), Status::Code::kCorruption);
  StoredPruneResult pr;
  EXPECT_EQ(stp.prune(&pr).code(), Status::Code::kCorruption);
  EXPECT_TRUE(stp.stop().ok());
  stps_.clear();  // closes it
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 1);
}

// A failed row waits for its backoff on the retention clock: a wall clock set back an hour
// does not stall it, one stepped a day forward does not make it early.
TEST_F(StpClockTest, RetryBackoffIgnoresWallClockSteps) {
  std::atomic<int> runs{0};
  StoreThenProcess& stp = make(
      [&](SQLite::Database& db, const StoredDelivery& d) {
        ++runs;
        if (d.message_id == "r-1" && d.attempt == 1) throw std::runtime_error("flaky");
        record_run(db, d);
      },
      options());
  ASSERT_EQ(stp.handle(reading("a", "r-1")), Outcome::kProcessed);
  ASSERT_EQ(stp.handle(reading("a", "r-2")), Outcome::kProcessed);
  ASSERT_TRUE(stp.start().ok());
  ASSERT_TRUE(wait_until(
      [&] {
        return q("SELECT count(*) FROM inbox_messages WHERE message_id = 'r-1' AND status = "
                 "'pending'"
                 " AND attempts = 1") == 1;
      },
      10s));
  clock_.wall -= kHour;
  std::this_thread::sleep_for(150ms);
  clock_.wall += kDay;
  std::this_thread::sleep_for(150ms);
  clock_.steady += 999;  // the first backoff is 1000 ms
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 0);
  clock_.steady += 1;
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp.stop().ok());
  EXPECT_EQ(column(db_path_, "SELECT message_id || ':' || attempt FROM runs ORDER BY id"),
            (std::vector<std::string>{"r-1:2", "r-2:1"}));
}

// No retry waits longer than retry_backoff_max, so a next_attempt_at further ahead was
// stamped by a clock ahead of this one (an older release's wall clock, another process):
// due at once. One within the maximum waits for it.
TEST_F(StpClockTest, ARetryTimeBeyondTheLongestBackoffIsDueAtOnce) {
  StoreThenProcess& stp = make(record_run, options());
  ASSERT_EQ(stp.handle(reading("a", "far")), Outcome::kProcessed);
  ASSERT_EQ(stp.handle(reading("b", "near")), Outcome::kProcessed);
  const int64_t now = inbox_->retention_clock_ms();
  inbox_->with_connection([&](SQLite::Database& db) {
    db.exec("UPDATE inbox_messages SET next_attempt_at = " + std::to_string(now + kHour) +
            ", attempts = 1 WHERE message_id = 'far'");
    db.exec("UPDATE inbox_messages SET next_attempt_at = " + std::to_string(now + 1500) +
            ", attempts = 1 WHERE message_id = 'near'");
  });
  ASSERT_TRUE(stp.start().ok());
  ASSERT_TRUE(wait_until([&] { return q("SELECT count(*) FROM runs") == 1; }, 10s));
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(column(db_path_, "SELECT message_id FROM runs"), (std::vector<std::string>{"far"}));
  clock_.steady += 1500;
  ASSERT_TRUE(wait_settled());
  ASSERT_TRUE(stp.stop().ok());
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 2);
}

// Retention of stored rows counts on the retention clock: wall-clock steps of a year either
// way compact and delete nothing early, nor does a restart with the monotonic clock set
// back (a reboot): the clock continues from its persisted value.
TEST_F(StpClockTest, PruneNeverCompactsOrDeletesEarlyAcrossClockStepsAndARestart) {
  auto o = options();
  o.compact_after_ms = 60'000;
  o.dedup_retention_ms = 120'000;
  {
    StoreThenProcess& stp = make(record_run, o);
    for (int i = 0; i < 3; ++i)
      ASSERT_EQ(stp.handle(reading("a", "k-" + std::to_string(i))), Outcome::kProcessed);
    ASSERT_TRUE(stp.start().ok());
    ASSERT_TRUE(wait_settled());
    ASSERT_TRUE(stp.stop().ok());
  }
  auto prune = [&]() {
    StoreThenProcess& stp = *stps_.back();
    StoredPruneResult r;
    const Status s = stp.prune(&r);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return r;
  };
  clock_.wall += 365 * kDay;
  EXPECT_EQ(prune().compacted, 0);
  clock_.steady += 60'000 - 1;
  clock_.wall -= 2 * 365 * kDay;
  EXPECT_EQ(prune().compacted, 0);
  clock_.steady += 2;
  StoredPruneResult r = prune();
  EXPECT_EQ(r.compacted, 3);
  EXPECT_EQ(r.deleted, 0);

  // Restart after a reboot: the monotonic clock starts small, the wall clock is a day back.
  stps_.clear();
  inbox_.reset();
  clock_.steady = 7;
  clock_.wall -= kDay;
  open_inbox();
  make(record_run, o);
  EXPECT_EQ(prune().deleted, 0);
  EXPECT_EQ(stps_.back()->handle(reading("a", "k-1")), Outcome::kDuplicate);
  clock_.steady += 60'000 - 10;  // 120 s - 9 ms after receipt, in running time
  EXPECT_EQ(prune().deleted, 0);
  clock_.steady += 20;
  EXPECT_EQ(prune().deleted, 3);
  EXPECT_EQ(q("SELECT count(*) FROM runs"), 3);  // business state is never touched
}

// Schema step 11 adds the fence to a file of version 9 in place: every row kept, tokens 0.
// A pending row that an older release stamped with a wall-clock retry time an hour ahead,
// and a claim its dead process left, are both processed at once.
TEST_F(StpClockTest, VersionNineGainsClaimTokensAndItsRowsRunAtOnce) {
  TearDown();
  const std::string path = dir_.file("v9.db");
  const int64_t wall = clock_.wall_ms();
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    for (const auto& step : detail::schema_steps())
      if (step.version <= 9) db.exec(step.sql);
    ASSERT_EQ(db.execAndGet("PRAGMA user_version").getInt(), 9);
    db.exec(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY, device TEXT NOT NULL,"
        " message_id TEXT NOT NULL, attempt INTEGER NOT NULL)");
    SQLite::Statement ins(db,
                          "INSERT INTO inbox_messages (consumer_name, message_id, aggregate_key,"
                          " topic, payload, qos, received_at, status, attempts, claimed_at,"
                          " claimant, next_attempt_at) VALUES ('sensors', ?1, ?2, ?3, ?4, 1, ?5,"
                          " ?6, ?7, ?8, ?9, ?10)");
    auto row = [&](const std::string& id, const std::string& dev, const std::string& status,
                   int attempts, bool claimed, int64_t next) {
      ins.reset();
      ins.clearBindings();
      const Message m = reading(dev, id);
      ins.bind(1, id);
      ins.bind(2, dev);
      ins.bind(3, m.topic);
      ins.bind(4, m.payload);
      ins.bind(5, wall - 1000);
      ins.bind(6, status);
      ins.bind(7, attempts);
      if (claimed) {
        ins.bind(8, wall - 500);
        ins.bind(9, "1-00000001/w0/3");
      }
      ins.bind(10, next);
      ins.exec();
    };
    row("old-retry", "a", "pending", 1, false, wall + kHour);
    row("old-claim", "b", "processing", 0, true, 0);
    row("old-done", "c", "done", 1, false, 0);
  }
  InboxOptions io;
  io.clock = &clock_;
  ASSERT_TRUE(Inbox::open(path, io, &inbox_).ok());
  db_path_ = path;
  EXPECT_EQ(q("PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE claim_token = 0"), 3);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE message_id = 'old-claim'"
              " AND status = 'processing' AND claimant = '1-00000001/w0/3'"),
            1);
  StoreThenProcess& stp = make(record_run, options());
  ASSERT_TRUE(stp.start().ok());
  ASSERT_TRUE(wait_settled());  // no fake time passes
  ASSERT_TRUE(stp.stop().ok());
  EXPECT_EQ(column(db_path_, "SELECT message_id || ':' || attempt FROM runs ORDER BY message_id"),
            (std::vector<std::string>{"old-claim:2", "old-retry:2"}));
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'done'"), 3);
}

// Receipt's wait for a failing store (the PUBACK waits with it) keeps warning at its log
// interval while the wall clock is set back an hour at every retry: the interval is
// measured on the monotonic clock. It reports how long the wait lasted the same way.
TEST(StoreRetryClock, WarningsAndDurationsIgnoreWallClockSteps) {
  FakeClock clock;
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto log = std::make_shared<spdlog::logger>("retry", ring);
  detail::StoreRetry retry("store-then-process 'sensors'", "x.db", /*initial_ms=*/100,
                           /*max_ms=*/100, /*log_interval_ms=*/1000, &clock, log);
  int calls = 0;
  retry.until_stored("storing a message", [&] {
    clock.wall -= kHour;  // FakeClock::sleep_ms advances both clocks by the backoff
    return ++calls <= 25 ? Status(Status::Code::kBusy, "locked") : Status::Ok();
  });
  int warnings = 0;
  std::string recovered;
  for (const std::string& line : ring->last_formatted()) {
    if (line.find("store failed while storing a message") != std::string::npos) ++warnings;
    if (line.find("store recovered") != std::string::npos) recovered = line;
  }
  EXPECT_EQ(warnings, 3);  // the first failure, then after 1 s and 2 s of the 2.5 s wait
  EXPECT_NE(recovered.find("after 25 retries (2500 ms)"), std::string::npos) << recovered;
}

}  // namespace
}  // namespace mqtt_inbox::test

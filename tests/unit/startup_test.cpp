// Issue 13, part 1: start-up under a lock. Every store access at start-up (Inbox::open:
// pragmas, schema, migrations, the retention clock and the synchronous record;
// Inbox::setup, the application's own set-up; Pruner::create) waits out a transiently
// unavailable store with capped backoff and reports it (InboxOptions::startup_progress,
// Inbox::health) instead of failing, ends the wait at startup_deadline_ms if one is set,
// and fails at once for what is not transient. Each member of the kind is triggered for
// real: another connection holding BEGIN EXCLUSIVE (as a backup or the admin tool would),
// and FaultVfs errors on open, write and fsync. The example programs under a lock held
// by another process are in startup_lock_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include "mqtt_inbox/health.h"
#include "mqtt_inbox/store_then_process.h"
#include "store/sqlite/schema.h"
#include "support/fault_vfs.h"
#include "support/ledger_fixture.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every startup_progress call, for the test thread to inspect.
class ProgressLog {
 public:
  std::function<void(const Health&)> callback() {
    return [this](const Health& h) {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back(h);
    };
  }
  std::vector<Health> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  size_t stuck_calls() const {
    size_t n = 0;
    for (const Health& h : calls()) n += h.stuck ? 1 : 0;
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Health> calls_;
};

class StartupTest : public ::testing::Test {
 protected:
  void SetUp() override { db_ = dir_.file("ledger.db"); }

  InboxOptions options() {
    InboxOptions o;
    o.busy_timeout_ms = 50;
    o.startup_backoff_initial = milliseconds(5);
    o.startup_backoff_max = milliseconds(50);
    o.startup_log_interval_ms = 1000;
    o.startup_progress = progress_.callback();
    return o;
  }

  // Runs `call` on its own thread while `locker` holds BEGIN EXCLUSIVE. It must not
  // return while the lock is held, and must report the wait (stuck, starting, the
  // operation, a busy error) through startup_progress; then the lock is released and
  // the call's Status is returned.
  Status run_while_locked(SQLite::Database& locker, const std::function<Status()>& call,
                          const std::string& operation) {
    locker.exec("BEGIN EXCLUSIVE");
    std::atomic<bool> done{false};
    Status result;
    std::thread t([&] {
      result = call();
      done = true;
    });
    const bool waited = wait_until([&] { return progress_.stuck_calls() >= 3; }, seconds(10));
    std::this_thread::sleep_for(milliseconds(200));
    const bool returned_while_locked = done.load();
    locker.exec("COMMIT");
    t.join();
    EXPECT_TRUE(waited) << "no start-up wait was reported";
    EXPECT_FALSE(returned_while_locked)
        << "returned while the store was locked: " << result.to_string();
    const std::vector<Health> calls = progress_.calls();
    if (!calls.empty()) {
      const Health& first = calls.front();
      EXPECT_TRUE(first.stuck);
      EXPECT_TRUE(first.starting);
      EXPECT_EQ(first.operation, operation);
      EXPECT_EQ(first.database, db_);
      EXPECT_GT(first.stuck_since_ms, 0);
      EXPECT_NE(first.last_error.find("busy"), std::string::npos) << first.last_error;
      EXPECT_EQ(level(first), HealthLevel::kAmber);
      // The last call says the wait is over.
      EXPECT_FALSE(calls.back().stuck);
      EXPECT_FALSE(calls.back().starting);
      EXPECT_EQ(level(calls.back()), HealthLevel::kGreen);
    }
    return result;
  }

  // A WAL database made by another program, with one table of its own.
  void make_foreign_wal_db() {
    SQLite::Database db(db_, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    db.exec("CREATE TABLE IF NOT EXISTS other (x)");
  }

  TempDir dir_;
  std::string db_;
  ProgressLog progress_;
};

// A new database: the schema is written under the write lock, so Inbox::open waits for it.
TEST_F(StartupTest, OpenWaitsForTheWriteLockThenAppliesTheSchema) {
  make_foreign_wal_db();
  SQLite::Database locker(db_, SQLite::OPEN_READWRITE);
  std::unique_ptr<Inbox> inbox;
  const Status s = run_while_locked(
      locker, [&] { return Inbox::open(db_, options(), &inbox); }, "opening the database");
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(query_int(db_, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM sqlite_master WHERE name = 'inbox_processed'"), 1);
  EXPECT_FALSE(inbox->health().stuck);
  EXPECT_GE(inbox->health().total_store_errors, 3);
}

// A database of the previous release: each migration step is a write transaction.
TEST_F(StartupTest, MigrationWaitsForTheWriteLockAndKeepsRows) {
  {
    SQLite::Database db(db_, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    db.exec(detail::schema_steps().front().sql);
    db.exec(
        "INSERT INTO inbox_processed (consumer_name, message_id, received_at)"
        " VALUES ('ledger', 'old-1', 1000)");
  }
  SQLite::Database locker(db_, SQLite::OPEN_READWRITE);
  std::unique_ptr<Inbox> inbox;
  const Status s = run_while_locked(
      locker, [&] { return Inbox::open(db_, options(), &inbox); }, "opening the database");
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(query_int(db_, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM inbox_processed WHERE message_id = 'old-1'"), 1);
}

// An existing inbox opened with another synchronous setting records it (a write).
TEST_F(StartupTest, RecordingTheSynchronousSettingWaitsForTheWriteLock) {
  { auto first = open_ledger_inbox(db_); }
  SQLite::Database locker(db_, SQLite::OPEN_READWRITE);
  InboxOptions o = options();
  o.synchronous = Synchronous::kNormal;
  std::unique_ptr<Inbox> inbox;
  const Status s = run_while_locked(
      locker, [&] { return Inbox::open(db_, o, &inbox); }, "opening the database");
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(query_int(db_, "SELECT value = 'normal' FROM inbox_meta WHERE key = 'synchronous'"), 1);
}

// The application's own set-up SQL: one transaction, retried from the start after each
// failed attempt, so a seed row is there once however many attempts it took.
TEST_F(StartupTest, SetupWaitsForTheWriteLockAndRunsInOneTransaction) {
  std::unique_ptr<Inbox> inbox;
  ASSERT_TRUE(Inbox::open(db_, options(), &inbox).ok());
  SQLite::Database locker(db_, SQLite::OPEN_READWRITE);
  std::atomic<int> runs{0};
  const Status s = run_while_locked(
      locker,
      [&] {
        return inbox->setup([&](SQLite::Database& db) {
          ++runs;
          ledger::create_tables(db);
          db.exec("INSERT INTO accounts (account, balance) VALUES ('seed', 100)");
        });
      },
      "running the application's set-up");
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_GE(runs.load(), 1);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM accounts WHERE account = 'seed'"), 1);
  EXPECT_EQ(query_int(db_, "SELECT sum(balance) FROM accounts"), 100);
}

// Pruner::create records the declared horizon: the write that failed in the issue.
TEST_F(StartupTest, PrunerCreateWaitsForTheWriteLockThenRecordsTheHorizon) {
  std::unique_ptr<Inbox> inbox;
  ASSERT_TRUE(Inbox::open(db_, options(), &inbox).ok());
  SQLite::Database locker(db_, SQLite::OPEN_READWRITE);
  std::unique_ptr<Pruner> pruner;
  RetentionOptions r;
  const Status s = run_while_locked(
      locker, [&] { return Pruner::create(inbox.get(), r, &pruner); },
      "recording the retention horizon");
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(
      query_int(db_,
                "SELECT CAST(value AS INTEGER) FROM inbox_meta WHERE key = 'required_window_ms'"),
      Pruner::required_window_ms(r));
}

// A start-up deadline ends the wait with the last transient error, about when it said.
TEST_F(StartupTest, DeadlineEndsTheWaitWithTheLastTransientError) {
  make_foreign_wal_db();
  SQLite::Database locker(db_, SQLite::OPEN_READWRITE);
  locker.exec("BEGIN EXCLUSIVE");
  InboxOptions o = options();
  o.busy_timeout_ms = 5000;  // cut to what is left of the deadline
  o.startup_deadline_ms = 400;
  std::unique_ptr<Inbox> inbox;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = Inbox::open(db_, o, &inbox);
  const auto took = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  locker.exec("COMMIT");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.is_transient_store_error()) << s.to_string();
  EXPECT_NE(s.message().find("not ready after"), std::string::npos) << s.to_string();
  EXPECT_EQ(inbox, nullptr);
  EXPECT_GE(took.count(), 400);
  EXPECT_LT(took.count(), 4000) << "the attempt's busy timeout was not cut to the deadline";
  ASSERT_FALSE(progress_.calls().empty());
  EXPECT_FALSE(progress_.calls().back().stuck);
  // Nothing was written: the schema is not there.
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM sqlite_master WHERE name = 'inbox_processed'"), 0);
}

// What does not clear by itself is not waited for: a file that is not a database comes
// back as kCorruption at once, and is left byte for byte as it was.
TEST_F(StartupTest, NotADatabaseFailsAtOnceAndIsLeftUntouched) {
  {
    std::ofstream f(db_, std::ios::binary);
    for (int i = 0; i < 2048; ++i) f << "this is not an SQLite database. ";
  }
  const std::string before = file_bytes(db_);
  std::unique_ptr<Inbox> inbox;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = Inbox::open(db_, options(), &inbox);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(2));
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.to_string();
  EXPECT_TRUE(s.is_fatal_store_error());
  EXPECT_EQ(progress_.stuck_calls(), 0u);
  EXPECT_EQ(file_bytes(db_), before);
  EXPECT_NE(::access((db_ + "-wal").c_str(), F_OK), 0) << "a WAL was created next to it";
}

// --- StoreThenProcess at start-up ---

// The ledger's credit as a store-then-process handler: the business change of these tests.
void apply_stored_credit(SQLite::Database& db, const StoredDelivery& d) {
  ledger::apply_credit(db, Delivery{d.message, d.message_id, d.attempt});
}

StoreThenProcessOptions stp_options() {
  StoreThenProcessOptions o;
  o.consumer.store_backoff_initial = milliseconds(5);
  o.consumer.store_backoff_max = milliseconds(50);
  o.poll_interval_ms = 20;
  o.workers = 2;
  return o;
}

// The lock (another connection's BEGIN EXCLUSIVE, as the sqlite3 shell or a
// backup takes it) while a store-then-process consumer starts with credits stored by an
// earlier run. In WAL mode the lock blocks writers only, and create() and start() write
// nothing, so they return at once (no exit, nothing for a supervisor to restart); the
// workers' claims wait it out without counting an attempt, and every credit is applied
// once after the lock is released.
TEST_F(StartupTest, StoreThenProcessStartedUnderTheWriteLockAppliesStoredCreditsAfterIt) {
  std::unique_ptr<Inbox> inbox;
  ASSERT_TRUE(Inbox::open(db_, options(), &inbox).ok());
  ASSERT_TRUE(inbox->setup(ledger::create_tables).ok());
  {
    std::unique_ptr<StoreThenProcess> earlier;
    ASSERT_TRUE(StoreThenProcess::create(inbox.get(), "ledger", apply_stored_credit, stp_options(),
                                         &earlier)
                    .ok());
    for (int i = 1; i <= 3; ++i)
      ASSERT_EQ(earlier->handle(credit_message("c-" + std::to_string(i), "ann", 10 * i)),
                Outcome::kProcessed);
  }
  SQLite::Database locker(db_, SQLite::OPEN_READWRITE);
  locker.exec("BEGIN EXCLUSIVE");
  std::unique_ptr<StoreThenProcess> stp;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      StoreThenProcess::create(inbox.get(), "ledger", apply_stored_credit, stp_options(), &stp)
          .ok());
  ASSERT_TRUE(stp->start().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(2));
  ASSERT_TRUE(wait_until([&] { return stp->counters().worker_store_errors >= 3; }, seconds(10)))
      << "the workers never met the lock";
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM ledger_entries"), 0);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM inbox_messages WHERE status = 'pending'"), 3);
  locker.exec("COMMIT");

  ASSERT_TRUE(wait_until(
      [&] {
        return query_int(db_, "SELECT count(*) FROM inbox_messages WHERE status = 'done'") == 3;
      },
      seconds(15)));
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM ledger_entries"), 3);
  EXPECT_EQ(query_int(db_, "SELECT balance FROM accounts WHERE account = 'ann'"), 60);
  // The lock was the store's, not the credits': each ran once, on its first attempt.
  EXPECT_EQ(query_int(db_, "SELECT max(attempts) FROM inbox_messages"), 1);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM inbox_dead_letters"), 0);
}

// What can fail when a store-then-process consumer opens its own connections (a
// connection limit, an fd limit, an I/O error: here FaultVfs refusing the next opens of
// the database file) is waited out like Inbox::open, reported through startup_progress
// with the operation named, and then the credits are applied once.
TEST_F(StartupTest, StoreThenProcessCreateAndStartWaitOutFailingOpensThenApplyCredits) {
  FaultVfs vfs("stp_startup_fault");
  InboxOptions o = options();
  o.vfs = vfs.name();
  std::unique_ptr<Inbox> inbox;
  ASSERT_TRUE(Inbox::open(db_, o, &inbox).ok());
  ASSERT_TRUE(inbox->setup(ledger::create_tables).ok());
  ASSERT_EQ(progress_.stuck_calls(), 0u);

  vfs.arm(Fault::next(FaultOp::kOpen, 3, SQLITE_CANTOPEN, FileKind::kMainDb));
  std::unique_ptr<StoreThenProcess> stp;
  const Status created =
      StoreThenProcess::create(inbox.get(), "ledger", apply_stored_credit, stp_options(), &stp);
  ASSERT_TRUE(created.ok()) << created.to_string();
  EXPECT_EQ(vfs.injected(), 3u);
  const size_t create_calls = progress_.calls().size();
  ASSERT_GE(progress_.stuck_calls(), 3u);
  EXPECT_EQ(progress_.calls().front().operation,
            "opening the store-then-process maintenance connection");
  EXPECT_FALSE(progress_.calls().back().stuck);

  vfs.arm(Fault::next(FaultOp::kOpen, 3, SQLITE_CANTOPEN, FileKind::kMainDb));
  const Status started = stp->start();
  ASSERT_TRUE(started.ok()) << started.to_string();
  EXPECT_EQ(vfs.injected(), 6u);
  const std::vector<Health> calls = progress_.calls();
  ASSERT_GT(calls.size(), create_calls);
  EXPECT_EQ(calls[create_calls].operation, "opening the store-then-process worker connections");
  EXPECT_FALSE(calls.back().stuck);
  EXPECT_FALSE(inbox->health().stuck);

  for (int i = 1; i <= 4; ++i)
    ASSERT_EQ(stp->handle(credit_message("o-" + std::to_string(i), "bo", i)), Outcome::kProcessed);
  ASSERT_TRUE(wait_until(
      [&] {
        return query_int(db_, "SELECT count(*) FROM inbox_messages WHERE status = 'done'") == 4;
      },
      seconds(15)));
  ASSERT_TRUE(stp->stop().ok());
  stp.reset();
  inbox.reset();
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM ledger_entries"), 4);
  EXPECT_EQ(query_int(db_, "SELECT balance FROM accounts WHERE account = 'bo'"), 10);
}

// --- injected I/O faults at start-up (FaultVfs) ---

struct StartupFault {
  const char* name;
  Fault fault;
  const char* status_word;
};
void PrintTo(const StartupFault& f, std::ostream* os) { *os << f.name; }

class InjectedStartupFault : public StartupTest,
                             public ::testing::WithParamInterface<StartupFault> {
 protected:
  FaultVfs vfs_{"startup_fault"};
};

// A new database while the file system fails for the next N calls (an I/O error, a
// read-only file system): open waits, then creates the inbox once the fault clears.
TEST_P(InjectedStartupFault, IsWaitedOutThenTheInboxOpens) {
  const StartupFault& c = GetParam();
  InboxOptions o = options();
  o.vfs = vfs_.name();
  vfs_.arm(c.fault);
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(db_, o, &inbox);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(vfs_.injected(), static_cast<uint64_t>(c.fault.count));
  ASSERT_GE(progress_.stuck_calls(), 1u);
  EXPECT_NE(progress_.calls().front().last_error.find(c.status_word), std::string::npos)
      << progress_.calls().front().last_error;
  EXPECT_FALSE(inbox->health().stuck);
  ASSERT_TRUE(inbox->setup(ledger::create_tables).ok());
  std::unique_ptr<Consumer> consumer;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", ledger::apply_credit, {}, &consumer).ok());
  EXPECT_EQ(consumer->handle(credit_message("s-1", "sam", 5)), Outcome::kProcessed);
  inbox.reset();
  EXPECT_EQ(query_int(db_, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(query_int(db_, "SELECT balance FROM accounts WHERE account = 'sam'"), 5);
}

// A new database that does not fit (SQLITE_FULL while it is being made) is not waited for:
// no message waits in a database that was never made. kFull at once, and the files the
// open made are gone; an existing database on a full disk is still waited out
// (tests/crash/disk_full_test.cpp).
TEST_F(StartupTest, ANewDatabaseThatDoesNotFitFailsAtOnceAndLeavesNothing) {
  FaultVfs vfs{"startup_full"};
  InboxOptions o = options();
  o.vfs = vfs.name();
  vfs.arm(Fault::next(FaultOp::kWrite, 4, SQLITE_FULL));
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(db_, o, &inbox);
  EXPECT_EQ(s.code(), Status::Code::kFull) << s.to_string();
  EXPECT_NE(s.message().find("no room to create the new database"), std::string::npos)
      << s.to_string();
  EXPECT_EQ(vfs.injected(), 1u);  // not retried
  EXPECT_EQ(progress_.stuck_calls(), 0u);
  for (const char* suffix : {"", "-wal", "-shm", ".lock"})
    EXPECT_NE(::access((db_ + suffix).c_str(), F_OK), 0) << suffix;
  vfs.disarm();
  ASSERT_TRUE(Inbox::open(db_, o, &inbox).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Faults, InjectedStartupFault,
    ::testing::Values(
        StartupFault{"CantOpen", Fault::next(FaultOp::kOpen, 4, SQLITE_CANTOPEN, FileKind::kMainDb),
                     "io_error"},
        StartupFault{"IoErrWrite", Fault::next(FaultOp::kWrite, 4, SQLITE_IOERR_WRITE), "io_error"},
        StartupFault{"IoErrFsync", Fault::next(FaultOp::kSync, 4, SQLITE_IOERR_FSYNC), "io_error"},
        StartupFault{"ReadOnly", Fault::next(FaultOp::kWrite, 4, SQLITE_READONLY), "read_only"}),
    [](const ::testing::TestParamInfo<StartupFault>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace mqtt_inbox::test

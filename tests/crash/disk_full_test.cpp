// Issue 13, part 2: a nearly full disk that frees up again. Storage exhaustion must
// always be recoverable once the outside cause is gone, and the inbox's own files must
// never be what keeps the disk full.
//
// The database lives on a real 4 MiB or 8 MiB tmpfs. A stream of 1,500 credits runs
// through a Consumer while another file fills the file system to the last byte and is
// deleted again, at several points: before the first message, in the middle of the
// stream, while a checkpoint is writing the database file, and while the pruner deletes
// expired ids. After each, the stream must go on by itself. At the end every credit is
// applied exactly once, the pruner has done its work, and integrity_check is ok.
// (Before the fix, the WAL grew to the 1,000-page autocheckpoint threshold, 4 MB, which
// is all the space a 4 MiB file system has: after the filler was deleted, the consumer
// logged "full" forever.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "support/fault_vfs.h"
#include "support/ledger_fixture.h"
#include "support/tmpfs.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kCredits = 1500;
constexpr int kExpiredIds = 4000;  // for the pruner to delete

int64_t amount_of(int i) { return 1 + i % 97; }

class DiskFullTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    mnt_ = dir_.file("fs");
    fs_ = std::make_unique<TmpfsMount>(mnt_, GetParam());
    if (!fs_->mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << fs_->error() << ")";
    db_ = mnt_ + "/ledger.db";
    filler_ = mnt_ + "/filler";
    InboxOptions o;
    o.vfs = vfs_.name();  // the real file system underneath, plus an I/O hook
    o.busy_timeout_ms = 200;
    inbox_ = open_ledger_inbox(db_, o);
    ASSERT_TRUE(inbox_);
    ConsumerOptions co;
    co.store_backoff_initial = milliseconds(5);
    co.store_backoff_max = milliseconds(50);
    co.store_error_log_interval_ms = 2000;
    ASSERT_TRUE(
        Consumer::create(inbox_.get(), "ledger", ledger::apply_credit, co, &consumer_).ok());
    RetentionOptions r;
    r.pass_budget = seconds(30);
    ASSERT_TRUE(Pruner::create(inbox_.get(), r, &pruner_).ok());
    // Expired ids, as a device that has run for a while has them.
    inbox_->with_connection([](SQLite::Database& db) {
      db.exec("BEGIN");
      SQLite::Statement ins(db,
                            "INSERT INTO inbox_processed (consumer_name, message_id, received_at)"
                            " VALUES ('ledger', ?1, 1)");
      for (int i = 0; i < kExpiredIds; ++i) {
        ins.bind(1, "expired-" + std::to_string(i));
        ins.exec();
        ins.reset();
      }
      db.exec("COMMIT");
    });
  }

  void TearDown() override {
    vfs_.set_io_hook(nullptr);
    if (stream_.joinable()) {
      // A store that stayed full would keep the stream blocked: give it room to finish.
      if (fs_) fs_->resize("64m");
      ::unlink(filler_.c_str());
      stream_.join();
    }
    pruner_.reset();
    consumer_.reset();
    inbox_.reset();
  }

  void start_stream() {
    stream_ = std::thread([this] {
      for (int i = 0; i < kCredits; ++i) {
        const Outcome o = consumer_->handle(credit_message(
            "c-" + std::to_string(i), "acct-" + std::to_string(i % 7), amount_of(i)));
        if (o != Outcome::kProcessed) ++unexpected_;
        done_ = i + 1;
      }
    });
  }

  int64_t fill() { return fill_file_system(filler_); }
  void free_space() { ::unlink(filler_.c_str()); }

  // The consumer waits for the store with SQLITE_FULL. With `no_progress`, it also makes
  // no progress meanwhile: true where no file has room left. After a checkpoint, commits
  // may go on for a while in WAL space the file already has (a restarted WAL is rewritten
  // from its start without growing), which loses nothing, so that case does not ask it.
  void expect_stuck_on_full(const std::string& where, bool no_progress = true) {
    ASSERT_TRUE(wait_until([&] { return consumer_->health().stuck; }, seconds(20)))
        << where << ": the consumer never got stuck";
    const int before = done_.load();
    std::this_thread::sleep_for(milliseconds(300));
    if (no_progress) {
      EXPECT_EQ(done_.load(), before) << where << ": a message completed on a full disk";
    }
    EXPECT_NE(consumer_->health().last_error.find("full"), std::string::npos)
        << where << ": " << consumer_->health().last_error;
  }

  // After the outside cause is gone the stream goes on by itself, past `target`.
  void expect_recovers_past(int target, const std::string& where) {
    const bool moved = wait_until([&] { return done_.load() >= target; }, seconds(60));
    EXPECT_TRUE(moved) << where << ": still stuck after the space was freed (" << done_.load()
                       << " done): " << consumer_->health().last_error;
    if (!moved) {
      fs_->resize("64m");  // unblock, so the rest of the test can run
      ASSERT_TRUE(wait_until([&] { return done_.load() >= target; }, seconds(60)));
    }
  }

  int64_t q(const std::string& sql) { return query_int(db_, sql); }

  FaultVfs vfs_{"disk_full_vfs"};  // declared first: destroyed after every connection
  TempDir dir_;
  std::string mnt_, db_, filler_;
  std::unique_ptr<TmpfsMount> fs_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
  std::unique_ptr<Pruner> pruner_;
  std::thread stream_;
  std::atomic<int> done_{0};
  std::atomic<int> unexpected_{0};
};

TEST_P(DiskFullTest, FillAndFreeAtSeveralPointsAppliesEveryCreditOnce) {
  // 1. Full before the first message.
  ASSERT_GT(fill(), 0);
  start_stream();
  expect_stuck_on_full("before the stream");
  EXPECT_EQ(done_.load(), 0);
  free_space();
  expect_recovers_past(300, "before the stream");

  // 2. Full in the middle of the stream.
  ASSERT_GT(fill(), 0);
  expect_stuck_on_full("mid-stream");
  free_space();
  expect_recovers_past(600, "mid-stream");

  // 3. Full while a checkpoint writes the database file (in WAL mode only checkpoints
  //    write it): the checkpoint fails half way, commits go on into the WAL until it
  //    cannot grow either.
  std::atomic<bool> filled_in_checkpoint{false};
  vfs_.set_io_hook([&](FaultOp op, FileKind kind) {
    if (op == FaultOp::kWrite && kind == FileKind::kMainDb && !filled_in_checkpoint.exchange(true))
      fill();
  });
  ASSERT_TRUE(wait_until([&] { return filled_in_checkpoint.load(); }, seconds(60)))
      << "no checkpoint ran";
  vfs_.set_io_hook(nullptr);
  expect_stuck_on_full("during a checkpoint", /*no_progress=*/false);
  free_space();
  expect_recovers_past(900, "during a checkpoint");

  // 4. Full while the pruner deletes expired ids (at the third write once its pass has
  //    begun). The pass stops with SQLITE_FULL, or finishes if its deletes fit in space
  //    the files already had; either way the stream waits for space and goes on after.
  std::atomic<bool> pruning{false};
  std::atomic<int> prune_writes{0};
  vfs_.set_io_hook([&](FaultOp op, FileKind) {
    if (op == FaultOp::kWrite && pruning.load() && ++prune_writes == 3) fill();
  });
  PruneResult pr;
  pruning = true;
  const Status first_pass = pruner_->prune_once(&pr);
  pruning = false;
  vfs_.set_io_hook(nullptr);
  ASSERT_GE(prune_writes.load(), 3) << "the disk was not filled during the prune";
  EXPECT_TRUE(first_pass.ok() || first_pass.code() == Status::Code::kFull)
      << first_pass.to_string();
  free_space();
  expect_recovers_past(1200, "during a prune");
  Status second_pass;
  ASSERT_TRUE(wait_until(
      [&] {
        second_pass = pruner_->prune_once(&pr);
        return second_pass.ok();
      },
      seconds(30)))
      << second_pass.to_string();

  expect_recovers_past(kCredits, "the end of the stream");
  stream_.join();
  EXPECT_EQ(unexpected_.load(), 0);

  int64_t expected = 0;
  for (int i = 0; i < kCredits; ++i) expected += amount_of(i);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), kCredits);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), kCredits);
  EXPECT_EQ(q("SELECT sum(amount) FROM ledger_entries"), expected);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), expected);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE message_id LIKE 'c-%'"), kCredits);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE received_at = 1"), 0)
      << "prune did not finish";
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(consumer_->counters().processed, kCredits);
  EXPECT_FALSE(consumer_->health().stuck);
  SQLite::Database check(db_, SQLite::OPEN_READONLY);
  EXPECT_EQ(check.execAndGet("PRAGMA integrity_check").getString(), "ok");
}

INSTANTIATE_TEST_SUITE_P(Sizes, DiskFullTest, ::testing::Values("4m", "8m"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string("Tmpfs") + p.param;
                         });

}  // namespace
}  // namespace mqtt_inbox::test

namespace mqtt_inbox::test {
namespace {

// A full disk at open is reported as full (kFull, transient: the programs wait, then exit
// 4), on every path of the open: an existing database closed cleanly (the open must make
// the -wal and -shm files), one with a WAL left by a crash, and a new one. It was
// reported as an I/O error, which a supervisor cannot tell from a failing disk.
TEST(DiskFullAtOpen, EveryPathOfAFullDiskAtOpenSaysFull) {
  TempDir dir;
  const std::string mnt = dir.file("fs");
  TmpfsMount fs(mnt, "2m");
  if (!fs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << fs.error() << ")";
  const std::string clean = mnt + "/clean.db", crashed = mnt + "/crashed.db",
                    fresh = mnt + "/fresh.db", filler = mnt + "/filler";
  {
    auto a = open_ledger_inbox(clean);
    ASSERT_TRUE(a);
  }
  // A WAL left behind: a copy of a live database with its -wal, as a crash leaves them.
  {
    auto b = open_ledger_inbox(crashed);
    ASSERT_TRUE(b);
    b->with_connection([](SQLite::Database& db) {
      db.exec("PRAGMA wal_autocheckpoint = 0");
      db.exec("CREATE TABLE IF NOT EXISTS t (x)");
      db.exec("INSERT INTO t VALUES (1)");
    });
    ASSERT_EQ(::system(("cp " + crashed + " " + crashed + ".copy && cp " + crashed + "-wal " +
                        crashed + ".copy-wal")
                           .c_str()),
              0);
  }
  const std::string crashed_copy = crashed + ".copy";
  ASSERT_GT(fill_file_system(filler), 0);
  for (const std::string& path : {clean, crashed_copy, fresh}) {
    SCOPED_TRACE(path);
    InboxOptions o;
    o.busy_timeout_ms = 100;
    o.startup_deadline_ms = 300;
    std::unique_ptr<Inbox> inbox;
    const Status s = Inbox::open(path, o, &inbox);
    EXPECT_EQ(s.code(), Status::Code::kFull) << s.to_string();
    EXPECT_TRUE(s.is_transient_store_error()) << s.to_string();
    // A new database that does not fit is not waited for, and leaves no file behind.
    if (path == fresh) {
      for (const char* suffix : {"", "-wal", "-shm", ".lock"})
        EXPECT_NE(::access((fresh + suffix).c_str(), F_OK), 0) << suffix;
    }
  }
  ::unlink(filler.c_str());
  std::unique_ptr<Inbox> inbox;
  EXPECT_TRUE(Inbox::open(clean, {}, &inbox).ok());
}

}  // namespace
}  // namespace mqtt_inbox::test

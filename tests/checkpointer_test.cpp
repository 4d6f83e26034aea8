// Issue 14: WAL checkpoints on a thread of their own (src/checkpointer.h). What must hold:
// the WAL stays bounded while messages commit; a checkpoint that fails (the database file
// cannot be written or synced) costs no commit, and the WAL shrinks again once the disk
// recovers; closing the Inbox while checkpoints run stops the thread first (also this
// test's TSan check). Real SQLite files; failures injected by the fault VFS on the main
// database file only, which nothing but a checkpoint writes in WAL mode.
#include <filesystem>

#include "support/fault_vfs.h"
#include "support/ledger_fixture.h"

namespace mqtt_inbox::test {
namespace {

constexpr int kThresholdPages = 32;
constexpr int64_t kJournalLimit = 256 * 1024;

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override { db_path_ = dir_.file("inbox.db"); }

  InboxOptions options(const std::string& vfs) const {
    InboxOptions o;
    o.vfs = vfs;
    o.wal_autocheckpoint_pages = kThresholdPages;
    o.journal_size_limit_bytes = kJournalLimit;
    o.background_checkpoint = true;  // opt-in (options.h)
    return o;
  }

  // Credits 1 to account "a" for ids prefix-0 .. prefix-(n-1); every one must commit.
  static void credit(Consumer* c, const std::string& prefix, int n) {
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(c->handle(credit_message(prefix + std::to_string(i), "a", 1)),
                Outcome::kProcessed)
          << prefix << i;
  }

  int64_t wal_bytes() const {
    std::error_code ec;
    const auto n = std::filesystem::file_size(db_path_ + "-wal", ec);
    return ec ? 0 : static_cast<int64_t>(n);
  }

  int64_t balance() const {
    return query_int(db_path_, "SELECT balance FROM accounts WHERE account = 'a'");
  }

  TempDir dir_;
  std::string db_path_;
};

// A steady stream: the database file is written (checkpoints ran), the WAL never grows
// past a few thresholds' worth of pages, and every credit is there.
TEST_F(CheckpointerTest, BackgroundCheckpointsKeepTheWalBounded) {
  FaultVfs vfs("ckpt_bounded_vfs");
  auto inbox = open_ledger_inbox(db_path_, options(vfs.name()));
  ASSERT_TRUE(inbox);
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", ledger::CreditHandler{}, {}, &c).ok());
  vfs.reset_counters();
  // The commit that sees 2x the threshold checkpoints itself (checkpointer.h); one more
  // message's frames on top. Frames are page size + 24 bytes, after a 32-byte header.
  const int64_t bound = (2 * kThresholdPages + 8) * (4096 + 24) + 32;
  int64_t max_wal = 0;
  for (int round = 0; round < 20; ++round) {
    credit(c.get(), "r" + std::to_string(round) + "-", 100);
    max_wal = std::max(max_wal, wal_bytes());
  }
  EXPECT_GT(vfs.counters(FileKind::kMainDb).writes, 0u) << "no checkpoint reached the file";
  EXPECT_LE(max_wal, bound);
  c.reset();
  inbox.reset();
  EXPECT_EQ(balance(), 2000);
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM inbox_processed"), 2000);
}

// Every way a checkpoint can fail on the database file (write, fsync): messages keep
// committing, none is lost, and once the fault clears the WAL is copied back and cut to
// journal_size_limit. Checked after a clean close and from a fresh connection.
TEST_F(CheckpointerTest, FailingCheckpointsLoseNoCommit) {
  for (const FaultOp op : {FaultOp::kWrite, FaultOp::kSync}) {
    SCOPED_TRACE(op == FaultOp::kWrite ? "write" : "sync");
    std::filesystem::remove_all(dir_.path());
    std::filesystem::create_directories(dir_.path());
    FaultVfs vfs(op == FaultOp::kWrite ? "ckpt_fail_write_vfs" : "ckpt_fail_sync_vfs");
    auto inbox = open_ledger_inbox(db_path_, options(vfs.name()));
    ASSERT_TRUE(inbox);
    std::unique_ptr<Consumer> c;
    ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", ledger::CreditHandler{}, {}, &c).ok());
    vfs.arm(Fault::always(op, 0, FileKind::kMainDb));
    credit(c.get(), "failing-", 600);  // ~20 thresholds of WAL
    EXPECT_GT(vfs.injected(), 0u) << "no checkpoint was tried";
    const int64_t grown = wal_bytes();
    EXPECT_GT(grown, 4 * kThresholdPages * 4096) << "the WAL could not have been copied back";
    vfs.disarm();
    credit(c.get(), "after-", 400);
    EXPECT_LT(wal_bytes(), grown) << "the WAL did not shrink after the fault cleared";
    EXPECT_LE(wal_bytes(), kJournalLimit + (2 * kThresholdPages + 8) * (4096 + 24));
    c.reset();
    inbox.reset();
    EXPECT_EQ(balance(), 1000);
    EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM ledger_entries"), 1000);
  }
}

// Closing the Inbox in the middle of a stream, again and again, while the thread is likely
// inside a checkpoint: the thread is joined before the connection closes, and every
// credit of every session is there.
TEST_F(CheckpointerTest, CloseWhileCheckpointing) {
  for (int session = 0; session < 8; ++session) {
    InboxOptions o = options("");
    o.wal_autocheckpoint_pages = 4;  // a checkpoint every few messages
    auto inbox = open_ledger_inbox(db_path_, o);
    ASSERT_TRUE(inbox);
    std::unique_ptr<Consumer> c;
    ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", ledger::CreditHandler{}, {}, &c).ok());
    credit(c.get(), "s" + std::to_string(session) + "-", 50);
    c.reset();
    inbox.reset();
    EXPECT_EQ(balance(), 50 * (session + 1));
  }
}

}  // namespace
}  // namespace mqtt_inbox::test

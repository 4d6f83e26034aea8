// Proves the test VFS itself against real SQLite files: each injected fault
// surfaces as the expected SQLite error, and the power-loss model loses
// exactly what an fsync-less write would lose. Every verdict is taken from
// the data found after reopening the database with the plain default VFS.
#include "support/fault_vfs.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

namespace mqtt_inbox::test {
namespace {

constexpr const char* kVfs = "fault_vfs_test";

class FaultVfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fault_vfs_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/inbox.db";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::string path_;
};

// Opens with extended result codes so step()/exec() report e.g.
// SQLITE_IOERR_FSYNC and not just SQLITE_IOERR.
sqlite3* open_db(const std::string& path, const char* vfs, const char* synchronous = "FULL") {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs);
  EXPECT_EQ(rc, SQLITE_OK) << sqlite3_errstr(rc);
  sqlite3_extended_result_codes(db, 1);
  std::string pragmas = std::string(
                            "PRAGMA journal_mode=WAL;"
                            "PRAGMA synchronous=") +
                        synchronous;
  EXPECT_EQ(sqlite3_exec(db, pragmas.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  return db;
}

int exec(sqlite3* db, const std::string& sql) {
  return sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
}

void must_exec(sqlite3* db, const std::string& sql) {
  ASSERT_EQ(exec(db, sql), SQLITE_OK) << sql << ": " << sqlite3_errmsg(db);
}

std::string query_text(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  std::string out = "<error>";
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    auto* text = sqlite3_column_text(st, 0);
    out = text ? reinterpret_cast<const char*>(text) : "<null>";
  }
  sqlite3_finalize(st);
  return out;
}

// What a freshly booted process sees: default VFS, WAL recovery included.
struct Reopened {
  std::int64_t rows = -1;
  std::string integrity;
};
Reopened reopen(const std::string& path, const std::string& where = "1") {
  sqlite3* db = nullptr;
  Reopened r;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK) {
    r.integrity = query_text(db, "PRAGMA integrity_check");
    std::string n = query_text(db, "SELECT count(*) FROM t WHERE " + where);
    if (n != "<error>") r.rows = std::stoll(n);
  }
  sqlite3_close(db);
  return r;
}

void create_table(sqlite3* db) {
  must_exec(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL)");
}

void insert(sqlite3* db, int id) {
  must_exec(db, "INSERT INTO t VALUES(" + std::to_string(id) + ", 'payload')");
}

// Arms `fault`, runs one explicit transaction and checks how COMMIT fails;
// the row must then be absent for a new process.
void expect_commit_fails(const std::string& path, const Fault& fault, int expected_extended) {
  FaultVfs vfs(kVfs);
  sqlite3* db = open_db(path, kVfs);
  create_table(db);
  insert(db, 1);

  vfs.arm(fault);
  must_exec(db, "BEGIN; INSERT INTO t VALUES(2, 'doomed')");
  int rc = exec(db, "COMMIT");
  EXPECT_EQ(rc, expected_extended) << sqlite3_errstr(rc);
  EXPECT_EQ(sqlite3_extended_errcode(db), expected_extended);
  EXPECT_EQ(vfs.injected(), 1u);
  vfs.disarm();
  if (!sqlite3_get_autocommit(db)) exec(db, "ROLLBACK");
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);

  Reopened r = reopen(path);
  EXPECT_EQ(r.integrity, "ok");
  EXPECT_EQ(r.rows, 1) << "the failed commit must not be visible";
}

TEST_F(FaultVfsTest, WalSyncFailureFailsCommitWithIoerrFsync) {
  expect_commit_fails(path_, Fault::once(FaultOp::kSync, SQLITE_IOERR_FSYNC, FileKind::kWal),
                      SQLITE_IOERR_FSYNC);
}

TEST_F(FaultVfsTest, WalWriteFailureFailsCommitWithIoerrWrite) {
  expect_commit_fails(path_, Fault::once(FaultOp::kWrite, 0, FileKind::kWal), SQLITE_IOERR_WRITE);
}

TEST_F(FaultVfsTest, FullDiskOnWriteFailsCommitWithSqliteFull) {
  expect_commit_fails(path_, Fault::once(FaultOp::kWrite, SQLITE_FULL, FileKind::kWal),
                      SQLITE_FULL);
}

// Why the library must treat a failed commit as "maybe committed" and stay
// idempotent on retry: the frames of the failed commit are in the WAL file,
// and if the WAL survives (here: the close-time checkpoint fails too), WAL
// recovery replays them.
TEST_F(FaultVfsTest, PersistentWalSyncFailureCanResurrectTheFailedCommit) {
  {
    FaultVfs vfs(kVfs);
    sqlite3* db = open_db(path_, kVfs);
    create_table(db);
    insert(db, 1);
    vfs.arm(Fault::always(FaultOp::kSync, 0, FileKind::kWal));
    EXPECT_EQ(exec(db, "INSERT INTO t VALUES(2, 'maybe')"), SQLITE_IOERR_FSYNC);
    EXPECT_EQ(query_text(db, "SELECT count(*) FROM t"), "1");
    EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  }
  Reopened r = reopen(path_);
  EXPECT_EQ(r.integrity, "ok");
  EXPECT_EQ(r.rows, 2);
}

TEST_F(FaultVfsTest, FaultOnlyHitsTheArmedFileKind) {
  FaultVfs vfs(kVfs);
  sqlite3* db = open_db(path_, kVfs);
  create_table(db);
  // WAL mode never syncs the main db on commit, so this must not fire.
  vfs.arm(Fault::always(FaultOp::kSync, 0, FileKind::kMainDb));
  insert(db, 1);
  EXPECT_EQ(vfs.injected(), 0u);
  // ...but a checkpoint does.
  EXPECT_NE(exec(db, "PRAGMA wal_checkpoint(TRUNCATE)"), SQLITE_OK);
  EXPECT_GE(vfs.injected(), 1u);
  vfs.disarm();
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  EXPECT_EQ(reopen(path_).rows, 1);
}

TEST_F(FaultVfsTest, NthWriteFailsThenDisarmedCommitsSucceed) {
  FaultVfs vfs(kVfs);
  sqlite3* db = open_db(path_, kVfs);
  create_table(db);
  // A single-row commit writes one WAL frame, as two xWrite calls (frame
  // header, page); measure instead of assuming.
  vfs.reset_counters();
  insert(db, 1);
  const auto per_commit = vfs.counters(FileKind::kWal).writes;
  ASSERT_GE(per_commit, 1u);
  vfs.arm(Fault::nth(FaultOp::kWrite, per_commit + 1, 0, FileKind::kWal));
  insert(db, 2);
  EXPECT_EQ(exec(db, "INSERT INTO t VALUES(3, 'x')"), SQLITE_IOERR_WRITE);
  // The rule is spent: the same connection can retry.
  insert(db, 3);
  EXPECT_EQ(vfs.injected(), 1u);
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  Reopened r = reopen(path_);
  EXPECT_EQ(r.rows, 3);
  EXPECT_EQ(r.integrity, "ok");
}

TEST_F(FaultVfsTest, OpenFailureGivesCantOpen) {
  FaultVfs vfs(kVfs);
  vfs.arm(Fault::once(FaultOp::kOpen, 0, FileKind::kMainDb));
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, kVfs);
  EXPECT_EQ(rc, SQLITE_CANTOPEN);
  sqlite3_close(db);
  EXPECT_FALSE(std::filesystem::exists(path_));
  EXPECT_EQ(vfs.injected(), 1u);

  // The WAL is opened lazily, at the first read of a WAL-mode database.
  db = open_db(path_, kVfs);
  create_table(db);
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  vfs.arm(Fault::once(FaultOp::kOpen, 0, FileKind::kWal));
  ASSERT_EQ(sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READWRITE, kVfs), SQLITE_OK);
  sqlite3_extended_result_codes(db, 1);
  EXPECT_EQ(exec(db, "SELECT * FROM t") & 0xff, SQLITE_CANTOPEN);
  EXPECT_EQ(vfs.injected(), 2u);
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
}

// Commits `before` rows and checkpoints them into the main db, then commits
// `after` more rows, cuts the power, writes one more row through the still
// open connection, closes it and restores.
Reopened run_power_cut(const std::string& path, const char* synchronous, int before, int after,
                       CutOptions cut = {}) {
  FaultVfs vfs(kVfs, /*simulate_power_loss=*/true);
  sqlite3* db = open_db(path, kVfs, synchronous);
  create_table(db);
  for (int i = 1; i <= before; ++i) insert(db, i);
  must_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)");
  for (int i = before + 1; i <= before + after; ++i) insert(db, i);

  vfs.power_cut(cut);
  EXPECT_TRUE(vfs.is_cut());
  // Post-cut I/O "succeeds" but must vanish, as must close's checkpoint.
  EXPECT_EQ(exec(db, "INSERT INTO t VALUES(-1, 'after the cut')"), SQLITE_OK);
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  vfs.restore_after_cut();
  EXPECT_FALSE(vfs.is_cut());
  EXPECT_FALSE(std::filesystem::exists(path + "-shm"));

  Reopened r = reopen(path);
  EXPECT_EQ(reopen(path, "id = -1").rows, 0) << "post-cut write survived";
  return r;
}

TEST_F(FaultVfsTest, PowerCutWithWalFullKeepsEveryCommit) {
  constexpr int kBefore = 5, kAfter = 20;
  Reopened r = run_power_cut(path_, "FULL", kBefore, kAfter);
  EXPECT_EQ(r.integrity, "ok");
  EXPECT_EQ(r.rows, kBefore + kAfter);
}

TEST_F(FaultVfsTest, PowerCutWithWalNormalLosesCommitsSinceLastSync) {
  constexpr int kBefore = 5, kAfter = 20;
  Reopened r = run_power_cut(path_, "NORMAL", kBefore, kAfter);
  EXPECT_EQ(r.integrity, "ok");
  // The checkpoint synced the first rows; the later ones were never fsynced.
  EXPECT_GE(r.rows, kBefore);
  EXPECT_LT(r.rows, kBefore + kAfter) << "NORMAL should lose unsynced commits";
  EXPECT_EQ(r.rows, kBefore) << "nothing unsynced is kept by default";
}

// Part of the dirty page cache may have reached the disk before the cut,
// in any subset: WAL+FULL must not care.
TEST_F(FaultVfsTest, PowerCutWithPartialWritebackStillKeepsEveryFullCommit) {
  constexpr int kBefore = 3, kAfter = 15;
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directory(dir_);
    Reopened r = run_power_cut(path_, "FULL", kBefore, kAfter, CutOptions{0.5, seed});
    EXPECT_EQ(r.integrity, "ok");
    EXPECT_EQ(r.rows, kBefore + kAfter);
  }
}

TEST_F(FaultVfsTest, RestoreRefusesWhileConnectionsAreOpen) {
  FaultVfs vfs(kVfs, /*simulate_power_loss=*/true);
  sqlite3* db = open_db(path_, kVfs);
  create_table(db);
  EXPECT_THROW(vfs.restore_after_cut(), std::logic_error);  // not cut yet
  vfs.power_cut();
  EXPECT_THROW(vfs.restore_after_cut(), std::logic_error);  // db still open
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  vfs.restore_after_cut();
  EXPECT_EQ(reopen(path_).rows, 0);
}

TEST_F(FaultVfsTest, CountersMeasureWalBytesPerCommit) {
  FaultVfs vfs(kVfs);
  sqlite3* db = open_db(path_, kVfs);
  create_table(db);
  const int page_size = std::stoi(query_text(db, "PRAGMA page_size"));
  vfs.reset_counters();

  constexpr int kCommits = 50;
  for (int i = 1; i <= kCommits; ++i) insert(db, i);

  IoCounters wal = vfs.counters(FileKind::kWal);
  IoCounters main_db = vfs.counters(FileKind::kMainDb);
  const double per_commit = double(wal.bytes_written) / kCommits;
  std::cout << "WAL bytes per single-row commit: " << per_commit << " (page size " << page_size
            << ")\n";
  // One frame (24-byte header + page) per commit, give or take the WAL
  // header and an occasional second page.
  EXPECT_GE(per_commit, page_size);
  EXPECT_LE(per_commit, 3.0 * (page_size + 24));
  EXPECT_GE(wal.syncs, static_cast<std::uint64_t>(kCommits));  // FULL
  EXPECT_EQ(main_db.bytes_written, 0u) << "no checkpoint expected yet";
  EXPECT_EQ(vfs.counters().bytes_written, wal.bytes_written + main_db.bytes_written +
                                              vfs.counters(FileKind::kJournal).bytes_written +
                                              vfs.counters(FileKind::kOther).bytes_written);
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  EXPECT_EQ(reopen(path_).rows, kCommits);
}

// Arming from one thread while another commits (as Paho's callback thread
// and a test thread will): every commit that reported success is in the
// database, every failed one is not. Also meant to run under TSan.
TEST_F(FaultVfsTest, ArmingFromAnotherThreadIsSafe) {
  FaultVfs vfs(kVfs);
  sqlite3* db = open_db(path_, kVfs);
  create_table(db);
  std::atomic<bool> done{false};
  std::atomic<int> ok{0}, failed{0};
  std::thread writer([&] {
    for (int i = 1; i <= 300; ++i) {
      int rc = exec(db, "INSERT INTO t VALUES(" + std::to_string(i) + ", 'x')");
      (rc == SQLITE_OK ? ok : failed)++;
    }
    done = true;
  });
  while (!done) {
    vfs.arm(Fault::always(FaultOp::kWrite, 0, FileKind::kWal));
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    vfs.disarm();
    (void)vfs.counters();
    std::this_thread::sleep_for(std::chrono::microseconds(700));
  }
  writer.join();
  vfs.disarm();
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  Reopened r = reopen(path_);
  EXPECT_EQ(r.integrity, "ok");
  EXPECT_EQ(r.rows, ok.load());
  EXPECT_EQ(ok + failed, 300);
  std::cout << ok << " commits ok, " << failed << " failed by injection\n";
}

}  // namespace
}  // namespace mqtt_inbox::test

#include "checkpointer.h"

#include <sqlite3.h>

#include <chrono>

namespace mqtt_inbox::detail {

Checkpointer::Checkpointer(const std::string& path, const std::string& vfs, bool full,
                           int busy_timeout_ms, int threshold_frames, std::mutex* writer_mu,
                           std::shared_ptr<spdlog::logger> log)
    : threshold_(threshold_frames), writer_mu_(writer_mu), log_(std::move(log)) {
  conn_ = std::make_unique<SQLite::Database>(path, SQLite::OPEN_READWRITE | SQLite::OPEN_URI,
                                             busy_timeout_ms, vfs);
  // A checkpoint syncs the WAL before copying it and the database file after, unless
  // synchronous is OFF (https://sqlite.org/pragma.html#pragma_synchronous).
  conn_->exec(full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
  // It reads nothing but the WAL and writes pages straight from it: a small page cache.
  conn_->exec("PRAGMA cache_size = -64");
  // A checkpoint on a connection that has not read the database yet does nothing: the
  // connection opens the WAL at its first read.
  conn_->execAndGet("SELECT count(*) FROM sqlite_master");
  thread_ = std::thread([this] { run(); });
}

Checkpointer::~Checkpointer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Checkpointer::on_commit(sqlite3* db, const char* name, int frames) {
  if (frames < threshold_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    due_ = true;
  }
  cv_.notify_one();
  if (frames < 2 * threshold_) return;
  // Far behind: wait for the thread's checkpoint round to end, then copy the rest here.
  // We hold writer_mu_, so no frame is added meanwhile and this one copies all of it.
  std::lock_guard<std::mutex> lock(checkpoint_mu_);
  (void)sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
}

bool Checkpointer::checkpoint(int* wal, int* copied) {
  std::lock_guard<std::mutex> lock(checkpoint_mu_);
  const int rc = sqlite3_wal_checkpoint_v2(conn_->getHandle(), nullptr,
                                           SQLITE_CHECKPOINT_PASSIVE, wal, copied);
  if (rc == SQLITE_OK) {
    ++checkpoints_;
    return true;
  }
  // BUSY: another checkpoint is running (the pruner's, or the hook's). Anything else is
  // logged at most once a minute; the frames stay in the WAL for the next try.
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  if ((rc & 0xff) != SQLITE_BUSY && now - last_warning_ms_ > 60000) {
    last_warning_ms_ = now;
    log_->warn("background checkpoint failed: {} ({})", sqlite3_errstr(rc), rc);
  }
  return false;
}

void Checkpointer::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || due_; });
      if (stop_) return;
    }
    // PASSIVE copies what no reader still needs and never waits for the writer. Commits
    // go on meanwhile; another round is worth its two fsyncs (WAL before, database after)
    // only while a good part of a threshold is left.
    int before = -1, left = 0;
    bool ok = true;
    for (int round = 0; round < 4; ++round) {
      int wal = 0, copied = 0;
      if (!(ok = checkpoint(&wal, &copied))) break;
      left = wal - copied;
      if (left <= threshold_ / 4 || left == before) break;  // little left, or a reader
      before = left;
    }
    // The rest with the writer held off, so that this checkpoint copies the whole WAL and
    // the next commit restarts it (checkpointer.h).
    if (ok && left > 0) {
      std::lock_guard<std::mutex> writer(*writer_mu_);
      int wal = 0, copied = 0;
      (void)checkpoint(&wal, &copied);
    }
    // One cycle per threshold: commits during it must not start another (each would cost
    // two fsyncs for a few frames). If the WAL was not copied back (a reader, a failure),
    // the next commit past the threshold wakes the thread again, as SQLite's own
    // autocheckpoint retries after every such commit.
    std::lock_guard<std::mutex> lock(mu_);
    due_ = false;
  }
}

}  // namespace mqtt_inbox::detail

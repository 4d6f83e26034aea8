// Internal: WAL checkpoints off the message path. In WAL mode SQLite copies the WAL back
// into the database file (a checkpoint) inside the commit that crosses
// wal_autocheckpoint: that commit writes ~1000 pages and, with FULL or NORMAL, fsyncs the
// database file, and the message waiting for it pays tens of milliseconds. Measured, the
// autocheckpoint took 35-45 % of the per-message time with synchronous=NORMAL
// (docs/benchmarks.md). The Checkpointer does that work on a connection and a thread of its
// own, so the message path only appends to the WAL.
//
// The inbox connection's wal hook (sqlite3_wal_hook, which replaces SQLite's own
// autocheckpoint) reports the WAL length after every commit; past the threshold the
// thread runs PASSIVE checkpoints (they never block the writer) while they make progress.
// Commits go on meanwhile, so those alone may never copy the whole WAL back, and SQLite
// restarts the WAL from its beginning only after a checkpoint that copied all of it
// (https://sqlite.org/wal.html#ckpt): a steady stream grew the WAL to 35 MB that way
// (RetentionTest.WalStaysBoundedWithAReaderAttached). So the thread ends each cycle with
// one more PASSIVE checkpoint while it holds the writer's mutex: no commit can add frames
// during it, it copies only the few frames left, and the next commit restarts the WAL, as
// after SQLite's own autocheckpoint. A hard bound, however slow the thread: once the WAL
// holds 2x the threshold, the commit that sees it waits for the thread's checkpoint in
// progress and then checkpoints itself, as SQLite would, with no commit able to add frames
// meanwhile. A failed checkpoint loses nothing: the frames stay in
// the WAL, which then grows until a checkpoint succeeds (as with SQLite's own).
//
// Thread safety: on_commit() is called on the committing thread; the rest is the owner's.
#pragma once

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "log.h"

namespace mqtt_inbox::detail {

class Checkpointer {
 public:
  // Opens the second connection (`vfs`, "" = default; synchronous FULL or NORMAL, which
  // decides whether a checkpoint fsyncs) and starts the thread. Checkpoints start once the
  // WAL holds `threshold_frames` frames. `writer_mu` is the mutex every write on the
  // inbox connection holds (Inbox::Impl::mu); it must outlive this object and must not be
  // held while it is destroyed. Throws SQLite::Exception if the connection cannot be
  // opened.
  Checkpointer(const std::string& path, const std::string& vfs, bool full, int busy_timeout_ms,
               int threshold_frames, std::mutex* writer_mu, std::shared_ptr<spdlog::logger> log);
  ~Checkpointer();  // stops (joins) the thread, closes its connection
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Called by the wal hook after each commit on the inbox connection `db` (under
  // writer_mu), with the WAL's length in frames: wakes the thread past the threshold; at
  // 2x, checkpoints on `db` itself once the thread's checkpoint in progress ended.
  void on_commit(sqlite3* db, const char* name, int frames);

  // Checkpoints run by the thread so far (for tests and stats).
  int64_t checkpoints() const { return checkpoints_.load(); }

 private:
  void run();
  // One PASSIVE checkpoint on conn_; false (and a rate-limited warning) if it failed.
  bool checkpoint(int* wal, int* copied);

  const int threshold_;
  std::mutex* const writer_mu_;
  std::mutex checkpoint_mu_;  // held by whoever checkpoints; never taken with writer_mu_
                              // by the thread (the hook takes it under writer_mu_)
  int64_t last_warning_ms_ = 0;  // the thread's
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<SQLite::Database> conn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool due_ = false;
  std::atomic<int64_t> checkpoints_{0};
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace mqtt_inbox::detail

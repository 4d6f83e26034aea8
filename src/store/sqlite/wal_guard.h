// Internal: the inbox's own files must never be what keeps a disk full (issue 13).
//
// SQLite's automatic checkpoint runs once the WAL holds wal_autocheckpoint pages (1,000
// by default: 4 MB with 4 KiB pages). On a small file system that is all the space
// there is: the WAL fills the disk before it reaches the threshold, no checkpoint runs,
// and every later write fails with SQLITE_FULL, even after the space that an outside
// file took is freed. Two measures on the inbox's connection prevent that:
//
//  - Adaptive checkpoints. A WAL hook (sqlite3_wal_hook, which replaces SQLite's
//    autocheckpoint hook) checkpoints (PASSIVE) after a commit once the WAL holds more
//    frames than a quarter of the file system's free space, read with statvfs(2) (again
//    each time the WAL has grown by kRecheckPages); never more than
//    wal_autocheckpoint_pages, never less than kMinWalPages. The WAL then
//    stays small where space is scarce, and the checkpoint always has room to grow the
//    database file.
//  - On SQLITE_FULL, at once: a TRUNCATE checkpoint, which copies the WAL into the
//    database and cuts the WAL file to zero bytes, giving its space back to the file
//    system (https://sqlite.org/pragma.html#pragma_wal_checkpoint).
//
// min_free_bytes (inbox.h) is the free space these need; `mqtt-inbox check` warns below it.
//
// The same hook, which SQLite calls after every commit on the connection, also wakes the
// outbox relays after a commit that enqueued (store/sqlite/commit_wake.h). Every connection the
// library opens to write the file has one: the Inbox's, and each StoreThenProcess worker's.
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "store/sqlite/commit_wake.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox::detail {

// Bytes available to this process on the file system holding `path`'s folder
// (statvfs f_bavail * f_frsize), or -1 if unknown.
int64_t free_bytes(const std::string& path);

class WalGuard {
 public:
  // The smallest WAL the hook lets grow before it checkpoints, in pages.
  static constexpr int kMinWalPages = 32;
  // The WAL growth, in pages, after which the hook reads free space again (between
  // readings it uses the last limit).
  static constexpr int kRecheckPages = 32;

  // Installs the WAL hook on `db` (not owned; must outlive the guard) for the database
  // at `path`. `max_pages` is InboxOptions::wal_autocheckpoint_pages; 0 keeps automatic
  // checkpoints off, as it does in SQLite (on_full still runs). `wake` (optional) watches
  // `db` and is told of every commit on it.
  WalGuard(sqlite3* db, std::string path, int page_size, int max_pages,
           std::shared_ptr<spdlog::logger> log, std::shared_ptr<CommitWake> wake = nullptr);
  ~WalGuard();  // removes the hook and the watch
  WalGuard(const WalGuard&) = delete;
  WalGuard& operator=(const WalGuard&) = delete;

  // After a write failed with SQLITE_FULL, outside a transaction, by the thread that
  // owns the connection: checkpoint (TRUNCATE) so the WAL gives its space back.
  void on_full();

  // The WAL size, in pages, after which the hook checkpoints now.
  int checkpoint_pages() const;

  // Stops all checkpoints (the file was found corrupt and is not written again).
  void disable() { disabled_ = true; }

 private:
  static int hook(void* self, sqlite3* db, const char* name, int frames);

  sqlite3* const db_;
  const std::string path_;
  const int page_size_;
  const int max_pages_;
  const std::shared_ptr<spdlog::logger> log_;
  const std::shared_ptr<CommitWake> wake_;
  CommitWake::Watch watch_;  // this connection's, registered with wake_
  std::atomic<bool> disabled_{false};
  // Only touched by the connection's thread (the hook runs inside its commits):
  bool low_space_logged_ = false;
  int read_at_frames_ = -1;  // WAL size at the last free-space reading; -1 = none yet
  int limit_ = 0;            // checkpoint_pages() at that reading
};

}  // namespace mqtt_inbox::detail

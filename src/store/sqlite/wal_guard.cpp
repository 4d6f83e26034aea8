#include "store/sqlite/wal_guard.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "mqtt_inbox/sqlite.h"

namespace mqtt_inbox {

int64_t min_free_bytes(int page_size_bytes) {
  // The smallest WAL and the database growth that checkpointing it needs, twice over,
  // and the -shm file (32 KiB covers 4,096 WAL frames).
  return 4LL * detail::WalGuard::kMinWalPages * page_size_bytes + 32 * 1024;
}

}  // namespace mqtt_inbox

namespace mqtt_inbox::detail {

int64_t free_bytes(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string folder =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  struct statvfs st {};
  if (::statvfs(folder.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

namespace {
int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}
}  // namespace

std::shared_ptr<CommitWake> CommitWake::of_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::make_shared<CommitWake>();
  // Weak: a file no Inbox holds any more drops out at the next look-up. An inode reused by
  // a new file while an old Inbox still holds the old one's only costs spurious wakes.
  static std::mutex mu;
  static std::map<std::pair<dev_t, ino_t>, std::weak_ptr<CommitWake>> files;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = files.begin(); it != files.end();)
    it = it->second.expired() ? files.erase(it) : std::next(it);
  std::weak_ptr<CommitWake>& slot = files[{st.st_dev, st.st_ino}];
  std::shared_ptr<CommitWake> wake = slot.lock();
  if (!wake) {
    wake = std::make_shared<CommitWake>();
    slot = wake;
  }
  return wake;
}

WalGuard::WalGuard(sqlite3* db, std::string path, int page_size, int max_pages,
                   std::shared_ptr<spdlog::logger> log, std::shared_ptr<CommitWake> wake)
    : db_(db),
      path_(std::move(path)),
      page_size_(std::max(512, page_size)),
      max_pages_(max_pages),
      log_(std::move(log)),
      wake_(std::move(wake)),
      watch_(db) {
  if (wake_) wake_->watch(&watch_);
  // Also with max_pages 0 (no automatic checkpoints) when relays are to be woken.
  if (max_pages_ > 0 || wake_) sqlite3_wal_hook(db_, &WalGuard::hook, this);
}

WalGuard::~WalGuard() {
  sqlite3_wal_hook(db_, nullptr, nullptr);
  if (wake_) wake_->unwatch(&watch_);
}

int WalGuard::checkpoint_pages() const {
  const int64_t free = free_bytes(path_);
  if (free < 0) return std::max(kMinWalPages, max_pages_);
  const int64_t quarter = free / 4 / page_size_;
  return static_cast<int>(
      std::clamp<int64_t>(quarter, kMinWalPages, std::max(kMinWalPages, max_pages_)));
}

int WalGuard::hook(void* self, sqlite3* db, const char* name, int frames) {
  auto* g = static_cast<WalGuard*>(self);
  if (g->wake_) g->wake_->committed(g->watch_);
  if (g->disabled_.load() || g->max_pages_ <= 0 || frames < kMinWalPages) return SQLITE_OK;
  // statvfs(2) after every commit was a system call per message (issue 14). Free space is
  // read again only once the WAL has grown by kRecheckPages since the last reading (or was
  // restarted by a checkpoint): a stale limit moves a checkpoint by at most that many
  // pages, and a disk that fills in between has its own path (on_full).
  if (g->read_at_frames_ < 0 || frames < g->read_at_frames_ ||
      frames - g->read_at_frames_ >= kRecheckPages) {
    g->limit_ = g->checkpoint_pages();
    g->read_at_frames_ = frames;
  }
  const int limit = g->limit_;
  if (frames < limit) return SQLITE_OK;
  if (limit < g->max_pages_ && !g->low_space_logged_) {
    g->low_space_logged_ = true;
    g->log_->warn(
        "inbox {}: little free space ({} bytes): checkpointing the WAL every {} pages "
        "instead of {}",
        g->path_, free_bytes(g->path_), limit, g->max_pages_);
  }
  // As SQLite's own autocheckpoint: PASSIVE never waits; errors (SQLITE_FULL while the
  // database grows) leave the WAL as it was, and the next commit tries again.
  (void)sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  return SQLITE_OK;
}

void WalGuard::on_full() {
  if (disabled_.load() || sqlite3_get_autocommit(db_) == 0) return;
  const int64_t before = file_size(path_ + "-wal");
  int log = -1, done = -1;
  const int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_TRUNCATE, &log, &done);
  const int64_t after = file_size(path_ + "-wal");
  if (rc == SQLITE_OK) {
    if (before > after)
      log_->warn(
          "inbox {}: disk full: checkpointed the WAL and truncated it, {} bytes given back "
          "to the file system ({} bytes free now)",
          path_, before - after, free_bytes(path_));
  } else {
    log_->debug("inbox {}: disk full: the WAL could not be checkpointed yet ({}; {} of {} frames)",
                path_, sqlite3_errstr(rc), done, log);
  }
}

}  // namespace mqtt_inbox::detail

// Shared helpers for the benchmark programs: clocks, JSON result lines, percentiles,
// /proc/self/io, and a counting SQLite VFS that tallies what SQLite asks the file system
// to write and sync (the "logical" write volume, before the page cache and the device).
#pragma once

#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace bench {

// CLOCK_MONOTONIC in ns. On Linux it is shared by all processes of the machine, so a
// publisher's timestamp can be compared with a subscriber's.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One JSON object per line. Keys and string values are plain ASCII chosen by the benches.
class Json {
 public:
  Json& add(const std::string& k, const std::string& v) {
    sep();
    out_ << '"' << k << "\":\"" << v << '"';
    return *this;
  }
  Json& add(const std::string& k, const char* v) { return add(k, std::string(v)); }
  Json& add(const std::string& k, double v) {
    sep();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    out_ << '"' << k << "\":" << buf;
    return *this;
  }
  Json& add(const std::string& k, int64_t v) {
    sep();
    out_ << '"' << k << "\":" << v;
    return *this;
  }
  Json& add(const std::string& k, int v) { return add(k, static_cast<int64_t>(v)); }
  Json& add(const std::string& k, bool v) {
    sep();
    out_ << '"' << k << "\":" << (v ? "true" : "false");
    return *this;
  }
  void print() const {
    std::printf("%s}\n", out_.str().c_str());
    std::fflush(stdout);
  }

 private:
  void sep() {
    if (first_) {
      out_ << '{';
      first_ = false;
    } else {
      out_ << ',';
    }
  }
  std::ostringstream out_;
  bool first_ = true;
};

// p in [0,100]; sorts a copy.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(idx);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

// write_bytes from /proc/self/io: bytes this process caused to be sent to the storage
// layer (accounted when a page-cache page is dirtied, so in 4 KiB units).
inline int64_t proc_write_bytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  int64_t v = 0;
  while (f >> key >> v)
    if (key == "write_bytes:") return v;
  return -1;
}

// Bytes written to the block device holding `path` (sectors written * 512, from
// /sys/dev/block/M:m/stat). Whole-device: includes the file system journal and every
// other process, so it is only meaningful on a quiet machine. -1 if unavailable.
inline int64_t device_write_bytes(const std::string& path);

// Random 128-bit id rendered as a UUID-shaped 36-char string (what producers often use).
inline std::string uuid_like(std::mt19937_64& rng) {
  const uint64_t a = rng(), b = rng();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xffff),
                static_cast<unsigned>(b >> 48),
                static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return buf;
}

// ---------------------------------------------------------------------------------------
// Counting VFS: forwards everything to the default VFS and counts xWrite bytes and xSync
// calls per file kind. Register once with register_counting_vfs(); open databases with
// vfs name "counting".

struct VfsCounters {
  std::atomic<int64_t> db_write_bytes{0}, db_writes{0}, db_syncs{0};
  std::atomic<int64_t> wal_write_bytes{0}, wal_writes{0}, wal_syncs{0};
  std::atomic<int64_t> other_write_bytes{0}, other_syncs{0};
  void reset() {
    db_write_bytes = db_writes = db_syncs = 0;
    wal_write_bytes = wal_writes = wal_syncs = 0;
    other_write_bytes = other_syncs = 0;
  }
};

inline VfsCounters& vfs_counters() {
  static VfsCounters c;
  return c;
}

namespace vfs_detail {

enum Kind { kDb, kWal, kOther };

struct CFile {
  sqlite3_file base;
  sqlite3_file* real;
  Kind kind;
};

inline sqlite3_vfs*& real_vfs() {
  static sqlite3_vfs* v = nullptr;
  return v;
}

inline sqlite3_file* R(sqlite3_file* f) { return reinterpret_cast<CFile*>(f)->real; }

inline int x_close(sqlite3_file* f) {
  int rc = R(f)->pMethods ? R(f)->pMethods->xClose(R(f)) : SQLITE_OK;
  return rc;
}
inline int x_read(sqlite3_file* f, void* p, int n, sqlite3_int64 off) {
  return R(f)->pMethods->xRead(R(f), p, n, off);
}
inline int x_write(sqlite3_file* f, const void* p, int n, sqlite3_int64 off) {
  auto& c = vfs_counters();
  switch (reinterpret_cast<CFile*>(f)->kind) {
    case kDb:
      c.db_write_bytes += n;
      ++c.db_writes;
      break;
    case kWal:
      c.wal_write_bytes += n;
      ++c.wal_writes;
      break;
    default:
      c.other_write_bytes += n;
      break;
  }
  return R(f)->pMethods->xWrite(R(f), p, n, off);
}
inline int x_truncate(sqlite3_file* f, sqlite3_int64 size) {
  return R(f)->pMethods->xTruncate(R(f), size);
}
inline int x_sync(sqlite3_file* f, int flags) {
  auto& c = vfs_counters();
  switch (reinterpret_cast<CFile*>(f)->kind) {
    case kDb:
      ++c.db_syncs;
      break;
    case kWal:
      ++c.wal_syncs;
      break;
    default:
      ++c.other_syncs;
      break;
  }
  return R(f)->pMethods->xSync(R(f), flags);
}
inline int x_file_size(sqlite3_file* f, sqlite3_int64* s) {
  return R(f)->pMethods->xFileSize(R(f), s);
}
inline int x_lock(sqlite3_file* f, int l) { return R(f)->pMethods->xLock(R(f), l); }
inline int x_unlock(sqlite3_file* f, int l) { return R(f)->pMethods->xUnlock(R(f), l); }
inline int x_check(sqlite3_file* f, int* o) { return R(f)->pMethods->xCheckReservedLock(R(f), o); }
inline int x_fcntl(sqlite3_file* f, int op, void* a) {
  return R(f)->pMethods->xFileControl(R(f), op, a);
}
inline int x_sector(sqlite3_file* f) { return R(f)->pMethods->xSectorSize(R(f)); }
inline int x_dev(sqlite3_file* f) { return R(f)->pMethods->xDeviceCharacteristics(R(f)); }
inline int x_shm_map(sqlite3_file* f, int i, int sz, int ext, void volatile** pp) {
  return R(f)->pMethods->xShmMap(R(f), i, sz, ext, pp);
}
inline int x_shm_lock(sqlite3_file* f, int off, int n, int fl) {
  return R(f)->pMethods->xShmLock(R(f), off, n, fl);
}
inline void x_shm_barrier(sqlite3_file* f) { R(f)->pMethods->xShmBarrier(R(f)); }
inline int x_shm_unmap(sqlite3_file* f, int del) { return R(f)->pMethods->xShmUnmap(R(f), del); }
inline int x_fetch(sqlite3_file* f, sqlite3_int64 off, int amt, void** pp) {
  return R(f)->pMethods->xFetch(R(f), off, amt, pp);
}
inline int x_unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return R(f)->pMethods->xUnfetch(R(f), off, p);
}

inline const sqlite3_io_methods* methods_for(const sqlite3_io_methods* real) {
  // Mirror the real file's iVersion (a WAL database needs the shm methods of v2+).
  static sqlite3_io_methods m[4];
  static bool init = false;
  if (!init) {
    for (int v = 1; v <= 3; ++v) {
      m[v] = sqlite3_io_methods{
          v,          x_close,       x_read,      x_write, x_truncate, x_sync, x_file_size,
          x_lock,     x_unlock,      x_check,     x_fcntl, x_sector,   x_dev,  x_shm_map,
          x_shm_lock, x_shm_barrier, x_shm_unmap, x_fetch, x_unfetch};
    }
    init = true;
  }
  const int v = std::min(real->iVersion, 3);
  return &m[v < 1 ? 1 : v];
}

inline int x_open(sqlite3_vfs* vfs, const char* name, sqlite3_file* f, int flags, int* out) {
  CFile* cf = reinterpret_cast<CFile*>(f);
  cf->real = reinterpret_cast<sqlite3_file*>(cf + 1);
  cf->kind = (flags & SQLITE_OPEN_MAIN_DB) ? kDb : (flags & SQLITE_OPEN_WAL) ? kWal : kOther;
  sqlite3_vfs* rv = static_cast<sqlite3_vfs*>(vfs->pAppData);
  int rc = rv->xOpen(rv, name, cf->real, flags, out);
  cf->base.pMethods =
      (rc == SQLITE_OK && cf->real->pMethods) ? methods_for(cf->real->pMethods) : nullptr;
  return rc;
}

}  // namespace vfs_detail

// Registers the "counting" VFS (not as default). Safe to call more than once.
inline void register_counting_vfs() {
  static sqlite3_vfs vfs;
  static bool done = false;
  if (done) return;
  sqlite3_vfs* real = sqlite3_vfs_find(nullptr);
  vfs = *real;
  vfs.zName = "counting";
  vfs.szOsFile = static_cast<int>(sizeof(vfs_detail::CFile)) + real->szOsFile;
  vfs.pAppData = real;
  vfs.xOpen = vfs_detail::x_open;
  vfs.pNext = nullptr;
  sqlite3_vfs_register(&vfs, 0);
  done = true;
}

// What SQLite and the process had written at one moment (counting VFS + /proc/self/io).
struct WriteSnapshot {
  int64_t wal_bytes = 0, wal_syncs = 0, db_bytes = 0, db_syncs = 0, proc_write_bytes = 0;
  static WriteSnapshot now() {
    const VfsCounters& c = vfs_counters();
    WriteSnapshot s;
    s.wal_bytes = c.wal_write_bytes;
    s.wal_syncs = c.wal_syncs;
    s.db_bytes = c.db_write_bytes;
    s.db_syncs = c.db_syncs;
    s.proc_write_bytes = bench::proc_write_bytes();
    return s;
  }
};

// Adds the per-message write figures between two snapshots to a JSON line:
// vfs_wal_bytes_per_msg (what SQLite wrote to the WAL through xWrite, frame headers
// included), vfs_wal_frames_per_msg (that / (page_size + 24)), vfs_db_bytes_per_msg
// (checkpoints), fsyncs_per_msg (WAL + database) and proc_write_bytes_per_msg.
inline void add_writes(Json& j, const WriteSnapshot& a, const WriteSnapshot& b, double msgs,
                       int page_size) {
  j.add("vfs_wal_bytes_per_msg", (b.wal_bytes - a.wal_bytes) / msgs)
      .add("vfs_wal_frames_per_msg", (b.wal_bytes - a.wal_bytes) / msgs / (page_size + 24))
      .add("vfs_db_bytes_per_msg", (b.db_bytes - a.db_bytes) / msgs)
      .add("fsyncs_per_msg", (b.wal_syncs - a.wal_syncs + b.db_syncs - a.db_syncs) / msgs)
      .add("proc_write_bytes_per_msg", (b.proc_write_bytes - a.proc_write_bytes) / msgs);
}

// Times a drain of `target` messages, one() per message with a durable outcome (called
// from one thread at a time: the MQTT callback). The clock starts at message number
// `warm` (5 % of the stream by default: connecting, the session's first redeliveries and
// the first page reads are not the steady rate) and stops at the last one; the write
// counters are snapshotted at the same two points.
class Drain {
 public:
  explicit Drain(int64_t target, double warm_fraction = 0.05)
      : target_(target),
        warm_(std::max<int64_t>(
            1, static_cast<int64_t>(static_cast<double>(target) * warm_fraction))) {}
  void one() {
    const int64_t k = ++n_;
    if (k == warm_) {
      w0_ = WriteSnapshot::now();
      t_warm_ = now_ns();
    }
    if (k == target_) {
      t_last_ = now_ns();
      w1_ = WriteSnapshot::now();
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
  }
  bool wait(int timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(timeout_s), [&] { return n_ >= target_; });
  }
  int64_t done() const { return n_; }
  // Messages inside the timed span, and the span in seconds.
  double measured() const { return static_cast<double>(target_ - warm_); }
  double seconds() const { return static_cast<double>(t_last_ - t_warm_) / 1e9; }
  double rate() const { return measured() / seconds(); }
  void add_to(Json& j, int page_size) const {
    j.add("msgs_per_s", rate()).add("seconds", seconds()).add("measured", measured());
    add_writes(j, w0_, w1_, measured(), page_size);
  }
  // The write counters at message number `warm` (the start of the timed span).
  const WriteSnapshot& warm_snapshot() const { return w0_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int64_t> n_{0};
  const int64_t target_, warm_;
  int64_t t_warm_ = 0, t_last_ = 0;
  WriteSnapshot w0_, w1_;
};

inline int64_t device_write_bytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  char p[128];
  std::snprintf(p, sizeof p, "/sys/dev/block/%u:%u/stat", major(st.st_dev), minor(st.st_dev));
  std::ifstream f(p);
  int64_t v[8] = {0};
  for (auto& x : v)
    if (!(f >> x)) return -1;
  return v[6] * 512;
}

}  // namespace bench

#include "fault_vfs.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>

namespace mqtt_inbox::test {

// Our handle; SQLite allocates vfs_.szOsFile bytes, so the real VFS's handle
// lives right behind it. Kept trivially copyable: SQLite owns the memory and
// never runs constructors.
struct FaultVfs::File {
  sqlite3_file base;           // must be first: SQLite sees only this
  sqlite3_io_methods methods;  // per file, to mirror the real iVersion
  FaultVfs* vfs;
  FileKind kind;
  Tracked* tracked;  // null: not tracked for power loss
};

namespace {

FileKind kind_of(int flags) {
  if (flags & SQLITE_OPEN_MAIN_DB) return FileKind::kMainDb;
  if (flags & SQLITE_OPEN_WAL) return FileKind::kWal;
  if (flags & SQLITE_OPEN_MAIN_JOURNAL) return FileKind::kJournal;
  return FileKind::kOther;
}

std::optional<std::string> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

Fault Fault::once(FaultOp op, int error, FileKind kind) { return next(op, 1, error, kind); }
Fault Fault::nth(FaultOp op, std::uint64_t n, int error, FileKind kind) {
  Fault f = once(op, error, kind);
  f.skip = n > 0 ? n - 1 : 0;
  return f;
}
Fault Fault::next(FaultOp op, std::int64_t n, int error, FileKind kind) {
  Fault f;
  f.op = op;
  f.kind = kind;
  f.error = error;
  f.count = n;
  return f;
}
Fault Fault::always(FaultOp op, int error, FileKind kind) { return next(op, -1, error, kind); }
int Fault::default_error(FaultOp op) {
  switch (op) {
    case FaultOp::kOpen:
      return SQLITE_CANTOPEN;
    case FaultOp::kWrite:
      return SQLITE_IOERR_WRITE;
    case FaultOp::kSync:
      return SQLITE_IOERR_FSYNC;
    case FaultOp::kTruncate:
      return SQLITE_IOERR_TRUNCATE;
    case FaultOp::kRead:
      return SQLITE_IOERR_READ;
  }
  return SQLITE_IOERR;
}

sqlite3_vfs* FaultVfs::real_of(sqlite3_vfs* vfs) {
  return static_cast<FaultVfs*>(vfs->pAppData)->real_;
}
sqlite3_file* FaultVfs::real_of(sqlite3_file* file) {
  return reinterpret_cast<sqlite3_file*>(reinterpret_cast<char*>(file) + sizeof(File));
}

FaultVfs::FaultVfs(std::string name, bool simulate_power_loss)
    : name_(std::move(name)), power_loss_(simulate_power_loss), real_(sqlite3_vfs_find(nullptr)) {
  if (real_ == nullptr) throw std::runtime_error("no default sqlite3 VFS");
  // Everything but open/delete is forwarded with the real VFS as `this`:
  // handing the real methods our struct would be wrong for any VFS that
  // reads its own pAppData.
  vfs_.iVersion = std::min(real_->iVersion, 3);
  vfs_.szOsFile = static_cast<int>(sizeof(File)) + real_->szOsFile;
  vfs_.mxPathname = real_->mxPathname;
  vfs_.zName = name_.c_str();
  vfs_.pAppData = this;
  vfs_.xOpen = x_open;
  vfs_.xDelete = x_delete;
  vfs_.xAccess = [](sqlite3_vfs* v, const char* n, int fl, int* out) {
    return real_of(v)->xAccess(real_of(v), n, fl, out);
  };
  vfs_.xFullPathname = [](sqlite3_vfs* v, const char* n, int sz, char* out) {
    return real_of(v)->xFullPathname(real_of(v), n, sz, out);
  };
  vfs_.xDlOpen = [](sqlite3_vfs* v, const char* n) { return real_of(v)->xDlOpen(real_of(v), n); };
  vfs_.xDlError = [](sqlite3_vfs* v, int n, char* msg) {
    real_of(v)->xDlError(real_of(v), n, msg);
  };
  vfs_.xDlSym = [](sqlite3_vfs* v, void* h, const char* s) {
    return real_of(v)->xDlSym(real_of(v), h, s);
  };
  vfs_.xDlClose = [](sqlite3_vfs* v, void* h) { real_of(v)->xDlClose(real_of(v), h); };
  vfs_.xRandomness = [](sqlite3_vfs* v, int n, char* out) {
    return real_of(v)->xRandomness(real_of(v), n, out);
  };
  vfs_.xSleep = [](sqlite3_vfs* v, int us) { return real_of(v)->xSleep(real_of(v), us); };
  vfs_.xCurrentTime = [](sqlite3_vfs* v, double* t) {
    return real_of(v)->xCurrentTime(real_of(v), t);
  };
  vfs_.xGetLastError = [](sqlite3_vfs* v, int n, char* msg) {
    return real_of(v)->xGetLastError(real_of(v), n, msg);
  };
  if (vfs_.iVersion >= 2) {
    vfs_.xCurrentTimeInt64 = [](sqlite3_vfs* v, sqlite3_int64* t) {
      return real_of(v)->xCurrentTimeInt64(real_of(v), t);
    };
  }
  if (vfs_.iVersion >= 3) {
    vfs_.xSetSystemCall = [](sqlite3_vfs* v, const char* n, sqlite3_syscall_ptr p) {
      return real_of(v)->xSetSystemCall(real_of(v), n, p);
    };
    vfs_.xGetSystemCall = [](sqlite3_vfs* v, const char* n) {
      return real_of(v)->xGetSystemCall(real_of(v), n);
    };
    vfs_.xNextSystemCall = [](sqlite3_vfs* v, const char* n) {
      return real_of(v)->xNextSystemCall(real_of(v), n);
    };
  }
  if (sqlite3_vfs_register(&vfs_, /*makeDflt=*/0) != SQLITE_OK) {
    throw std::runtime_error("sqlite3_vfs_register failed for " + name_);
  }
}

FaultVfs::~FaultVfs() { sqlite3_vfs_unregister(&vfs_); }

const sqlite3_io_methods& FaultVfs::io_methods() {
  // Read-side and locking calls go straight through: faults and durability
  // only concern the calls that change file content.
  static const sqlite3_io_methods methods = {
      3,
      x_close,
      x_read,
      x_write,
      x_truncate,
      x_sync,
      [](sqlite3_file* f, sqlite3_int64* size) {
        return real_of(f)->pMethods->xFileSize(real_of(f), size);
      },
      [](sqlite3_file* f, int lock) { return real_of(f)->pMethods->xLock(real_of(f), lock); },
      [](sqlite3_file* f, int lock) { return real_of(f)->pMethods->xUnlock(real_of(f), lock); },
      [](sqlite3_file* f, int* out) {
        return real_of(f)->pMethods->xCheckReservedLock(real_of(f), out);
      },
      [](sqlite3_file* f, int op, void* arg) {
        return real_of(f)->pMethods->xFileControl(real_of(f), op, arg);
      },
      [](sqlite3_file* f) { return real_of(f)->pMethods->xSectorSize(real_of(f)); },
      [](sqlite3_file* f) { return real_of(f)->pMethods->xDeviceCharacteristics(real_of(f)); },
      // The -shm is shared memory, not durable storage: pass it through
      // untouched and drop it at restore_after_cut().
      [](sqlite3_file* f, int pg, int sz, int extend, void volatile** out) {
        return real_of(f)->pMethods->xShmMap(real_of(f), pg, sz, extend, out);
      },
      [](sqlite3_file* f, int off, int n, int flags) {
        return real_of(f)->pMethods->xShmLock(real_of(f), off, n, flags);
      },
      [](sqlite3_file* f) { real_of(f)->pMethods->xShmBarrier(real_of(f)); },
      [](sqlite3_file* f, int del) { return real_of(f)->pMethods->xShmUnmap(real_of(f), del); },
      [](sqlite3_file* f, sqlite3_int64 off, int n, void** out) {
        return real_of(f)->pMethods->xFetch(real_of(f), off, n, out);
      },
      [](sqlite3_file* f, sqlite3_int64 off, void* p) {
        return real_of(f)->pMethods->xUnfetch(real_of(f), off, p);
      },
  };
  return methods;
}

int FaultVfs::x_open(sqlite3_vfs* v, const char* name, sqlite3_file* file, int flags,
                     int* out_flags) {
  auto* self = static_cast<FaultVfs*>(v->pAppData);
  auto* f = reinterpret_cast<File*>(file);
  f->base.pMethods = nullptr;  // SQLite must not call xClose if we fail
  f->vfs = self;
  f->kind = kind_of(flags);
  f->tracked = nullptr;
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    if (int rc = self->take_fault(FaultOp::kOpen, f->kind)) return rc;
    // Temp files vanish at close anyway; nothing durable to model.
    if (self->power_loss_ && name && !(flags & SQLITE_OPEN_DELETEONCLOSE)) {
      auto [it, inserted] = self->files_.try_emplace(name);
      if (inserted) {
        // First sight of this path: whatever is on disk now counts as durable.
        it->second.durable = read_whole_file(name);
        it->second.kind = f->kind;
      }
      f->tracked = &it->second;
    }
  }
  sqlite3_file* real = real_of(file);
  // `name` is forwarded as is: URI parameters live behind its terminator.
  int rc = self->real_->xOpen(self->real_, name, real, flags, out_flags);
  if (rc != SQLITE_OK) {
    if (real->pMethods) real->pMethods->xClose(real);
    return rc;
  }
  // Advertise only what the real file supports (WAL needs version >= 2).
  f->methods = io_methods();
  f->methods.iVersion = std::min(f->methods.iVersion, real->pMethods->iVersion);
  f->base.pMethods = &f->methods;
  std::lock_guard<std::mutex> lock(self->mu_);
  ++self->open_files_;
  ++self->counters_[static_cast<int>(f->kind)].opens;
  return SQLITE_OK;
}

int FaultVfs::x_close(sqlite3_file* file) {
  auto* f = reinterpret_cast<File*>(file);
  int rc = real_of(file)->pMethods->xClose(real_of(file));
  std::lock_guard<std::mutex> lock(f->vfs->mu_);
  --f->vfs->open_files_;
  return rc;
}

int FaultVfs::x_delete(sqlite3_vfs* v, const char* name, int sync_dir) {
  auto* self = static_cast<FaultVfs*>(v->pAppData);
  std::lock_guard<std::mutex> lock(self->mu_);
  // Dropped after a cut: sqlite3_close() deletes the WAL after its
  // checkpoint, which would otherwise erase the evidence.
  if (self->dead_) return SQLITE_OK;
  int rc = self->real_->xDelete(self->real_, name, sync_dir);
  if (rc == SQLITE_OK || rc == SQLITE_IOERR_DELETE_NOENT) {
    auto it = self->files_.find(name);
    if (it != self->files_.end()) {
      it->second.durable.reset();
      it->second.pending.clear();
    }
  }
  return rc;
}

int FaultVfs::x_read(sqlite3_file* file, void* buf, int n, sqlite3_int64 off) {
  auto* f = reinterpret_cast<File*>(file);
  FaultVfs* self = f->vfs;
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    if (int rc = self->take_fault(FaultOp::kRead, f->kind)) return rc;
  }
  return real_of(file)->pMethods->xRead(real_of(file), buf, n, off);
}

int FaultVfs::x_write(sqlite3_file* file, const void* buf, int n, sqlite3_int64 off) {
  auto* f = reinterpret_cast<File*>(file);
  FaultVfs* self = f->vfs;
  std::lock_guard<std::mutex> lock(self->mu_);
  if (self->dead_) return SQLITE_OK;
  if (self->io_hook_) self->io_hook_(FaultOp::kWrite, f->kind);
  if (int rc = self->take_fault(FaultOp::kWrite, f->kind)) return rc;
  int rc = real_of(file)->pMethods->xWrite(real_of(file), buf, n, off);
  if (rc != SQLITE_OK) return rc;
  IoCounters& c = self->counters_[static_cast<int>(f->kind)];
  ++c.writes;
  c.bytes_written += static_cast<std::uint64_t>(n);
  if (f->tracked) {
    f->tracked->pending.push_back({off, std::string(static_cast<const char*>(buf), n)});
  }
  return SQLITE_OK;
}

int FaultVfs::x_truncate(sqlite3_file* file, sqlite3_int64 size) {
  auto* f = reinterpret_cast<File*>(file);
  FaultVfs* self = f->vfs;
  std::lock_guard<std::mutex> lock(self->mu_);
  if (self->dead_) return SQLITE_OK;
  if (self->io_hook_) self->io_hook_(FaultOp::kTruncate, f->kind);
  if (int rc = self->take_fault(FaultOp::kTruncate, f->kind)) return rc;
  int rc = real_of(file)->pMethods->xTruncate(real_of(file), size);
  if (rc != SQLITE_OK) return rc;
  ++self->counters_[static_cast<int>(f->kind)].truncates;
  if (f->tracked) f->tracked->pending.push_back({size, std::nullopt});
  return SQLITE_OK;
}

int FaultVfs::x_sync(sqlite3_file* file, int flags) {
  auto* f = reinterpret_cast<File*>(file);
  FaultVfs* self = f->vfs;
  std::lock_guard<std::mutex> lock(self->mu_);
  if (self->dead_) return SQLITE_OK;
  if (self->io_hook_) self->io_hook_(FaultOp::kSync, f->kind);
  if (int rc = self->take_fault(FaultOp::kSync, f->kind)) return rc;
  int rc = real_of(file)->pMethods->xSync(real_of(file), flags);
  if (rc != SQLITE_OK) return rc;  // a failed fsync makes nothing durable
  ++self->counters_[static_cast<int>(f->kind)].syncs;
  if (Tracked* t = f->tracked) {
    if (!t->durable) t->durable.emplace();  // synced once: it now exists
    for (const Pending& p : t->pending) apply(t->durable, p);
    t->pending.clear();
  }
  return SQLITE_OK;
}

void FaultVfs::apply(std::optional<std::string>& image, const Pending& p) {
  if (!image) image.emplace();
  const auto off = static_cast<std::size_t>(p.offset);
  if (!p.data) {
    image->resize(off);
    return;
  }
  if (image->size() < off + p.data->size()) image->resize(off + p.data->size());
  std::memcpy(&(*image)[off], p.data->data(), p.data->size());
}

int FaultVfs::take_fault(FaultOp op, FileKind kind) {
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    if (it->op != op || (it->kind != FileKind::kAny && it->kind != kind)) {
      continue;
    }
    if (it->skip > 0) {
      --it->skip;
      continue;
    }
    const int error = it->error != 0 ? it->error : Fault::default_error(op);
    if (it->count > 0 && --it->count == 0) rules_.erase(it);
    ++injected_;
    return error;
  }
  return SQLITE_OK;
}

void FaultVfs::arm(const Fault& fault) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back(fault);
}

void FaultVfs::set_io_hook(std::function<void(FaultOp, FileKind)> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  io_hook_ = std::move(hook);
}

void FaultVfs::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
}

std::uint64_t FaultVfs::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

IoCounters FaultVfs::counters(FileKind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind != FileKind::kAny) return counters_[static_cast<int>(kind)];
  IoCounters sum;
  for (const IoCounters& c : counters_) {
    sum.opens += c.opens;
    sum.writes += c.writes;
    sum.syncs += c.syncs;
    sum.truncates += c.truncates;
    sum.bytes_written += c.bytes_written;
  }
  return sum;
}

void FaultVfs::reset_counters() {
  std::lock_guard<std::mutex> lock(mu_);
  counters_ = {};
}

void FaultVfs::power_cut(CutOptions options) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!power_loss_) throw std::logic_error(name_ + ": power loss not enabled");
  dead_ = true;
  cut_options_ = options;
}

bool FaultVfs::is_cut() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dead_;
}

void FaultVfs::restore_after_cut() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!power_loss_ || !dead_) {
    throw std::logic_error(name_ + ": restore_after_cut() without power_cut()");
  }
  if (open_files_ != 0) {
    throw std::logic_error(name_ + ": close every connection before restore (" +
                           std::to_string(open_files_) + " files open)");
  }
  std::mt19937 rng(cut_options_.seed);
  std::bernoulli_distribution keep(cut_options_.keep_unsynced);
  for (auto& [path, t] : files_) {
    if (cut_options_.keep_unsynced > 0) {
      for (const Pending& p : t.pending) {
        if (keep(rng)) apply(t.durable, p);
      }
    }
    t.pending.clear();
    if (t.durable) {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(t.durable->data(), static_cast<std::streamsize>(t.durable->size()));
      if (!out) throw std::runtime_error("cannot restore " + path);
    } else {
      std::remove(path.c_str());
    }
    // A reboot empties the wal-index; SQLite rebuilds it from the WAL.
    if (t.kind == FileKind::kMainDb) std::remove((path + "-shm").c_str());
  }
  dead_ = false;
}

}  // namespace mqtt_inbox::test

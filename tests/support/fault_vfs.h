// Test-only SQLite VFS that wraps the platform default VFS to
//  - inject I/O failures on purpose (xOpen / xRead / xWrite / xSync / xTruncate),
//  - act at an exact point of SQLite's I/O (set_io_hook), and
//  - simulate a power loss: bytes written but not yet fsync'ed are discarded.
//
// It depends only on the sqlite3 C API so any test can use it:
//
//   mqtt_inbox::test::FaultVfs vfs("fault");          // registered, not default
//   sqlite3_open_v2(path, &db, flags, "fault");       // or "file:x.db?vfs=fault"
//   vfs.arm(Fault::once(FaultOp::kSync, SQLITE_IOERR_FSYNC, FileKind::kWal));
//
// A failed commit is "maybe committed", as with a real failing disk: an
// injected WAL xSync failure leaves the frames in the WAL file. If the fault
// is still armed when the last connection closes (its checkpoint fails, so
// the WAL is not deleted), WAL recovery on reopen brings the row back.
//
// Power-loss model (enable with FaultVfs(name, /*simulate_power_loss=*/true)):
//  - Writes and truncates reach the real file at once, so readers see them
//    as they would see the OS page cache. Per path the VFS also keeps the
//    "durable image": the content as of the last xSync of that path (an fsync
//    flushes the inode, whichever handle wrote). Nothing is durable in between.
//  - A file that did not exist when first opened through this VFS is absent
//    after a cut until it has been synced once (SQLite's unix VFS fsyncs the
//    directory on the first sync of a new WAL/journal, so that is the point
//    where it really becomes durable). A file that existed before is assumed
//    durable as found.
//  - Deletions are durable immediately (directory updates are not modelled).
//  - power_cut(): every later write/sync/truncate/delete through this VFS,
//    including from handles opened after the cut, is silently dropped and
//    reports SQLITE_OK (reads still see the pre-cut page cache), so closing
//    the old connections cannot leak post-cut state (sqlite3_close's
//    checkpoint and WAL delete are dropped).
//  - restore_after_cut(): rewrites every tracked file to its durable image
//    (or deletes it) and deletes the "-shm" of every main database, as a
//    reboot would (the wal-index is rebuilt from the WAL by SQLite's
//    recovery). All connections of the cut must be closed first: the unix
//    VFS shares the -shm mapping and POSIX locks per inode within a process,
//    so a leaked connection would feed the new one stale wal-index state.
//    After restore the VFS is live again and can be cut again.
//  - The -shm file itself is never seen by a VFS's xOpen (the unix VFS maps it
//    behind xShmMap), so it is passed through untracked.
//
// All public methods are thread-safe. One mutex guards all state and is held
// across the underlying write/sync/truncate/delete, so power_cut() is atomic
// with respect to I/O issued from other threads (e.g. Paho's callback thread).
#pragma once

#include <sqlite3.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace mqtt_inbox::test {

// What a file is, as told by the SQLITE_OPEN_* flags SQLite passes to xOpen.
enum class FileKind { kMainDb, kWal, kJournal, kOther, kAny };

enum class FaultOp { kOpen, kWrite, kSync, kTruncate, kRead };

// One armed failure rule. Calls matching (op, kind) first consume `skip`,
// then the next `count` matching calls fail with `error` (count < 0: forever).
struct Fault {
  FaultOp op = FaultOp::kWrite;
  FileKind kind = FileKind::kAny;
  int error = 0;  // 0: the natural code for op (see default_error)
  std::uint64_t skip = 0;
  std::int64_t count = 1;

  // Fail the next matching call.
  static Fault once(FaultOp op, int error = 0, FileKind kind = FileKind::kAny);
  // Fail only the n-th (1-based) matching call from now on.
  static Fault nth(FaultOp op, std::uint64_t n, int error = 0, FileKind kind = FileKind::kAny);
  // Fail the next n matching calls.
  static Fault next(FaultOp op, std::int64_t n, int error = 0, FileKind kind = FileKind::kAny);
  // Fail every matching call until disarmed.
  static Fault always(FaultOp op, int error = 0, FileKind kind = FileKind::kAny);

  // SQLITE_CANTOPEN / SQLITE_IOERR_WRITE / SQLITE_IOERR_FSYNC /
  // SQLITE_IOERR_TRUNCATE / SQLITE_IOERR_READ.
  static int default_error(FaultOp op);
};

// Calls that reached the real file (dropped and injected ones not counted).
struct IoCounters {
  std::uint64_t opens = 0;
  std::uint64_t writes = 0;
  std::uint64_t syncs = 0;
  std::uint64_t truncates = 0;
  std::uint64_t bytes_written = 0;
};

// How much of the unsynced data a power cut loses.
struct CutOptions {
  // Each pending (unsynced) write/truncate independently survives with this
  // probability, applied in issue order: models the kernel having written
  // back part of its dirty pages. 0 = lose everything unsynced.
  double keep_unsynced = 0.0;
  std::uint32_t seed = 1;
};

class FaultVfs {
 public:
  // Registers the VFS under `name` (not as default) wrapping
  // sqlite3_vfs_find(nullptr). Throws std::runtime_error on failure.
  explicit FaultVfs(std::string name, bool simulate_power_loss = false);
  // Unregisters. Every connection using the VFS must be closed before.
  ~FaultVfs();
  FaultVfs(const FaultVfs&) = delete;
  FaultVfs& operator=(const FaultVfs&) = delete;

  const std::string& name() const { return name_; }

  // Rules are checked in arming order; the first that fires wins. A kRead fault makes
  // xRead fail with its code (reads are otherwise passed through untouched).
  void arm(const Fault& fault);

  // Called before every write, sync and truncate that reaches the real file, with the
  // operation and the file's kind: lets a test act at an exact point of SQLite's I/O
  // (e.g. fill the disk when a checkpoint starts writing the main database file). Runs
  // with the VFS's lock held: it must not use this VFS. Empty = none.
  void set_io_hook(std::function<void(FaultOp, FileKind)> hook);
  void disarm();                   // all rules
  std::uint64_t injected() const;  // failures injected so far

  IoCounters counters(FileKind kind = FileKind::kAny) const;
  void reset_counters();

  // Power-loss simulation; both throw std::logic_error when the VFS was not
  // built with simulate_power_loss. restore_after_cut() also throws if the
  // VFS is not cut or if any file of this VFS is still open.
  void power_cut(CutOptions options = {});
  void restore_after_cut();
  bool is_cut() const;

 private:
  struct File;      // the sqlite3_file subclass
  struct Pending {  // one unsynced write (or truncate if !data)
    std::int64_t offset;
    std::optional<std::string> data;
  };
  struct Tracked {
    FileKind kind = FileKind::kOther;
    std::optional<std::string> durable;  // nullopt: absent after a cut
    std::vector<Pending> pending;
  };

  // Returns the error to inject for this call, or SQLITE_OK. Needs mu_.
  int take_fault(FaultOp op, FileKind kind);
  static void apply(std::optional<std::string>& image, const Pending& p);
  static const sqlite3_io_methods& io_methods();
  static sqlite3_vfs* real_of(sqlite3_vfs* vfs);
  static sqlite3_file* real_of(sqlite3_file* file);

  static int x_open(sqlite3_vfs*, const char*, sqlite3_file*, int, int*);
  static int x_delete(sqlite3_vfs*, const char*, int);
  static int x_close(sqlite3_file*);
  static int x_read(sqlite3_file*, void*, int, sqlite3_int64);
  static int x_write(sqlite3_file*, const void*, int, sqlite3_int64);
  static int x_truncate(sqlite3_file*, sqlite3_int64);
  static int x_sync(sqlite3_file*, int);

  std::string name_;
  bool power_loss_;
  sqlite3_vfs* real_;
  sqlite3_vfs vfs_{};

  mutable std::mutex mu_;
  std::vector<Fault> rules_;
  std::function<void(FaultOp, FileKind)> io_hook_;
  std::uint64_t injected_ = 0;
  std::array<IoCounters, 4> counters_{};  // indexed by FileKind minus kAny
  bool dead_ = false;
  CutOptions cut_options_;
  int open_files_ = 0;
  // Never erased, so File can keep a Tracked* (std::map nodes are stable).
  std::map<std::string, Tracked> files_;
};

}  // namespace mqtt_inbox::test

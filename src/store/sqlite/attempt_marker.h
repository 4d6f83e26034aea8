// Internal: the running-attempt marker. While a handler runs, the (consumer, message id)
// it runs for is written to a small file next to the database: the Inbox's own
// "<path>.lock", which it holds with flock, so no other process writes it.
//
// Why a file and not a row: a handler that kills the process must still be counted, or a
// poison message loops forever (docs/api-guide.md#dead-letters). Committing an attempt row before
// every handler run costs a second write transaction per message, and its page goes to
// flash with the next fsync. The marker costs two pwrite(2) calls, no fsync, nothing in
// the WAL, and it survives what it must survive: the death of the process (the kernel
// keeps the written page). The next Inbox::open turns a marker left behind into an
// attempt ('running') in inbox_attempts before anything is delivered. It does not survive
// a power loss or kernel crash before the page reaches the disk: that costs one
// uncounted attempt, as the unsynced attempt commit it replaces did.
//
// Once prepare() has given the file its first page, that page is mapped (mmap(2),
// MAP_SHARED) and the marker is written with plain stores: no system call per message
// (issue 14). A store into a shared file mapping lands in the same page cache a pwrite
// would, so it survives the death of the process just the same. A death in the middle of
// the stores must not leave a record that reads as valid: the magic is zeroed first, the
// body and checksum written, and the magic written last. Without a mapping (mmap failed,
// or the page has no blocks yet) it falls back to one pwrite(2).
//
// After a commit the marker is left as it is (one write per message, not two): the next
// open ignores a marker whose id is processed, the next message overwrites it, a clean
// close and the pruner (before it deletes ids) clear it.
//
// Record (little-endian): "MIA1", u32 body length, body = u64 nonce, u32 consumer length,
// consumer, u32 id length, id; then u32 FNV-1a of the body. Cleared by zeroing the magic.
// A torn record fails its checksum and reads as no marker (it can only be torn by a death
// before the handler started). The nonce makes the conversion at open idempotent.
//
// Thread safety: none; the Inbox calls it under its mutex.
#pragma once

#include <cstdint>
#include <string>

namespace mqtt_inbox::detail {

class AttemptMarker {
 public:
  struct Entry {
    std::string consumer;
    std::string message_id;
    uint64_t nonce = 0;
  };

  // `fd` is the lock file, open read-write; not owned. -1 = no marker (every call fails).
  explicit AttemptMarker(int fd);
  ~AttemptMarker();  // unmaps the page (the fd stays the owner's)
  AttemptMarker(const AttemptMarker&) = delete;
  AttemptMarker& operator=(const AttemptMarker&) = delete;

  // Reads a marker left by an earlier owner. False if there is none (or it is torn).
  // A marker found is cleared by the next clear().
  bool read(Entry* out);
  // Gives the file its size, so later writes need no new blocks (a full disk then cannot
  // fail them), and maps its first page. False on an I/O error.
  bool prepare();
  // Records that (consumer, message_id)'s handler is about to run. False if the write
  // failed: the caller must then count the attempt another way.
  bool set(const std::string& consumer, const std::string& message_id);
  // Records that no handler is running. Never fails the caller: a stale marker only costs
  // one attempt at the next open, and only for a message that is not yet processed.
  void clear();

  bool usable() const { return fd_ >= 0; }

 private:
  // Writes `n` bytes at offset 0: into the mapped page when there is one, else pwrite.
  bool write_at_start(const char* p, size_t n);

  int fd_;
  char* page_ = nullptr;  // the file's first kPrepared bytes, mapped; null = use pwrite
  uint64_t nonce_base_;
  uint64_t seq_ = 0;
  bool set_ = false;
  std::string buf_;  // reused: no allocation per message once it has grown
};

}  // namespace mqtt_inbox::detail

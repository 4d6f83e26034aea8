#include "store/sqlite/attempt_marker.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

namespace mqtt_inbox::detail {
namespace {

constexpr char kMagic[4] = {'M', 'I', 'A', '1'};
constexpr size_t kHeader = 8;       // magic + body length
constexpr size_t kPrepared = 4096;  // one page: the usual record fits with room to spare

void put32(std::string& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put64(std::string& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return v;
}
uint32_t fnv1a(const char* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 16777619u;
  }
  return h;
}

bool pwrite_all(int fd, const char* p, size_t n, off_t at) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, at);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
    at += w;
  }
  return true;
}

}  // namespace

AttemptMarker::AttemptMarker(int fd) : fd_(fd) {
  std::random_device rd;
  nonce_base_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  nonce_base_ &= ~uint64_t{0xffffffff};  // the low half counts this process's markers
}

AttemptMarker::~AttemptMarker() {
  if (page_ != nullptr) ::munmap(page_, kPrepared);
}

bool AttemptMarker::write_at_start(const char* p, size_t n) {
  if (page_ == nullptr || n > kPrepared) return pwrite_all(fd_, p, n, 0);
  // Magic last: until it is there the record reads as no marker (see the header). The
  // fences keep the compiler from reordering the stores; the process's own stores reach
  // the page in program order as far as a later reader after its death is concerned.
  std::memset(page_, 0, 4);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(page_ + 4, p + 4, n - 4);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(page_, p, 4);
  return true;
}

bool AttemptMarker::read(Entry* out) {
  if (fd_ < 0) return false;
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || st.st_size < static_cast<off_t>(kHeader)) return false;
  std::string b(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < b.size()) {
    const ssize_t r = ::pread(fd_, &b[got], b.size() - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  if (got < kHeader || b.compare(0, 4, kMagic, 4) != 0) return false;
  const size_t len = get(b, 4, 4);
  if (len < 16 || kHeader + len + 4 > got) return false;
  if (fnv1a(b.data() + kHeader, len) != get(b, kHeader + len, 4)) return false;
  size_t at = kHeader;
  out->nonce = get(b, at, 8);
  at += 8;
  const size_t clen = get(b, at, 4);
  at += 4;
  if (at + clen + 4 > kHeader + len) return false;
  out->consumer = b.substr(at, clen);
  at += clen;
  const size_t ilen = get(b, at, 4);
  at += 4;
  if (at + ilen != kHeader + len) return false;
  out->message_id = b.substr(at, ilen);
  set_ = true;
  return true;
}

bool AttemptMarker::prepare() {
  if (fd_ < 0) return false;
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return false;
  if (st.st_size < static_cast<off_t>(kPrepared)) {
    const std::string zeros(kPrepared - static_cast<size_t>(st.st_size), '\0');
    if (!pwrite_all(fd_, zeros.data(), zeros.size(), st.st_size)) return false;
    if (::fstat(fd_, &st) != 0) return true;  // sized; pwrite serves
  }
  // Map only a page with blocks behind it: a store into a hole that the file system
  // cannot fill (a full disk) is a SIGBUS, not an error return.
  if (page_ == nullptr && st.st_blocks * 512 >= static_cast<blkcnt_t>(kPrepared)) {
    void* p = ::mmap(nullptr, kPrepared, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p != MAP_FAILED) page_ = static_cast<char*>(p);
  }
  return true;
}

bool AttemptMarker::set(const std::string& consumer, const std::string& message_id) {
  if (fd_ < 0) return false;
  buf_.clear();
  buf_.append(kMagic, 4);
  put32(buf_, 0);  // body length, filled below
  put64(buf_, nonce_base_ | (++seq_ & 0xffffffff));
  put32(buf_, static_cast<uint32_t>(consumer.size()));
  buf_ += consumer;
  put32(buf_, static_cast<uint32_t>(message_id.size()));
  buf_ += message_id;
  const size_t len = buf_.size() - kHeader;
  for (int i = 0; i < 4; ++i) buf_[4 + i] = static_cast<char>((len >> (8 * i)) & 0xff);
  put32(buf_, fnv1a(buf_.data() + kHeader, len));
  // One write (or magic-last stores): the record is either all there or fails its checksum.
  set_ = write_at_start(buf_.data(), buf_.size());
  return set_;
}

void AttemptMarker::clear() {
  if (fd_ < 0 || !set_) return;
  static const char zero[4] = {0, 0, 0, 0};
  set_ = !write_at_start(zero, sizeof zero);
}

}  // namespace mqtt_inbox::detail

// Test support: a real small file system (tmpfs) to fill and free, for the tests of a
// full disk. Mounting needs root (CAP_SYS_ADMIN); tests skip with the reason otherwise.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace mqtt_inbox::test {

// A tmpfs of `size` (mount(8) syntax: "1m", "4m") mounted on `dir` for the life of the
// object. Mounted in a private mount namespace of this test process when possible, so
// the mount disappears with the process even if the test crashes. Child processes
// started afterwards (the example programs) see it too.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& dir, const std::string& size) : dir_(dir) {
    ::mkdir(dir.c_str(), 0755);
    if (::unshare(CLONE_NEWNS) == 0)
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);  // do not propagate out
    const std::string data = "size=" + size + ",mode=0755";
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, data.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  // Changes the size in place (files stay): how a test unblocks a store that stays full.
  bool resize(const std::string& size) {
    const std::string data = "size=" + size;
    return ::mount(nullptr, dir_.c_str(), nullptr, MS_REMOUNT, data.c_str()) == 0;
  }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string error_;
};

// Writes `path` until the file system refuses with ENOSPC; returns bytes written.
inline int64_t fill_file_system(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) return -1;
  int64_t total = 0;
  std::vector<char> block(64 * 1024, 'x');
  for (size_t chunk : {size_t{64 * 1024}, size_t{4096}, size_t{1}}) {
    for (;;) {
      const ssize_t n = ::write(fd, block.data(), chunk);
      if (n <= 0) break;
      total += n;
    }
  }
  ::close(fd);
  return total;
}

}  // namespace mqtt_inbox::test

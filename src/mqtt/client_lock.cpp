// The per-host client-id lock (mqtt/client_lock.h).
#include "mqtt/client_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mqtt_inbox {
namespace detail {

// SubscriberOptions::client_id_lock_dir "auto": the service manager's runtime folder,
// else /run/mqtt-inbox if writable, else /tmp.
std::string client_id_lock_dir(const std::string& configured) {
  if (configured != "auto") return configured;
  if (const char* rt = std::getenv("RUNTIME_DIRECTORY"); rt && *rt) {
    const std::string all(rt);
    return all.substr(0, all.find(':'));
  }
  if (::access("/run/mqtt-inbox", W_OK | X_OK) == 0) return "/run/mqtt-inbox";
  return "/tmp";
}

// Takes the exclusive lock on `path`. Because a clean stop removes the file, a process
// may lock a file that was just unlinked while another creates and locks a new one: so
// the lock only counts if `path` still names the locked inode; otherwise try again.
Status lock_client_id(const std::string& path, const std::string& client_id, int* fd_out) {
  for (int tries = 0; tries < 10; ++tries) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      return Status(Status::Code::kIoError, "cannot open " + path + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return Status(Status::Code::kBusy,
                    "client id '" + client_id + "' is in use by another process on this host (" +
                        path +
                        " is locked); two clients with one id take the session from "
                        "each other");
    }
    struct stat locked, named;
    if (::fstat(fd, &locked) == 0 && ::stat(path.c_str(), &named) == 0 &&
        locked.st_dev == named.st_dev && locked.st_ino == named.st_ino) {
      *fd_out = fd;
      return Status::Ok();
    }
    ::close(fd);  // unlinked by the previous holder's clean stop: lock the new file
  }
  return Status(Status::Code::kBusy, "client-id lock " + path + " keeps being replaced");
}

Status take_client_id_lock(const std::string& configured, const std::string& client_id, int* fd_out,
                           std::string* path_out) {
  *fd_out = -1;
  if (configured.empty()) return Status::Ok();
  std::string name;  // the client id, made safe for a file name
  for (unsigned char c : client_id) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
      name.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02x", c);
      name += hex;
    }
  }
  const std::string path = client_id_lock_dir(configured) + "/mqtt-inbox-client-" + name + ".lock";
  if (Status s = lock_client_id(path, client_id, fd_out); !s.ok()) return s;
  *path_out = path;
  return Status::Ok();
}

void release_client_id_lock(int* fd, const std::string& path) {
  if (*fd < 0) return;
  ::unlink(path.c_str());
  ::close(*fd);
  *fd = -1;
}

}  // namespace detail
}  // namespace mqtt_inbox

#include "util/file_access.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace mqtt_inbox::detail {

std::string describe_user(uid_t uid) {
  std::vector<char> buf(4096);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found)
    return "'" + std::string(found->pw_name) + "' (uid " + std::to_string(uid) + ")";
  return "uid " + std::to_string(uid);
}

namespace {

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string mode_text(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// kPermissionDenied if `path` exists and this process may not do `how` to it.
Status check_one(const std::string& path, int how, const char* role) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::Ok();  // not there (yet): fine
  if (::faccessat(AT_FDCWD, path.c_str(), how, AT_EACCESS) == 0) return Status::Ok();
  if (errno != EACCES && errno != EPERM) return Status::Ok();  // e.g. EROFS: SQLite reports it
  const std::string owner = describe_user(st.st_uid);
  const std::string me = describe_user(::geteuid());
  return Status(Status::Code::kPermissionDenied,
                "cannot write " + std::string(role) + " " + path + ": it belongs to user " + owner +
                    " with mode " + mode_text(st.st_mode) + ", and this process runs as " + me +
                    ". SQLite would open the database read-only and every write would fail. "
                    "A tool run as " +
                    owner +
                    " (mqtt-inbox, sqlite3) probably left it. Fix: stop every process using "
                    "the database, `chown` the file to the user of this process (or run this "
                    "process as its owner), and run tools as the database's owner or as root "
                    "(docs/operations.md#files-created-under-another-user)");
}

}  // namespace

Status check_database_location(const std::string& db_path, bool* exists) {
  *exists = false;
  if (db_path.rfind("file:", 0) == 0 || db_path == ":memory:") return Status::Ok();
  struct stat st {};
  if (::stat(db_path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      return Status::InvalidArgument("the database path " + db_path +
                                     " is a folder: name a file in it (e.g. " + db_path +
                                     "/inbox.db)");
    if (!S_ISREG(st.st_mode))
      return Status::InvalidArgument("the database path " + db_path +
                                     " is not a regular file (a device, a pipe or a socket)");
    *exists = true;
    return Status::Ok();
  }
  const int err = errno;
  const std::string folder = folder_of(db_path);
  if (err == ENOTDIR || ::stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::InvalidArgument("the folder of the database path " + db_path +
                                   " does not exist or is not a folder (" + folder +
                                   "): create it first");
  if (::faccessat(AT_FDCWD, folder.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    const int why = errno;
    return Status(Status::Code::kReadOnly, "cannot create the database " + db_path +
                                               ": its folder " + folder + " cannot be written (" +
                                               std::strerror(why) + ")");
  }
  return Status::Ok();
}

Status check_writable(const std::string& db_path, bool with_lock) {
  const std::string folder = folder_of(db_path);
  // SQLite creates -wal and -shm next to the database.
  if (Status s = check_one(folder, W_OK | X_OK, "the folder"); !s.ok()) return s;
  if (Status s = check_one(db_path, W_OK, "the database"); !s.ok()) return s;
  if (Status s = check_one(db_path + "-wal", W_OK, "the WAL file"); !s.ok()) return s;
  if (Status s = check_one(db_path + "-shm", W_OK, "the shared-memory file"); !s.ok()) return s;
  if (with_lock) {
    if (Status s = check_one(db_path + ".lock", W_OK, "the lock file"); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

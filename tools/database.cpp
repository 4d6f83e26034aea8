// Opening an inbox database next to a running consumer (see database.h).
#include "database.h"

#include <mqtt_inbox/postgres.h>

#include "pg_admin.h"
#include "store/sqlite/admin.h"
#include "util/file_access.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

namespace {

// The tool shares the file with a running consumer: never take the consumer's exclusive
// per-database lock (InboxOptions::exclusive, where the library has it).
template <typename T>
auto set_non_exclusive(T& o, int) -> decltype(o.exclusive = false, void()) {
  o.exclusive = false;
}
template <typename T>
void set_non_exclusive(T&, long) {}

std::shared_ptr<spdlog::logger> tool_logger() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = spdlog::stderr_color_mt("mqtt-inbox");
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return log;
}

}  // namespace

bool is_postgres(const std::string& location) {
  return location.rfind("postgresql://", 0) == 0 || location.rfind("postgres://", 0) == 0;
}

void require_sqlite(const std::string& location, const std::string& command) {
  if (is_postgres(location))
    fail(kUnsupported, "`" + command +
                           "` works on SQLite files only: not yet on a PostgreSQL location "
                           "(docs/admin-tool.md#postgresql)");
}

void require_file(const std::string& path) {
  // Every command that reaches here is for SQLite files (a PostgreSQL location goes to
  // pg_admin.h first): say so, rather than look for a file of that name.
  require_sqlite(path, "this command");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(kStoreError, "no such database: " + path);
  if (!S_ISREG(st.st_mode)) fail(kStoreError, "not a regular file: " + path);
  // SQLite creates -wal and -shm as the user that opens the file, and a consumer running
  // as the database's owner cannot write them afterwards
  // (docs/operations.md#files-created-under-another-user). As root SQLite hands them to
  // the owner itself; anyone else is refused before a file is created.
  const uid_t me = ::geteuid();
  if (me != 0 && me != st.st_uid) {
    const std::string owner = mi::detail::describe_user(st.st_uid);
    std::string name = owner;
    if (name.size() > 2 && name.front() == '\'') name = name.substr(1, name.find('\'', 1) - 1);
    fail(kRefused,
         path + " belongs to user " + owner + ", and this tool runs as " +
             mi::detail::describe_user(me) + ": it would leave " + path + "-wal and " + path +
             "-shm owned by this user, and the consumer could then not write the database. "
             "Run it as the owner, e.g. `sudo -u " +
             name + " mqtt-inbox ...`, or as root.");
  }
}

FileFacts read_facts(const std::string& path) {
  require_file(path);
  mi::detail::SqliteFileFacts facts;
  const mi::Status s = mi::detail::read_sqlite_facts(path, tool_inbox_options(), &facts);
  if (!s.ok()) fail(kStoreError, path + ": " + s.message());
  FileFacts f;
  f.user_version = facts.user_version;
  f.journal_mode = facts.journal_mode;
  f.has_inbox_tables = facts.has_inbox_tables;
  if (!f.has_inbox_tables && f.user_version == 0)
    fail(kStoreError, path + " is not an mqtt-inbox database (no inbox tables)");
  return f;
}

mi::InboxOptions tool_inbox_options() {
  mi::InboxOptions o;
  o.busy_timeout_ms = g.busy_timeout_ms;
  o.logger = tool_logger();
  o.postgres_password_file = g.password_file;
  o.postgres_schema = g.pg_schema;
  set_non_exclusive(o, 0);
  return o;
}

void require_current_schema(const std::string& path, const FileFacts& f) {
  if (f.user_version > mi::kSchemaVersion)
    fail(kSchema, path + " has schema version " + std::to_string(f.user_version) +
                      ", newer than this tool's " + std::to_string(mi::kSchemaVersion) +
                      ": use the mqtt-inbox tool of the release that wrote it");
  if (f.user_version < mi::kSchemaVersion)
    fail(kSchema, path + " has schema version " + std::to_string(f.user_version) +
                      ", older than this tool's " + std::to_string(mi::kSchemaVersion) +
                      ". Nothing was changed. Run `mqtt-inbox migrate " + path +
                      "` after upgrading the application that uses it (an older library refuses a "
                      "newer schema).");
}

std::unique_ptr<mi::Inbox> open_inbox(const std::string& path) {
  if (is_postgres(path)) return pg_open_inbox(path);
  const FileFacts f = read_facts(path);
  require_current_schema(path, f);
  std::unique_ptr<mi::Inbox> inbox;
  const mi::Status s = mi::Inbox::open(path, tool_inbox_options(), &inbox);
  if (!s.ok())
    fail(s.code() == mi::Status::Code::kCorruption ? kSchema : kStoreError, s.to_string());
  return inbox;
}

void check_status(const mi::Status& s, const std::string& what) {
  if (s.ok()) return;
  fail(s.code() == mi::Status::Code::kNotFound ? kNotFound : kStoreError,
       what + ": " + s.to_string());
}

void check_read(const mi::Status& s, const std::string& what) {
  if (!s.ok()) fail(kStoreError, what + ": " + s.message());
}

std::map<std::string, std::string> read_meta(mi::Inbox& inbox) {
  std::map<std::string, std::string> meta;
  check_read(mi::detail::read_sqlite_meta(inbox, &meta), "reading inbox_meta");
  return meta;
}

std::optional<int64_t> meta_int(const std::map<std::string, std::string>& meta,
                                const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end()) return std::nullopt;
  try {
    return std::stoll(it->second);
  } catch (...) {
    return std::nullopt;
  }
}

std::unique_ptr<mi::StoreThenProcess> stp_for(mi::Inbox* inbox, const std::string& consumer,
                                              int64_t lease_ms) {
  mi::StoreThenProcessOptions o;
  if (lease_ms > 0) o.lease_ms = lease_ms;
  o.workers = 0;
  o.prune_interval_ms = 0;
  std::unique_ptr<mi::StoreThenProcess> stp;
  // A handler of the inbox's store (each store refuses the other's), never run.
  const auto never = [](auto&, const mi::StoredDelivery&) {
    throw std::logic_error("the admin tool never processes rows");
  };
  const mi::Status s =
      is_postgres(inbox->path())
          ? mi::StoreThenProcess::create(inbox, consumer, mi::PgStoredHandler(never), o, &stp)
          : mi::StoreThenProcess::create(inbox, consumer, mi::StoredHandler(never), o, &stp);
  check_status(s, "opening store-then-process consumer '" + consumer + "'");
  return stp;
}

bool has_stp_rows(mi::StoreThenProcess& stp) {
  mi::StoreThenProcessStats st;
  check_status(stp.stats(&st), "counting stored messages");
  return st.pending + st.processing + st.done + st.dead > 0;
}

std::set<std::string> stp_consumers(mi::Inbox& inbox) {
  std::set<std::string> out;
  check_read(mi::detail::list_sqlite_stp_consumers(inbox, &out),
             "listing store-then-process consumers");
  return out;
}

}  // namespace mqtt_inbox::cli

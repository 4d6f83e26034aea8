#include "support/postgres.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace mqtt_inbox::test {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Bump when initdb's options change: a template made with other options is not reused.
constexpr int kTemplateFormat = 1;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string tail_of(const std::string& text, size_t bytes) {
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

// Who the server programs run as: the `postgres` user when we are root (initdb and
// postgres refuse root), else ourselves.
struct RunAs {
  bool drop = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

RunAs server_user() {
  RunAs r;
  if (geteuid() != 0) return r;
  const passwd* pw = getpwnam("postgres");
  if (!pw)
    throw std::runtime_error(
        "running as root, and there is no `postgres` user to run PostgreSQL as "
        "(apt-get install postgresql-15 creates it)");
  r.drop = true;
  r.uid = pw->pw_uid;
  r.gid = pw->pw_gid;
  int n = 32;
  r.groups.resize(static_cast<size_t>(n));
  if (getgrouplist("postgres", r.gid, r.groups.data(), &n) < 0) {
    r.groups.resize(static_cast<size_t>(n));
    getgrouplist("postgres", r.gid, r.groups.data(), &n);
  }
  r.groups.resize(static_cast<size_t>(n));
  return r;
}

void give_to(const std::string& path, const RunAs& as) {
  if (as.drop && chown(path.c_str(), as.uid, as.gid) != 0)
    throw std::runtime_error("chown " + path + ": " + std::strerror(errno));
}

// $TMPDIR (or /tmp). As root, the postgres user must be able to reach our folders: a
// TMPDIR under a folder others cannot enter (/root/tmp) is passed over for /tmp.
std::string base_dir() {
  const char* env = std::getenv("TMPDIR");
  const std::string base = env && *env ? env : "/tmp";
  if (geteuid() == 0) {
    for (fs::path p = fs::absolute(base); !p.empty(); p = p.parent_path()) {
      struct stat st {};
      if (stat(p.c_str(), &st) != 0 || !(st.st_mode & S_IXOTH)) return "/tmp";
      if (p == p.root_path()) break;
    }
  }
  return base;
}

std::string make_temp_dir(const std::string& prefix, const RunAs& as) {
  std::string tmpl = prefix + "XXXXXX";
  if (!mkdtemp(tmpl.data()))
    throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  give_to(tmpl, as);
  return tmpl;
}

// Forks and execs argv[0] with stdout and stderr on `log_fd`, in `cwd`, as `as`, in a
// session of its own (a terminal's ^C reaches the test, not the server). Everything the
// child touches is prepared before fork: only async-signal-safe calls follow it.
pid_t spawn(const std::vector<std::string>& argv, int log_fd, const RunAs& as,
            const std::string& cwd, bool die_with_parent) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // A clean environment: no PGDATA, PGPORT or locale of the caller's leaks in.
  std::vector<std::string> env_strings{"PATH=/usr/bin:/bin", "LC_ALL=C", "LANG=C"};
  if (const char* tz = std::getenv("TZ")) env_strings.push_back(std::string("TZ=") + tz);
  std::vector<char*> env;
  for (auto& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid > 0) return pid;
  setsid();
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  for (int sig : {SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGHUP, SIGCHLD}) signal(sig, SIG_DFL);
  if (log_fd >= 0) {
    dup2(log_fd, 1);
    dup2(log_fd, 2);
  }
  const int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  if (as.drop && (setgroups(as.groups.size(), as.groups.data()) != 0 || setgid(as.gid) != 0 ||
                  setuid(as.uid) != 0))
    _exit(126);
  // After setuid: a change of credentials clears the parent-death signal. SIGQUIT is
  // PostgreSQL's immediate shutdown: the postmaster takes its backends down with it.
  if (die_with_parent && (prctl(PR_SET_PDEATHSIG, SIGQUIT) != 0 || getppid() != parent)) _exit(125);
  if (chdir(cwd.c_str()) != 0) _exit(124);
  execve(args[0], args.data(), env.data());
  _exit(127);
}

// Runs a program to its end with its output in `log_path`; throws with that output if it
// fails.
void run_to_end(const std::vector<std::string>& argv, const std::string& log_path, const RunAs& as,
                const std::string& cwd) {
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = spawn(argv, fd, as, cwd, false);
  if (fd >= 0) close(fd);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw std::runtime_error(cmd + "failed (wait status " + std::to_string(st) + "):\n" +
                             tail_of(read_file(log_path), 4000));
  }
}

// The major version of the server binaries ("15"), from postgres --version.
std::string major_version(const std::string& bin) {
  std::string out;
  if (FILE* p = popen(("'" + bin + "/postgres' --version 2>/dev/null").c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  // "postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"
  const auto at = out.find(") ");
  if (at == std::string::npos) throw std::runtime_error(bin + "/postgres --version: " + out);
  std::string v = out.substr(at + 2);
  return v.substr(0, v.find_first_not_of("0123456789"));
}

std::string required_bin_dir() {
  const std::string bin = Postgres::bin_dir();
  if (bin.empty())
    throw std::runtime_error(
        "PostgreSQL server not found (apt-get install postgresql-15, or set "
        "MQTT_INBOX_PG_BINDIR)");
  return bin;
}

std::string template_path(const std::string& parent, const std::string& bin) {
  static const std::string major = major_version(bin);
  return (parent.empty() ? base_dir() : parent) + "/mqtt_inbox_pg" + major + "_template_u" +
         std::to_string(geteuid()) + "_v" + std::to_string(kTemplateFormat);
}

bool template_complete(const std::string& path) {
  return fs::exists(path + "/ready") && fs::exists(path + "/data/global/pg_control");
}

std::string quote_literal(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// The pids whose parent is `pid`, from /proc.
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* e = readdir(proc)) {
    const pid_t p = static_cast<pid_t>(std::atoi(e->d_name));
    if (p <= 0) continue;
    const std::string stat = read_file(std::string("/proc/") + e->d_name + "/stat");
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == pid)
      out.push_back(p);
  }
  closedir(proc);
  return out;
}

// Gone, or a zombie (its memory, and so the server's shared memory, already released).
bool process_gone(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close_paren = stat.rfind(')');
  return close_paren == std::string::npos || stat.compare(close_paren, 4, ") Z ") == 0;
}

// Waits for our child `pid` to exit and reaps it; false if it is still running after `timeout`.
bool wait_for_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) != pid) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Removes `path` in a detached `rm -rf` (a grandchild, its output on /dev/null so ctest
// does not wait for it): on a busy ext4, removing a cluster whose pages were written back
// took 3 s, where the test has nothing left to wait for. Renamed first, so the name is free
// at once. Falls back to removing it here.
void remove_in_background(const std::string& path) {
  const std::string doomed = path + ".removing";
  std::error_code ec;
  if (rename(path.c_str(), doomed.c_str()) != 0) {
    fs::remove_all(path, ec);
    return;
  }
  const char* argv[] = {"/bin/rm", "-rf", doomed.c_str(), nullptr};
  const pid_t child = fork();
  if (child == 0) {
    setsid();
    const int devnull = open("/dev/null", O_RDWR);
    for (int fd : {0, 1, 2}) dup2(devnull, fd);
    if (fork() == 0) execv(argv[0], const_cast<char* const*>(argv));
    _exit(0);
  }
  if (child < 0) {
    fs::remove_all(doomed, ec);
    return;
  }
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
}

struct PgConnCloser {
  void operator()(PGconn* c) const { PQfinish(c); }
};
struct PgResultCloser {
  void operator()(PGresult* r) const { PQclear(r); }
};

}  // namespace

std::string Postgres::bin_dir() {
  if (const char* env = std::getenv("MQTT_INBOX_PG_BINDIR")) return env;
  const auto usable = [](const std::string& d) {
    return access((d + "/postgres").c_str(), X_OK) == 0 &&
           access((d + "/initdb").c_str(), X_OK) == 0;
  };
  if (usable("/usr/lib/postgresql/15/bin")) return "/usr/lib/postgresql/15/bin";
  int best = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const int v = std::atoi(e.path().filename().c_str());
    if (v > best && usable(e.path().string() + "/bin")) best = v;
  }
  return best > 0 ? "/usr/lib/postgresql/" + std::to_string(best) + "/bin" : "";
}

double Postgres::make_template(const std::string& template_dir) {
  const std::string bin = required_bin_dir();
  const std::string path = template_path(template_dir, bin);
  if (template_complete(path)) return 0;  // made before: renamed into place whole
  // One maker at a time; the others wait here and then find it complete. flock is released
  // by the kernel if the maker dies.
  const int lock = open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) throw std::runtime_error("open " + path + ".lock: " + std::strerror(errno));
  struct Unlock {
    int fd;
    ~Unlock() { close(fd); }
  } unlock{lock};
  while (flock(lock, LOCK_EX) != 0)
    if (errno != EINTR)
      throw std::runtime_error("flock " + path + ".lock: " + std::strerror(errno));
  if (template_complete(path)) return 0;
  const auto t0 = Clock::now();
  std::error_code ec;
  fs::remove_all(path, ec);  // an incomplete one (a temporary-file cleaner took part of it)
  const RunAs as = server_user();
  const std::string tmp = make_temp_dir(path + ".tmp.", as);
  try {
    // --no-sync: see the header. --wal-segsize=1 (MB): a third less to copy per cluster.
    run_to_end({bin + "/initdb", "-D", tmp + "/data", "-U", "postgres", "-A", "trust", "-E", "UTF8",
                "--locale=C", "--no-sync", "--no-instructions", "--wal-segsize=1"},
               tmp + "/initdb.log", as, tmp);
    std::ofstream(tmp + "/ready") << "made by pid " << getpid() << "\n";
    if (rename(tmp.c_str(), path.c_str()) != 0)
      throw std::runtime_error("rename " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return seconds_since(t0);
}

Postgres::Postgres(Options options) : options_(std::move(options)) {
  const RunAs as = server_user();
  timings_.template_s = make_template(options_.template_dir);
  const std::string tmpl = template_path(options_.template_dir, required_bin_dir());
  dir_ = make_temp_dir(base_dir() + "/mqtt_inbox_pg.", as);
  data_ = dir_ + "/data";
  log_ = dir_ + "/postgres.log";
  try {
    const auto t0 = Clock::now();
    // cp -a keeps the files' owner (postgres) and the data folder's mode (0700), both of
    // which the server checks.
    run_to_end({"/bin/cp", "-a", tmpl + "/data", data_}, dir_ + "/cp.log", RunAs{}, dir_);
    timings_.copy_s = seconds_since(t0);
    start();
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

Postgres::~Postgres() {
  if (postmaster_ > 0) {
    // Immediate shutdown (SIGQUIT): the postmaster takes its backends down and exits without
    // the checkpoint a fast shutdown writes, for data that is removed next.
    kill(postmaster_, SIGQUIT);
    if (!wait_for_exit(postmaster_, std::chrono::seconds(30))) crash();
    postmaster_ = -1;
  }
  remove_in_background(dir_);
}

void Postgres::start() {
  if (postmaster_ > 0) return;
  const std::string bin = required_bin_dir();
  std::vector<std::string> argv{bin + "/postgres",
                                "-D",
                                data_,
                                "-c",
                                "listen_addresses=",
                                "-c",
                                "unix_socket_directories=" + dir_,
                                "-c",
                                "port=" + std::to_string(port_),
                                "-c",
                                std::string("fsync=") + (options_.fsync ? "on" : "off"),
                                "-c",
                                "synchronous_commit=on",
                                "-c",
                                "shared_buffers=32MB",
                                "-c",
                                "max_connections=50",
                                "-c",
                                "recovery_init_sync_method=syncfs",
                                "-c",
                                "log_line_prefix=%m [%p] %q%e %a: "};
  for (const auto& s : options_.settings) {
    argv.push_back("-c");
    argv.push_back(s);
  }
  const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const bool main_thread = syscall(SYS_gettid) == getpid();
  const auto t0 = Clock::now();
  postmaster_ = spawn(argv, fd, server_user(), dir_, main_thread);
  if (fd >= 0) close(fd);
  // Ready when the postmaster says so in postmaster.pid (line 8, PostgreSQL 10 and later):
  // a file read, where polling with PQping would fork a backend and log a FATAL line each
  // time while crash recovery runs.
  const std::string pid_file = data_ + "/postmaster.pid";
  bool exited = false;
  int st = 0;
  const auto deadline = t0 + std::chrono::seconds(60);
  for (;;) {
    if (waitpid(postmaster_, &st, WNOHANG) == postmaster_) {
      exited = true;
      postmaster_ = -1;
      break;
    }
    std::istringstream lines(read_file(pid_file));
    std::string line, status;
    for (int i = 1; std::getline(lines, line); ++i) {
      if (i == 1 && std::atoi(line.c_str()) != postmaster_) break;  // a stale file
      if (i == 8) status = line.substr(0, line.find_last_not_of(' ') + 1);
    }
    if (status == "ready") break;
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (exited || Clock::now() > deadline) {
    if (!exited) crash();
    throw std::runtime_error(std::string("PostgreSQL in ") + dir_ +
                             (exited ? " exited at start (wait status " + std::to_string(st) + ")"
                                     : " did not accept connections within 60 s") +
                             "; log:\n" + log_tail());
  }
  timings_.start_s = seconds_since(t0);
}

void Postgres::stop() {
  if (postmaster_ <= 0) return;
  const auto t0 = Clock::now();
  kill(postmaster_, SIGINT);  // fast shutdown
  if (!wait_for_exit(postmaster_, std::chrono::seconds(60))) {
    crash();
    return;
  }
  postmaster_ = -1;
  timings_.stop_s = seconds_since(t0);
}

void Postgres::crash() {
  if (postmaster_ <= 0) return;
  // Stopped first, the postmaster can start no new process while we collect its children.
  kill(postmaster_, SIGSTOP);
  const std::vector<pid_t> children = children_of(postmaster_);
  for (pid_t c : children) kill(c, SIGKILL);
  kill(postmaster_, SIGKILL);
  int st = 0;
  while (waitpid(postmaster_, &st, 0) < 0 && errno == EINTR) {
  }
  postmaster_ = -1;
  // The next start refuses while a process of this one still holds its shared memory.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (pid_t c : children)
    while (!process_gone(c) && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

std::string Postgres::conninfo(const std::string& dbname,
                               const std::string& application_name) const {
  std::string s =
      "host=" + dir_ + " port=" + std::to_string(port_) + " user=postgres dbname=" + dbname;
  if (!application_name.empty()) s += " application_name=" + application_name;
  return s;
}

std::string Postgres::uri(const std::string& dbname) const {
  return "postgresql:///" + dbname + "?host=" + dir_ + "&port=" + std::to_string(port_) +
         "&user=postgres";
}

std::string Postgres::socket_path() const { return dir_ + "/.s.PGSQL." + std::to_string(port_); }

Postgres::Rows Postgres::query(const std::string& sql, const std::string& dbname) const {
  std::unique_ptr<PGconn, PgConnCloser> conn(
      PQconnectdb((conninfo(dbname, "mqtt_inbox_test_fixture") + " connect_timeout=10").c_str()));
  if (PQstatus(conn.get()) != CONNECTION_OK)
    throw std::runtime_error("cannot connect to " + dir_ + ": " + PQerrorMessage(conn.get()));
  std::unique_ptr<PGresult, PgResultCloser> res(PQexec(conn.get(), sql.c_str()));
  const ExecStatusType status = PQresultStatus(res.get());
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    const char* state = PQresultErrorField(res.get(), PG_DIAG_SQLSTATE);
    throw std::runtime_error(std::string("SQL failed (") + (state ? state : "no SQLSTATE") +
                             "): " + PQresultErrorMessage(res.get()) + "in: " + sql);
  }
  Rows rows;
  for (int r = 0; r < PQntuples(res.get()); ++r) {
    rows.emplace_back();
    for (int c = 0; c < PQnfields(res.get()); ++c)
      rows.back().push_back(PQgetisnull(res.get(), r, c)
                                ? std::nullopt
                                : std::optional<std::string>(PQgetvalue(res.get(), r, c)));
  }
  return rows;
}

std::string Postgres::query_value(const std::string& sql, const std::string& dbname) const {
  const Rows rows = query(sql, dbname);
  if (rows.size() != 1 || rows[0].size() != 1)
    throw std::runtime_error("expected one value, got " + std::to_string(rows.size()) +
                             " rows: " + sql);
  return rows[0][0].value_or("");
}

void Postgres::execute(const std::string& sql, const std::string& dbname) const {
  query(sql, dbname);
}

void Postgres::create_database(const std::string& name) const {
  std::string ident = "\"";
  for (char c : name) ident += c == '"' ? std::string("\"\"") : std::string(1, c);
  execute("CREATE DATABASE " + ident + "\"");
}

int Postgres::terminate_backends(const std::string& application_name) const {
  // The subquery keeps pg_terminate_backend from being evaluated for other rows.
  return std::stoi(query_value(
      "SELECT count(*) FILTER (WHERE t) FROM (SELECT pg_terminate_backend(pid, 5000) AS t "
      "FROM pg_stat_activity WHERE application_name = " +
      quote_literal(application_name) + " AND pid <> pg_backend_pid()) s"));
}

bool Postgres::terminate_backend(int pid) const {
  return query_value("SELECT pg_terminate_backend(" + std::to_string(pid) + ", 5000)") == "t";
}

bool Postgres::wait_for_lock_wait(int pid, std::chrono::milliseconds timeout) const {
  const std::string sql =
      "SELECT wait_event_type FROM pg_stat_activity WHERE pid = " + std::to_string(pid);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const Rows rows = query(sql);
    if (!rows.empty() && rows[0][0] == std::optional<std::string>("Lock")) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string Postgres::log_tail(size_t bytes) const { return tail_of(read_file(log_), bytes); }

}  // namespace mqtt_inbox::test

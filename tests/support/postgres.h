// Test support: a private PostgreSQL cluster per test process (Debian's postgresql-15),
// started without systemd, as the RabbitMQ node is (support/rabbitmq.h).
//
// - Its data folder, log and unix socket live in a temporary folder; listen_addresses=''
//   (no TCP port), so clusters of parallel test processes never clash. Authentication is
//   `trust` on that socket, whose folder only its owner (and root) may enter.
// - initdb and postgres refuse to run as root: when the test runs as root (CI), they run
//   as the `postgres` user (setuid in the forked child, as runuser would, but with the
//   postmaster our own child so stop() and crash() can reap it); otherwise as the user
//   running the test. The superuser role is `postgres` either way.
// - initdb runs once per machine, user and PostgreSQL major version into a template data
//   folder ($TMPDIR/mqtt_inbox_pg<major>_template_u<uid>_v<n>, made under a file lock and
//   renamed into place, so parallel ctest processes do not race); each cluster is a copy
//   of it. Measured on the 2-core machine under ctest -j3 with the rest of the suite:
//   initdb 1.2 s once, then copy 0.2 s + start 0.2 s; restart 0.3 s; start after crash()
//   0.3-0.5 s.
// - fsync=on and synchronous_commit=on by default: crash() and a restart test what a
//   committed transaction survives. Options::fsync=false where durability is not under
//   test. The template itself is written without fsync (initdb --no-sync): it is data the
//   tests can always make again, and the OS page cache serves crash() tests. After a
//   crash, PostgreSQL makes the whole data folder durable before redo; with
//   recovery_init_sync_method=syncfs (set here) that is one syncfs() of the file system
//   rather than an fsync per file: measured 0.7 s instead of 5.2 s on the loaded 2-core
//   machine, where the just-copied cluster is still dirty in the page cache.
//
// Thread safety: one thread drives a Postgres (start/stop/crash); the query helpers open
// a connection of their own per call and may run on any thread. Construct it on the
// thread that destroys it: when it is the main thread, a test process that dies without
// cleaning up (a SIGKILL, a ctest timeout) takes the server down with it (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace mqtt_inbox::test {

class Postgres {
 public:
  struct Options {
    // fsync (and so WAL flushes at commit) on; off is faster where durability is not
    // under test: such a cluster survives crash() (the OS keeps its pages) but not a
    // power loss.
    bool fsync = true;
    // More server settings, each "name=value" (passed as -c name=value), applied at
    // every start. Defaults set here: shared_buffers=32MB, max_connections=50.
    std::vector<std::string> settings;
    // The template data folder's parent; "" = the machine's shared one under $TMPDIR.
    // A fresh folder makes this cluster run initdb (the self-test measures it there).
    std::string template_dir;
  };

  // Where initdb and postgres are: MQTT_INBOX_PG_BINDIR, else /usr/lib/postgresql/15/bin,
  // else the newest /usr/lib/postgresql/<n>/bin; "" if PostgreSQL is not installed.
  static std::string bin_dir();

  // Makes the template data folder under `template_dir` ("" = the shared one) unless a
  // complete one exists; waits for another process making it. Returns the seconds spent
  // in initdb, 0 if the template was already there. Throws std::runtime_error on failure.
  static double make_template(const std::string& template_dir = "");

  // Copies the template into a fresh temporary folder and starts the server. Throws
  // std::runtime_error (with the end of the server's log) if it is not accepting
  // connections within 60 s, or if PostgreSQL or the `postgres` user (as root) is missing.
  Postgres() : Postgres(Options{}) {}
  explicit Postgres(Options options);
  // Stops the server (immediate shutdown: no checkpoint for data about to go; SIGKILL if it
  // hangs) and removes its folder (renamed at once, its files removed in the background).
  ~Postgres();
  Postgres(const Postgres&) = delete;
  Postgres& operator=(const Postgres&) = delete;

  // Starts the server on the same data and socket; returns once it accepts connections
  // (after crash recovery, if crash() came before). Throws as the constructor does.
  void start();
  // Fast shutdown (SIGINT): open transactions roll back, clients are disconnected with
  // 57P01 admin_shutdown, a checkpoint is written. Waits up to 60 s, then crash()es.
  void stop();
  void restart() {
    stop();
    start();
  }
  // SIGKILL to the postmaster and all its processes at once (as the OOM killer or
  // `systemctl kill -s KILL` would): no checkpoint, no goodbye to clients. The next
  // start() runs crash recovery from the WAL.
  void crash();
  bool running() const { return postmaster_ > 0; }
  pid_t postmaster_pid() const { return postmaster_; }

  // Connection parameters for libpq / libpqxx over the unix socket, as superuser
  // `postgres`: "host=<dir> port=<n> user=postgres dbname=<db>[ application_name=<a>]"
  // and the URI form "postgresql:///<db>?host=<dir>&port=<n>&user=postgres".
  std::string conninfo(const std::string& dbname = "postgres",
                       const std::string& application_name = "") const;
  std::string uri(const std::string& dbname = "postgres") const;
  const std::string& socket_dir() const { return dir_; }
  int port() const { return port_; }
  // <socket_dir>/.s.PGSQL.<port>: what a CutProxy forwards to.
  std::string socket_path() const;
  const std::string& data_dir() const { return data_; }

  // SQL as superuser, each call on a new connection (application_name
  // mqtt_inbox_test_fixture, never terminated by terminate_backends). Throws
  // std::runtime_error with the SQLSTATE and message on an error.
  // query: the rows, each value as text, NULL as nullopt.
  using Rows = std::vector<std::vector<std::optional<std::string>>>;
  Rows query(const std::string& sql, const std::string& dbname = "postgres") const;
  // The one value of a one-row, one-column result (throws otherwise; NULL is "").
  std::string query_value(const std::string& sql, const std::string& dbname = "postgres") const;
  void execute(const std::string& sql, const std::string& dbname = "postgres") const;
  void create_database(const std::string& name) const;

  // pg_terminate_backend for every backend of `application_name` / for backend `pid`
  // (the client's next call fails: 57P01, then the connection closes). Waits up to 5 s
  // for each to exit. Returns how many were terminated / whether it was.
  int terminate_backends(const std::string& application_name) const;
  bool terminate_backend(int pid) const;
  // Waits until backend `pid` waits for a lock (pg_stat_activity.wait_event_type = 'Lock'):
  // the step in a two-connection test where the second statement has blocked.
  bool wait_for_lock_wait(int pid, std::chrono::milliseconds timeout) const;

  // The end of the server's log (all starts appended), for failure messages. Each line of
  // a backend carries its SQLSTATE and application name: "<time> [<pid>] 40001 <app>: ERROR: ..."
  std::string log_tail(size_t bytes = 4000) const;
  const std::string& log_path() const { return log_; }

  // Seconds: initdb (0 if the template existed), copying the template, the last start
  // (until it accepted connections) and the last stop.
  struct Timings {
    double template_s = 0, copy_s = 0, start_s = 0, stop_s = 0;
  };
  const Timings& timings() const { return timings_; }

 private:
  Options options_;
  std::string dir_, data_, log_;
  int port_ = 5432;  // names the socket file only: there is no TCP listener
  pid_t postmaster_ = -1;
  Timings timings_;
};

}  // namespace mqtt_inbox::test

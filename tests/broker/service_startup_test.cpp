// Every wait before READY=1, and every way a start-up or a run ends, as systemd sees it
// (issue 27, item 5 and the exit codes of item 8). The example programs run as child
// processes with NOTIFY_SOCKET (a datagram socket the test binds, as systemd does for a
// Type=notify unit) and WATCHDOG_USEC (a tick every 200 ms) against a real mosquitto and
// real SQLite files, made unavailable by real means: the sqlite3 CLI holding the write
// lock, another process holding the per-database lock file, a full tmpfs, garbage in
// place of the database, a broker that refuses the client. Assertions are on the
// datagrams and their order, the exit codes, and the business rows.
//
// Members of "a wait or an end before READY=1" covered here, per program:
//   store locked at start (write lock)      ledger_consumer, sensor_gateway, event_consumer
//   disk full at start                      ledger_consumer
//   stop requested during that wait         sensor_gateway
//   database lock file held (exit 4)        ledger_consumer
//   corrupt database (exit 5)               ledger_consumer, sensor_gateway
//   broker refusing the client (exit 7)     ledger_consumer (3.1.1 and 5), sensor_gateway
//                                           (TLS, untrusted CA); a broker that is merely
//                                           down is not a refusal
#include <fcntl.h>
#include <gtest/gtest.h>
#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/service_notifier.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include "support/example_fixture.h"
#include "support/notify_socket.h"
#include "support/publisher.h"
#include "support/tls_pki.h"
#include "support/tmpfs.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class ServiceStartupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = std::make_unique<NotifySocket>(dir_.file("notify.sock"));
    runtime_dir_ = dir_.file("run");
    ::mkdir(runtime_dir_.c_str(), 0755);
    client_id_ = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                 "-" + std::to_string(::getpid());
    if (!ServiceNotifier::supported())
      GTEST_SKIP() << "built without libsystemd: the programs send nothing (service_e2e_test "
                      "checks that)";
  }

  // `program` with the environment of a Type=notify unit with WatchdogSec=600ms.
  // Without `watchdog`: no WatchdogSec=, so the notifier ticks every 5 s.
  std::unique_ptr<Child> start(std::vector<std::string> argv, bool watchdog = true) {
    ::setenv("NOTIFY_SOCKET", socket_->path().c_str(), 1);
    if (watchdog) ::setenv("WATCHDOG_USEC", "600000", 1);
    ::setenv("RUNTIME_DIRECTORY", runtime_dir_.c_str(), 1);
    auto child = std::make_unique<Child>(std::move(argv), log_path());
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
    ::unsetenv("RUNTIME_DIRECTORY");
    return child;
  }

  std::vector<std::string> ledger(const std::string& db, const std::string& version = "5") {
    return {built_program("ledger_consumer"),
            "--broker",
            broker_.uri(),
            "--client-id",
            client_id_,
            "--topic",
            "credits/#",
            "--db",
            db,
            "--mqtt-version",
            version};
  }
  std::vector<std::string> events(const std::string& db) {
    return {built_program("event_consumer"),
            "--broker",
            broker_.uri(),
            "--client-id",
            client_id_,
            "--topic",
            "events/#",
            "--db",
            db,
            "--mqtt-version",
            "5"};
  }
  std::vector<std::string> gateway(const std::string& db) {
    return {built_program("sensor_gateway"),
            "--broker",
            broker_.uri(),
            "--client-id",
            client_id_,
            "--db",
            db,
            "--mqtt-version",
            "5"};
  }

  std::string log_path() const { return dir_.file("service.log"); }
  std::string diagnostics() const {
    return "notifications:\n" + socket_->dump() + "log:\n" + read_text(log_path());
  }

  // Index of the first datagram holding `line` exactly (or, with `status`, whose STATUS
  // contains it); -1 if none.
  int first(const std::string& line) const {
    const auto all = socket_->received();
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i].has(line)) return static_cast<int>(i);
    return -1;
  }
  int first_status(const std::string& fragment) const {
    const auto all = socket_->received();
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i].value("STATUS").find(fragment) != std::string::npos) return static_cast<int>(i);
    return -1;
  }
  int first_extend() const {
    const auto all = socket_->received();
    for (size_t i = 0; i < all.size(); ++i)
      if (!all[i].value("EXTEND_TIMEOUT_USEC").empty()) return static_cast<int>(i);
    return -1;
  }
  int last_extend() const {
    const auto all = socket_->received();
    for (size_t i = all.size(); i-- > 0;)
      if (!all[i].value("EXTEND_TIMEOUT_USEC").empty()) return static_cast<int>(i);
    return -1;
  }

  // The start-up wait as systemd sees it, in order: STATUS=starting first, then a STATUS
  // with `reason` and EXTEND_TIMEOUT_USEC= (three 200 ms ticks) every tick while the
  // wait lasts, and no READY=1 yet.
  void expect_wait_reported(const std::string& reason) {
    ASSERT_TRUE(socket_->wait_status(reason, seconds(20))) << diagnostics();
    ASSERT_TRUE(socket_->wait_for(
        [](const std::vector<Notification>& all) {
          int extends = 0;
          for (const auto& n : all) extends += !n.value("EXTEND_TIMEOUT_USEC").empty();
          return extends >= 3;  // renewed every tick while the wait lasts
        },
        seconds(5)))
        << diagnostics();
    const auto all = socket_->received();
    ASSERT_FALSE(all.empty());
    EXPECT_EQ(all.front().value("STATUS").rfind("starting", 0), 0u) << diagnostics();
    EXPECT_EQ(first("READY=1"), -1) << "READY=1 while the store is not ready\n" << diagnostics();
    EXPECT_LE(first_status(reason), first_extend()) << diagnostics();
    EXPECT_EQ(socket_->received()[first_extend()].value("EXTEND_TIMEOUT_USEC"), "600000");
    EXPECT_NE(first_status("starting; stuck"), -1) << diagnostics();
  }

  // After the wait: READY=1 comes after every extension, and none follows it.
  void expect_ready_after_wait() {
    ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
    socket_->collect(milliseconds(600));
    const int ready = first("READY=1");
    EXPECT_GT(ready, last_extend()) << "start timeout extended after READY=1\n" << diagnostics();
    EXPECT_EQ(socket_->count_line("READY=1"), 1u);
  }

  void stop_cleanly(Child& c) {
    c.signal(SIGTERM);
    const int st = c.wait(seconds(30));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << diagnostics();
  }

  // The exit status of `c` within `timeout` (-1 if it is still running).
  static int exit_code(Child& c, std::chrono::milliseconds timeout) {
    const int st = c.wait(timeout);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  size_t broker_connections() const {
    return count_of(read_text(broker_.log_path()), " as " + client_id_ + " (");
  }

  TempDir dir_;
  Broker broker_;
  std::unique_ptr<NotifySocket> socket_;
  std::string runtime_dir_, client_id_;
};

// The issue's run: the store locked at start (a backup's write lock). The notify socket
// hears why at once, the start timeout is extended while the lock lasts, READY=1 comes
// when it goes, nothing connects before, and then a credit is applied once.
TEST_F(ServiceStartupTest, LedgerConsumerStoreLockedAtStart) {
  const std::string db = dir_.file("ledger.db");
  WriteLockHolder lock(db, dir_.path());
  ASSERT_TRUE(lock.held());
  auto c = start(ledger(db));
  expect_wait_reported("store: waiting at start-up while opening the database: busy");
  EXPECT_EQ(broker_connections(), 0u) << "connected before the store was ready";
  lock.release();
  expect_ready_after_wait();
  ASSERT_TRUE(socket_->wait_status("connected; processed 0", seconds(30))) << diagnostics();
  {
    TestPublisher pub(broker_.uri(), true);
    pub.credit("credits/a", "after-lock-1", "acc-1", 42);
  }
  ASSERT_TRUE(socket_->wait_status("processed 1", seconds(30))) << diagnostics();
  stop_cleanly(*c);
  EXPECT_EQ(query_int(db, "SELECT sum(balance) FROM accounts"), 42);
}

TEST_F(ServiceStartupTest, SensorGatewayStoreLockedAtStart) {
  const std::string db = dir_.file("sensors.db");
  WriteLockHolder lock(db, dir_.path());
  ASSERT_TRUE(lock.held());
  auto c = start(gateway(db));
  expect_wait_reported("store: waiting at start-up while opening the database: busy");
  lock.release();
  expect_ready_after_wait();
  ASSERT_TRUE(socket_->wait_status("connected; processed 0", seconds(30))) << diagnostics();
  {
    TestPublisher pub(broker_.uri(), true);
    pub.publish("sensors/dev-1/reading", "{\"message_id\":\"r-1\",\"value\":21.5}");
  }
  ASSERT_TRUE(socket_->wait_status("processed 1", seconds(30))) << diagnostics();
  stop_cleanly(*c);
  EXPECT_EQ(query_int(db, "SELECT sum(readings) FROM devices"), 1);
}

// The lock taken after the schema exists: the wait is in the program's own set-up
// (Inbox::setup), another start-up call than open.
TEST_F(ServiceStartupTest, EventConsumerStoreLockedDuringItsSetUp) {
  const std::string db = dir_.file("events.db");
  {
    auto first_run = start(events(db));
    ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
    stop_cleanly(*first_run);
  }
  socket_ = std::make_unique<NotifySocket>(dir_.file("notify2.sock"));
  WriteLockHolder lock(db, dir_.path());
  ASSERT_TRUE(lock.held());
  auto c = start(events(db));
  expect_wait_reported("store: waiting at start-up while");
  lock.release();
  expect_ready_after_wait();
  stop_cleanly(*c);
}

// A disk full at start: the new database cannot be written. Reported and extended like
// a lock; READY=1 once space is freed.
// The first STATUS= of a start-up wait leaves about 1 s into it, not after a whole busy
// timeout (5 s) and the next notifier tick (5 s without a watchdog): the first attempt
// waits at most 1 s for the lock, and its failure refreshes STATUS at once. And "stuck
// N s" counts from the start of the wait, not from the first report of it.
TEST_F(ServiceStartupTest, StartUpWaitIsReportedWithinASecondWithItsTrueLength) {
  const std::string db = dir_.file("ledger.db");
  WriteLockHolder lock(db, dir_.path());
  ASSERT_TRUE(lock.held());
  const auto t0 = std::chrono::steady_clock::now();
  auto c = start(ledger(db), /*watchdog=*/false);
  const std::string reason = "store: waiting at start-up while opening the database: busy";
  ASSERT_TRUE(socket_->wait_status(reason, seconds(20))) << diagnostics();
  const auto first_at = socket_->received()[first_status(reason)].at;
  EXPECT_LT(first_at - t0, milliseconds(2500))
      << "first STATUS of the wait after "
      << std::chrono::duration_cast<milliseconds>(first_at - t0).count() << " ms\n"
      << diagnostics();
  // A later report of the same wait, 6 s or more into it: its figure is the wait's length.
  ASSERT_TRUE(socket_->wait_for(
      [&](const std::vector<Notification>& all) {
        for (const auto& n : all)
          if (n.at - t0 >= seconds(6) && n.value("STATUS").find("stuck ") != std::string::npos)
            return true;
        return false;
      },
      seconds(20)))
      << diagnostics();
  for (const auto& n : socket_->received()) {
    const std::string status = n.value("STATUS");
    const size_t at = status.find("stuck ");
    if (n.at - t0 < seconds(6) || at == std::string::npos) continue;
    const int64_t reported_s = std::stoll(status.substr(at + 6));
    const int64_t true_s = std::chrono::duration_cast<seconds>(n.at - t0).count();
    EXPECT_GE(reported_s, true_s - 2) << status << " at " << true_s << " s\n" << diagnostics();
    EXPECT_LE(reported_s, true_s) << status << " at " << true_s << " s";
    break;
  }
  EXPECT_EQ(first("READY=1"), -1) << diagnostics();
  lock.release();
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
  stop_cleanly(*c);
}

// The disk full at start: an existing database (messages may wait in it) is waited for,
// STATUS saying so, until space is freed; a new one that does not fit is not (nothing
// waits in a database never made): exit 4 at once, no file left, and the next start (the
// unit's Restart=) once there is room.
TEST_F(ServiceStartupTest, LedgerConsumerDiskFullAtStart) {
  const std::string mnt = dir_.file("fs");
  TmpfsMount fs(mnt, "1m");
  if (!fs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << fs.error() << ")";
  const std::string filler = mnt + "/filler", db = mnt + "/ledger.db";
  {
    std::unique_ptr<Inbox> made;
    ASSERT_TRUE(Inbox::open(db, {}, &made).ok());
  }
  ASSERT_GT(fill_file_system(filler), 0);
  auto c = start(ledger(db));
  expect_wait_reported("store: waiting at start-up while");
  ::unlink(filler.c_str());
  expect_ready_after_wait();
  stop_cleanly(*c);
  c.reset();

  socket_ = std::make_unique<NotifySocket>(dir_.file("notify-new.sock"));
  const std::string fresh = mnt + "/fresh.db";
  ASSERT_GT(fill_file_system(filler), 0);
  auto d = start(ledger(fresh));
  EXPECT_EQ(exit_code(*d, seconds(20)), 4) << diagnostics();
  EXPECT_NE(first_status("no room to create the new database"), -1) << diagnostics();
  EXPECT_EQ(first("READY=1"), -1);
  for (const char* suffix : {"", "-wal", "-shm", ".lock"})
    EXPECT_NE(::access((fresh + suffix).c_str(), F_OK), 0) << suffix;
  ::unlink(filler.c_str());
  auto e = start(ledger(fresh));
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
  stop_cleanly(*e);
}

// systemctl stop (or the start timeout's SIGTERM) during a start-up wait ends the
// process at once, not after TimeoutStopSec=: nothing was connected or acked.
TEST_F(ServiceStartupTest, StopDuringTheStartUpWaitEndsAtOnce) {
  const std::string db = dir_.file("sensors.db");
  WriteLockHolder lock(db, dir_.path());
  ASSERT_TRUE(lock.held());
  auto c = start(gateway(db));
  ASSERT_TRUE(socket_->wait_status("store: waiting at start-up", seconds(20))) << diagnostics();
  const auto t0 = std::chrono::steady_clock::now();
  c->signal(SIGTERM);
  EXPECT_EQ(exit_code(*c, seconds(5)), 0) << diagnostics();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(3));
  EXPECT_NE(first("STOPPING=1"), -1) << diagnostics();
  EXPECT_EQ(first("READY=1"), -1) << diagnostics();
  EXPECT_EQ(broker_connections(), 0u);
}

// Another consumer process holds the database (its lock file): not a wait, exit 4 at
// once, and STATUS says which file and why.
TEST_F(ServiceStartupTest, DatabaseLockFileHeldEndsWithExit4AndTheReason) {
  const std::string db = dir_.file("ledger.db");
  const int fd = ::open((db + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  auto c = start(ledger(db));
  EXPECT_EQ(exit_code(*c, seconds(20)), 4) << diagnostics();
  ::close(fd);
  EXPECT_NE(first_status("failed: exit 4: busy: " + db + " is in use by another consumer"), -1)
      << diagnostics();
  EXPECT_EQ(first("READY=1"), -1);
}

// A corrupt database is a wait that would never end: STATUS says so, exit 5 at once (the
// unit's RestartPreventExitStatus= then leaves it failed), the file untouched.
TEST_F(ServiceStartupTest, CorruptDatabaseSaysSoAndExits5) {
  for (const std::string program : {"ledger_consumer", "sensor_gateway"}) {
    SCOPED_TRACE(program);
    socket_ = std::make_unique<NotifySocket>(dir_.file("notify-" + program + ".sock"));
    const std::string db = dir_.file(program + ".db");
    const std::string garbage(8192, 'x');
    std::ofstream(db, std::ios::binary) << "this is not an SQLite database " << garbage;
    auto c = start(program == "ledger_consumer" ? ledger(db) : gateway(db));
    EXPECT_EQ(exit_code(*c, seconds(20)), 5) << diagnostics();
    EXPECT_NE(first_status("failed: exit 5: corruption: "), -1) << diagnostics();
    EXPECT_NE(first_status("(a restart does not help)"), -1) << diagnostics();
    EXPECT_EQ(first("READY=1"), -1);
    EXPECT_EQ(read_text(db), "this is not an SQLite database " + garbage) << "file changed";
  }
}

// A broker that refuses the client: the unit does not stay "active" for ever. Once every
// attempt for --refused-limit-ms was refused, the program stops cleanly with exit 7 and
// STATUS says why. On MQTT 3.1.1 (return code 5) and 5 (reason code 0x87).
TEST_F(ServiceStartupTest, BrokerRefusingTheClientEndsWithExit7) {
  Broker closed(Broker::Config{}, {"allow_anonymous false\n"});
  const std::string uri = "tcp://127.0.0.1:" + std::to_string(closed.listener_port(0));
  for (const std::string version : {"3.1.1", "5"}) {
    SCOPED_TRACE(version);
    socket_ = std::make_unique<NotifySocket>(dir_.file("notify-" + version + ".sock"));
    auto argv = ledger(dir_.file("ledger-" + version + ".db"), version);
    argv[2] = uri;
    argv.insert(argv.end(), {"--refused-limit-ms", "3000"});
    auto c = start(argv);
    ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
    EXPECT_EQ(exit_code(*c, seconds(30)), 7) << diagnostics();
    EXPECT_NE(first_status("failed: exit 7: the broker refused this client for 3 s"), -1)
        << diagnostics();
    EXPECT_NE(first_status("not authorized"), -1) << diagnostics();
    EXPECT_GT(first_status("failed: exit 7"), first("STOPPING=1")) << diagnostics();
  }
}

TEST_F(ServiceStartupTest, UntrustedBrokerCertificateEndsWithExit7) {
  TestPki pki;
  Broker tls(Broker::Config{}, {"cafile " + pki.ca_cert() + "\ncertfile " + pki.server_cert() +
                                "\nkeyfile " + pki.server_key() + "\nallow_anonymous true\n"});
  auto argv = gateway(dir_.file("sensors.db"));
  argv[2] = "ssl://127.0.0.1:" + std::to_string(tls.listener_port(0));
  argv.insert(argv.end(), {"--cafile", pki.untrusted_ca_cert(), "--refused-limit-ms", "3000"});
  auto c = start(argv);
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
  EXPECT_EQ(exit_code(*c, seconds(30)), 7) << diagnostics();
  EXPECT_NE(first_status("failed: exit 7: the broker refused this client"), -1) << diagnostics();
  EXPECT_NE(first_status("TLS"), -1) << diagnostics();
}

// A broker that is down is not a refusal: a gateway boots before its network, and keeps
// trying past --refused-limit-ms.
TEST_F(ServiceStartupTest, BrokerDownIsNotARefusal) {
  broker_.stop();
  auto argv = ledger(dir_.file("ledger.db"));
  argv.insert(argv.end(), {"--refused-limit-ms", "1000"});
  auto c = start(argv);
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
  EXPECT_EQ(c->wait(seconds(4)), -1) << "gave up on a broker that is only down\n" << diagnostics();
  ASSERT_TRUE(socket_->wait_status("not connected", seconds(5))) << diagnostics();
  stop_cleanly(*c);
}

}  // namespace
}  // namespace mqtt_inbox::test

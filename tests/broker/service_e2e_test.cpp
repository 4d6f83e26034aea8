// The example programs as a systemd service sees them, without systemd: each test starts
// ledger_consumer or sensor_gateway with NOTIFY_SOCKET (a socket the test binds, as
// systemd does for Type=notify), WATCHDOG_USEC and RUNTIME_DIRECTORY set, against a real
// mosquitto, and reads what a service manager would: READY=1, WATCHDOG=1, STATUS=,
// STOPPING=1. The store gets stuck for real: the sqlite3 CLI holds BEGIN EXCLUSIVE in
// another process while a credit waits. Assertions are on the notifications, the ledger
// in the file, and the client-id lock file in the runtime folder.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iterator>

#include <mqtt_inbox/service_notifier.h>

#include "support/ledger_fixture.h"
#include "support/notify_socket.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

class ServiceE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = std::make_unique<NotifySocket>(dir_.file("notify.sock"));
    runtime_dir_ = dir_.file("run");
    ::mkdir(runtime_dir_.c_str(), 0755);
  }

  // Starts `argv` with the environment systemd gives a Type=notify unit with
  // WatchdogSec=600ms and RuntimeDirectory=. The variables are set only around the fork.
  std::unique_ptr<Child> start_service(std::vector<std::string> argv) {
    ::setenv("NOTIFY_SOCKET", socket_->path().c_str(), 1);
    ::setenv("WATCHDOG_USEC", "600000", 1);  // a ping every 200 ms
    ::setenv("RUNTIME_DIRECTORY", runtime_dir_.c_str(), 1);
    auto child = std::make_unique<Child>(std::move(argv), log_path());
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
    ::unsetenv("RUNTIME_DIRECTORY");
    return child;
  }

  // The STATUS value of the last datagram in `all` that carried one.
  static std::string last_status(const std::vector<Notification>& all) {
    for (auto it = all.rbegin(); it != all.rend(); ++it)
      if (!it->value("STATUS").empty()) return it->value("STATUS");
    return "";
  }
  std::string last_status() const { return last_status(socket_->received()); }

  bool wait_status_is(const std::string& status, std::chrono::milliseconds timeout) {
    return socket_->wait_for(
        [&](const std::vector<Notification>& all) { return last_status(all) == status; }, timeout);
  }

  // The STATUS sent with READY=1 describes a consumer that has processed nothing yet and
  // starts with one of `allowed` ("connected", "not connected"). Its tail may say why a
  // first connect attempt failed: under a sanitizer that attempt can fail before READY.
  // READY=1 need not be the first datagram: a slow start-up pings the watchdog first.
  void expect_ready_status(std::initializer_list<const char*> allowed) const {
    std::string status;
    for (const Notification& n : socket_->received())
      if (n.has("READY=1")) {
        status = n.value("STATUS");
        break;
      }
    bool starts = false;
    for (const char* a : allowed)
      starts = starts || status.rfind(std::string(a) + "; processed 0; dead letters 0", 0) == 0;
    EXPECT_TRUE(starts) << status << "\n" << diagnostics();
  }

  std::string log_path() const { return dir_.file("service.log"); }
  std::string diagnostics() const {
    return "notifications:\n" + socket_->dump() + "log:\n" + file_text(log_path());
  }

  // SIGTERM, as `systemctl stop` sends: STOPPING=1, a clean exit, the lock file removed.
  void stop_service(Child& child, const std::string& lock_file) {
    child.signal(SIGTERM);
    EXPECT_TRUE(socket_->wait_line("STOPPING=1", seconds(20))) << diagnostics();
    EXPECT_NE(socket_->dump().find("STATUS=stopping; "), std::string::npos) << diagnostics();
    const int status = child.wait(seconds(30));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << diagnostics();
    EXPECT_FALSE(exists(lock_file)) << "a clean stop removes the client-id lock file";
  }

  TempDir dir_;
  Broker broker_;
  std::unique_ptr<NotifySocket> socket_;
  std::string runtime_dir_;
};

TEST_F(ServiceE2ETest, LedgerConsumerReadyWatchdogStatusStuckStoreAndStopping) {
  const std::string db = dir_.file("ledger.db");
  const std::string lock_file = runtime_dir_ + "/mqtt-inbox-client-svc-ledger.lock";
  auto consumer = start_service({built_program("ledger_consumer"), "--broker", broker_.uri(),
                                 "--client-id", "svc-ledger", "--topic", "credits/#", "--db", db,
                                 "--mqtt-version", "5", "--stuck-limit-ms", "2000"});
  if (!ServiceNotifier::supported()) {
    // Built without libsystemd: the program runs and stops as before, and sends nothing.
    ASSERT_TRUE(wait_until([&] { return exists(lock_file); }, seconds(30))) << diagnostics();
    EXPECT_TRUE(socket_->collect(seconds(2)).empty()) << diagnostics();
    consumer->signal(SIGTERM);
    const int status = consumer->wait(seconds(30));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << diagnostics();
    EXPECT_NE(file_text(log_path()).find("built without libsystemd"), std::string::npos)
        << diagnostics();
    GTEST_SKIP() << "built without libsystemd: checked that nothing is sent";
  }

  // READY=1 once the store is open and the subscriber started, whether or not the first
  // CONNACK has come; the lock file sits in $RUNTIME_DIRECTORY.
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
  expect_ready_status({"not connected", "connected"});
  EXPECT_TRUE(exists(lock_file)) << diagnostics();
  ASSERT_TRUE(wait_status_is("connected; processed 0; dead letters 0", seconds(30)))
      << diagnostics();

  int64_t total = 0;
  {
    TestPublisher pub(broker_.uri(), true);
    for (int i = 0; i < 10; ++i) {
      pub.credit("credits/a", "e2e-" + std::to_string(i), "acc-" + std::to_string(i % 3), i + 1);
      total += i + 1;
    }
  }
  ASSERT_TRUE(wait_status_is("connected; processed 10; dead letters 0", seconds(30)))
      << diagnostics();
  size_t mark = socket_->size();
  socket_->collect(milliseconds(1500));
  EXPECT_GE(socket_->count_line("WATCHDOG=1", mark), 3u) << diagnostics();

  // Another process holds the write lock while a credit arrives: the consumer waits
  // without acking; past --stuck-limit-ms the pings stop and STATUS says why.
  const std::string locked = dir_.file("locked"), release = dir_.file("release");
  Child locker(
      {"/usr/bin/sqlite3", db, ".timeout 5000", "BEGIN EXCLUSIVE;",
       "INSERT INTO accounts (account, balance) VALUES ('locker', 0);", ".shell touch " + locked,
       ".shell i=0; while [ ! -e " + release +
           " ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
       "ROLLBACK;"},
      dir_.file("locker.log"));
  ASSERT_TRUE(wait_until([&] { return exists(locked); }, seconds(10)));
  mark = socket_->size();
  {
    TestPublisher pub(broker_.uri(), true);
    pub.credit("credits/a", "e2e-stuck", "acc-0", 100);
    total += 100;
  }
  ASSERT_TRUE(socket_->wait_status("stuck", seconds(15), mark)) << diagnostics();
  ASSERT_TRUE(socket_->wait_status("watchdog pings stopped", seconds(15), mark)) << diagnostics();
  EXPECT_NE(last_status().find("ledger: store failed: busy"), std::string::npos) << last_status();
  socket_->collect(milliseconds(250));                      // a ping already on its way
  const auto quiet = socket_->collect(milliseconds(1800));  // three watchdog intervals
  for (const auto& n : quiet) EXPECT_FALSE(n.has("WATCHDOG=1")) << diagnostics();
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ledger_entries"), 10);
  EXPECT_NE(file_text(log_path()).find("watchdog pings stop"), std::string::npos) << diagnostics();

  // The lock goes away before systemd would act: the credit commits once, pings resume.
  std::ofstream(release).put('x');
  ASSERT_NE(locker.wait(seconds(15)), -1);
  mark = socket_->size();
  ASSERT_TRUE(wait_status_is("connected; processed 11; dead letters 0", seconds(30)))
      << diagnostics();
  EXPECT_TRUE(socket_->wait_line("WATCHDOG=1", seconds(5), mark)) << diagnostics();

  stop_service(*consumer, lock_file);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ledger_entries"), 11);
  EXPECT_EQ(query_int(db, "SELECT sum(balance) FROM accounts"), total);
  EXPECT_EQ(socket_->count_line("READY=1"), 1u);
}

TEST_F(ServiceE2ETest, SensorGatewayReadyStatusAndStopping) {
  const std::string db = dir_.file("sensors.db");
  const std::string lock_file = runtime_dir_ + "/mqtt-inbox-client-svc-sensors.lock";
  auto gateway = start_service({built_program("sensor_gateway"), "--broker", broker_.uri(),
                                "--client-id", "svc-sensors", "--db", db, "--mqtt-version", "5"});
  if (!ServiceNotifier::supported()) {
    EXPECT_TRUE(socket_->collect(seconds(2)).empty()) << diagnostics();
    GTEST_SKIP() << "built without libsystemd: checked that nothing is sent";
  }
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
  ASSERT_TRUE(wait_status_is("connected; processed 0; dead letters 0", seconds(30)))
      << diagnostics();
  {
    TestPublisher pub(broker_.uri(), true);
    for (int i = 0; i < 6; ++i)
      pub.publish("sensors/dev-" + std::to_string(i % 2) + "/reading",
                  "{\"message_id\":\"r-" + std::to_string(i) +
                      "\",\"value\":" + std::to_string(20 + i) + "}");
    pub.publish("sensors/dev-0/reading", "{\"message_id\":\"r-bad\"}");  // no value
  }
  ASSERT_TRUE(wait_status_is("connected; processed 6; dead letters 1", seconds(30)))
      << diagnostics();
  EXPECT_GE(socket_->count_line("WATCHDOG=1"), 1u);
  stop_service(*gateway, lock_file);
  EXPECT_EQ(query_int(db, "SELECT sum(readings) FROM devices"), 6);
}

// A gateway boots before its network: READY=1 comes once the store is open and the
// subscriber started, with no broker reachable, and STATUS says why it is not connected
// (the subscriber's last failure, never a secret). When the broker appears the service
// connects without a restart.
TEST_F(ServiceE2ETest, ReadyWithoutABrokerAndStatusSaysWhyNotConnected) {
  broker_.stop();  // nothing listens on its port until start() below
  const std::string db = dir_.file("ledger.db");
  auto consumer =
      start_service({built_program("ledger_consumer"), "--broker", broker_.uri(), "--client-id",
                     "svc-offline", "--topic", "credits/#", "--db", db, "--mqtt-version", "5"});
  if (!ServiceNotifier::supported()) {
    EXPECT_TRUE(socket_->collect(seconds(2)).empty()) << diagnostics();
    GTEST_SKIP() << "built without libsystemd: checked that nothing is sent";
  }
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(30))) << diagnostics();
  expect_ready_status({"not connected"});
  ASSERT_TRUE(
      socket_->wait_status("not connected; processed 0; dead letters 0; mqtt: ", seconds(30)))
      << diagnostics();
  EXPECT_GE(socket_->count_line("WATCHDOG=1"), 1u) << "not connected is not stuck";

  broker_.start();
  ASSERT_TRUE(wait_status_is("connected; processed 0; dead letters 0", seconds(60)))
      << diagnostics();
  {
    TestPublisher pub(broker_.uri(), true);
    pub.credit("credits/a", "late-1", "acc-0", 5);
  }
  ASSERT_TRUE(wait_status_is("connected; processed 1; dead letters 0", seconds(30)))
      << diagnostics();
  stop_service(*consumer, runtime_dir_ + "/mqtt-inbox-client-svc-offline.lock");
  EXPECT_EQ(query_int(db, "SELECT sum(balance) FROM accounts"), 5);
}

// SubscriberOptions::client_id_lock_dir "auto" under a unit with RuntimeDirectory=: the
// lock is taken in $RUNTIME_DIRECTORY, a second subscriber with the same client id is
// refused while the first runs, and a clean stop removes the file, after which the id
// can be taken again.
TEST_F(ServiceE2ETest, ClientIdLockLivesInTheRuntimeDirectoryAndGoesAwayOnCleanStop) {
  auto inbox = open_ledger_inbox(dir_.file("lock.db"));
  std::unique_ptr<Consumer> consumer;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", ledger::apply_credit, {}, &consumer).ok());
  ::setenv("RUNTIME_DIRECTORY", (runtime_dir_ + ":" + dir_.file("second")).c_str(), 1);
  auto make = [&] {
    SubscriberOptions o;
    o.broker_uri = broker_.uri();
    o.client_id = "svc lock/1";  // made safe for a file name
    EXPECT_EQ(o.client_id_lock_dir, "auto");
    std::unique_ptr<Subscriber> s;
    EXPECT_TRUE(Subscriber::create(o, &s).ok());
    EXPECT_TRUE(s->subscribe("credits/#", consumer.get()).ok());
    return s;
  };
  const std::string lock_file = runtime_dir_ + "/mqtt-inbox-client-svc%20lock%2f1.lock";
  auto first = make();
  ASSERT_TRUE(first->start().ok());
  EXPECT_TRUE(exists(lock_file));
  auto second = make();
  const Status busy = second->start();
  EXPECT_EQ(busy.code(), Status::Code::kBusy) << busy.to_string();
  EXPECT_NE(busy.message().find(lock_file), std::string::npos) << busy.message();
  ASSERT_TRUE(first->wait_connected(20000));
  ASSERT_TRUE(first->stop().ok());
  EXPECT_FALSE(exists(lock_file)) << "a clean stop removes the lock file";
  auto third = make();
  ASSERT_TRUE(third->start().ok());
  EXPECT_TRUE(exists(lock_file));
  ASSERT_TRUE(third->stop().ok());
  EXPECT_FALSE(exists(lock_file));
  ::unsetenv("RUNTIME_DIRECTORY");
}

// The relay of --emit-topic cannot start (SQLite: another process on this host holds its
// client id, "<client-id>-relay"): the service ends with exit 4 and says why, rather than
// running without a relay, its events piling up in the outbox unpublished.
TEST_F(ServiceE2ETest, RelayThatCannotStartEndsTheServiceWithExit4) {
  const std::string relay_lock = runtime_dir_ + "/mqtt-inbox-client-svc-emit-relay.lock";
  const int held = ::open(relay_lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  auto consumer = start_service({built_program("ledger_consumer"), "--broker", broker_.uri(),
                                 "--client-id", "svc-emit", "--topic", "credits/#", "--db",
                                 dir_.file("emit.db"), "--emit-topic", "events/credited"});
  const int status = consumer->wait(seconds(30));
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 4) << status << "\n"
                                                                             << diagnostics();
  EXPECT_NE(file_text(log_path()).find(relay_lock), std::string::npos) << diagnostics();
  if (ServiceNotifier::supported()) {
    EXPECT_TRUE(socket_->wait_status("failed: exit 4", seconds(5))) << diagnostics();
  }
  ::close(held);
}

}  // namespace
}  // namespace mqtt_inbox::test

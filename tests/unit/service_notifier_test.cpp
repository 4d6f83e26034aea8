// ServiceNotifier (service_notifier.h) against the service manager's end of the sd_notify
// protocol: a datagram socket this test binds and names in NOTIFY_SOCKET, as systemd does
// for a Type=notify unit (no systemd runs here). The health comes from a real Consumer on
// a real SQLite file; "stuck" is a real one: another connection holds BEGIN EXCLUSIVE
// while a message waits to commit. Assertions are on what reached the socket (READY=1,
// WATCHDOG=1, STATUS=, STOPPING=1, EXTEND_TIMEOUT_USEC=) and on the ledger in the file.
//
// In a build without libsystemd (ServiceNotifier::supported() false, e.g. a firmware
// build with MQTT_INBOX_WITH_SYSTEMD=OFF) the same tests assert the other half of the
// contract: nothing reaches the socket and every call still returns OK.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <mqtt_inbox/service_notifier.h>

#include "support/ledger_fixture.h"
#include "support/notify_socket.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The environment a Type=notify unit with WatchdogSec= gives its main process. Set before
// any thread of the test starts, restored afterwards.
class ServiceEnv {
 public:
  ServiceEnv(const std::string& socket, int64_t watchdog_usec) {
    ::setenv("NOTIFY_SOCKET", socket.c_str(), 1);
    if (watchdog_usec > 0)
      ::setenv("WATCHDOG_USEC", std::to_string(watchdog_usec).c_str(), 1);
    else
      ::unsetenv("WATCHDOG_USEC");
    ::unsetenv("WATCHDOG_PID");
  }
  ~ServiceEnv() {
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
  }
};

class ServiceNotifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("ledger.db");
    socket_ = std::make_unique<NotifySocket>(dir_.file("notify.sock"));
  }

  void open_store() {
    InboxOptions o;
    o.busy_timeout_ms = 50;  // a locked store shows as stuck at once
    inbox_ = open_ledger_inbox(db_path_, o);
    ConsumerOptions co;
    co.store_backoff_initial = milliseconds(10);
    co.store_backoff_max = milliseconds(50);
    ASSERT_TRUE(
        Consumer::create(inbox_.get(), "ledger", ledger::apply_credit, co, &consumer_).ok());
  }

  std::unique_ptr<ServiceNotifier> make_notifier(int64_t stuck_limit_ms) {
    ServiceNotifierOptions o;
    o.stuck_limit_ms = stuck_limit_ms;
    o.status_interval_ms = 100;
    std::unique_ptr<ServiceNotifier> n;
    EXPECT_TRUE(ServiceNotifier::create(o, &n).ok());
    EXPECT_TRUE(n->add_source(health_source(*consumer_)).ok());
    return n;
  }

  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }

  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<NotifySocket> socket_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
};

// READY=1 once the store is open, with the first STATUS and a watchdog ping; pings at
// WATCHDOG_USEC / 3; STATUS follows the counters; STOPPING=1 on shutdown.
TEST_F(ServiceNotifierTest, ReadyWatchdogStatusAndStopping) {
  ServiceEnv env(socket_->path(), 300000);  // WatchdogSec=300ms: a ping every 100 ms
  open_store();
  auto notifier = make_notifier(/*stuck_limit_ms=*/60000);
  if (!ServiceNotifier::supported()) {
    EXPECT_FALSE(notifier->enabled());
    EXPECT_EQ(notifier->watchdog_interval_us(), 0);
    EXPECT_TRUE(notifier->ready().ok());
    EXPECT_TRUE(notifier->stopping().ok());
    EXPECT_TRUE(socket_->collect(milliseconds(500)).empty()) << socket_->dump();
    GTEST_SKIP() << "built without libsystemd: checked that nothing is sent";
  }
  EXPECT_TRUE(notifier->enabled());
  EXPECT_EQ(notifier->watchdog_interval_us(), 300000);
  EXPECT_TRUE(socket_->collect(milliseconds(300)).empty()) << "sent before ready()";

  ASSERT_TRUE(notifier->ready().ok());
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(5))) << socket_->dump();
  const Notification ready = socket_->received().front();
  EXPECT_TRUE(ready.has("READY=1"));
  EXPECT_TRUE(ready.has("WATCHDOG=1"));
  EXPECT_EQ(ready.value("STATUS"), "processed 0; dead letters 0");
  EXPECT_TRUE(notifier->ready().ok());  // idempotent: no second READY=1

  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(consumer_->handle(credit_message("c-" + std::to_string(i), "ann", 10 + i)),
              Outcome::kProcessed);
  EXPECT_EQ(consumer_->handle(credit_message("c-1", "ann", 11)), Outcome::kDuplicate);
  Message bad;
  bad.topic = "credits/test";
  bad.payload = "{\"message_id\":\"bad-1\",\"account\":\"ann\"}";  // no amount
  EXPECT_EQ(consumer_->handle(bad), Outcome::kDeadLettered);
  ASSERT_TRUE(socket_->wait_status("processed 3; dead letters 1", seconds(5))) << socket_->dump();
  const size_t mark = socket_->size();
  socket_->collect(seconds(1));
  EXPECT_GE(socket_->count_line("WATCHDOG=1", mark), 3u) << socket_->dump();
  EXPECT_EQ(socket_->count_line("READY=1"), 1u);

  ASSERT_TRUE(notifier->stopping().ok());
  ASSERT_TRUE(socket_->wait_line("STOPPING=1", seconds(5))) << socket_->dump();
  EXPECT_TRUE(socket_->wait_status("stopping; processed 3; dead letters 1", seconds(1)));
  // The watchdog stays armed while the service stops: pings go on until destruction.
  const size_t stop_mark = socket_->size();
  socket_->collect(milliseconds(600));
  EXPECT_GE(socket_->count_line("WATCHDOG=1", stop_mark), 1u) << socket_->dump();
  notifier.reset();
  socket_->collect(milliseconds(300));  // drain what was in flight
  EXPECT_TRUE(socket_->collect(milliseconds(400)).empty()) << "sent after destruction";

  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 3);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'ann'"), 33);
}

// A message waits for a store another connection holds locked. Within stuck_limit_ms the
// pings go on; past it they stop (systemd would restart the service) and STATUS says why;
// nothing was committed or acked meanwhile. When the lock goes away the message commits
// once and the pings resume.
TEST_F(ServiceNotifierTest, PingsStopWhileTheStoreIsStuckPastTheLimitAndResume) {
  ServiceEnv env(socket_->path(), 300000);
  open_store();
  auto notifier = make_notifier(/*stuck_limit_ms=*/1500);
  ASSERT_TRUE(notifier->ready().ok());
  if (!ServiceNotifier::supported()) {
    EXPECT_TRUE(socket_->collect(milliseconds(300)).empty());
    GTEST_SKIP() << "built without libsystemd: checked that nothing is sent";
  }
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(5)));
  ASSERT_EQ(consumer_->handle(credit_message("s-0", "bob", 5)), Outcome::kProcessed);

  SQLite::Database locker(db_path_, SQLite::OPEN_READWRITE);
  locker.exec("BEGIN EXCLUSIVE");
  std::atomic<bool> locked{true};
  std::atomic<bool> done{false};
  Outcome out{};
  std::thread handler([&] {
    out = consumer_->handle(credit_message("s-1", "bob", 7));
    done = true;
  });
  auto release = [&] {
    if (locked.exchange(false)) locker.exec("ROLLBACK");
  };
  struct Joiner {
    std::function<void()> f;
    ~Joiner() { f(); }
  } joiner{[&] {
    release();
    if (handler.joinable()) handler.join();
  }};

  ASSERT_TRUE(wait_until([&] { return consumer_->health().stuck; }, seconds(5)));
  const size_t stuck_mark = socket_->size();
  // Inside the limit: still pinging, and STATUS names the wait.
  ASSERT_TRUE(socket_->wait_status("stuck", seconds(2), stuck_mark)) << socket_->dump();
  EXPECT_GE(socket_->count_line("WATCHDOG=1", stuck_mark), 1u) << socket_->dump();
  EXPECT_FALSE(notifier->watchdog_withheld());

  // Past the limit: no more pings.
  ASSERT_TRUE(wait_until([&] { return notifier->watchdog_withheld(); }, seconds(10)));
  ASSERT_TRUE(socket_->wait_status("watchdog pings stopped", seconds(2), stuck_mark))
      << socket_->dump();
  std::string stuck_status;
  const std::vector<Notification> all = socket_->received();
  for (size_t i = stuck_mark; i < all.size(); ++i)
    if (all[i].value("STATUS").find("pings stopped") != std::string::npos)
      stuck_status = all[i].value("STATUS");
  EXPECT_NE(stuck_status.find("ledger: store failed: busy"), std::string::npos) << stuck_status;
  EXPECT_NE(stuck_status.find("over the 1 s limit"), std::string::npos) << stuck_status;
  socket_->collect(milliseconds(150));                      // a ping already on its way
  const auto quiet = socket_->collect(milliseconds(1200));  // 4 intervals of 300 ms
  for (const auto& n : quiet) EXPECT_FALSE(n.has("WATCHDOG=1")) << socket_->dump();
  EXPECT_FALSE(done.load());
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 1);  // nothing committed while locked

  // The store recovers: the message commits once, pings resume, STATUS clears.
  // The mark is taken before the release: the STATUS line changes (and is sent) as soon
  // as the commit lands, possibly before this thread sees `done`.
  const size_t recovered = socket_->size();
  release();
  ASSERT_TRUE(wait_until([&] { return done.load(); }, seconds(10)));
  handler.join();
  EXPECT_EQ(out, Outcome::kProcessed);
  ASSERT_TRUE(socket_->wait_line("WATCHDOG=1", seconds(3), recovered)) << socket_->dump();
  ASSERT_TRUE(socket_->wait_status("processed 2; dead letters 0", seconds(3), recovered));
  EXPECT_FALSE(notifier->watchdog_withheld());
  EXPECT_EQ(notifier->status_line(), "processed 2; dead letters 0");
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 2);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'bob'"), 12);
}

// A handler holds its message for a dependency that is down (RetryLater): not stuck, so
// the pings go on and STATUS says "waiting for a dependency" with the message and the
// attempt, also past stuck_limit_ms; only past dependency_wait_limit_ms do the pings stop
// (systemd would restart the service). When the dependency is back the message commits
// once and the pings resume.
TEST_F(ServiceNotifierTest, AWaitForADependencyIsNotStuckAndStopsThePingsOnlyPastItsLimit) {
  ServiceEnv env(socket_->path(), 300000);
  InboxOptions o;
  inbox_ = open_ledger_inbox(db_path_, o);
  std::atomic<bool> down{true};
  ConsumerOptions co;
  co.dependency_immediate_attempts = 1;
  co.dependency_backoff_initial = milliseconds(50);
  co.dependency_backoff_max = milliseconds(100);
  ASSERT_TRUE(Consumer::create(
                  inbox_.get(), "ledger",
                  [&](SQLite::Database& db, const Delivery& d) {
                    ledger::apply_credit(db, d);
                    if (down) throw RetryLater("meter gateway 10.0.0.7: connection refused");
                  },
                  co, &consumer_)
                  .ok());
  ServiceNotifierOptions no;
  no.stuck_limit_ms = 500;  // a dependency wait outlasts it: not stuck, pings go on
  no.dependency_wait_limit_ms = 2500;
  no.status_interval_ms = 100;
  std::unique_ptr<ServiceNotifier> notifier;
  ASSERT_TRUE(ServiceNotifier::create(no, &notifier).ok());
  ASSERT_TRUE(notifier->add_source(health_source(*consumer_)).ok());
  ASSERT_TRUE(notifier->ready().ok());
  if (!ServiceNotifier::supported()) {
    EXPECT_TRUE(socket_->collect(milliseconds(300)).empty());
    GTEST_SKIP() << "built without libsystemd: checked that nothing is sent";
  }
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(5)));
  const size_t mark = socket_->size();
  Outcome out{};
  std::atomic<bool> done{false};
  std::thread feeder([&] {
    out = consumer_->handle(credit_message("dep-1", "ann", 5));
    done = true;
  });
  struct Joiner {
    std::function<void()> f;
    ~Joiner() { f(); }
  } joiner{[&] {
    down = false;
    if (feeder.joinable()) feeder.join();
  }};

  ASSERT_TRUE(socket_->wait_status("ledger: waiting for a dependency: ", seconds(5), mark))
      << socket_->dump();
  // Past stuck_limit_ms, within the dependency limit: still pinging, never "stuck".
  std::this_thread::sleep_for(milliseconds(1200));
  const size_t within = socket_->size();
  socket_->collect(milliseconds(600));
  EXPECT_GE(socket_->count_line("WATCHDOG=1", within), 2u) << socket_->dump();
  EXPECT_FALSE(notifier->watchdog_withheld());
  const std::string status = notifier->status_line();
  EXPECT_EQ(status.find("stuck"), std::string::npos) << status;
  EXPECT_NE(status.find("message 'dep-1', attempt "), std::string::npos) << status;
  EXPECT_NE(status.find("connection refused"), std::string::npos) << status;
  EXPECT_FALSE(consumer_->health().stuck);

  // Past the dependency limit the pings stop, and STATUS says which limit.
  ASSERT_TRUE(wait_until([&] { return notifier->watchdog_withheld(); }, seconds(10)));
  ASSERT_TRUE(socket_->wait_status("over the 2 s dependency limit: watchdog pings stopped",
                                   seconds(2), within))
      << socket_->dump();
  socket_->collect(milliseconds(150));
  for (const auto& n : socket_->collect(milliseconds(900)))
    EXPECT_FALSE(n.has("WATCHDOG=1")) << socket_->dump();
  EXPECT_FALSE(done.load());
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 0);

  // The dependency is back: applied once, pings resume.
  const size_t back = socket_->size();
  down = false;
  ASSERT_TRUE(wait_until([&] { return done.load(); }, seconds(10)));
  feeder.join();
  EXPECT_EQ(out, Outcome::kProcessed);
  ASSERT_TRUE(socket_->wait_line("WATCHDOG=1", seconds(3), back)) << socket_->dump();
  ASSERT_TRUE(socket_->wait_status("processed 1; dead letters 0", seconds(3), back));
  EXPECT_FALSE(notifier->watchdog_withheld());
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 1);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'ann'"), 5);
}

// Start-up: before READY=1 the notifier reports a known wait and extends the start
// timeout while that wait is within the limit. The wait here is real and is today's
// start-up of ledger_consumer: the inbox opens, but recording the retention horizon
// (Pruner::create) needs the write lock, which another connection holds. The
// application retries and reports each failed attempt through its own health source
// (how a start-up wait plugs in).
TEST_F(ServiceNotifierTest, StartUpWaitExtendsTheStartTimeoutWithinTheLimit) {
  ServiceEnv env(socket_->path(), 0);
  { open_ledger_inbox(db_path_); }  // the database exists; the service is stopped
  SQLite::Database locker(db_path_, SQLite::OPEN_READWRITE);
  locker.exec("BEGIN EXCLUSIVE");
  bool locked = true;

  std::mutex mu;
  std::string waiting;  // the last failed attempt, "" once started
  std::unique_ptr<Pruner> pruner;
  ServiceNotifierOptions o;
  o.stuck_limit_ms = 1200;
  o.status_interval_ms = 100;
  std::unique_ptr<ServiceNotifier> notifier;
  ASSERT_TRUE(ServiceNotifier::create(o, &notifier).ok());
  ASSERT_TRUE(notifier
                  ->add_source([&] {
                    ServiceHealth h;
                    h.name = "start-up";
                    std::lock_guard<std::mutex> lock(mu);
                    h.stuck = !waiting.empty();
                    h.stuck_reason = waiting;
                    return h;
                  })
                  .ok());
  ASSERT_TRUE(notifier->start().ok());

  std::atomic<bool> give_up{false};
  std::thread starter([&] {
    InboxOptions io;
    io.busy_timeout_ms = 50;
    // The library waits out a locked store at start-up by itself (startup_deadline_ms 0 =
    // for ever); this application prefers to retry and report each attempt, so each
    // Pruner::create gives up after 100 ms.
    io.startup_deadline_ms = 100;
    std::unique_ptr<Inbox> inbox;
    if (!Inbox::open(db_path_, io, &inbox).ok()) return;
    while (!give_up) {
      std::unique_ptr<Pruner> p;
      const Status s = Pruner::create(inbox.get(), RetentionOptions{}, &p);
      std::lock_guard<std::mutex> lock(mu);
      if (s.ok()) {
        waiting.clear();
        pruner = std::move(p);
        inbox_ = std::move(inbox);
        return;
      }
      waiting = "waiting for the store: " + s.to_string();
      std::this_thread::sleep_for(milliseconds(20));
    }
  });
  struct Joiner {
    std::function<void()> f;
    ~Joiner() { f(); }
  } joiner{[&] {
    give_up = true;
    if (starter.joinable()) starter.join();
    if (locked) locker.exec("ROLLBACK");
  }};

  if (!ServiceNotifier::supported()) {
    EXPECT_TRUE(socket_->collect(milliseconds(500)).empty());
    GTEST_SKIP() << "built without libsystemd: checked that nothing is sent";
  }
  ASSERT_TRUE(socket_->wait_status("starting; stuck", seconds(5))) << socket_->dump();
  ASSERT_TRUE(socket_->wait_line("EXTEND_TIMEOUT_USEC=300000", seconds(2))) << socket_->dump();
  EXPECT_NE(socket_->dump().find("start-up: waiting for the store: busy"), std::string::npos)
      << socket_->dump();
  // Past the limit the extensions stop: TimeoutStartSec= takes over again.
  ASSERT_TRUE(socket_->wait_status("start timeout no longer extended", seconds(5)))
      << socket_->dump();
  socket_->collect(milliseconds(150));
  const auto late = socket_->collect(milliseconds(600));
  for (const auto& n : late) EXPECT_EQ(n.value("EXTEND_TIMEOUT_USEC"), "") << socket_->dump();
  EXPECT_EQ(socket_->count_line("READY=1"), 0u);

  locker.exec("ROLLBACK");
  locked = false;
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return pruner != nullptr;
      },
      seconds(10)));
  starter.join();
  ASSERT_TRUE(notifier->ready().ok());
  ASSERT_TRUE(socket_->wait_line("READY=1", seconds(5))) << socket_->dump();
  EXPECT_EQ(socket_->received().back().value("STATUS"), "running");
  notifier.reset();
  pruner.reset();
}

// Without NOTIFY_SOCKET (started by hand, by another supervisor) nothing is sent and
// every call returns OK; the status line still works for logs.
TEST_F(ServiceNotifierTest, WithoutNotifySocketNothingIsSent) {
  ::unsetenv("NOTIFY_SOCKET");
  ::setenv("WATCHDOG_USEC", "300000", 1);
  open_store();
  auto notifier = make_notifier(60000);
  EXPECT_FALSE(notifier->enabled());
  EXPECT_EQ(notifier->watchdog_interval_us(), 0);
  EXPECT_TRUE(notifier->start().ok());
  EXPECT_TRUE(notifier->ready().ok());
  ASSERT_EQ(consumer_->handle(credit_message("n-1", "cy", 1)), Outcome::kProcessed);
  EXPECT_EQ(notifier->status_line(), "processed 1; dead letters 0");
  EXPECT_TRUE(notifier->stopping().ok());
  EXPECT_TRUE(socket_->collect(milliseconds(500)).empty()) << socket_->dump();
  ::unsetenv("WATCHDOG_USEC");
}

TEST_F(ServiceNotifierTest, RefusesBadOptionsAndEmptySources) {
  std::unique_ptr<ServiceNotifier> n;
  ServiceNotifierOptions o;
  o.stuck_limit_ms = -1;
  EXPECT_EQ(ServiceNotifier::create(o, &n).code(), Status::Code::kInvalidArgument);
  o = ServiceNotifierOptions{};
  o.status_interval_ms = 5;
  EXPECT_EQ(ServiceNotifier::create(o, &n).code(), Status::Code::kInvalidArgument);
  ASSERT_TRUE(ServiceNotifier::create(ServiceNotifierOptions{}, &n).ok());
  EXPECT_EQ(n->add_source(HealthSource{}).code(), Status::Code::kInvalidArgument);
}

// STATUS combines several parts: the connection of every transport, counters summed over
// consumers, the longest stuck part, notes; a source that throws becomes a note.
TEST_F(ServiceNotifierTest, StatusLineCombinesSources) {
  ::unsetenv("NOTIFY_SOCKET");
  std::unique_ptr<ServiceNotifier> n;
  ASSERT_TRUE(ServiceNotifier::create(ServiceNotifierOptions{}, &n).ok());
  EXPECT_EQ(n->status_line(), "");
  ASSERT_TRUE(n->add_source([] {
                 ServiceHealth h;
                 h.name = "mqtt";
                 h.connected = false;
                 h.note = "broker refused: not authorized";
                 return h;
               }).ok());
  ASSERT_TRUE(n->add_source([] {
                 ServiceHealth h;
                 h.name = "a";
                 h.processed = 5;
                 h.dead_letters = 1;
                 return h;
               }).ok());
  ASSERT_TRUE(n->add_source([] {
                 ServiceHealth h;
                 h.name = "b";
                 h.processed = 7;
                 h.dead_letters = 0;
                 h.stuck = true;
                 h.stuck_reason = "store failed: full: database or disk is full\nsecond line";
                 return h;
               }).ok());
  ASSERT_TRUE(n->add_source([]() -> ServiceHealth { throw std::runtime_error("boom"); }).ok());
  EXPECT_EQ(n->status_line(),
            "not connected; processed 12; dead letters 1; stuck 0 s: b: store failed: full: "
            "database or disk is full second line; mqtt: broker refused: not authorized; "
            "health source failed: boom");
}

}  // namespace
}  // namespace mqtt_inbox::test

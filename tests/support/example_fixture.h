// Test support: the example programs (examples/ledger_consumer, sensor_gateway,
// publisher) run as child processes against a real mosquitto and a real SQLite file,
// with the store made unavailable by another real process (the sqlite3 CLI holding the
// write lock). Used by the tests of issue 13 that check what a user's program does.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/ledger_fixture.h"
#include "support/process.h"

namespace mqtt_inbox::test {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Another process holding the database's write lock (`sqlite3 DB 'BEGIN EXCLUSIVE;' ...`),
// as a backup tool, the admin tool or a migration does, until release() (at most
// `max_seconds`).
class WriteLockHolder {
 public:
  WriteLockHolder(const std::string& db, const std::string& dir, int max_seconds = 60)
      : ready_(dir + "/lock-ready"), release_(dir + "/lock-release") {
    ::unlink(ready_.c_str());
    ::unlink(release_.c_str());
    const int ticks = max_seconds * 10;
    child_ = std::make_unique<Child>(
        std::vector<std::string>{"/usr/bin/sqlite3", db, ".timeout 5000", "BEGIN EXCLUSIVE;",
                                 ".shell touch " + ready_,
                                 ".shell i=0; while [ ! -e " + release_ + " ] && [ $i -lt " +
                                     std::to_string(ticks) + " ]; do sleep 0.1; i=$((i+1)); done",
                                 "COMMIT;"},
        dir + "/lock-holder.log");
    held_ =
        wait_until([&] { return ::access(ready_.c_str(), F_OK) == 0; }, std::chrono::seconds(10));
  }
  ~WriteLockHolder() { release(); }
  bool held() const { return held_; }
  void release() {
    if (!child_) return;
    std::ofstream(release_).put('x');
    child_->wait(std::chrono::seconds(10));
    child_.reset();
  }

 private:
  std::string ready_, release_;
  bool held_ = false;
  std::unique_ptr<Child> child_;
};

class ExampleProgramTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = dir_.file("ledger.db");
    // Unique per test process: the examples keep their client-id lock in /tmp.
    client_id_ = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                 "-" + std::to_string(::getpid());
  }

  // ledger_consumer with the test's broker, database and client id, logging to `log`.
  std::unique_ptr<Child> start_ledger(const std::string& log, std::vector<std::string> extra = {}) {
    return std::make_unique<Child>(ledger_argv(std::move(extra)), dir_.file(log));
  }

  // The command line of start_ledger(), for a test that runs it another way (as another
  // user, say).
  std::vector<std::string> ledger_argv(std::vector<std::string> extra = {}) const {
    std::vector<std::string> argv = {built_program("ledger_consumer"),
                                     "--broker",
                                     broker_.uri(),
                                     "--client-id",
                                     client_id_,
                                     "--topic",
                                     "credits/#",
                                     "--db",
                                     db_,
                                     "--mqtt-version",
                                     "5"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  // sensor_gateway likewise (topic sensors/+/reading).
  std::unique_ptr<Child> start_gateway(const std::string& log,
                                       std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {built_program("sensor_gateway"),
                                     "--broker",
                                     broker_.uri(),
                                     "--client-id",
                                     client_id_,
                                     "--db",
                                     db_,
                                     "--mqtt-version",
                                     "5"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(argv, dir_.file(log));
  }

  // Runs a program once until it has subscribed, then stops it: the broker then keeps a
  // persistent session (with the subscription) that queues what is published next.
  void create_session(const std::function<std::unique_ptr<Child>(const std::string&)>& start) {
    auto first = start("session.log");
    ASSERT_TRUE(wait_until(
        [&] {
          return read_text(dir_.file("session.log")).find("consuming: ") != std::string::npos;
        },
        std::chrono::seconds(15)))
        << read_text(dir_.file("session.log"));
    first->signal(SIGTERM);
    const int st = first->wait(std::chrono::seconds(15));
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  }

  // examples/publisher: `count` credits (or readings) to `topic`; returns the
  // total_amount it printed (-1 on failure).
  int64_t publish(const std::string& topic, int count, const std::string& prefix,
                  const std::string& log = "publisher.log") {
    Child pub({built_program("publisher"), "--broker", broker_.uri(), "--topic", topic, "--count",
               std::to_string(count), "--accounts", "7", "--id-prefix", prefix, "--client-id",
               "pub-" + client_id_},
              dir_.file(log));
    const int st = pub.wait(std::chrono::seconds(60));
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) return -1;
    const std::string out = read_text(dir_.file(log));
    const size_t at = out.rfind("total_amount=");
    return at == std::string::npos ? -1 : std::stoll(out.substr(at + 13));
  }

  // Connections the broker accepted from our client id so far.
  size_t broker_connections() const {
    return count_of(read_text(broker_.log_path()), " as " + client_id_ + " (");
  }

  int64_t q(const std::string& sql) const { return query_int(db_, sql); }

  Broker broker_;
  TempDir dir_;
  std::string db_;
  std::string client_id_;
};

}  // namespace mqtt_inbox::test

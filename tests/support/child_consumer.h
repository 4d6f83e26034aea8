// Test support: a fixture that runs support/crash_consumer as a child process against a
// real mosquitto and a real SQLite file, and reads back what happened.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {

class ChildConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override { db_path_ = dir_.file("ledger.db"); }

  std::unique_ptr<Child> start_consumer(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {built_program("crash_consumer"), broker_.uri(), client_id_,
                                     "credits/#", db_path_, "--mqtt-version", "5"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(argv, log_path());
  }

  // Starts and stops a consumer once so the broker holds a persistent session (with the
  // subscription) before a test publishes.
  void create_session() {
    auto first = start_consumer();
    ASSERT_TRUE(wait_until([&] { return log_text().find("subscribing") != std::string::npos; },
                           std::chrono::seconds(10)));
    first->signal(SIGTERM);
    ASSERT_NE(first->wait(std::chrono::seconds(10)), -1);
  }

  std::string log_path() const { return dir_.file("consumer.log"); }
  std::string log_text() const {
    std::ifstream f(log_path());
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  size_t log_count(const std::string& needle) const {
    const std::string text = log_text();
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  }

  // Stops the child with SIGTERM and returns the counter it printed last, or -1.
  int64_t stop_and_count(Child& child, const std::string& counter) {
    child.signal(SIGTERM);
    EXPECT_NE(child.wait(std::chrono::seconds(20)), -1);
    const std::string text = log_text();
    const std::regex re("counters:.* " + counter + "=(\\d+)");
    std::string last;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
      last = (*it)[1];
    return last.empty() ? -1 : std::stoll(last);
  }

  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }

  Broker broker_;
  TempDir dir_;
  std::string db_path_;
  std::string client_id_ = "crash-client";  // the MQTT session the children share
};

}  // namespace mqtt_inbox::test

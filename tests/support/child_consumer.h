// Test support: runs support/crash_consumer as a child process against a real broker and
// a real SQLite file (or, after use_store(), a PostgreSQL database), and reads back what
// happened. ChildConsumers works against any broker (the core cases run it against
// mosquitto and RabbitMQ, support/core_cases.h); ChildConsumerTest is the fixture with a
// mosquitto of its own per test.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "support/ledger_fixture.h"
#include "support/publisher.h"
#include "support/store_under_test.h"

namespace mqtt_inbox::test {

class ChildConsumers {
 public:
  // `dir`: the folder of the database (ledger.db), the log and the client-id lock.
  // `mqtt_version`: "5" or "3.1.1", as crash_consumer's --mqtt-version takes it.
  ChildConsumers(const std::string& dir, std::string broker_uri, std::string mqtt_version,
                 std::string client_id = "crash-client")
      : dir_(dir),
        uri_(std::move(broker_uri)),
        version_(std::move(mqtt_version)),
        client_id_(std::move(client_id)) {}

  const std::string& uri() const { return uri_; }
  bool mqtt5() const { return version_ == "5"; }
  std::string db_path() const { return location_.empty() ? dir_ + "/ledger.db" : location_; }
  // The children keep the ledger in `store` at a new location of it (the client-id lock
  // stays in the folder); q() reads there. Without it: ledger.db in the folder, SQLite.
  void use_store(const StoreUnderTest& store) {
    store_ = store;
    location_ = store.make_location(dir_);
  }
  const StoreUnderTest& store() const { return store_; }
  // The MQTT session the children share; a test may move later children to a new one.
  void set_client_id(std::string client_id) { client_id_ = std::move(client_id); }

  std::unique_ptr<Child> start_consumer(std::vector<std::string> extra = {}) const {
    std::vector<std::string> argv = {built_program("crash_consumer"),
                                     uri_,
                                     client_id_,
                                     "credits/#",
                                     db_path(),
                                     "--mqtt-version",
                                     version_};
    if (!location_.empty()) argv.insert(argv.end(), {"--lock-dir", dir_});
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(argv, log_path());
  }

  // Starts and stops a consumer once so the broker holds a persistent session (with the
  // subscription) before a test publishes.
  void create_session() const {
    auto first = start_consumer();
    ASSERT_TRUE(wait_until([&] { return log_text().find("consuming: ") != std::string::npos; },
                           std::chrono::seconds(10)));
    first->signal(SIGTERM);
    ASSERT_NE(first->wait(std::chrono::seconds(10)), -1);
  }

  std::string log_path() const { return dir_ + "/consumer.log"; }
  std::string log_text() const {
    std::ifstream f(log_path());
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  size_t log_count(const std::string& needle) const {
    const std::string text = log_text();
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
      ++n;
    return n;
  }

  // Stops the child with SIGTERM and returns the counter it printed last, or -1.
  int64_t stop_and_count(Child& child, const std::string& counter) const {
    child.signal(SIGTERM);
    EXPECT_NE(child.wait(std::chrono::seconds(20)), -1);
    const std::string text = log_text();
    const std::regex re("counters:.* " + counter + "=(\\d+)");
    std::string last;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
         ++it)
      last = (*it)[1];
    return last.empty() ? -1 : std::stoll(last);
  }

  int64_t q(const std::string& sql) const { return store_.query(db_path(), sql); }

 private:
  std::string dir_, uri_, version_, client_id_;
  StoreUnderTest store_ = sqlite_store();
  std::string location_;  // "" = ledger.db in dir_
};

class ChildConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override { db_path_ = dir_.file("ledger.db"); }

  std::unique_ptr<Child> start_consumer(std::vector<std::string> extra = {}) {
    return children_.start_consumer(std::move(extra));
  }
  void create_session() { children_.create_session(); }
  std::string log_path() const { return children_.log_path(); }
  std::string log_text() const { return children_.log_text(); }
  size_t log_count(const std::string& needle) const { return children_.log_count(needle); }
  int64_t stop_and_count(Child& child, const std::string& counter) {
    return children_.stop_and_count(child, counter);
  }
  int64_t q(const std::string& sql) { return children_.q(sql); }

  Broker broker_;
  TempDir dir_;
  std::string db_path_;
  ChildConsumers children_{dir_.path(), broker_.uri(), "5"};
};

}  // namespace mqtt_inbox::test

// docs/c-api.md's minimal C program as a user builds it against an installed prefix
// (package_c_consumer builds it: tests/package/c_consumer), linked each way the docs give,
// run against a real mosquitto: credits published twice, a bad one, a stop and a restart
// with credits queued while it was away. Each credit is applied once. The statically linked
// ones need no libmqtt_inbox*.so (readelf -d), the shared ones do: both facts are checked,
// so a static link that quietly became dynamic fails here.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "support/ledger_fixture.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

// The NEEDED entries of an ELF file's dynamic section.
std::vector<std::string> needed(const std::string& path) {
  std::vector<std::string> out;
  FILE* p = ::popen(("readelf -d '" + path + "' 2>&1").c_str(), "r");
  if (!p) return out;
  char line[1024];
  while (std::fgets(line, sizeof line, p)) {
    const std::string l(line);
    const auto open = l.find("(NEEDED)");
    const auto lb = l.find('[');
    const auto rb = l.find(']');
    if (open != std::string::npos && lb != std::string::npos && rb > lb)
      out.push_back(l.substr(lb + 1, rb - lb - 1));
  }
  ::pclose(p);
  return out;
}

bool needs_the_library(const std::vector<std::string>& libs) {
  for (const auto& l : libs)
    if (l.rfind("libmqtt_inbox", 0) == 0) return true;
  return false;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + " ";
  return s;
}

struct Linkage {
  const char* program;  // in the c_consumer build folder
  bool is_static;
};

class CProgramTest : public ::testing::TestWithParam<Linkage> {
 protected:
  std::string program() const {
    return std::string(MQTT_INBOX_C_CONSUMER_DIR) + "/" + GetParam().program;
  }
  std::string db() const { return dir_.file("ledger.db"); }
  std::string log() const { return dir_.file("minimal.log"); }
  std::string log_text() const {
    std::ifstream f(log());
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  size_t count(const std::string& needle) const {
    const std::string t = log_text();
    size_t n = 0;
    for (size_t at = t.find(needle); at != std::string::npos; at = t.find(needle, at + 1)) ++n;
    return n;
  }
  std::unique_ptr<Child> start() {
    auto child = std::make_unique<Child>(
        std::vector<std::string>{program(), broker_.uri(), db(), "minimal-gw"}, log());
    ++starts_;
    EXPECT_TRUE(
        wait_until([&] { return count("consuming:") >= starts_; }, std::chrono::seconds(20)))
        << log_text();
    return child;
  }
  void stop(Child& child) {
    child.signal(SIGTERM);
    const int st = child.wait(std::chrono::seconds(20));
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << log_text();
  }
  int64_t q(const std::string& sql) const { return query_int(db(), sql); }

  Broker broker_;
  TempDir dir_;
  size_t starts_ = 0;
};

TEST_P(CProgramTest, LinksAsDocumentedAndAppliesEveryCreditOnce) {
  const std::vector<std::string> libs = needed(program());
  ASSERT_FALSE(libs.empty()) << program() << ": no dynamic section read";
  if (GetParam().is_static)
    EXPECT_FALSE(needs_the_library(libs)) << "linked statically, yet NEEDED: " << joined(libs);
  else
    EXPECT_TRUE(needs_the_library(libs)) << "linked with the .so, yet NEEDED: " << joined(libs);
  // A program without libsystemd or the PostgreSQL client chain in its NEEDED list is
  // what a firmware build makes; a host build may have them, so only say what it has.
  std::cout << GetParam().program << " NEEDED: " << joined(libs) << "\n";

  int64_t expected = 0;
  {
    auto child = start();
    TestPublisher pub(broker_.uri(), /*mqtt5=*/false);
    for (int i = 0; i < 20; ++i) {
      const std::string id = "m-" + std::to_string(i);
      pub.credit("credits/a", id, "acct-" + std::to_string(i % 3), 1 + i);
      pub.credit("credits/a", id, "acct-" + std::to_string(i % 3), 1 + i);  // a retry
      expected += 1 + i;
    }
    pub.publish("credits/a", R"({"message_id":"bad-1","account":"x","amount":"ten"})");
    ASSERT_TRUE(
        wait_until([&] { return q("SELECT coalesce(sum(balance), 0) FROM accounts") == expected; },
                   std::chrono::seconds(20)))
        << log_text();
    stop(*child);
  }
  {
    // Queued at the broker while the program is away: its session keeps them.
    TestPublisher pub(broker_.uri(), /*mqtt5=*/false);
    for (int i = 20; i < 30; ++i) {
      pub.credit("credits/b", "m-" + std::to_string(i), "acct-late", 100);
      expected += 100;
    }
    pub.credit("credits/b", "m-3", "acct-0", 4);  // a late duplicate of an applied one
  }
  auto child = start();
  ASSERT_TRUE(
      wait_until([&] { return q("SELECT coalesce(sum(balance), 0) FROM accounts") == expected; },
                 std::chrono::seconds(20)))
      << log_text();
  // The pruner is running: the program started one.
  stop(*child);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 30);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), expected);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct-late'"), 1000);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'bad-1'"
              " AND reason = 'invalid_payload'"),
            1);
}

INSTANTIATE_TEST_SUITE_P(Installed, CProgramTest,
                         ::testing::Values(Linkage{"minimal_shared", false},
                                           Linkage{"minimal_cc", false},
                                           Linkage{"minimal_static_cmake", true},
                                           Linkage{"minimal_static_pkgconfig", true}),
                         [](const auto& p) { return std::string(p.param.program); });

}  // namespace
}  // namespace mqtt_inbox::test

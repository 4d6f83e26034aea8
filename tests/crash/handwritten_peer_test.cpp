// The benchmark's hand-written consumer (bench/handwritten_consumer.cpp) is the peer the
// library is measured against (issue 14). Beating a peer that loses or doubles messages
// would prove nothing, so it passes the same crash checks: a real mosquitto, a real SQLite
// file, the peer as a child process killed with SIGKILL, and the ledger read back.
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <thread>

#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

class HandwrittenPeerTest : public ::testing::Test {
 protected:
  void SetUp() override { db_path_ = dir_.file("peer.db"); }

  std::unique_ptr<Child> start_peer(const std::string& phase, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {built_program("handwritten_consumer"),
                                     "--phase",
                                     phase,
                                     "--broker",
                                     broker_.uri(),
                                     "--topic",
                                     "credits/#",
                                     "--client-id",
                                     "peer-client",
                                     "--db",
                                     db_path_,
                                     "--count",
                                     "0",
                                     "--keep",
                                     "--vfs",
                                     ""};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(argv, dir_.file("peer.log"));
  }
  // A persistent session with the subscription, so credits published next are queued.
  void create_session() {
    auto setup = start_peer("setup");
    ASSERT_NE(setup->wait(std::chrono::seconds(20)), -1);
  }
  void publish_credits(int n) {
    TestPublisher pub(broker_.uri());
    for (int i = 0; i < n; ++i) pub.credit("credits/p", "p-" + std::to_string(i), "acct", 1 + i);
  }
  int64_t entries() {
    // The peer creates the file and its tables on start: until then there is nothing.
    if (!std::filesystem::exists(db_path_)) return 0;
    try {
      return q("SELECT count(*) FROM ledger_entries");
    } catch (const SQLite::Exception&) {
      return 0;
    }
  }
  // Every credit applied exactly once: one ledger row per id, the balance of 1..n.
  void expect_exactly_once(int n) {
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), n);
    EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), n);
    EXPECT_EQ(q("SELECT count(*) FROM processed"), n);
    EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct'"), n * (n + 1LL) / 2);
  }
  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }

  Broker broker_;
  TempDir dir_;
  std::string db_path_;
};

// Killed after p-5's commit, before its callback returned (no PUBACK): p-5 comes back
// and is recognised as a duplicate by its claim.
TEST_F(HandwrittenPeerTest, KilledBetweenCommitAndAckAppliesOnce) {
  create_session();
  publish_credits(10);
  auto first = start_peer("run", {"--crash-after-commit", "p-5"});
  const int st = first->wait(std::chrono::seconds(30));
  ASSERT_NE(st, -1) << "the peer did not crash";
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'p-5'"), 1);

  auto second = start_peer("run");
  ASSERT_TRUE(wait_until([&] { return entries() == 10; }, std::chrono::seconds(30)));
  second->signal(SIGTERM);
  ASSERT_NE(second->wait(std::chrono::seconds(20)), -1);
  expect_exactly_once(10);
}

// SIGKILL at arbitrary points of a drain, four times: wherever a kill lands (before,
// inside or after a commit, before or after the PUBACK), each credit is applied once.
TEST_F(HandwrittenPeerTest, KilledMidStreamRepeatedlyAppliesEachCreditOnce) {
  constexpr int kCredits = 600;
  create_session();
  publish_credits(kCredits);
  int kills = 0;
  for (int64_t at : {50, 200, 350, 500}) {
    auto peer = start_peer("run");
    ASSERT_TRUE(wait_until([&] { return entries() >= at; }, std::chrono::seconds(60)));
    peer->signal(SIGKILL);
    ASSERT_NE(peer->wait(std::chrono::seconds(10)), -1);
    ++kills;
  }
  auto last = start_peer("run");
  ASSERT_TRUE(wait_until([&] { return entries() >= kCredits; }, std::chrono::seconds(60)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // room for a late double
  last->signal(SIGTERM);
  ASSERT_NE(last->wait(std::chrono::seconds(20)), -1);
  EXPECT_EQ(kills, 4);
  expect_exactly_once(kCredits);
}

}  // namespace
}  // namespace mqtt_inbox::test

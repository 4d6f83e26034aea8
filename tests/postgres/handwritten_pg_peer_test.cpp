// The benchmark's hand-written PostgreSQL consumer (bench/handwritten_pg_consumer.cpp) is
// the peer the PostgreSQL store is measured against (issue 30). Beating a peer that loses
// or doubles messages would prove nothing, so it passes the crash check its SQLite sibling
// passes (tests/crash/handwritten_peer_test.cpp): a real mosquitto, a private PostgreSQL
// cluster (support/postgres.h, fsync on), the peer as a child process SIGKILLed four times
// mid-stream wherever it is, and the ledger read back from PostgreSQL.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "support/postgres.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

class HandwrittenPgPeerTest : public ::testing::Test {
 protected:
  HandwrittenPgPeerTest() {
    pg_.create_database("peer");
    uri_ = pg_.uri("peer");
  }
  // --count far above what is published: a run ends by a signal, not by itself.
  std::unique_ptr<Child> start_peer(const std::string& phase) {
    return std::make_unique<Child>(
        std::vector<std::string>{built_program("handwritten_pg_consumer"), "--phase", phase,
                                 "--broker", broker_.uri(), "--topic", "credits/#", "--client-id",
                                 "pg-peer", "--uri", uri_, "--count", "1000000", "--timeout",
                                 "120"},
        dir_.file("peer.log"));
  }
  int64_t q(const std::string& sql) const {
    // The peer creates its tables when it starts: until then there is nothing to count.
    const std::string v = pg_.query_value(sql, "peer");
    return v.empty() ? 0 : std::stoll(v);
  }
  int64_t entries() const {
    return q("SELECT count(*) FROM pg_tables WHERE tablename = 'ledger_entries'") == 0
               ? 0
               : q("SELECT count(*) FROM ledger_entries");
  }

  Postgres pg_;
  Broker broker_;
  TempDir dir_;
  std::string uri_;
};

// SIGKILL at arbitrary points of a drain, four times: wherever a kill lands (before,
// inside or after a COMMIT, before or after the PUBACK), each credit is applied once.
TEST_F(HandwrittenPgPeerTest, KilledMidStreamRepeatedlyAppliesEachCreditOnce) {
  constexpr int kCredits = 600;
  {
    auto setup = start_peer("setup");  // the persistent session, so credits are queued
    ASSERT_NE(setup->wait(std::chrono::seconds(20)), -1);
  }
  {
    TestPublisher pub(broker_.uri());
    for (int i = 0; i < kCredits; ++i)
      pub.credit("credits/p", "p-" + std::to_string(i), "acct", 1 + i);
  }
  int kills = 0;
  for (int64_t at : {50, 200, 350, 500}) {
    auto peer = start_peer("run");
    ASSERT_TRUE(wait_until([&] { return entries() >= at; }, std::chrono::seconds(60)))
        << "stuck at " << entries();
    peer->signal(SIGKILL);
    ASSERT_NE(peer->wait(std::chrono::seconds(10)), -1);
    ++kills;
  }
  EXPECT_LT(q("SELECT count(*) FROM ledger_entries"), kCredits)
      << "the kills came after the stream: nothing was cut";
  auto last = start_peer("run");
  ASSERT_TRUE(wait_until([&] { return entries() >= kCredits; }, std::chrono::seconds(60)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // room for a late double
  last->signal(SIGKILL);
  ASSERT_NE(last->wait(std::chrono::seconds(10)), -1);
  EXPECT_EQ(kills, 4);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), kCredits);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), kCredits);
  EXPECT_EQ(q("SELECT count(*) FROM processed"), kCredits);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct'"),
            kCredits * (kCredits + 1LL) / 2);
}

}  // namespace
}  // namespace mqtt_inbox::test

// Exactly-once for ledger_consumer --db postgresql://... (examples/ledger_postgres.h) under
// the crashes of docs/guarantees.md section 5, against a real mosquitto on MQTT 3.1.1 and 5
// and a real private PostgreSQL cluster (support/postgres.h, fsync on): the consumer
// process SIGKILLed three times mid-stream at whatever point it is (before a commit,
// between COMMIT and PUBACK, after), the broker restarted under a running consumer, every
// credit published twice and some a third time after the restart. Every credit applied
// once: the balances, the ledger entries and the claims in PostgreSQL say so. Bad credits
// end as undecodable_payload dead letters in PostgreSQL, with their reason, and the stream
// goes on. And what the program refuses at start-up: --synchronous-normal (SQLite's switch;
// the server decides durability) and a password in the URI, each with exit code 1 before
// anything connects. (--emit-topic on PostgreSQL: tests/postgres/pg_outbox_test.cpp.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "support/postgres.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class LedgerPgCrashTest : public ::testing::TestWithParam<const char*> {
 protected:
  LedgerPgCrashTest() {
    pg_.create_database("ledger");
    uri_ = pg_.uri("ledger");
  }
  bool mqtt5() const { return std::string(GetParam()) == "5"; }
  std::string log() const { return dir_.file("consumer.log"); }
  std::string log_text() const { return read_file(log()); }

  // The example on PostgreSQL, connected (the library logs "consuming: " once subscribed).
  std::unique_ptr<Child> start_example(bool wait_for_subscription = true) {
    const size_t before = occurrences(log_text(), "consuming: ");
    auto child = std::make_unique<Child>(
        with_emulator({built_program("ledger_consumer"), "--broker", broker_.uri(), "--client-id",
                       "pg-ledger", "--topic", "credits/#", "--db", uri_, "--mqtt-version",
                       GetParam(), "--client-id-lock-dir", dir_.path()}),
        log());
    // Queued messages arrive before the SUBSCRIBE completes: a run that is to be cut
    // mid-stream does not wait for it.
    if (!wait_for_subscription) return child;
    EXPECT_TRUE(wait_until(
        [&] { return occurrences(log_text(), "consuming: ") > before || !child->running(); },
        std::chrono::seconds(15)))
        << log_text();
    return child;
  }
  int64_t q(const std::string& sql) const {
    const std::string v = pg_.query_value(sql, "ledger");
    return v.empty() ? 0 : std::stoll(v);
  }
  int64_t entries() const { return q("SELECT count(*) FROM ledger_entries"); }
  void sigkill_when(Child& child, int64_t at_least) {
    ASSERT_TRUE(wait_until([&] { return entries() >= at_least; }, std::chrono::seconds(30)))
        << log_text();
    child.signal(SIGKILL);
    ASSERT_NE(child.wait(std::chrono::seconds(10)), -1);
  }
  void term(Child& child) {
    child.signal(SIGTERM);
    const int st = child.wait(std::chrono::seconds(20));
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << log_text();
  }

  Postgres pg_;
  Broker broker_;
  TempDir dir_;
  std::string uri_;
};

TEST_P(LedgerPgCrashTest, SigkillsMidStreamAndABrokerRestartApplyEveryCreditOnce) {
  constexpr int kFirst = 1000, kSecond = 200;
  int64_t expected = 0;
  // The session exists before anything is published, so the broker queues for it; the
  // first run also creates the business tables and the inbox's schema.
  {
    auto first = start_example();
    term(*first);
  }
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < kFirst; ++i) {
      const std::string id = "c-" + std::to_string(i);
      pub.credit("credits/a", id, "acct-" + std::to_string(i % 7), 1 + i % 13);
      pub.credit("credits/a", id, "acct-" + std::to_string(i % 7), 1 + i % 13);  // a retry
      expected += 1 + i % 13;
    }
  }
  // The queued stream, cut three times by SIGKILL wherever the consumer is.
  auto run1 = start_example(false);
  sigkill_when(*run1, 100);
  const int64_t at_first_kill = entries();
  auto run2 = start_example(false);
  sigkill_when(*run2, at_first_kill + 150);
  const int64_t at_second_kill = entries();
  auto run3 = start_example(false);
  sigkill_when(*run3, at_second_kill + 150);
  const int64_t at_third_kill = entries();
  EXPECT_LT(at_third_kill, kFirst) << "the kills came after the stream: nothing was cut";

  // The broker restarts under a running consumer, which reconnects to its session.
  auto run4 = start_example();
  broker_.stop();
  broker_.start();
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = kFirst; i < kFirst + kSecond; ++i) {
      const std::string id = "c-" + std::to_string(i);
      pub.credit("credits/b", id, "acct-" + std::to_string(i % 7), 1 + i % 13);
      pub.credit("credits/b", id, "acct-" + std::to_string(i % 7), 1 + i % 13);
      expected += 1 + i % 13;
    }
    // Producers that re-send old ids after the restart, then a last credit: in order
    // behind them, so once it is applied the re-sent ones have been seen.
    for (int i = 0; i < 50; ++i)
      pub.credit("credits/a", "c-" + std::to_string(i), "acct-" + std::to_string(i % 7),
                 1 + i % 13);
    pub.credit("credits/a", "end", "acct-end", 1);
  }
  ASSERT_TRUE(wait_until(
      [&] { return q("SELECT count(*) FROM ledger_entries WHERE message_id = 'end'") == 1; },
      std::chrono::seconds(60)))
      << entries() << "\n"
      << log_text();
  term(*run4);

  EXPECT_EQ(entries(), kFirst + kSecond + 1);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), kFirst + kSecond + 1);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_processed WHERE consumer_name = 'ledger'"),
            kFirst + kSecond + 1);
  EXPECT_EQ(q("SELECT sum(balance) FROM accounts WHERE account <> 'acct-end'"), expected);
  for (int a = 0; a < 7; ++a) {
    int64_t want = 0;
    for (int i = 0; i < kFirst + kSecond; ++i)
      if (i % 7 == a) want += 1 + i % 13;
    EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct-" + std::to_string(a) + "'"),
              want)
        << "acct-" << a;
  }
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_attempts"), 0);
}

// Bad credits through the PgHandler: decode_credit throws UndecodablePayload, the message
// is dead-lettered at once in PostgreSQL with its reason and acked, and what follows is
// applied. The same poison sent again is acked as already dead-lettered, not a second row.
// The runtime role of docs/postgres.md#privileges: the owner's first run created the
// inbox's schema and the ledger's tables; a role that may only use them (CREATE nowhere)
// starts and applies each credit once. Before, the ledger's CREATE TABLE IF NOT EXISTS and
// the inbox's CREATE SCHEMA IF NOT EXISTS were refused (42501: PostgreSQL checks CREATE
// before existence) at every start, and the consumer waited for ever.
TEST_P(LedgerPgCrashTest, RuntimeRoleWithoutCreateStartsAndAppliesOnce) {
  {
    auto owner_run = start_example();
    term(*owner_run);
  }
  pg_.execute(
      "CREATE ROLE runtime LOGIN;"
      "GRANT USAGE ON SCHEMA mqtt_inbox TO runtime;"
      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mqtt_inbox TO runtime;"
      "GRANT USAGE ON ALL SEQUENCES IN SCHEMA mqtt_inbox TO runtime;"
      "GRANT SELECT, INSERT, UPDATE ON accounts, ledger_entries TO runtime",
      "ledger");
  ASSERT_EQ(pg_.query_value("SELECT has_schema_privilege('runtime', 'public', 'CREATE') OR "
                            "has_database_privilege('runtime', 'ledger', 'CREATE')",
                            "ledger"),
            "f");
  uri_.replace(uri_.find("user=postgres"), std::string("user=postgres").size(), "user=runtime");
  auto run = start_example();
  ASSERT_TRUE(run->running()) << log_text();
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 20; ++i) {
      pub.credit("credits/r", "r-" + std::to_string(i), "acct", 1 + i);
      pub.credit("credits/r", "r-" + std::to_string(i), "acct", 1 + i);  // a retry
    }
  }
  ASSERT_TRUE(wait_until([&] { return entries() >= 20; }, std::chrono::seconds(30))) << log_text();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // room for a late double
  term(*run);
  EXPECT_EQ(entries(), 20);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct'"), 210);
}

TEST_P(LedgerPgCrashTest, BadCreditsEndAsUndecodableDeadLettersInPostgres) {
  {
    auto first = start_example();
    term(*first);
  }
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 3; ++i) pub.credit("credits/p", "p-" + std::to_string(i), "acct", 10);
    pub.publish("credits/p", R"({"message_id":"bad-1","account":"acct","amount":"ten"})",
                {{"message-id", "bad-1"}});
    pub.publish("credits/p", R"({"message_id":"bad-2","account":"","amount":5})",
                {{"message-id", "bad-2"}});
    pub.publish("credits/p", R"({"message_id":"bad-1","account":"acct","amount":"ten"})",
                {{"message-id", "bad-1"}});  // the poison again: already dead-lettered
    for (int i = 3; i < 6; ++i) pub.credit("credits/p", "p-" + std::to_string(i), "acct", 10);
  }
  auto run = start_example(false);
  ASSERT_TRUE(wait_until([&] { return entries() == 6; }, std::chrono::seconds(30))) << log_text();
  term(*run);

  EXPECT_EQ(entries(), 6);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'acct'"), 60);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 2);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'bad-1'"
              " AND reason = 'undecodable_payload'"
              " AND reason_text LIKE '%''amount'' is missing or not an integer%'"),
            1)
      << pg_.query_value(
             "SELECT string_agg(message_id || ' ' || reason || ': ' || reason_text, "
             "E'\\n') FROM mqtt_inbox.inbox_dead_letters",
             "ledger");
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'bad-2'"
              " AND reason = 'undecodable_payload'"
              " AND reason_text LIKE '%''account'' is missing or not a non-empty string%'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_attempts"), 0);
}

INSTANTIATE_TEST_SUITE_P(Mqtt, LedgerPgCrashTest, ::testing::Values("3.1.1", "5"),
                         [](const auto& p) {
                           return std::string(p.param) == "5" ? "V5" : "V3_1_1";
                         });

// What ledger_consumer refuses on PostgreSQL before anything connects (no server, no
// broker needed): exit 1, the bad configuration code of examples/exit_codes.h.
int run_refused(const std::vector<std::string>& extra, const std::string& log) {
  std::vector<std::string> argv = {built_program("ledger_consumer"),
                                   "--broker",
                                   "tcp://127.0.0.1:1",
                                   "--client-id",
                                   "pg-refused",
                                   "--topic",
                                   "credits/#"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Child child(with_emulator(argv), log);
  return child.wait(std::chrono::seconds(20));
}

TEST(LedgerPgStartup, SqliteOnlyFlagsAndAPasswordInTheUriAreRefusedWithExit1) {
  TempDir dir;
  // SQLite's durability switch would do nothing on PostgreSQL: refused, not ignored.
  const std::string sync_log = dir.file("sync.log");
  int st = run_refused({"--db", "postgresql:///ledger?host=" + dir.path(), "--synchronous-normal"},
                       sync_log);
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  EXPECT_NE(read_file(sync_log).find("--synchronous-normal is SQLite's"), std::string::npos)
      << read_file(sync_log);

  const std::string pw_log = dir.file("password.log");
  st = run_refused({"--db", "postgresql://alice:hunter2@db.invalid/ledger"}, pw_log);
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  EXPECT_NE(read_file(pw_log).find("holds a password"), std::string::npos) << read_file(pw_log);
  EXPECT_EQ(read_file(pw_log).find("hunter2"), std::string::npos) << read_file(pw_log);
}

}  // namespace
}  // namespace mqtt_inbox::test

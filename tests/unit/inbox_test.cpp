// The inbox core on real SQLite files: claim, duplicates, retries, dead letters, store
// failures. Assertions are on business state (balances, ledger rows) and on the inbox's
// own tables, read back through a separate connection.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "store/claims.h"
#include "store/sqlite/schema.h"
#include "store/store.h"
#include "support/ledger_fixture.h"
#include "support/store_access.h"

namespace mqtt_inbox::test {
namespace {

class InboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("inbox.db");
    inbox_ = open_ledger_inbox(db_path_);
    ASSERT_TRUE(inbox_);
  }

  std::unique_ptr<Consumer> make_consumer(const std::string& name, Handler handler,
                                          ConsumerOptions options = {}) {
    options.retry_backoff_initial = std::chrono::milliseconds(1);
    options.retry_backoff_max = std::chrono::milliseconds(2);
    options.store_backoff_initial = std::chrono::milliseconds(5);
    options.store_backoff_max = std::chrono::milliseconds(50);
    std::unique_ptr<Consumer> c;
    const Status s = Consumer::create(inbox_.get(), name, std::move(handler), options, &c);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return c;
  }

  int64_t balance(const std::string& account) {
    return query_int(db_path_, "SELECT balance FROM accounts WHERE account = '" + account + "'");
  }
  int64_t count(const std::string& table, const std::string& where = "1") {
    return query_int(db_path_, "SELECT count(*) FROM " + table + " WHERE " + where);
  }

  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
};

TEST_F(InboxTest, OpenAppliesSchemaInWalMode) {
  EXPECT_EQ(query_int(db_path_, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(query_int(db_path_, "PRAGMA auto_vacuum"), 2);  // INCREMENTAL
  SQLite::Database db(db_path_, SQLite::OPEN_READONLY);
  EXPECT_EQ(db.execAndGet("PRAGMA journal_mode").getString(), "wal");
  for (const char* t : {"inbox_processed", "inbox_attempts", "inbox_dead_letters", "inbox_meta"})
    EXPECT_TRUE(db.tableExists(t)) << t;
  // Reopening an existing database keeps its rows and version.
  auto c = make_consumer("ledger", ledger::apply_credit);
  EXPECT_EQ(c->handle(credit_message("m-1", "a", 5)), Outcome::kProcessed);
  c.reset();
  inbox_.reset();
  inbox_ = open_ledger_inbox(db_path_);
  EXPECT_EQ(count("inbox_processed"), 1);
}

TEST_F(InboxTest, SecondConsumerProcessOnTheSameDatabaseIsRefused) {
  std::unique_ptr<Inbox> second;
  const Status s = Inbox::open(db_path_, {}, &second);
  EXPECT_EQ(s.code(), Status::Code::kBusy) << s.to_string();
  EXPECT_NE(s.message().find("one consumer process per database"), std::string::npos);
  InboxOptions inspect;
  inspect.exclusive = false;  // what the admin tool does
  EXPECT_TRUE(Inbox::open(db_path_, inspect, &second).ok());
  second.reset();
  inbox_.reset();  // the lock goes with the first Inbox
  EXPECT_TRUE(Inbox::open(db_path_, {}, &second).ok());
}

TEST(InboxOptionsTest, PageSizeAppliesToNewFilesOnly) {
  TempDir dir;
  InboxOptions o;
  o.page_size_bytes = 1024;
  auto inbox = open_ledger_inbox(dir.file("small-pages.db"), o);
  inbox.reset();
  EXPECT_EQ(query_int(dir.file("small-pages.db"), "PRAGMA page_size"), 1024);
  o.page_size_bytes = 8192;  // an existing file keeps its page size
  inbox = open_ledger_inbox(dir.file("small-pages.db"), o);
  inbox.reset();
  EXPECT_EQ(query_int(dir.file("small-pages.db"), "PRAGMA page_size"), 1024);
  o.page_size_bytes = 1000;
  std::unique_ptr<Inbox> bad;
  EXPECT_EQ(Inbox::open(dir.file("x.db"), o, &bad).code(), Status::Code::kInvalidArgument);
}

TEST_F(InboxTest, SequentialDuplicateAppliesOnceAndSkipsHandler) {
  int calls = 0;
  auto c = make_consumer("ledger", [&](SQLite::Database& db, const Delivery& d) {
    ++calls;
    ledger::apply_credit(db, d);
  });
  const Message m = credit_message("m-1", "alice", 250);
  EXPECT_EQ(c->handle(m), Outcome::kProcessed);
  EXPECT_EQ(c->handle(m), Outcome::kDuplicate);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(balance("alice"), 250);
  EXPECT_EQ(count("ledger_entries"), 1);
  EXPECT_EQ(count("inbox_processed", "consumer_name = 'ledger' AND message_id = 'm-1'"), 1);
  EXPECT_EQ(count("inbox_attempts"), 0);
  EXPECT_EQ(c->counters().duplicates, 1);
}

// Two connections (two Inbox objects on one file) both pass the duplicate pre-check and
// are held at a barrier right before the claim. The unique key lets exactly one commit.
TEST_F(InboxTest, ConcurrentDuplicateCommitsExactlyOnce) {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  auto barrier = [&](const std::string&, const std::string&) {
    std::unique_lock<std::mutex> lock(mu);
    ++arrived;
    cv.notify_all();
    cv.wait(lock, [&] { return arrived >= 2; });
  };
  InboxOptions o;
  o.before_claim_hook = barrier;
  o.exclusive = false;  // two connections in one process on purpose
  auto inbox_a = open_ledger_inbox(db_path_, o);
  auto inbox_b = open_ledger_inbox(db_path_, o);
  std::atomic<int> calls{0};
  auto handler = [&](SQLite::Database& db, const Delivery& d) {
    ++calls;
    ledger::apply_credit(db, d);
  };
  std::unique_ptr<Consumer> ca, cb;
  ASSERT_TRUE(Consumer::create(inbox_a.get(), "ledger", handler, {}, &ca).ok());
  ASSERT_TRUE(Consumer::create(inbox_b.get(), "ledger", handler, {}, &cb).ok());

  const Message m = credit_message("race-1", "bob", 100);
  Outcome oa{}, ob{};
  std::thread ta([&] { oa = ca->handle(m); });
  std::thread tb([&] { ob = cb->handle(m); });
  ta.join();
  tb.join();

  EXPECT_EQ(arrived, 2);  // both really reached the claim
  EXPECT_TRUE((oa == Outcome::kProcessed && ob == Outcome::kDuplicate) ||
              (oa == Outcome::kDuplicate && ob == Outcome::kProcessed))
      << to_string(oa) << " / " << to_string(ob);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(balance("bob"), 100);
  EXPECT_EQ(count("ledger_entries"), 1);
  EXPECT_EQ(count("inbox_attempts"), 0);  // the loser's attempt row went too
}

TEST_F(InboxTest, ConsumersHaveTheirOwnClaims) {
  auto billing = make_consumer("billing", ledger::apply_credit);
  auto audit = make_consumer("audit", ledger::apply_credit);
  const Message m = credit_message("shared-1", "carol", 10);
  EXPECT_EQ(billing->handle(m), Outcome::kProcessed);
  EXPECT_EQ(audit->handle(m), Outcome::kProcessed);
  EXPECT_EQ(billing->handle(m), Outcome::kDuplicate);
  EXPECT_EQ(audit->handle(m), Outcome::kDuplicate);
  EXPECT_EQ(count("inbox_processed", "message_id = 'shared-1'"), 2);
  EXPECT_EQ(count("ledger_entries"), 2);  // each consumer applied its effect once
}

TEST_F(InboxTest, FailingHandlerIsRetriedThenDeadLettered) {
  int calls = 0;
  ConsumerOptions o;
  o.max_attempts = 3;
  auto c = make_consumer(
      "ledger",
      [&](SQLite::Database& db, const Delivery& d) {
        ++calls;
        ledger::apply_credit(db, d);  // writes, then the throw must roll them back
        throw std::runtime_error("downstream table locked by bug #42");
      },
      o);
  const Message m = credit_message("poison-1", "dave", 7);
  EXPECT_EQ(c->handle(m), Outcome::kDeadLettered);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(count("accounts"), 0);
  EXPECT_EQ(count("ledger_entries"), 0);
  EXPECT_EQ(count("inbox_processed"), 0);  // a dead letter is not a claim
  EXPECT_EQ(count("inbox_attempts"), 0);

  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox_->list_dead_letters({}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  EXPECT_EQ(dls[0].reason, DeadLetterReason::kHandlerFailed);
  EXPECT_EQ(dls[0].attempts, 3);
  EXPECT_EQ(*dls[0].message_id, "poison-1");
  EXPECT_EQ(dls[0].payload, m.payload);
  EXPECT_NE(dls[0].reason_text.find("bug #42"), std::string::npos);

  // A redelivery (e.g. the PUBACK was lost) neither runs the handler nor adds a row.
  EXPECT_EQ(c->handle(m), Outcome::kAlreadyDeadLettered);
  EXPECT_EQ(calls, 3);
  ASSERT_TRUE(inbox_->list_dead_letters({}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  EXPECT_EQ(dls[0].redeliveries, 1);
}

TEST_F(InboxTest, HandlerThatRecoversIsAppliedOnce) {
  int calls = 0;
  auto c = make_consumer("ledger", [&](SQLite::Database& db, const Delivery& d) {
    ++calls;
    ledger::apply_credit(db, d);
    if (d.attempt == 1) throw std::runtime_error("transient");
  });
  EXPECT_EQ(c->handle(credit_message("flaky-1", "erin", 40)), Outcome::kProcessed);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(balance("erin"), 40);
  EXPECT_EQ(count("ledger_entries"), 1);
  EXPECT_EQ(count("inbox_attempts"), 0);
}

TEST_F(InboxTest, UndecodablePayloadIsDeadLetteredWithoutRetries) {
  int calls = 0;
  auto c = make_consumer("ledger", [&](SQLite::Database& db, const Delivery& d) {
    ++calls;
    ledger::apply_credit(db, d);
  });
  Message m;
  m.topic = "credits/test";
  m.payload = R"({"message_id":"bad-amount","account":"x","amount":"12"})";
  EXPECT_EQ(c->handle(m), Outcome::kDeadLettered);
  EXPECT_EQ(calls, 1);
  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox_->list_dead_letters({}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  EXPECT_EQ(dls[0].reason, DeadLetterReason::kUndecodablePayload);
  EXPECT_NE(dls[0].reason_text.find("amount"), std::string::npos);
}

TEST_F(InboxTest, MessagesWithoutUsableIdAreDeadLetteredWithReasons) {
  int calls = 0;
  auto c = make_consumer("ledger", [&](SQLite::Database& db, const Delivery& d) {
    ++calls;
    ledger::apply_credit(db, d);
  });
  struct Case {
    std::string payload;
    std::vector<std::pair<std::string, std::string>> props;
    DeadLetterReason reason;
  };
  const std::vector<Case> cases = {
      {R"({"account":"a","amount":1})", {}, DeadLetterReason::kMissingId},
      {R"({"account":"a","amount":1})", {}, DeadLetterReason::kMissingId},  // not collapsed
      {R"({"message_id":"","account":"a","amount":1})", {}, DeadLetterReason::kInvalidId},
      {R"({"message_id":"   ","account":"a","amount":1})", {}, DeadLetterReason::kInvalidId},
      {R"({"message_id":42,"account":"a","amount":1})", {}, DeadLetterReason::kInvalidId},
      {R"({"message_id":"ok","account":"a","amount":1})",
       {{"message-id", "bad\nid"}},
       DeadLetterReason::kInvalidId},
      {"not json at all", {}, DeadLetterReason::kUndecodablePayload},
      {"", {}, DeadLetterReason::kUndecodablePayload},
  };
  for (const Case& k : cases) {
    Message m;
    m.topic = "credits/test";
    m.payload = k.payload;
    m.user_properties = k.props;
    EXPECT_EQ(c->handle(m), Outcome::kDeadLettered) << k.payload;
  }
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(count("accounts"), 0);
  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox_->list_dead_letters({}, &dls).ok());
  ASSERT_EQ(dls.size(), cases.size());
  // Newest first.
  for (size_t i = 0; i < cases.size(); ++i) {
    const DeadLetter& d = dls[cases.size() - 1 - i];
    EXPECT_EQ(d.reason, cases[i].reason) << cases[i].payload << ": " << d.reason_text;
    EXPECT_FALSE(d.message_id.has_value());
    EXPECT_EQ(d.payload, cases[i].payload);
    EXPECT_FALSE(d.reason_text.empty());
  }
}

TEST_F(InboxTest, OversizedPayloadIsDeadLetteredWithoutParsing) {
  int calls = 0;
  ConsumerOptions o;
  o.max_payload_bytes = 64;
  o.dead_letter_payload_bytes = 32;
  auto c = make_consumer(
      "ledger", [&](SQLite::Database&, const Delivery&) { ++calls; }, o);
  Message m;
  m.topic = "credits/test";
  m.payload = std::string(65, 'x');
  m.user_properties = {{"message-id", "big-1"}};
  EXPECT_EQ(c->handle(m), Outcome::kDeadLettered);
  m.payload = std::string(64, 'y');  // exactly at the limit: accepted (and no JSON id)
  m.user_properties = {{"message-id", "edge-1"}};
  EXPECT_EQ(c->handle(m), Outcome::kProcessed);
  EXPECT_EQ(calls, 1);
  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox_->list_dead_letters({}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  EXPECT_EQ(dls[0].reason, DeadLetterReason::kPayloadTooLarge);
  EXPECT_EQ(dls[0].payload_size, 65);
  EXPECT_EQ(dls[0].payload.size(), 32u);  // cut, and the cut is recorded
  EXPECT_EQ(*dls[0].message_id, "big-1");
}

// Attempts recorded by processes that died inside the handler are honoured: the next
// delivery dead-letters the message without running the handler again.
TEST_F(InboxTest, AttemptsFromCrashedRunsLeadToHandlerCrashed) {
  ConsumerOptions o;
  o.max_attempts = 2;
  // Two attempts of processes that died inside the handler ('running'), as the store counts
  // them at the next open.
  inbox_->with_connection([](SQLite::Database& db) {
    db.exec(
        "INSERT INTO inbox_attempts (consumer_name, message_id, attempts, first_attempt_at,"
        " last_attempt_at, state) VALUES ('ledger', 'crashy-1', 2, 1, 1, 'running')");
  });
  int calls = 0;
  auto c = make_consumer(
      "ledger", [&](SQLite::Database&, const Delivery&) { ++calls; }, o);
  EXPECT_EQ(c->handle(credit_message("crashy-1", "f", 1)), Outcome::kDeadLettered);
  EXPECT_EQ(calls, 0);
  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox_->list_dead_letters({}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  EXPECT_EQ(dls[0].reason, DeadLetterReason::kHandlerCrashed);
  EXPECT_EQ(dls[0].attempts, 2);
  EXPECT_EQ(count("inbox_attempts"), 0);
}

TEST_F(InboxTest, ReplayAfterFixAppliesExactlyOnce) {
  bool fixed = false;
  ConsumerOptions o;
  o.max_attempts = 2;
  auto c = make_consumer(
      "ledger",
      [&](SQLite::Database& db, const Delivery& d) {
        if (!fixed) throw std::runtime_error("bug");
        ledger::apply_credit(db, d);
      },
      o);
  EXPECT_EQ(c->handle(credit_message("late-1", "gina", 75)), Outcome::kDeadLettered);
  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox_->list_dead_letters({}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);

  fixed = true;
  Outcome out{};
  ASSERT_TRUE(c->replay_dead_letter(dls[0].id, &out).ok());
  EXPECT_EQ(out, Outcome::kProcessed);
  EXPECT_EQ(balance("gina"), 75);
  const Status again = c->replay_dead_letter(dls[0].id, &out);
  EXPECT_EQ(again.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(balance("gina"), 75);
  EXPECT_EQ(count("ledger_entries"), 1);
  EXPECT_EQ(count("inbox_dead_letters", "status = 'replayed'"), 1);
  // A late redelivery of the original is now a plain duplicate.
  EXPECT_EQ(c->handle(credit_message("late-1", "gina", 75)), Outcome::kDuplicate);
}

// While another connection holds the write lock, handle() must not return (returning
// would release the PUBACK); it reports the wait through health() and commits once the
// lock is released.
TEST_F(InboxTest, LockedStoreBlocksUntilCommitAndReportsHealth) {
  inbox_.reset();
  InboxOptions o;
  o.busy_timeout_ms = 50;
  inbox_ = open_ledger_inbox(db_path_, o);
  auto c = make_consumer("ledger", ledger::apply_credit);

  SQLite::Database locker(db_path_, SQLite::OPEN_READWRITE);
  locker.exec("BEGIN EXCLUSIVE");
  std::atomic<bool> done{false};
  Outcome out{};
  std::thread t([&] {
    out = c->handle(credit_message("locked-1", "hank", 9));
    done = true;
  });
  EXPECT_TRUE(wait_until([&] { return c->health().stuck; }, std::chrono::seconds(5)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load());
  const Health h = c->health();
  EXPECT_GT(h.retries, 0);
  EXPECT_GT(h.stuck_since_ms, 0);
  EXPECT_NE(h.last_error.find("busy"), std::string::npos) << h.last_error;
  locker.exec("COMMIT");
  t.join();
  EXPECT_EQ(out, Outcome::kProcessed);
  EXPECT_FALSE(c->health().stuck);
  EXPECT_EQ(balance("hank"), 9);
  EXPECT_EQ(count("ledger_entries"), 1);
}

TEST_F(InboxTest, PurgeAndFilterDeadLetters) {
  ConsumerOptions o;
  o.max_attempts = 1;
  auto c = make_consumer(
      "ledger", [](SQLite::Database&, const Delivery&) { throw std::runtime_error("no"); }, o);
  EXPECT_EQ(c->handle(credit_message("p-1", "a", 1)), Outcome::kDeadLettered);
  Message no_id;
  no_id.topic = "t";
  no_id.payload = "{}";
  EXPECT_EQ(c->handle(no_id), Outcome::kDeadLettered);
  std::vector<DeadLetter> dls;
  DeadLetterFilter f;
  f.reason = DeadLetterReason::kMissingId;
  ASSERT_TRUE(inbox_->list_dead_letters(f, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  int64_t removed = 0;
  ASSERT_TRUE(inbox_->purge_dead_letters(f, &removed).ok());
  EXPECT_EQ(removed, 1);
  EXPECT_EQ(count("inbox_dead_letters"), 1);
  EXPECT_EQ(count("inbox_dead_letters", "reason = 'handler_failed'"), 1);
}

}  // namespace
}  // namespace mqtt_inbox::test

namespace mqtt_inbox::test {
namespace {

std::string schema_of(const std::string& path) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  SQLite::Statement q(db,
                      "SELECT type || ' ' || name || ': ' || sql FROM sqlite_master"
                      " WHERE name LIKE 'inbox_%' ORDER BY name");
  std::string out;
  while (q.executeStep()) out += q.getColumn(0).getString() + "\n";
  return out;
}

// A database made by the previous release (schema step 1 only, with rows) opens with
// this one: it is migrated in place, keeps its rows, and ends with the same schema as a
// new database.
TEST(Migration, PreviousSchemaVersionUpgradesInPlaceKeepingRows) {
  TempDir dir;
  const std::string old_db = dir.file("v1.db");
  {
    SQLite::Database db(old_db, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    ASSERT_EQ(detail::schema_steps().front().version, 1);
    db.exec(detail::schema_steps().front().sql);
    db.exec(
        "INSERT INTO inbox_processed (consumer_name, message_id, received_at)"
        " VALUES ('ledger', 'old-1', 1000), ('ledger', 'old-2', 2000)");
    db.exec(
        "INSERT INTO inbox_dead_letters (consumer_name, topic, payload, payload_size, qos,"
        " reason, reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at)"
        " VALUES ('ledger', 't', x'00', 1, 1, 'missing_id', 'no id', 0, 1, 1, 1)");
    ASSERT_EQ(db.execAndGet("PRAGMA user_version").getInt(), 1);
  }
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(old_db, {}, &inbox);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(query_int(old_db, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(query_int(old_db, "SELECT count(*) FROM inbox_processed"), 2);
  EXPECT_EQ(query_int(old_db, "SELECT count(*) FROM inbox_dead_letters"), 1);

  // The old claims still deduplicate.
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "ledger", [](SQLite::Database&, const Delivery&) {}, {}, &c)
                  .ok());
  Message m;
  m.payload = R"({"message_id":"old-1"})";
  EXPECT_EQ(c->handle(m), Outcome::kDuplicate);
  c.reset();
  inbox.reset();

  const std::string new_db = dir.file("new.db");
  ASSERT_TRUE(Inbox::open(new_db, {}, &inbox).ok());
  inbox.reset();
  EXPECT_EQ(schema_of(old_db), schema_of(new_db));
}

}  // namespace
}  // namespace mqtt_inbox::test

// The session records (session_record.h) on real SQLite files: what the subscriber writes
// before it connects and after it (un)subscribes, read back as a fresh process would.
#include "store/sqlite/schema.h"
#include "support/ledger_fixture.h"

namespace mqtt_inbox::test {
namespace {

class SessionRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("inbox.db");
    inbox_ = open_ledger_inbox(db_path_);
    ASSERT_TRUE(inbox_);
  }
  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }

  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
};

TEST_F(SessionRecordTest, RecordReplacesFiltersAndExpiryAndSurvivesReopening) {
  SessionRecord r;
  r.client_id = "gw-17";
  r.topic_filters = {"credits/#", "alerts/+", "credits/#"};  // a set: the repeat is one row
  r.session_expiry_ms = 7LL * 24 * 3600 * 1000;
  r.expiry_source = SessionExpirySource::kRequested;
  ASSERT_TRUE(inbox_->sessions().record(r).ok());
  EXPECT_EQ(q("SELECT count(*) FROM inbox_session_filters WHERE client_id = 'gw-17'"), 2);

  r.topic_filters = {"credits/#", "$share/g/orders/+"};
  r.session_expiry_ms = 3600 * 1000;
  r.expiry_source = SessionExpirySource::kGranted;
  ASSERT_TRUE(inbox_->sessions().record(r).ok());
  SessionRecord other;
  other.client_id = "gw-18";
  other.session_expiry_ms = 60 * 1000;
  other.expiry_source = SessionExpirySource::kDeclared;
  ASSERT_TRUE(inbox_->sessions().record(other).ok());

  inbox_.reset();  // what the next process sees
  inbox_ = open_ledger_inbox(db_path_);
  SessionRecord got;
  ASSERT_TRUE(inbox_->sessions().load("gw-17", &got).ok());
  EXPECT_EQ(got.topic_filters, (std::vector<std::string>{"$share/g/orders/+", "credits/#"}));
  EXPECT_EQ(got.session_expiry_ms, 3600 * 1000);
  EXPECT_EQ(got.expiry_source, SessionExpirySource::kGranted);
  EXPECT_GT(got.updated_at_ms, 0);
  std::vector<SessionRecord> all;
  ASSERT_TRUE(inbox_->sessions().list(&all).ok());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].client_id, "gw-18");
  EXPECT_TRUE(all[1].topic_filters.empty());
  EXPECT_EQ(all[1].expiry_source, SessionExpirySource::kDeclared);

  EXPECT_EQ(inbox_->sessions().load("gw-99", &got).code(), Status::Code::kNotFound);
  bool removed = false;
  ASSERT_TRUE(inbox_->sessions().forget("gw-17", &removed).ok());
  EXPECT_TRUE(removed);
  ASSERT_TRUE(inbox_->sessions().forget("gw-17", &removed).ok());
  EXPECT_FALSE(removed);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_session_filters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_sessions"), 1);
}

// A lost session is recorded where the session is, so that it is seen after the process
// that saw it is gone (mqtt-inbox stats): per client id, a count and the last time.
// record() keeps them; a client id without a record changes nothing.
TEST_F(SessionRecordTest, LostSessionsAreCountedInTheRecordAcrossRestarts) {
  SessionRecord r;
  r.client_id = "gw-17";
  r.topic_filters = {"credits/#"};
  r.session_expiry_ms = 3600 * 1000;
  ASSERT_TRUE(inbox_->sessions().record(r).ok());
  const int64_t before = Clock::system()->wall_ms();
  inbox_->sessions().note_lost("gw-17");
  inbox_->sessions().note_lost("gw-17");
  inbox_->sessions().note_lost("gw-99");        // no record: nothing to count it in
  EXPECT_EQ(inbox_->stats().sessions_lost, 3);  // this process's count: every call

  ASSERT_TRUE(inbox_->sessions().record(r).ok());  // the next connection's record
  inbox_.reset();
  inbox_ = open_ledger_inbox(db_path_);
  EXPECT_EQ(inbox_->stats().sessions_lost, 0);  // a new process
  SessionRecord got;
  ASSERT_TRUE(inbox_->sessions().load("gw-17", &got).ok());
  EXPECT_EQ(got.sessions_lost, 2);
  EXPECT_GE(got.last_lost_at_ms, before);
  EXPECT_LE(got.last_lost_at_ms, Clock::system()->wall_ms());
  EXPECT_EQ(got.topic_filters, std::vector<std::string>{"credits/#"});
  EXPECT_EQ(q("SELECT count(*) FROM inbox_sessions"), 1);
}

// Schema step 13 on a file of step 12 with a session record: the record is kept, with no
// loss counted.
TEST_F(SessionRecordTest, Step13KeepsTheRecordsOfAVersion12File) {
  const std::string path = dir_.file("v12.db");
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    for (const auto& step : detail::schema_steps())
      if (step.version <= 12) db.exec(step.sql);
    ASSERT_EQ(db.execAndGet("PRAGMA user_version").getInt(), 12);
    db.exec(
        "INSERT INTO inbox_sessions (client_id, session_expiry_ms, expiry_source, updated_at)"
        " VALUES ('old-gw', 60000, 'granted', 1000)");
    db.exec("INSERT INTO inbox_session_filters VALUES ('old-gw', 'a/#')");
  }
  auto inbox = open_ledger_inbox(path);
  ASSERT_TRUE(inbox);
  EXPECT_EQ(query_int(path, "PRAGMA user_version"), kSchemaVersion);
  SessionRecord got;
  ASSERT_TRUE(inbox->sessions().load("old-gw", &got).ok());
  EXPECT_EQ(got.session_expiry_ms, 60000);
  EXPECT_EQ(got.updated_at_ms, 1000);
  EXPECT_EQ(got.topic_filters, std::vector<std::string>{"a/#"});
  EXPECT_EQ(got.sessions_lost, 0);
  EXPECT_EQ(got.last_lost_at_ms, 0);
  inbox->sessions().note_lost("old-gw");
  ASSERT_TRUE(inbox->sessions().load("old-gw", &got).ok());
  EXPECT_EQ(got.sessions_lost, 1);
}

TEST_F(SessionRecordTest, RefusesRecordsThatCannotBeRight) {
  SessionRecord r;
  EXPECT_EQ(inbox_->sessions().record(r).code(), Status::Code::kInvalidArgument);  // no client id
  r.client_id = "c";
  r.session_expiry_ms = -1;
  EXPECT_EQ(inbox_->sessions().record(r).code(), Status::Code::kInvalidArgument);
  r.session_expiry_ms = 0;
  r.topic_filters = {"a", ""};
  EXPECT_EQ(inbox_->sessions().record(r).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_sessions"), 0);
}

TEST(SessionExpirySource, TextFormsRoundTrip) {
  for (auto s : {SessionExpirySource::kRequested, SessionExpirySource::kGranted,
                 SessionExpirySource::kDeclared}) {
    SessionExpirySource back{};
    ASSERT_TRUE(parse_session_expiry_source(to_string(s), &back));
    EXPECT_EQ(back, s);
  }
  SessionExpirySource unused{};
  EXPECT_FALSE(parse_session_expiry_source("forever", &unused));
}

}  // namespace
}  // namespace mqtt_inbox::test

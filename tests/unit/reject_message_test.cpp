// RejectMessage (issue 18 section 3): a well-formed message the application refuses is
// dead-lettered at once as invalid_payload with the handler's text, without retries or
// backoff, in Consumer mode and in store-then-process mode, and the stream goes on. And
// the schema steps that made room for new reasons (7: invalid_payload, 9: outbox_full): a
// database of the previous version with dead letters in it is rebuilt in place, its rows
// intact.
#include <mqtt_inbox/store_then_process.h>

#include <chrono>
#include <thread>

#include "store/sqlite/schema.h"
#include "store/store.h"
#include "support/ledger_fixture.h"
#include "support/store_access.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

// A thermostat: setpoints must lie in 5..35 C. Writes the accepted setpoint.
void create_setpoints(SQLite::Database& db) {
  db.exec("CREATE TABLE IF NOT EXISTS setpoints (room TEXT PRIMARY KEY, celsius INTEGER NOT NULL)");
}

void apply_setpoint(SQLite::Database& db, const Message& m) {
  const auto j = nlohmann::json::parse(m.payload, nullptr, false);
  if (!j.is_object() || !j.contains("celsius") || !j["celsius"].is_number_integer())
    throw UndecodablePayload("'celsius' is missing or not an integer");
  const int64_t c = j["celsius"].get<int64_t>();
  // Written before the check on purpose: a rejection must roll this back.
  SQLite::Statement q(db,
                      "INSERT INTO setpoints (room, celsius) VALUES (?1, ?2)"
                      " ON CONFLICT (room) DO UPDATE SET celsius = excluded.celsius");
  q.bind(1, j.value("room", std::string("hall")));
  q.bind(2, c);
  q.exec();
  if (c < 5 || c > 35)
    throw RejectMessage("setpoint " + std::to_string(c) + " C out of range 5..35");
}

Message setpoint(const std::string& id, int celsius, const std::string& room = "hall") {
  Message m;
  m.topic = "thermostat/" + room + "/setpoint";
  m.payload = "{\"message_id\":\"" + id + "\",\"room\":\"" + room +
              "\",\"celsius\":" + std::to_string(celsius) + "}";
  return m;
}

class RejectMessageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("thermostat.db");
    inbox_ = open_ledger_inbox(db_path_);
    ASSERT_TRUE(inbox_);
    inbox_->with_connection(create_setpoints);
  }
  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }

  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
};

TEST_F(RejectMessageTest, ConsumerDeadLettersAtOnceAsInvalidPayloadWithTheText) {
  int calls = 0;
  ConsumerOptions o;
  o.max_attempts = 5;
  o.retry_backoff_initial = 5000ms;  // a retry would show in the elapsed time
  o.retry_backoff_max = 5000ms;
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(
                  inbox_.get(), "thermostat",
                  [&](SQLite::Database& db, const Delivery& d) {
                    ++calls;
                    apply_setpoint(db, d.message);
                  },
                  o, &c)
                  .ok());
  ASSERT_EQ(c->handle(setpoint("s-1", 21)), Outcome::kProcessed);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c->handle(setpoint("s-2", 95)), Outcome::kDeadLettered);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(calls, 2);  // one attempt only
  EXPECT_LT(elapsed, 4000ms) << "a rejection must not wait for a retry backoff";
  // The rejected write was rolled back with the claim; the earlier setpoint stands.
  EXPECT_EQ(q("SELECT celsius FROM setpoints WHERE room = 'hall'"), 21);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE message_id = 's-2'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox_->list_dead_letters({}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  EXPECT_EQ(dls[0].reason, DeadLetterReason::kInvalidPayload);
  EXPECT_STREQ(to_string(dls[0].reason), "invalid_payload");
  EXPECT_EQ(dls[0].reason_text, "setpoint 95 C out of range 5..35");
  EXPECT_EQ(dls[0].attempts, 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_payload'"), 1);
  // A redelivery is recognised, not run again; the next message goes through.
  EXPECT_EQ(c->handle(setpoint("s-2", 95)), Outcome::kAlreadyDeadLettered);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(c->handle(setpoint("s-3", 18)), Outcome::kProcessed);
  EXPECT_EQ(q("SELECT celsius FROM setpoints WHERE room = 'hall'"), 18);
  // Real parse errors keep their own reason.
  Message garbled = setpoint("s-4", 0);
  garbled.payload = R"({"message_id":"s-4","celsius":"warm"})";
  EXPECT_EQ(c->handle(garbled), Outcome::kDeadLettered);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'undecodable_payload'"
              " AND message_id = 's-4'"),
            1);
}

TEST_F(RejectMessageTest, StoreThenProcessHandlerAndPrepareDeadLetterAtOnce) {
  StoreThenProcessOptions o;
  o.workers = 1;
  o.poll_interval_ms = 10;
  o.consumer.max_attempts = 5;
  o.consumer.retry_backoff_initial = 1000ms;
  o.consumer.retry_backoff_max = 1000ms;
  o.prepare = [](const StoredDelivery& d) -> std::any {
    if (d.message_id == "p-bad") throw RejectMessage("room 'attic' is not heated");
    return {};
  };
  std::atomic<int> runs{0};
  std::unique_ptr<StoreThenProcess> stp;
  ASSERT_TRUE(StoreThenProcess::create(
                  inbox_.get(), "thermostat",
                  [&](SQLite::Database& db, const StoredDelivery& d) {
                    ++runs;
                    apply_setpoint(db, d.message);
                  },
                  o, &stp)
                  .ok());
  ASSERT_EQ(stp->handle(setpoint("t-1", 22)), Outcome::kProcessed);
  ASSERT_EQ(stp->handle(setpoint("t-2", 95)), Outcome::kProcessed);  // stored; rejected later
  ASSERT_EQ(stp->handle(setpoint("p-bad", 20, "attic")), Outcome::kProcessed);
  ASSERT_EQ(stp->handle(setpoint("t-3", 19)), Outcome::kProcessed);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until(
      [&] {
        return q("SELECT count(*) FROM inbox_messages WHERE status"
                 " IN ('done', 'dead')") == 4;
      },
      5s));
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(runs.load(), 3);  // t-1, t-2 once, t-3; p-bad never reached the handler
  EXPECT_EQ(q("SELECT celsius FROM setpoints WHERE room = 'hall'"), 19);
  EXPECT_EQ(q("SELECT count(*) FROM setpoints WHERE room = 'attic'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'dead' AND attempts = 1"), 2);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_payload'"
              " AND message_id = 't-2' AND reason_text = 'setpoint 95 C out of range 5..35'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_payload'"
              " AND message_id = 'p-bad' AND reason_text = 'room ''attic'' is not heated'"),
            1);
}

// Every column of every dead letter, in id order, as one string.
std::string dead_letter_rows(const std::string& path) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  SQLite::Statement s(db,
                      "SELECT group_concat(id || '|' || consumer_name || '|' ||"
                      " coalesce(message_id, '-') || '|' || topic || '|' || hex(payload) ||"
                      " '|' || payload_size || '|' || coalesce(properties, '-') || '|' || qos"
                      " || '|' || reason || '|' || reason_text || '|' || attempts || '|' ||"
                      " first_attempt_at || '|' || last_attempt_at || '|' || dead_lettered_at"
                      " || '|' || redeliveries || '|' || status || '|' ||"
                      " coalesce(replayed_at, '-') || '|' || retention_at, ';')"
                      " FROM (SELECT * FROM inbox_dead_letters ORDER BY id)");
  s.executeStep();
  return s.getColumn(0).getString();
}

// The step that widened the CHECK constraints rebuilds inbox_dead_letters (SQLite cannot
// alter a CHECK). A database of the release before it (the version whose step added the
// 'retained' reason, so every later step runs), with dead letters of old reasons and
// statuses, 'retained' among them, is migrated in place: same rows, same values, ids
// kept, the new values accepted.
TEST(DeadLetterSchemaMigration, PreviousVersionWithRowsIsRebuiltKeepingThem) {
  TempDir dir;
  const std::string path = dir.file("previous.db");
  const auto& steps = detail::schema_steps();
  int previous = 0;
  for (const auto& step : steps)
    if (previous == 0 && step.sql.find("'retained'") != std::string::npos) previous = step.version;
  ASSERT_GT(previous, 0);
  ASSERT_LT(previous, kSchemaVersion);
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    for (const auto& step : steps)
      if (step.version <= previous) db.exec(step.sql);
    ASSERT_EQ(db.execAndGet("PRAGMA user_version").getInt(), previous);
    // The old table refuses the new reason: this step is what makes room for it.
    EXPECT_THROW(db.exec("INSERT INTO inbox_dead_letters (consumer_name, topic, payload,"
                         " payload_size, qos, reason, reason_text, attempts, first_attempt_at,"
                         " last_attempt_at, dead_lettered_at)"
                         " VALUES ('c', 't', x'', 0, 1, 'invalid_payload', '', 0, 1, 1, 1)"),
                 SQLite::Exception);
    db.exec(
        "INSERT INTO inbox_dead_letters (id, consumer_name, message_id, topic, payload,"
        " payload_size, properties, qos, reason, reason_text, attempts, first_attempt_at,"
        " last_attempt_at, dead_lettered_at, redeliveries, status, replayed_at, retention_at)"
        " VALUES (7, 'ledger', 'm-7', 'credits/a', x'00ff', 9, '{\"a\":1}', 1, 'handler_failed',"
        "         'boom', 5, 100, 200, 300, 2, 'dead', NULL, 300),"
        "        (9, 'ledger', 'm-9', 'credits/b', x'7b7d', 2, NULL, 0, 'handler_crashed',"
        "         'died', 3, 110, 210, 310, 0, 'replayed', 400, 310),"
        "        (12, 'sensors', NULL, 'sensors/x', x'', 0, '{}', 1, 'missing_id',"
        "         'no id', 0, 120, 220, 320, 1, 'dead', NULL, 320),"
        "        (15, 'ledger', 'm-15', 'credits/r', x'7b7d', 2, NULL, 1, 'retained',"
        "         'retained', 0, 130, 230, 330, 0, 'dead', NULL, 330)");
  }
  const std::string before_rows = dead_letter_rows(path);

  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(path, {}, &inbox);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(query_int(path, "PRAGMA user_version"), kSchemaVersion);
  {
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    EXPECT_EQ(dead_letter_rows(path), before_rows);
    EXPECT_EQ(db.execAndGet("PRAGMA integrity_check").getString(), "ok");
    for (const char* index : {"inbox_dead_letters_by_id", "inbox_dead_letters_by_time",
                              "inbox_dead_letters_retention", "inbox_dead_letters_requeued"})
      EXPECT_EQ(db.execAndGet(std::string("SELECT count(*) FROM sqlite_master WHERE type = "
                                          "'index' AND name = '") +
                              index + "'")
                    .getInt(),
                1)
          << index;
  }
  // The library reads the old rows, and a redelivery of m-7 still finds its dead letter.
  std::vector<DeadLetter> dls;
  DeadLetterFilter all;
  all.include_replayed = true;
  ASSERT_TRUE(inbox->list_dead_letters(all, &dls).ok());
  ASSERT_EQ(dls.size(), 4u);
  EXPECT_EQ(dls[0].id, 15);
  EXPECT_EQ(dls[0].reason, DeadLetterReason::kRetained);
  EXPECT_EQ(dls[3].id, 7);
  EXPECT_EQ(dls[3].reason, DeadLetterReason::kHandlerFailed);
  EXPECT_EQ(dls[3].redeliveries, 2);
  EXPECT_TRUE(dls[2].replayed);
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "ledger",
                  [](SQLite::Database&, const Delivery&) {
                    throw RejectMessage("amount must be positive");
                  },
                  {}, &c)
                  .ok());
  Message again;
  again.topic = "credits/a";
  again.payload = R"({"message_id":"m-7"})";
  EXPECT_EQ(c->handle(again), Outcome::kAlreadyDeadLettered);
  EXPECT_EQ(query_int(path, "SELECT redeliveries FROM inbox_dead_letters WHERE id = 7"), 3);
  // The new reason fits now.
  Message fresh = again;
  fresh.payload = R"({"message_id":"m-20"})";
  EXPECT_EQ(c->handle(fresh), Outcome::kDeadLettered);
  EXPECT_EQ(query_int(path,
                      "SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'm-20'"
                      " AND reason = 'invalid_payload' AND id > 15"),
            1);
}

// Step 9 rebuilds inbox_dead_letters again to admit 'outbox_full' (a message parked by a
// full outbox, outbox.h OutboxFull). A file of version 8 with dead letters of every status,
// a requeued one among them, keeps every row and value, and the new reason fits.
TEST(DeadLetterSchemaMigration, VersionEightGainsTheOutboxFullReasonKeepingEveryRow) {
  TempDir dir;
  const std::string path = dir.file("v8.db");
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    for (const auto& step : detail::schema_steps())
      if (step.version <= 8) db.exec(step.sql);
    ASSERT_EQ(db.execAndGet("PRAGMA user_version").getInt(), 8);
    EXPECT_THROW(db.exec("INSERT INTO inbox_dead_letters (consumer_name, topic, payload,"
                         " payload_size, qos, reason, reason_text, attempts, first_attempt_at,"
                         " last_attempt_at, dead_lettered_at)"
                         " VALUES ('c', 't', x'', 0, 1, 'outbox_full', '', 0, 1, 1, 1)"),
                 SQLite::Exception);
    db.exec(
        "INSERT INTO inbox_dead_letters (id, consumer_name, message_id, topic, payload,"
        " payload_size, properties, qos, reason, reason_text, attempts, first_attempt_at,"
        " last_attempt_at, dead_lettered_at, redeliveries, status, replayed_at, retention_at)"
        " VALUES (3, 'ledger', 'm-3', 'credits/a', x'7b7d', 2, NULL, 1, 'invalid_payload',"
        "         'no', 1, 100, 200, 300, 0, 'requeued', NULL, 300),"
        "        (4, 'ledger', 'm-4', 'credits/b', x'00', 1, '{}', 1, 'handler_reentered',"
        "         'Inbox::claim', 1, 110, 210, 310, 4, 'dead', NULL, 310),"
        "        (8, 'sensors', NULL, 'sensors/x', x'', 0, '{}', 0, 'missing_id',"
        "         'no id', 0, 120, 220, 320, 0, 'replayed', 330, 320)");
  }
  const std::string before_rows = dead_letter_rows(path);
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(path, {}, &inbox);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(query_int(path, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(dead_letter_rows(path), before_rows);
  EXPECT_EQ(query_int(path,
                      "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name"
                      " IN ('inbox_dead_letters_by_id', 'inbox_dead_letters_by_time',"
                      " 'inbox_dead_letters_retention', 'inbox_dead_letters_requeued')"),
            4);
  std::vector<int64_t> requeued;
  ASSERT_TRUE(store_of(*inbox).requeued_dead_letters("ledger", 10, &requeued).ok());
  EXPECT_EQ(requeued, std::vector<int64_t>{3});
  DeadLetter parked;
  parked.consumer_name = "ledger";
  parked.message_id = "m-9";
  parked.topic = "credits/c";
  parked.reason = DeadLetterReason::kOutboxFull;
  parked.reason_text = "outbox full: class 'events/' holds 11 rows";
  parked.requeued = true;
  int64_t id = 0;
  ASSERT_TRUE(store_of(*inbox).add_dead_letter(parked, std::nullopt, &id).ok());
  EXPECT_GT(id, 8);
  EXPECT_EQ(
      query_int(path, "SELECT count(*) FROM inbox_dead_letters WHERE id = " + std::to_string(id) +
                          " AND reason = 'outbox_full' AND status = 'requeued'"),
      1);
}

// Step 10 rebuilds inbox_dead_letters once more to admit 'outbox_refused' (issue 27: the
// handler's outgoing message refused for good, outbox.h OutboxRefused). A file of version
// 9 with dead letters of every status, a parked outbox_full row among them, keeps every
// row, value and index, and the new reason fits.
TEST(DeadLetterSchemaMigration, VersionNineGainsTheOutboxRefusedReasonKeepingEveryRow) {
  TempDir dir;
  const std::string path = dir.file("v9.db");
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    for (const auto& step : detail::schema_steps())
      if (step.version <= 9) db.exec(step.sql);
    ASSERT_EQ(db.execAndGet("PRAGMA user_version").getInt(), 9);
    EXPECT_THROW(db.exec("INSERT INTO inbox_dead_letters (consumer_name, topic, payload,"
                         " payload_size, qos, reason, reason_text, attempts, first_attempt_at,"
                         " last_attempt_at, dead_lettered_at)"
                         " VALUES ('c', 't', x'', 0, 1, 'outbox_refused', '', 0, 1, 1, 1)"),
                 SQLite::Exception);
    db.exec(
        "INSERT INTO inbox_dead_letters (id, consumer_name, message_id, topic, payload,"
        " payload_size, properties, qos, reason, reason_text, attempts, first_attempt_at,"
        " last_attempt_at, dead_lettered_at, redeliveries, status, replayed_at, retention_at)"
        " VALUES (5, 'ledger', 'm-5', 'credits/a', x'7b7d', 2, NULL, 1, 'outbox_full',"
        "         'outbox full', 0, 100, 200, 300, 0, 'requeued', NULL, 300),"
        "        (6, 'ledger', 'm-6', 'credits/b', x'00', 1, '{}', 1, 'handler_failed',"
        "         'boom', 5, 110, 210, 310, 1, 'dead', NULL, 310),"
        "        (11, 'sensors', NULL, 'sensors/x', x'', 0, '{}', 0, 'invalid_payload',"
        "         'no', 1, 120, 220, 320, 0, 'replayed', 330, 320)");
  }
  const std::string before_rows = dead_letter_rows(path);
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(path, {}, &inbox);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(query_int(path, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(dead_letter_rows(path), before_rows);
  EXPECT_EQ(query_int(path,
                      "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name"
                      " IN ('inbox_dead_letters_by_id', 'inbox_dead_letters_by_time',"
                      " 'inbox_dead_letters_retention', 'inbox_dead_letters_requeued')"),
            4);
  std::vector<int64_t> requeued;
  ASSERT_TRUE(store_of(*inbox).requeued_dead_letters("ledger", 10, &requeued).ok());
  EXPECT_EQ(requeued, std::vector<int64_t>{5});
  DeadLetter refused;
  refused.consumer_name = "ledger";
  refused.message_id = "m-12";
  refused.topic = "credits/c";
  refused.reason = DeadLetterReason::kOutboxRefused;
  refused.reason_text = "outbox message id refused: message id is 259 bytes, longer than 256";
  int64_t id = 0;
  ASSERT_TRUE(store_of(*inbox).add_dead_letter(refused, std::nullopt, &id).ok());
  EXPECT_GT(id, 11);
  DeadLetter got;
  ASSERT_TRUE(inbox->get_dead_letter(id, &got).ok());
  EXPECT_EQ(got.reason, DeadLetterReason::kOutboxRefused);
  EXPECT_STREQ(to_string(got.reason), "outbox_refused");
}

}  // namespace
}  // namespace mqtt_inbox::test

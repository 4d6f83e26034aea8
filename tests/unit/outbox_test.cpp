// The outbox core on real SQLite files: enqueue inside the handler's claim transaction and
// inside the application's own, stable ids, class bounds (reject, drop_oldest), order, and
// the relay-side fetch and marks. Assertions read the tables back through a separate
// connection.
#include "mqtt_inbox/outbox.h"

#include <mqtt_inbox/store_then_process.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <set>

#include "store/sqlite/schema.h"
#include "store/store.h"
#include "support/fake_clock.h"
#include "support/ledger_fixture.h"
#include "support/relay_side.h"
#include "support/store_access.h"
#include "util/log.h"

namespace mqtt_inbox::test {
namespace {

class OutboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("inbox.db");
    inbox_ = open_ledger_inbox(db_path_);
    ASSERT_TRUE(inbox_);
  }

  std::unique_ptr<Outbox> make_outbox(OutboxOptions options = {}) {
    std::unique_ptr<Outbox> o;
    const Status s = Outbox::create(inbox_.get(), options, &o);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return o;
  }

  std::unique_ptr<Consumer> make_consumer(Handler handler, ConsumerOptions options = {}) {
    options.max_attempts = 2;
    options.retry_backoff_initial = std::chrono::milliseconds(1);
    options.retry_backoff_max = std::chrono::milliseconds(2);
    std::unique_ptr<Consumer> c;
    const Status s = Consumer::create(inbox_.get(), "ledger", std::move(handler), options, &c);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return c;
  }

  // Enqueues `m` in a transaction of its own on the inbox's connection (store-and-forward).
  Status enqueue_own(Outbox& o, const OutgoingMessage& m, std::string* id = nullptr) {
    Status s;
    inbox_->with_connection([&](SQLite::Database& db) {
      db.exec("BEGIN IMMEDIATE");
      s = o.enqueue(db, m, id);
      db.exec(s.ok() ? "COMMIT" : "ROLLBACK");
    });
    return s;
  }

  int64_t count(const std::string& where = "1") {
    return query_int(db_path_, "SELECT count(*) FROM outbox_messages WHERE " + where);
  }
  std::vector<std::string> pending_payloads() {
    std::vector<std::string> out;
    SQLite::Database db(db_path_, SQLite::OPEN_READONLY);
    SQLite::Statement q(db,
                        "SELECT payload FROM outbox_messages WHERE state = 'pending' ORDER BY seq");
    while (q.executeStep()) out.push_back(q.getColumn(0).getString());
    return out;
  }

  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
};

OutgoingMessage out_msg(const std::string& topic, const std::string& payload,
                        const std::string& id = "") {
  OutgoingMessage m;
  m.topic = topic;
  m.payload = payload;
  m.message_id = id;
  return m;
}

// The handler's enqueue commits with the claim and the credit; a failing attempt rolls all
// three back, and the retry's row carries the same derived id.
TEST_F(OutboxTest, EnqueueCommitsAndRollsBackWithTheClaim) {
  auto outbox = make_outbox();
  int calls = 0;
  auto consumer = make_consumer([&](SQLite::Database& db, const Delivery& d) {
    ledger::apply_credit(db, d);
    OutgoingMessage m = out_msg("events/credited", "credited " + d.message_id);
    m.message_id = derived_message_id(d.message_id, "0");
    outbox->enqueue_or_throw(db, m);
    if (++calls == 1) throw std::runtime_error("first attempt fails after the enqueue");
  });
  EXPECT_EQ(consumer->handle(credit_message("c-1", "a", 5)), Outcome::kProcessed);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(count(), 1);
  EXPECT_EQ(count("message_id = 'c-1/0' AND state = 'pending' AND topic = 'events/credited'"), 1);
  EXPECT_EQ(query_int(db_path_, "SELECT balance FROM accounts WHERE account = 'a'"), 5);
  // A redelivery is a duplicate: no handler, no second row.
  EXPECT_EQ(consumer->handle(credit_message("c-1", "a", 5)), Outcome::kDuplicate);
  EXPECT_EQ(count(), 1);
}

TEST_F(OutboxTest, RollbackOfTheApplicationsTransactionRemovesTheRow) {
  auto outbox = make_outbox();
  inbox_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    ASSERT_TRUE(outbox->enqueue(db, out_msg("telemetry/t", "1")).ok());
    db.exec("ROLLBACK");
  });
  EXPECT_EQ(count(), 0);
  EXPECT_EQ(query_int(db_path_, "SELECT coalesce(sum(rows), 0) FROM outbox_usage"), 0);
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("telemetry/t", "2")).ok());
  EXPECT_EQ(count(), 1);
  EXPECT_EQ(query_int(db_path_, "SELECT rows FROM outbox_usage WHERE class = ''"), 1);
}

TEST_F(OutboxTest, EnqueueOutsideATransactionIsRefused) {
  auto outbox = make_outbox();
  Status s;
  inbox_->with_connection(
      [&](SQLite::Database& db) { s = outbox->enqueue(db, out_msg("telemetry/t", "1")); });
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.to_string();
  EXPECT_EQ(count(), 0);
}

TEST_F(OutboxTest, BadTopicsAndIdsAreRefused) {
  auto outbox = make_outbox();
  for (const char* topic : {"", "a/+/b", "a/#"})
    EXPECT_EQ(enqueue_own(*outbox, out_msg(topic, "x")).code(), Status::Code::kInvalidArgument)
        << topic;
  EXPECT_EQ(enqueue_own(*outbox, out_msg("t", "x", std::string("bad\x01id"))).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(enqueue_own(*outbox, out_msg("t", "x", std::string(300, 'a'))).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(count(), 0);
}

TEST_F(OutboxTest, DerivedIdsAreDeterministicAndEnqueueIsIdempotentOnThem) {
  EXPECT_EQ(derived_message_id("in-7", "0"), "in-7/0");
  EXPECT_EQ(derived_message_id("in-7", "0"), derived_message_id("in-7", "0"));
  EXPECT_NE(derived_message_id("in-7", "0"), derived_message_id("in-7", "1"));
  EXPECT_NE(derived_message_id("in-7", "0"), derived_message_id("in-8", "0"));
  auto outbox = make_outbox();
  std::string a, b;
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("t", "x", derived_message_id("in-7", "0")), &a).ok());
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("t", "x", derived_message_id("in-7", "0")), &b).ok());
  EXPECT_EQ(a, "in-7/0");
  EXPECT_EQ(a, b);
  EXPECT_EQ(count(), 1);
  EXPECT_EQ(outbox->counters().duplicates, 1);
}

// Enqueue claims the id with one INSERT ... ON CONFLICT DO NOTHING (guarantees.md section
// 3), never SELECT then INSERT. The difference shows when another connection commits the
// same id between the two: here an application's deferred transaction, and a second
// writer that commits the id just before enqueue's INSERT starts (an SQLite trace
// callback on the statement). A SELECT would have opened a read snapshot that no longer
// sees the latest data, and the INSERT would fail (SQLITE_BUSY_SNAPSHOT or a UNIQUE
// violation); the claim reads and writes at once and counts a duplicate.
TEST_F(OutboxTest, EnqueueClaimsTheIdInOneStatement) {
  auto outbox = make_outbox();
  SQLite::Database app(db_path_, SQLite::OPEN_READWRITE);
  app.setBusyTimeout(5000);
  SQLite::Database other(db_path_, SQLite::OPEN_READWRITE);
  other.setBusyTimeout(5000);
  struct Race {
    SQLite::Database* other;
    Outbox* outbox;
    int fired = 0;
    Status other_status;
  } race{&other, outbox.get(), 0, Status::Ok()};
  sqlite3_trace_v2(
      app.getHandle(), SQLITE_TRACE_STMT,
      [](unsigned, void* ctx, void*, void* sql) -> int {
        auto* r = static_cast<Race*>(ctx);
        const std::string text(static_cast<const char*>(sql));
        if (text.rfind("INSERT INTO outbox_messages", 0) == 0 && r->fired++ == 0) {
          r->other->exec("BEGIN IMMEDIATE");
          r->other_status = r->outbox->enqueue(*r->other, out_msg("t", "other", "same-id"));
          r->other->exec("COMMIT");
        }
        return 0;
      },
      &race);
  app.exec("BEGIN");  // deferred: the snapshot starts at the first statement
  const Status s = outbox->enqueue(app, out_msg("t", "app", "same-id"));
  app.exec(s.ok() ? "COMMIT" : "ROLLBACK");
  sqlite3_trace_v2(app.getHandle(), 0, nullptr, nullptr);
  ASSERT_EQ(race.fired, 1);
  ASSERT_TRUE(race.other_status.ok()) << race.other_status.to_string();
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(count("message_id = 'same-id'"), 1);
  EXPECT_EQ(pending_payloads(), std::vector<std::string>{"other"});
  EXPECT_EQ(outbox->counters().enqueued, 1);
  EXPECT_EQ(outbox->counters().duplicates, 1);
  EXPECT_EQ(query_int(db_path_, "SELECT rows FROM outbox_usage WHERE class = ''"), 1);
}

// A refused enqueue (the class is full) leaves no row and no usage behind, even when the
// caller ignores the refusal and commits its transaction.
TEST_F(OutboxTest, ARefusedEnqueueLeavesNothingEvenIfTheCallerCommits) {
  OutboxOptions o;
  o.classes = {{"t/", 1, 0, OutboxFullPolicy::kReject}};
  auto outbox = make_outbox(o);
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("t/a", "first", "id-1")).ok());
  Status s;
  inbox_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    s = outbox->enqueue(db, out_msg("t/a", "second", "id-2"));
    db.exec("COMMIT");
  });
  EXPECT_EQ(s.code(), Status::Code::kRejected) << s.to_string();
  EXPECT_EQ(count(), 1);
  EXPECT_EQ(count("message_id = 'id-2'"), 0);
  EXPECT_EQ(query_int(db_path_, "SELECT rows FROM outbox_usage WHERE class = 't/'"), 1);
  EXPECT_EQ(query_int(db_path_, "SELECT bytes FROM outbox_usage WHERE class = 't/'"),
            query_int(db_path_, "SELECT sum(size_bytes) FROM outbox_messages"));
}

TEST_F(OutboxTest, RandomIdsAreVersion4UuidsAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string id;
    ASSERT_TRUE(random_message_id(&id).ok());
    ASSERT_EQ(id.size(), 36u);
    EXPECT_EQ(id[14], '4');
    EXPECT_NE(std::string("89ab").find(id[19]), std::string::npos) << id;
    for (int dash : {8, 13, 18, 23}) EXPECT_EQ(id[dash], '-');
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
  auto outbox = make_outbox();
  std::string id;
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("t", "x"), &id).ok());
  EXPECT_EQ(id.size(), 36u);
  EXPECT_EQ(count("message_id = '" + id + "'"), 1);
}

// reject: the handler's attempt fails while the class is full, the message is retried and
// applied once after the relay marked rows sent.
// A full kReject class is backpressure, not a failure of the message: the Consumer parks
// it (dead letter outbox_full, status 'requeued', no attempt counted), passes that find
// the outbox still full leave it parked however many there are (max_attempts is 2 here),
// a redelivery meanwhile is acked without running the handler, and once the relay has
// made room the next pass applies it once.
TEST_F(OutboxTest, RejectParksTheMessageUntilTheRelayMakesRoom) {
  OutboxOptions options;
  options.classes.push_back({"events/", 2, 0, OutboxFullPolicy::kReject});
  auto outbox = make_outbox(options);
  int runs = 0;
  ConsumerOptions co;
  co.requeue_poll_ms = 0;            // the test calls replay_requeued() itself
  co.dead_letter_payload_bytes = 8;  // dead letters keep 8 bytes; a parked message all
  auto consumer = make_consumer(
      [&](SQLite::Database& db, const Delivery& d) {
        ++runs;
        ledger::apply_credit(db, d);
        outbox->enqueue_or_throw(
            db, out_msg("events/c", d.message_id, derived_message_id(d.message_id, "0")));
      },
      co);
  EXPECT_EQ(consumer->handle(credit_message("c-1", "a", 1)), Outcome::kProcessed);
  EXPECT_EQ(consumer->handle(credit_message("c-2", "a", 2)), Outcome::kProcessed);
  EXPECT_EQ(consumer->handle(credit_message("c-3", "a", 4)), Outcome::kDeadLettered);
  EXPECT_EQ(consumer->handle(credit_message("c-4", "a", 8)), Outcome::kDeadLettered);
  EXPECT_EQ(runs, 4);  // one run each: a full outbox is not retried in the callback
  auto parked = [&](const std::string& status) {
    return query_int(db_path_,
                     "SELECT count(*) FROM inbox_dead_letters WHERE reason = "
                     "'outbox_full' AND attempts = 0 AND status = '" +
                         status + "'");
  };
  EXPECT_EQ(parked("requeued"), 2);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT count(*) FROM inbox_dead_letters WHERE reason_text "
                      "LIKE '%outbox full: class ''events/'' holds 3 rows%'"),
            2);
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM inbox_attempts"), 0);
  EXPECT_EQ(query_int(db_path_, "SELECT balance FROM accounts WHERE account = 'a'"), 3);
  EXPECT_EQ(count(), 2);
  EXPECT_EQ(consumer->counters().outbox_full_parked, 2);
  EXPECT_EQ(consumer->counters().handler_failures, 0);
  EXPECT_EQ(consumer->counters().dead_lettered, 0);

  // Still full: each pass runs the first parked message once, parks it again and stops.
  for (int pass = 0; pass < 4; ++pass) {
    int64_t replayed = -1;
    ASSERT_TRUE(consumer->replay_requeued(&replayed).ok());
    EXPECT_EQ(replayed, 0);
  }
  EXPECT_EQ(runs, 8);
  EXPECT_EQ(parked("requeued"), 2);
  EXPECT_EQ(parked("dead"), 0);
  // A redelivery of a parked message: acked, the handler not run, the row kept.
  EXPECT_EQ(consumer->handle(credit_message("c-3", "a", 4)), Outcome::kAlreadyDeadLettered);
  EXPECT_EQ(runs, 8);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT redeliveries FROM inbox_dead_letters "
                      "WHERE message_id = 'c-3'"),
            1);

  // The relay frees one row: one more fits, the next pass applies c-3 and parks c-4 again.
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[0].seq, 1}}).ok());
  int64_t replayed = 0;
  ASSERT_TRUE(consumer->replay_requeued(&replayed).ok());
  EXPECT_EQ(replayed, 1);
  EXPECT_EQ(query_int(db_path_, "SELECT balance FROM accounts WHERE account = 'a'"), 7);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT count(*) FROM inbox_dead_letters WHERE message_id = "
                      "'c-3' AND status = 'replayed'"),
            1);
  EXPECT_EQ(parked("requeued"), 1);
  // The rest of the room: c-4 applies once, and every credit is in the ledger once.
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[1].seq, 1}}).ok());
  ASSERT_TRUE(consumer->replay_requeued(&replayed).ok());
  EXPECT_EQ(replayed, 1);
  EXPECT_EQ(query_int(db_path_, "SELECT balance FROM accounts WHERE account = 'a'"), 15);
  EXPECT_EQ(query_int(db_path_, "SELECT count(DISTINCT message_id) FROM ledger_entries"), 4);
  EXPECT_EQ(count("state = 'pending'"), 2);
  EXPECT_EQ(count("message_id IN ('c-3/0', 'c-4/0')"), 2);
  EXPECT_EQ(parked("requeued"), 0);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT count(*) FROM inbox_dead_letters WHERE status <> "
                      "'replayed'"),
            0);
}

// A parked message is a message still to apply: the Pruner deletes dead letters past
// dead_letter_window, but never a 'requeued' row, however long the uplink stays down.
TEST(OutboxParking, ParkedMessagesOutliveTheDeadLetterWindow) {
  TempDir dir;
  const std::string path = dir.file("inbox.db");
  FakeClock clock;
  InboxOptions io;
  io.clock = &clock;
  auto inbox = open_ledger_inbox(path, io);
  ASSERT_TRUE(inbox);
  OutboxOptions oo;
  oo.classes.push_back({"events/", 1, 0, OutboxFullPolicy::kReject});
  std::unique_ptr<Outbox> outbox;
  ASSERT_TRUE(Outbox::create(inbox.get(), oo, &outbox).ok());
  ConsumerOptions co;
  co.requeue_poll_ms = 0;
  std::unique_ptr<Consumer> consumer;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "ledger",
                  [&](SQLite::Database& db, const Delivery& d) {
                    ledger::apply_credit(db, d);
                    outbox->enqueue_or_throw(db, out_msg("events/c", d.message_id,
                                                         derived_message_id(d.message_id, "0")));
                  },
                  co, &consumer)
                  .ok());
  EXPECT_EQ(consumer->handle(credit_message("c-1", "a", 1)), Outcome::kProcessed);
  EXPECT_EQ(consumer->handle(credit_message("c-2", "a", 2)), Outcome::kDeadLettered);
  Message no_id;
  no_id.topic = "credits/x";
  no_id.payload = R"({"account":"a","amount":5})";
  EXPECT_EQ(consumer->handle(no_id), Outcome::kDeadLettered);  // missing_id: a real one
  RetentionOptions r;
  r.dead_letter_window = std::chrono::hours(1);
  r.stats_log_period_ms = 0;
  std::unique_ptr<Pruner> pruner;
  ASSERT_TRUE(Pruner::create(inbox.get(), r, &pruner).ok());
  clock.advance(2 * 3600 * 1000);
  PruneResult pr;
  ASSERT_TRUE(pruner->prune_once(&pr).ok());
  EXPECT_EQ(pr.dead_letters_deleted, 1);
  EXPECT_EQ(query_int(path,
                      "SELECT count(*) FROM inbox_dead_letters WHERE reason = "
                      "'missing_id'"),
            0);
  EXPECT_EQ(query_int(path,
                      "SELECT count(*) FROM inbox_dead_letters WHERE reason = "
                      "'outbox_full' AND status = 'requeued'"),
            1);
  // Room at last: the parked credit applies once.
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[0].seq, 1}}).ok());
  int64_t replayed = 0;
  ASSERT_TRUE(consumer->replay_requeued(&replayed).ok());
  EXPECT_EQ(replayed, 1);
  EXPECT_EQ(query_int(path, "SELECT balance FROM accounts WHERE account = 'a'"), 3);
}

// A parked row purged by hand while its replay ran (the replay rolled back, then parks it
// again): the message is written as a new row instead of being lost or failing for ever.
TEST_F(OutboxTest, ReparkingAPurgedRowWritesItAgain) {
  DeadLetter dl;
  dl.consumer_name = "ledger";
  dl.message_id = "c-9";
  dl.topic = "credits/a";
  dl.payload = R"({"message_id":"c-9","account":"a","amount":1})";
  dl.payload_size = static_cast<int64_t>(dl.payload.size());
  dl.reason = DeadLetterReason::kOutboxFull;
  dl.reason_text = "outbox full";
  dl.requeued = true;
  int64_t id = 0;
  ASSERT_TRUE(store_of(*inbox_).add_dead_letter(dl, /*replace_id=*/4242, &id).ok());
  EXPECT_NE(id, 4242);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT count(*) FROM inbox_dead_letters WHERE message_id = "
                      "'c-9' AND status = 'requeued' AND payload_size = " +
                          std::to_string(dl.payload_size)),
            1);
  EXPECT_EQ(inbox_->stats().dead_lettered, 0);  // parked, not dead
}

// A message larger than its class's max_bytes can never fit: refused for good (a dead
// letter outbox_refused at once, one attempt), never parked for ever.
TEST_F(OutboxTest, MessageLargerThanItsClassIsRefusedInsteadOfParking) {
  OutboxOptions options;
  options.classes.push_back({"events/", 0, 64, OutboxFullPolicy::kReject});
  auto outbox = make_outbox(options);
  auto consumer = make_consumer([&](SQLite::Database& db, const Delivery& d) {
    ledger::apply_credit(db, d);
    outbox->enqueue_or_throw(db, out_msg("events/c", std::string(100, 'x')));
  });
  EXPECT_EQ(consumer->handle(credit_message("big-1", "a", 1)), Outcome::kDeadLettered);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT count(*) FROM inbox_dead_letters WHERE reason = "
                      "'outbox_refused' AND status = 'dead' AND attempts = 1"
                      " AND reason_text LIKE '%larger than class ''events/''%'"),
            1);
  EXPECT_EQ(consumer->counters().outbox_full_parked, 0);
  EXPECT_EQ(consumer->counters().handler_failures, 0);
}

// Bounds by bytes as well as rows; other classes and unbounded topics are not affected.
TEST_F(OutboxTest, RejectCountsBytesPerClass) {
  OutboxOptions options;
  options.classes.push_back({"big/", 0, 3000, OutboxFullPolicy::kReject});
  auto outbox = make_outbox(options);
  const std::string kb(1000, 'x');
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("big/a", kb, "b1")).ok());
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("big/a", kb, "b2")).ok());
  const Status full = enqueue_own(*outbox, out_msg("big/a", kb, "b3"));
  EXPECT_EQ(full.code(), Status::Code::kRejected) << full.to_string();
  EXPECT_NE(full.message().find("outbox full"), std::string::npos);
  EXPECT_TRUE(enqueue_own(*outbox, out_msg("other/a", kb, "o1")).ok());
  EXPECT_TRUE(enqueue_own(*outbox, out_msg("big/a", "small", "b4")).ok());
  // A message that can never fit is an argument error, not "full".
  EXPECT_EQ(enqueue_own(*outbox, out_msg("big/a", std::string(4000, 'y'), "b5")).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(count("class = 'big/'"), 3);
  EXPECT_EQ(
      query_int(db_path_, "SELECT bytes FROM outbox_usage WHERE class = 'big/'"),
      query_int(db_path_, "SELECT sum(size_bytes) FROM outbox_messages WHERE class = 'big/'"));
}

// drop_oldest: exact counts, the newest rows kept in order, the longest prefix decides.
TEST_F(OutboxTest, DropOldestKeepsTheNewestAndCountsExactly) {
  OutboxOptions options;
  options.classes.push_back({"telemetry/", 5, 0, OutboxFullPolicy::kDropOldest});
  options.classes.push_back({"telemetry/alarm/", 0, 0, OutboxFullPolicy::kReject});
  auto outbox = make_outbox(options);
  for (int i = 0; i < 12; ++i)
    ASSERT_TRUE(enqueue_own(*outbox, out_msg("telemetry/t", std::to_string(i))).ok());
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(enqueue_own(*outbox, out_msg("telemetry/alarm/x", "alarm")).ok());
  EXPECT_EQ(pending_payloads(),
            (std::vector<std::string>{"7", "8", "9", "10", "11", "alarm", "alarm", "alarm"}));
  EXPECT_EQ(outbox->counters().dropped, 7);
  EXPECT_EQ(query_int(db_path_, "SELECT dropped FROM outbox_usage WHERE class = 'telemetry/'"), 7);
  EXPECT_EQ(query_int(db_path_, "SELECT rows FROM outbox_usage WHERE class = 'telemetry/'"), 5);
  // A drop inside a transaction that rolls back is undone with it.
  inbox_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    ASSERT_TRUE(outbox->enqueue(db, out_msg("telemetry/t", "rolled back")).ok());
    db.exec("ROLLBACK");
  });
  EXPECT_EQ(count("class = 'telemetry/'"), 5);
  EXPECT_EQ(query_int(db_path_, "SELECT dropped FROM outbox_usage WHERE class = 'telemetry/'"), 7);
}

// How many of `ring`'s lines hold `text`.
int lines_with(spdlog::sinks::ringbuffer_sink_mt& ring, const std::string& text) {
  int n = 0;
  for (const auto& line : ring.last_formatted())
    if (line.find(text) != std::string::npos) ++n;
  return n;
}

// An Outbox made without a logger logs where its Inbox does (InboxOptions::logger: a
// service's journal), never to the default "mqtt_inbox" logger; one given its own logger
// logs there only. Each kind of outbox log line: a drop (warn), a dead row (warn), a
// replay and a purge (info).
TEST_F(OutboxTest, LogsToItsInboxsLoggerUnlessGivenOne) {
  auto inbox_ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto inbox_log = std::make_shared<spdlog::logger>("outbox-test-inbox", inbox_ring);
  inbox_log->set_level(spdlog::level::info);
  auto fallback_ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto fallback = detail::logger_or_default(nullptr);  // the "mqtt_inbox" logger
  fallback->sinks().push_back(fallback_ring);
  InboxOptions io;
  io.logger = inbox_log;
  inbox_.reset();
  inbox_ = open_ledger_inbox(db_path_, io);
  ASSERT_TRUE(inbox_);

  OutboxOptions options;
  options.classes.push_back({"telemetry/", 1, 0, OutboxFullPolicy::kDropOldest});
  auto outbox = make_outbox(options);
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("telemetry/t", "1", "l-1")).ok());
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("telemetry/t", "2", "l-2")).ok());  // drops l-1
  EXPECT_EQ(outbox->counters().dropped, 1);
  EXPECT_EQ(count("message_id = 'l-1'"), 0);
  EXPECT_EQ(lines_with(*inbox_ring, "dropped 1 oldest pending row(s), first id 'l-1'"), 1);

  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(relay_side(*outbox)
                  .mark_dead({rows[0].seq, 1}, OutboxDeadReason::kRejectedByBroker, 0x87, "no")
                  .ok());
  EXPECT_EQ(count("message_id = 'l-2' AND state = 'dead'"), 1);
  EXPECT_EQ(lines_with(*inbox_ring, "is an outbox dead letter: rejected_by_broker"), 1);
  ASSERT_TRUE(outbox->replay_dead("l-2").ok());
  EXPECT_EQ(lines_with(*inbox_ring, "dead letter 'l-2' replayed"), 1);
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(
      relay_side(*outbox).mark_dead({rows[0].seq, 1}, OutboxDeadReason::kExpired, 0, "late").ok());
  int64_t removed = 0;
  ASSERT_TRUE(outbox->purge(OutboxPurgeFilter{}, &removed).ok());
  EXPECT_EQ(removed, 1);
  EXPECT_EQ(lines_with(*inbox_ring, "1 dead row(s) purged"), 1);
  EXPECT_EQ(lines_with(*fallback_ring, "outbox:"), 0);

  // An outbox with a logger of its own: its lines go there, not to the inbox's.
  auto own_ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  options.logger = std::make_shared<spdlog::logger>("outbox-test-own", own_ring);
  auto own = make_outbox(options);
  ASSERT_TRUE(enqueue_own(*own, out_msg("telemetry/t", "3", "l-3")).ok());  // drops nothing
  ASSERT_TRUE(enqueue_own(*own, out_msg("telemetry/t", "4", "l-4")).ok());  // drops l-3
  EXPECT_EQ(lines_with(*own_ring, "first id 'l-3'"), 1);
  EXPECT_EQ(lines_with(*inbox_ring, "first id 'l-3'"), 0);
  EXPECT_EQ(lines_with(*fallback_ring, "outbox:"), 0);
  fallback->sinks().pop_back();
}

// fetch_pending returns committed rows in enqueue order from a given seq on and keeps the
// properties; marks move rows out of the pending set and add the publishes they carry to
// attempts, once (a second mark of a row no longer pending changes nothing).
TEST_F(OutboxTest, FetchIsInOrderAndMarksAreFinal) {
  OutboxOptions options;
  options.classes.push_back({"", 100, 0, OutboxFullPolicy::kReject});
  auto outbox = make_outbox(options);
  for (int i = 0; i < 10; ++i) {
    OutgoingMessage m =
        out_msg(i % 2 ? "a/odd" : "a/even", std::to_string(i), "id-" + std::to_string(i));
    m.user_properties = {{"k", "v" + std::to_string(i)}};
    m.content_type = "text/plain";
    if (i == 3) m.ordering_key = "custom";
    ASSERT_TRUE(enqueue_own(*outbox, m).ok());
  }
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 4, &rows).ok());
  ASSERT_EQ(rows.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(rows[i].payload, std::to_string(i));
    EXPECT_EQ(rows[i].message_id, "id-" + std::to_string(i));
    EXPECT_EQ(rows[i].attempts, 0);  // a fetch counts nothing: the relay's marks do
    ASSERT_EQ(rows[i].properties.user_properties.size(), 1u);
    EXPECT_EQ(rows[i].properties.user_properties[0].second, "v" + std::to_string(i));
    EXPECT_EQ(rows[i].properties.content_type.value_or(""), "text/plain");
  }
  EXPECT_EQ(rows[0].ordering_key, "a/even");
  EXPECT_EQ(rows[3].ordering_key, "custom");
  std::vector<OutboxRow> rest;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(rows.back().seq, 100, &rest).ok());
  ASSERT_EQ(rest.size(), 6u);
  EXPECT_EQ(rest.front().payload, "4");
  ASSERT_TRUE(
      relay_side(*outbox).mark_sent({{rows[0].seq, 1}, {rows[1].seq, 3}, {rows[1].seq, 5}}).ok());
  ASSERT_TRUE(
      relay_side(*outbox)
          .mark_dead({rows[2].seq, 2}, OutboxDeadReason::kRejectedByBroker, 0x87, "not authorized")
          .ok());
  // A late mark for a dead row changes nothing.
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[2].seq, 1}}).ok());
  EXPECT_EQ(count("message_id = 'id-0' AND attempts = 1"), 1);
  EXPECT_EQ(count("message_id = 'id-1' AND attempts = 3"), 1);
  EXPECT_EQ(count("message_id = 'id-2' AND attempts = 2"), 1);
  EXPECT_EQ(count("state = 'sent'"), 2);
  EXPECT_EQ(count("state = 'dead' AND dead_reason = 'rejected_by_broker' AND reason_code = 135"),
            1);
  EXPECT_EQ(outbox->counters().sent, 2);
  EXPECT_EQ(query_int(db_path_, "SELECT rows FROM outbox_usage WHERE class = ''"), 7);
  std::vector<OutboxRow> dead;
  ASSERT_TRUE(outbox->list(OutboxState::kDead, 10, &dead).ok());
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].reason_text, "not authorized");
  ASSERT_TRUE(dead[0].dead_reason.has_value());
  EXPECT_EQ(*dead[0].dead_reason, OutboxDeadReason::kRejectedByBroker);
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 100, &rest).ok());
  EXPECT_EQ(rest.size(), 7u);
  EXPECT_EQ(rest.front().payload, "3");
  EXPECT_EQ(rest.front().attempts, 0);  // fetched twice, never marked
}

// A replayed dead letter is pending again under the same id with a new seq past every
// existing row, so a relay that already read past its old seq publishes it; the class
// counts it again, and only dead rows can be replayed.
TEST_F(OutboxTest, ReplayedDeadLetterIsPendingAgainPastTheRelaysCursor) {
  OutboxOptions options;
  options.classes.push_back({"a/", 100, 0, OutboxFullPolicy::kReject});
  auto outbox = make_outbox(options);
  for (const char* id : {"r-1", "r-2", "r-3"})
    ASSERT_TRUE(enqueue_own(*outbox, out_msg("a/x", id, id)).ok());
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 3u);
  const int64_t cursor = rows.back().seq;
  ASSERT_TRUE(
      relay_side(*outbox)
          .mark_dead({rows[0].seq, 1}, OutboxDeadReason::kRejectedByBroker, 0x87, "not authorized")
          .ok());
  EXPECT_EQ(query_int(db_path_, "SELECT rows FROM outbox_usage WHERE class = 'a/'"), 2);

  EXPECT_EQ(outbox->replay_dead("r-2").code(), Status::Code::kInvalidArgument);  // pending
  EXPECT_EQ(outbox->replay_dead("nope").code(), Status::Code::kNotFound);
  ASSERT_TRUE(outbox->replay_dead("r-1").ok());

  OutboxRow r;
  ASSERT_TRUE(outbox->get("r-1", &r).ok());
  EXPECT_EQ(r.state, OutboxState::kPending);
  EXPECT_GT(r.seq, cursor);
  EXPECT_EQ(r.attempts, 0);
  EXPECT_FALSE(r.dead_reason.has_value());
  EXPECT_EQ(r.payload, "r-1");
  EXPECT_EQ(query_int(db_path_, "SELECT rows FROM outbox_usage WHERE class = 'a/'"), 3);
  EXPECT_EQ(count("message_id = 'r-1'"), 1);
  std::vector<OutboxRow> next;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(cursor, 10, &next).ok());
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].message_id, "r-1");
  // Replayed again once dead again: a new seq each time, never one used before.
  ASSERT_TRUE(relay_side(*outbox)
                  .mark_dead({next[0].seq, 1}, OutboxDeadReason::kRejectedByBroker, 0x87, "again")
                  .ok());
  ASSERT_TRUE(outbox->replay_dead("r-1").ok());
  ASSERT_TRUE(outbox->get("r-1", &r).ok());
  EXPECT_GT(r.seq, next[0].seq);
  EXPECT_EQ(outbox->get("nope", &r).code(), Status::Code::kNotFound);
}

// purge deletes the finished rows its filter selects and never a pending one; summary()
// counts every state.
TEST_F(OutboxTest, PurgeDeletesOnlyTheFinishedRowsItSelects) {
  auto outbox = make_outbox();
  for (int i = 0; i < 6; ++i) {
    const std::string id = "p-" + std::to_string(i);
    ASSERT_TRUE(enqueue_own(*outbox, out_msg("t/" + id, "x", id)).ok());
  }
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[0].seq, 1}, {rows[1].seq, 1}}).ok());
  ASSERT_TRUE(relay_side(*outbox)
                  .mark_dead({rows[2].seq, 0}, OutboxDeadReason::kPayloadTooLarge, 0x95, "big")
                  .ok());
  ASSERT_TRUE(relay_side(*outbox)
                  .mark_dead({rows[3].seq, 1}, OutboxDeadReason::kRejectedByBroker, 0x87, "acl")
                  .ok());
  OutboxSummary sum;
  ASSERT_TRUE(outbox->summary(&sum).ok());
  EXPECT_EQ(sum.pending_rows, 2);
  EXPECT_EQ(sum.sent_rows, 2);
  EXPECT_EQ(sum.dead_rows, 2);
  EXPECT_GT(sum.pending_bytes, 0);
  EXPECT_GT(sum.oldest_pending_enqueued_at_ms, 0);

  OutboxPurgeFilter pending;
  pending.state = OutboxState::kPending;
  EXPECT_EQ(outbox->purge(pending).code(), Status::Code::kInvalidArgument);
  OutboxPurgeFilter one;
  one.message_id = "p-2";
  int64_t removed = -1;
  ASSERT_TRUE(outbox->purge(one, &removed).ok());
  EXPECT_EQ(removed, 1);
  one.message_id = "p-4";  // pending: the dead-state filter does not select it
  ASSERT_TRUE(outbox->purge(one, &removed).ok());
  EXPECT_EQ(removed, 0);
  OutboxPurgeFilter old_sent;
  old_sent.state = OutboxState::kSent;
  old_sent.before_ms = 1;  // sent before 1970: none
  ASSERT_TRUE(outbox->purge(old_sent, &removed).ok());
  EXPECT_EQ(removed, 0);
  old_sent.before_ms.reset();
  ASSERT_TRUE(outbox->purge(old_sent, &removed).ok());
  EXPECT_EQ(removed, 2);
  EXPECT_EQ(count("state = 'pending'"), 2);
  EXPECT_EQ(count("state = 'dead'"), 1);
  EXPECT_EQ(count("state = 'sent'"), 0);
  EXPECT_EQ(query_int(db_path_, "SELECT rows FROM outbox_usage WHERE class = ''"), 2);
}

// The relays' wake-up (store/sqlite/commit_wake.h): after the commit of a transaction on the
// inbox's connection that enqueued (or replayed a dead letter), never before it, and not for a
// transaction that enqueued nothing, nor for one that rolled back... until the next commit.
TEST_F(OutboxTest, ACommitThatEnqueuedWakesTheRelaysAfterItCommits) {
  auto outbox = make_outbox();
  int wakes = 0;
  int wakes_in_transaction = -1;
  const uint64_t id = relay_side(*outbox).add_commit_waker([&] { ++wakes; });
  inbox_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    ASSERT_TRUE(outbox->enqueue(db, out_msg("t/a", "1", "w-1")).ok());
    ASSERT_TRUE(outbox->enqueue(db, out_msg("t/a", "2", "w-2")).ok());
    wakes_in_transaction = wakes;
    db.exec("COMMIT");
  });
  EXPECT_EQ(wakes_in_transaction, 0);  // a wake before the commit would find nothing
  EXPECT_EQ(wakes, 1);                 // one per commit, not per row
  // A transaction that enqueued nothing (the per-message path of a consumer without an
  // outbox) wakes no one.
  inbox_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    db.exec("INSERT INTO accounts (account, balance) VALUES ('a', 1)");
    db.exec("COMMIT");
  });
  EXPECT_EQ(wakes, 1);
  // A handler's claim transaction that enqueued.
  auto consumer = make_consumer([&](SQLite::Database& db, const Delivery& d) {
    outbox->enqueue_or_throw(db, out_msg("t/b", "3", derived_message_id(d.message_id, "e")));
  });
  EXPECT_EQ(consumer->handle(credit_message("c-1", "a", 1)), Outcome::kProcessed);
  EXPECT_EQ(wakes, 2);
  // A rolled-back enqueue wakes at the next commit (for nothing, harmlessly).
  inbox_->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    ASSERT_TRUE(outbox->enqueue(db, out_msg("t/a", "x", "w-x")).ok());
    db.exec("ROLLBACK");
  });
  EXPECT_EQ(wakes, 2);
  // A replayed dead letter is pending again: a running relay is woken to send it.
  const int64_t seq =
      query_int(db_path_, "SELECT seq FROM outbox_messages WHERE message_id = 'w-1'");
  ASSERT_TRUE(relay_side(*outbox).mark_dead({seq, 0}, OutboxDeadReason::kExpired, 0, "test").ok());
  const int before_replay = wakes;
  ASSERT_TRUE(outbox->replay_dead("w-1").ok());
  EXPECT_GT(wakes, before_replay);
  // An enqueue on another connection than the inbox's is not watched.
  const int before_other = wakes;
  {
    SQLite::Database other(db_path_, SQLite::OPEN_READWRITE);
    other.setBusyTimeout(5000);
    other.exec("BEGIN IMMEDIATE");
    ASSERT_TRUE(outbox->enqueue(other, out_msg("t/c", "4", "w-4")).ok());
    other.exec("COMMIT");
  }
  EXPECT_EQ(wakes, before_other);
  // Removed: never called again.
  relay_side(*outbox).remove_commit_waker(id);
  ASSERT_TRUE(enqueue_own(*outbox, out_msg("t/a", "5", "w-5")).ok());
  EXPECT_EQ(wakes, before_other);
}

// Every connection the library opened to the file wakes the relays after a commit that
// enqueued (commit_wake.h): a StoreThenProcess worker's (its handler's transaction), and
// another Inbox's of this process on the same file (the application's own transaction);
// a connection the application opened itself does not (it calls Relay::notify()).
TEST_F(OutboxTest, EveryConnectionTheLibraryOpenedWakesTheRelays) {
  auto outbox = make_outbox();
  std::atomic<int> wakes{0};
  const uint64_t id = relay_side(*outbox).add_commit_waker([&] { ++wakes; });
  // A worker's handler enqueues in the transaction that marks its row done.
  StoreThenProcessOptions so;
  so.aggregate_key = aggregate_key_from_topic_level(1);
  so.workers = 2;
  so.poll_interval_ms = 10;
  std::atomic<int> runs{0};
  std::atomic<int> wakes_seen_in_handler{-1};
  std::unique_ptr<StoreThenProcess> stp;
  ASSERT_TRUE(StoreThenProcess::create(
                  inbox_.get(), "readings",
                  [&](SQLite::Database& db, const StoredDelivery& d) {
                    outbox->enqueue_or_throw(db, out_msg("t/stp", "x", d.message_id + "/e"));
                    wakes_seen_in_handler = wakes.load();
                    ++runs;
                  },
                  so, &stp)
                  .ok());
  ASSERT_TRUE(stp->start().ok());
  Message m;
  m.topic = "sensors/d1/reading";
  m.payload = "{\"message_id\":\"s-1\"}";
  ASSERT_EQ(stp->handle(m), Outcome::kProcessed);
  ASSERT_TRUE(wait_until([&] { return wakes.load() >= 1; }, std::chrono::seconds(10)))
      << "runs " << runs.load();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(wakes_seen_in_handler.load(), 0);  // after the commit, not before
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(wakes.load(), 1);  // the claims and the lease renewals wake no one
  EXPECT_EQ(count("message_id = 's-1/e'"), 1);
  // Another Inbox of this process on the same file (exclusive = false).
  InboxOptions shared;
  shared.exclusive = false;
  std::unique_ptr<Inbox> second;
  ASSERT_TRUE(Inbox::open(db_path_, shared, &second).ok());
  second->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    ASSERT_TRUE(outbox->enqueue(db, out_msg("t/own", "y", "own-1")).ok());
    db.exec("COMMIT");
  });
  EXPECT_EQ(wakes.load(), 2);
  // The application's own sqlite3 connection: not watched.
  {
    SQLite::Database other(db_path_, SQLite::OPEN_READWRITE);
    other.setBusyTimeout(5000);
    other.exec("BEGIN IMMEDIATE");
    ASSERT_TRUE(outbox->enqueue(other, out_msg("t/raw", "z", "raw-1")).ok());
    other.exec("COMMIT");
  }
  EXPECT_EQ(wakes.load(), 2);
  relay_side(*outbox).remove_commit_waker(id);
}

// fetch_pending is a read: it returns the committed rows while another connection holds
// SQLite's write lock (BEGIN IMMEDIATE) and writes nothing; the marks, writes, wait for
// the lock (here past the busy timeout: kBusy) and count the publishes they are given.
TEST(OutboxRead, FetchPendingTakesNoWriteLockAndWritesNothing) {
  TempDir dir;
  const std::string path = dir.file("inbox.db");
  InboxOptions io;
  io.busy_timeout_ms = 200;
  auto inbox = open_ledger_inbox(path, io);
  ASSERT_TRUE(inbox);
  std::unique_ptr<Outbox> outbox;
  ASSERT_TRUE(Outbox::create(inbox.get(), {}, &outbox).ok());
  inbox->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(outbox->enqueue(db, out_msg("t/a", "p", "f-" + std::to_string(i))).ok());
    db.exec("COMMIT");
  });
  auto changes = [&] {
    int n = 0;
    inbox->with_connection(
        [&](SQLite::Database& db) { n = sqlite3_total_changes(db.getHandle()); });
    return n;
  };
  const int changes_before = changes();
  SQLite::Database writer(path, SQLite::OPEN_READWRITE);
  writer.exec("BEGIN IMMEDIATE");
  std::vector<OutboxRow> rows;
  const Status s = relay_side(*outbox).fetch_pending(0, 10, &rows);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].attempts, 0);
  EXPECT_EQ(changes(), changes_before);  // nothing written
  EXPECT_EQ(relay_side(*outbox).mark_sent({{rows[0].seq, 2}}).code(), Status::Code::kBusy);
  writer.exec("ROLLBACK");
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[0].seq, 2}}).ok());
  ASSERT_TRUE(
      relay_side(*outbox).mark_dead({rows[1].seq, 0}, OutboxDeadReason::kExpired, 0, "old").ok());
  OutboxRow r;
  ASSERT_TRUE(outbox->get("f-0", &r).ok());
  EXPECT_EQ(r.attempts, 2);
  ASSERT_TRUE(outbox->get("f-1", &r).ok());
  EXPECT_EQ(r.attempts, 0);  // made dead before any publish
}

// Schema step 12 rebuilds outbox_messages for the reason connection_dropped: a file made
// at step 9 keeps every row, its seqs, its pending rows' class usage, and its AUTOINCREMENT
// counter (a pruned last seq is never handed out again: the relay reads past the last seq
// it took), and the triggers still count.
TEST(OutboxSchema, Step12KeepsRowsSeqCounterAndTriggers) {
  TempDir dir;
  const std::string path = dir.file("v9.db");
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    for (const auto& step : detail::schema_steps())
      if (step.version <= 9) db.exec(step.sql);
    ASSERT_EQ(db.execAndGet("PRAGMA user_version").getInt(), 9);
    for (int i = 1; i <= 5; ++i)
      db.exec(
          "INSERT INTO outbox_messages (message_id, ordering_key, class, topic, payload, "
          "properties, size_bytes, enqueued_at) VALUES ('old-" +
          std::to_string(i) + "', 'k', '', 't', 'p', '{}', 10, 1)");
    db.exec("UPDATE outbox_messages SET state = 'dead', dead_reason = 'expired' WHERE seq = 2");
    db.exec("DELETE FROM outbox_messages WHERE seq = 5");  // the last seq, pruned
    ASSERT_EQ(db.execAndGet("SELECT rows FROM outbox_usage WHERE class = ''").getInt(), 3);
  }
  auto inbox = open_ledger_inbox(path);
  ASSERT_TRUE(inbox);
  EXPECT_EQ(query_int(path, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(query_int(path, "SELECT count(*) FROM outbox_messages"), 4);
  EXPECT_EQ(query_int(path,
                      "SELECT count(*) FROM outbox_messages WHERE seq = 2 AND "
                      "state = 'dead' AND dead_reason = 'expired'"),
            1);
  EXPECT_EQ(query_int(path, "SELECT rows FROM outbox_usage WHERE class = ''"), 3);
  std::unique_ptr<Outbox> outbox;
  ASSERT_TRUE(Outbox::create(inbox.get(), {}, &outbox).ok());
  inbox->with_connection([&](SQLite::Database& db) {
    db.exec("BEGIN IMMEDIATE");
    ASSERT_TRUE(outbox->enqueue(db, out_msg("t", "new", "new-1")).ok());
    db.exec("COMMIT");
  });
  EXPECT_EQ(query_int(path, "SELECT seq FROM outbox_messages WHERE message_id = 'new-1'"), 6);
  EXPECT_EQ(query_int(path, "SELECT rows FROM outbox_usage WHERE class = ''"), 4);
  // The new reason is accepted, and leaves the class usage as every dead row does.
  ASSERT_TRUE(relay_side(*outbox)
                  .mark_dead({1, 3}, OutboxDeadReason::kConnectionDropped, 0, "dropped")
                  .ok());
  OutboxRow r;
  ASSERT_TRUE(outbox->get("old-1", &r).ok());
  ASSERT_TRUE(r.dead_reason.has_value());
  EXPECT_EQ(*r.dead_reason, OutboxDeadReason::kConnectionDropped);
  EXPECT_STREQ(to_string(*r.dead_reason), "connection_dropped");
  EXPECT_EQ(query_int(path, "SELECT rows FROM outbox_usage WHERE class = ''"), 3);
  // The same indexes and triggers, word for word, as a file made new by this library.
  const std::string fresh = dir.file("fresh.db");
  ASSERT_TRUE(open_ledger_inbox(fresh));
  auto objects = [](const std::string& db_path) {
    SQLite::Database db(db_path, SQLite::OPEN_READONLY);
    SQLite::Statement q(db,
                        "SELECT type, name, coalesce(sql, '') FROM sqlite_master WHERE "
                        "tbl_name = 'outbox_messages' AND type <> 'table' ORDER BY name");
    std::vector<std::string> out;
    while (q.executeStep())
      out.push_back(q.getColumn(0).getString() + " " + q.getColumn(1).getString() + " " +
                    q.getColumn(2).getString());
    return out;
  };
  const std::vector<std::string> upgraded = objects(path);
  EXPECT_EQ(upgraded.size(), 9u);  // 4 partial indexes, the UNIQUE one, 4 usage triggers
  EXPECT_EQ(upgraded, objects(fresh));
}

TEST_F(OutboxTest, CreateRefusesBadClasses) {
  std::unique_ptr<Outbox> o;
  OutboxOptions dup;
  dup.classes = {{"a/", 1, 0, OutboxFullPolicy::kReject}, {"a/", 2, 0, OutboxFullPolicy::kReject}};
  EXPECT_EQ(Outbox::create(inbox_.get(), dup, &o).code(), Status::Code::kInvalidArgument);
  OutboxOptions neg;
  neg.classes = {{"a/", -1, 0, OutboxFullPolicy::kReject}};
  EXPECT_EQ(Outbox::create(inbox_.get(), neg, &o).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(Outbox::create(nullptr, {}, &o).code(), Status::Code::kInvalidArgument);
}

// Issue 27 item 6: every refusal of enqueue_or_throw that can never succeed, one member
// each, dead-letters the handler's input at once as outbox_refused, with a text that names
// the refusal: one attempt, no retry counted, no backoff waited, nothing of the handler's
// transaction kept; and the message behind it is processed with its event. In a Consumer
// (the ledger credit's handler, as ledger_consumer --emit-topic) and in StoreThenProcess.
namespace refusals {

// What the handler does to its event for the credit with this id, and a piece of the
// refusal's text. The event's id is derived as ledger_consumer derives it.
struct Member {
  std::string incoming_id;
  std::function<void(OutgoingMessage&)> spoil;
  std::string text;
};

std::vector<Member> members() {
  std::vector<Member> out;
  auto add = [&](std::string id, std::function<void(OutgoingMessage&)> spoil, std::string text) {
    out.push_back({std::move(id), std::move(spoil), std::move(text)});
  };
  // The field report: a 250-byte credit id, accepted by the inbox (256), derives
  // "<id>/credited", 259 bytes (derived_message_id throws).
  add(std::string(250, 'L'), nullptr, "259 bytes, longer than the outbox's 256");
  add(
      "id-long", [](OutgoingMessage& m) { m.message_id = std::string(257, 'i'); },
      "message id is 257 bytes, longer than 256");
  add(
      "id-control", [](OutgoingMessage& m) { m.message_id = "bad\x01id"; }, "control character");
  add(
      "id-utf8", [](OutgoingMessage& m) { m.message_id = "\xff\xfe"; }, "not valid UTF-8");
  add(
      "id-blank", [](OutgoingMessage& m) { m.message_id = "   "; }, "only whitespace");
  add(
      "topic-plus", [](OutgoingMessage& m) { m.topic = "events/+/x"; }, "holds a wildcard");
  add(
      "topic-hash", [](OutgoingMessage& m) { m.topic = "events/#"; }, "holds a wildcard");
  add(
      "topic-empty", [](OutgoingMessage& m) { m.topic = ""; }, "outbox topic is empty");
  add(
      "topic-nul", [](OutgoingMessage& m) { m.topic = std::string("events/a\0b", 10); }, "U+0000");
  add(
      "topic-utf8", [](OutgoingMessage& m) { m.topic = "events/\xc3\x28"; }, "not valid UTF-8");
  add(
      "topic-long", [](OutgoingMessage& m) { m.topic = "events/" + std::string(65530, 't'); },
      "65537 bytes, longer than MQTT's 65535");
  add(
      "response-topic", [](OutgoingMessage& m) { m.response_topic = "replies/#"; },
      "response topic 'replies/#' holds a wildcard");
  add(
      "content-type", [](OutgoingMessage& m) { m.content_type = "text/\xff"; }, "content type");
  add(
      "user-property",
      [](OutgoingMessage& m) {
        m.user_properties.push_back({"k", std::string("v\0", 2)});
      },
      "user property 'k' value");
  add(
      "correlation", [](OutgoingMessage& m) { m.correlation_data = std::string(65536, 'c'); },
      "correlation data is 65536 bytes");
  add(
      "format-2", [](OutgoingMessage& m) { m.payload_format_indicator = 2; },
      "payload format indicator 2");
  add(
      "format-utf8",
      [](OutgoingMessage& m) {
        m.payload_format_indicator = 1;
        m.payload = "\xff\xfe";
      },
      "not valid UTF-8");
  add(
      "class-bytes",
      [](OutgoingMessage& m) {
        m.topic = "bulk/x";
        m.payload = std::string(200, 'b');
      },
      "larger than class 'bulk/'");
  return out;
}

// The handler of both modes: the credit, then its event, spoiled as the member says.
void credit_and_event(Outbox& outbox, SQLite::Database& db, const Message& message,
                      const std::string& message_id) {
  ledger::apply_credit(db, Delivery{message, message_id, 1, nullptr});
  OutgoingMessage m;
  m.topic = "events/credited";
  m.payload = "{}";
  m.message_id = derived_message_id(message_id, "credited");
  for (const Member& member : members())
    if (member.incoming_id == message_id && member.spoil) member.spoil(m);
  outbox.enqueue_or_throw(db, m);
}

// `text` as the inside of an SQL string literal.
std::string sql_text(std::string text) {
  for (size_t at = text.find('\''); at != std::string::npos; at = text.find('\'', at + 2))
    text.insert(at, 1, '\'');
  return text;
}

OutboxOptions with_small_class() {
  OutboxOptions o;
  o.classes.push_back({"bulk/", 0, 100, OutboxFullPolicy::kReject});
  return o;
}

}  // namespace refusals

TEST_F(OutboxTest, EveryRefusalForGoodDeadLettersTheInputAtOnceInAConsumer) {
  auto outbox = make_outbox(refusals::with_small_class());
  ConsumerOptions co;
  co.max_attempts = 5;
  co.retry_backoff_initial = std::chrono::milliseconds(1000);  // a retry would show
  co.retry_backoff_max = std::chrono::milliseconds(1000);
  std::unique_ptr<Consumer> consumer;
  std::atomic<int> runs{0};
  ASSERT_TRUE(Consumer::create(
                  inbox_.get(), "ledger",
                  [&](SQLite::Database& db, const Delivery& d) {
                    ++runs;
                    refusals::credit_and_event(*outbox, db, d.message, d.message_id);
                  },
                  co, &consumer)
                  .ok());
  const auto members = refusals::members();
  int n = 0;
  for (const auto& member : members) {
    const std::string next = "ok-" + std::to_string(n++);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(consumer->handle(credit_message(member.incoming_id, "spoiled", 1)),
              Outcome::kDeadLettered)
        << member.text;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900))
        << member.text << ": a refusal for good must not wait for a retry";
    // The stream behind it goes on, with its event.
    EXPECT_EQ(consumer->handle(credit_message(next, "fine", 1)), Outcome::kProcessed);
    EXPECT_EQ(count("message_id = '" + next + "/credited'"), 1);
  }
  const int64_t k = static_cast<int64_t>(members.size());
  EXPECT_EQ(runs.load(), 2 * k);  // one run per message: no retry
  EXPECT_EQ(consumer->counters().dead_lettered, k);
  EXPECT_EQ(consumer->counters().handler_failures, 0);
  EXPECT_EQ(inbox_->stats().retries, 0);
  EXPECT_EQ(consumer->counters().processed, k);
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM inbox_dead_letters"), k);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT count(*) FROM inbox_dead_letters WHERE reason = "
                      "'outbox_refused' AND attempts = 1 AND status = 'dead'"),
            k);
  for (const auto& member : members)
    EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM inbox_dead_letters WHERE message_id = '" +
                                      member.incoming_id + "' AND instr(reason_text, '" +
                                      refusals::sql_text(member.text) + "') > 0"),
              1)
        << member.text;
  // Nothing of a refused message's transaction was kept: no credit, no claim, no event.
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM accounts WHERE account = 'spoiled'"), 0);
  EXPECT_EQ(query_int(db_path_, "SELECT balance FROM accounts WHERE account = 'fine'"), k);
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM inbox_processed"), k);
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM inbox_attempts"), 0);
  EXPECT_EQ(count(), k);
  // A redelivery of a refused message is recognised; the handler does not run again.
  EXPECT_EQ(consumer->handle(credit_message(members[0].incoming_id, "spoiled", 1)),
            Outcome::kAlreadyDeadLettered);
  EXPECT_EQ(runs.load(), 2 * k);
}

TEST_F(OutboxTest, EveryRefusalForGoodDeadLettersTheRowAtOnceInStoreThenProcess) {
  auto outbox = make_outbox(refusals::with_small_class());
  StoreThenProcessOptions o;
  o.workers = 1;
  o.poll_interval_ms = 10;
  o.consumer.max_attempts = 5;
  o.consumer.retry_backoff_initial = std::chrono::milliseconds(60000);  // a retry would stall
  o.consumer.retry_backoff_max = std::chrono::milliseconds(60000);
  std::atomic<int> runs{0};
  std::unique_ptr<StoreThenProcess> stp;
  ASSERT_TRUE(StoreThenProcess::create(
                  inbox_.get(), "ledger",
                  [&](SQLite::Database& db, const StoredDelivery& d) {
                    ++runs;
                    refusals::credit_and_event(*outbox, db, d.message, d.message_id);
                  },
                  o, &stp)
                  .ok());
  const auto members = refusals::members();
  int n = 0;
  for (const auto& member : members) {  // one aggregate: each refused row is in the way
    ASSERT_EQ(stp->handle(credit_message(member.incoming_id, "spoiled", 1)), Outcome::kProcessed);
    ASSERT_EQ(stp->handle(credit_message("ok-" + std::to_string(n++), "fine", 1)),
              Outcome::kProcessed);
  }
  const int64_t k = static_cast<int64_t>(members.size());
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until(
      [&] {
        return query_int(db_path_,
                         "SELECT count(*) FROM inbox_messages WHERE status IN "
                         "('done', 'dead')") == 2 * k;
      },
      std::chrono::seconds(10)))
      << query_int(db_path_, "SELECT count(*) FROM inbox_messages WHERE status = 'pending'");
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(runs.load(), 2 * k);
  EXPECT_EQ(stp->counters().handler_failures, 0);
  EXPECT_EQ(stp->counters().dead_lettered, k);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT count(*) FROM inbox_messages WHERE status = 'dead'"
                      " AND attempts = 1"),
            k);
  EXPECT_EQ(query_int(db_path_,
                      "SELECT count(*) FROM inbox_dead_letters WHERE reason = "
                      "'outbox_refused' AND attempts = 1"),
            k);
  for (const auto& member : members)
    EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM inbox_dead_letters WHERE message_id = '" +
                                      member.incoming_id + "' AND instr(reason_text, '" +
                                      refusals::sql_text(member.text) + "') > 0"),
              1)
        << member.text;
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM accounts WHERE account = 'spoiled'"), 0);
  EXPECT_EQ(query_int(db_path_, "SELECT balance FROM accounts WHERE account = 'fine'"), k);
  EXPECT_EQ(count(), k);
  EXPECT_EQ(count("message_id LIKE 'ok-%/credited'"), k);
}

// The derived id states its limit and checks it: at the limit it is accepted, a byte
// over it is refused with the room left named; the limit follows the outbox's option.
TEST_F(OutboxTest, DerivedIdChecksTheOutboxLimit) {
  const std::string at_limit(256 - 1 - 8, 'a');  // + "/credited" = 256 bytes
  EXPECT_EQ(derived_message_id(at_limit, "credited").size(), 256u);
  try {
    derived_message_id(at_limit + "a", "credited");
    ADD_FAILURE() << "a 257-byte derived id was accepted";
  } catch (const OutboxRefused& e) {
    EXPECT_EQ(e.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("is 257 bytes, longer than the outbox's 256"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("the incoming id is 248 bytes, and the suffix "
                                         "'credited' leaves room for 247 at most"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(derived_message_id(std::string(1000, 'a'), "0", 1024).size(), 1002u);
  EXPECT_THROW(derived_message_id("in", "x", 3), OutboxRefused);
  EXPECT_THROW(derived_message_id("in", "\x01"), OutboxRefused);
  // enqueue_or_throw throws the same class for every refusal for good; a plain enqueue
  // returns kInvalidArgument for them, as before.
  auto outbox = make_outbox();
  inbox_->with_connection([&](SQLite::Database& db) {
    EXPECT_THROW(outbox->enqueue_or_throw(db, out_msg("t", "x")), OutboxRefused);  // no txn
    db.exec("BEGIN IMMEDIATE");
    EXPECT_THROW(outbox->enqueue_or_throw(db, out_msg("t/#", "x")), OutboxRefused);
    EXPECT_EQ(outbox->enqueue(db, out_msg("t", "x", std::string(257, 'a'))).code(),
              Status::Code::kInvalidArgument);
    db.exec("ROLLBACK");
  });
  EXPECT_EQ(count(), 0);
}

}  // namespace
}  // namespace mqtt_inbox::test

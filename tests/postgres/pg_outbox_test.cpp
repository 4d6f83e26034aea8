// The transactional outbox on the PostgreSQL store (issue 30) against a real private
// cluster (support/postgres.h) and a real mosquitto: the enqueue commits and rolls back
// with a PgHandler's change; a duplicate id is one row; class bounds (kReject, drop-oldest)
// with the usage and drop counts in outbox_usage, a full class parking a PgHandler's
// message until the relay makes room; two transactions on two connections
// fitting rows into one bounded class queue up (the second seen waiting on a Lock in
// pg_stat_activity, stepped deterministically) and never exceed the bound; the relay's
// fetch, marks, replay and purge; the Pruner's deletes; and a Relay publishing a
// Consumer's rows once, in order per key, on MQTT 3.1.1 and 5, woken by LISTEN/NOTIFY for
// a row committed by another connection well before its 30 s poll, also after the
// listening connection was cut, and after a server restart. Every case asserts on
// the outbox's rows, the business rows, or what arrived at the broker.
#include <gtest/gtest.h>
#include <mqtt/async_client.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <pqxx/pqxx>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <mqtt_inbox/consumer.h>
#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/outbox.h>
#include <mqtt_inbox/postgres.h>
#include <mqtt_inbox/relay.h>
#include <mqtt_inbox/retention.h>
#include <nlohmann/json.hpp>

#include "store/postgres/admin.h"
#include "support/postgres.h"
#include "support/process.h"
#include "support/relay_side.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

const bool kPostgresEnabled = (enable_postgres_store(), true);

// One cluster per test process (each case runs as its own process under ctest). fsync off:
// durability is pg_store_test's and the crash tests' subject, not this file's.
Postgres& server() {
  static Postgres pg([] {
    Postgres::Options o;
    o.fsync = false;
    return o;
  }());
  return pg;
}

std::string fresh_db(const std::string& name) {
  server().create_database(name);
  server().execute(
      "CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);", name);
  return name;
}

std::string uri_of(const std::string& db, const std::string& app = "") {
  std::string u = server().uri(db);
  if (!app.empty()) u += "&application_name=" + app;
  return u;
}

int64_t q(const std::string& db, const std::string& sql) {
  return std::stoll(server().query_value(sql, db));
}
std::string qs(const std::string& db, const std::string& sql) {
  return server().query_value(sql, db);
}

std::unique_ptr<Inbox> open_inbox(const std::string& uri) {
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(uri, InboxOptions{}, &inbox);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return inbox;
}

std::unique_ptr<Outbox> make_outbox(Inbox* inbox, OutboxOptions o = {}) {
  std::unique_ptr<Outbox> outbox;
  const Status s = Outbox::create(inbox, o, &outbox);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return outbox;
}

Message credit(const std::string& id, const std::string& account, int64_t amount) {
  Message m;
  m.topic = "credits/" + account;
  m.payload = "{\"message_id\":\"" + id + "\",\"account\":\"" + account +
              "\",\"amount\":" + std::to_string(amount) + "}";
  m.qos = 1;
  return m;
}

OutgoingMessage msg(const std::string& topic, const std::string& id, const std::string& payload,
                    const std::string& key = "") {
  OutgoingMessage m;
  m.topic = topic;
  m.message_id = id;
  m.payload = payload;
  m.ordering_key = key;
  return m;
}

ConsumerOptions fast_options() {
  ConsumerOptions o;
  o.retry_backoff_initial = 1ms;
  o.retry_backoff_max = 2ms;
  o.store_backoff_initial = 5ms;
  o.store_backoff_max = 50ms;
  o.requeue_poll_ms = 0;
  return o;
}

// The handler of the tests' ledger: credits the account and enqueues the credit's event,
// derived id, in the claim's transaction; a negative amount fails after the enqueue.
PgHandler crediting(Outbox* outbox, std::atomic<int>* runs = nullptr) {
  return [outbox, runs](pqxx::transaction_base& t, const Delivery& d) {
    if (runs) ++*runs;
    const nlohmann::json& j = *d.payload_json;
    const std::string account = j.at("account").get<std::string>();
    const int64_t amount = j.at("amount").get<int64_t>();
    t.exec_params0(
        "INSERT INTO accounts (id, balance) VALUES ($1, $2)"
        " ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance",
        account, amount);
    OutgoingMessage e;
    e.topic = "events/" + account;
    e.message_id = derived_message_id(d.message_id, "credited");
    e.payload =
        nlohmann::json{{"message_id", e.message_id}, {"account", account}, {"n", amount}}.dump();
    outbox->enqueue_or_throw(t, e);
    if (amount < 0) throw std::runtime_error("negative credit");
  };
}

TEST(PgOutbox, EnqueueCommitsWithTheHandlersChangeAndRollsBackWithIt) {
  const std::string db = fresh_db("commit_rollback");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  EXPECT_EQ(qs(db, "SELECT value FROM mqtt_inbox.inbox_meta WHERE key = 'schema_version'"),
            std::to_string(detail::postgres_schema_version()));
  auto outbox = make_outbox(inbox.get());
  ASSERT_TRUE(outbox);
  std::atomic<int> runs{0};
  std::unique_ptr<Consumer> c;
  ConsumerOptions o = fast_options();
  o.max_attempts = 2;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", crediting(outbox.get(), &runs), o, &c).ok());
  EXPECT_EQ(c->handle(credit("m-1", "alice", 10)), Outcome::kProcessed);
  EXPECT_EQ(c->handle(credit("m-1", "alice", 10)), Outcome::kDuplicate);
  EXPECT_EQ(c->handle(credit("m-2", "alice", 5)), Outcome::kProcessed);
  // Fails after its enqueue, twice: dead-lettered, and neither the credit nor the event
  // stays.
  EXPECT_EQ(c->handle(credit("m-3", "alice", -1)), Outcome::kDeadLettered);
  EXPECT_EQ(runs.load(), 4);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'alice'"), 15);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages"), 2);
  EXPECT_EQ(qs(db,
               "SELECT string_agg(message_id, ',' ORDER BY seq) FROM "
               "mqtt_inbox.outbox_messages WHERE state = 'pending'"),
            "m-1/credited,m-2/credited");
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE message_id LIKE 'm-3%'"),
            0);
  // The trigger counted the two pending rows (class "": no class), and only them.
  EXPECT_EQ(q(db, "SELECT rows FROM mqtt_inbox.outbox_usage WHERE class = ''"), 2);
  EXPECT_EQ(q(db, "SELECT bytes FROM mqtt_inbox.outbox_usage WHERE class = ''"),
            q(db, "SELECT sum(size_bytes) FROM mqtt_inbox.outbox_messages"));
  // The seq and the payload as given; the row's clock is the server's.
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_LT(rows[0].seq, rows[1].seq);
  EXPECT_EQ(nlohmann::json::parse(rows[1].payload)["n"], 5);
  EXPECT_EQ(rows[0].ordering_key, "events/alice");

  // The same id from the application's own transaction: nothing added, and the call
  // succeeds; a refused topic is kInvalidArgument with nothing written.
  pqxx::connection app(uri_of(db));
  {
    pqxx::work w(app);
    std::string id;
    EXPECT_TRUE(outbox->enqueue(w, msg("events/alice", "m-1/credited", "x"), &id).ok());
    EXPECT_EQ(id, "m-1/credited");
    EXPECT_EQ(outbox->enqueue(w, msg("events/#", "bad", "x")).code(),
              Status::Code::kInvalidArgument);
    std::string random_id;
    EXPECT_TRUE(outbox->enqueue(w, msg("events/bob", "", "y"), &random_id).ok());
    EXPECT_EQ(random_id.size(), 36u);
    w.commit();
  }
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages"), 3);
  EXPECT_EQ(outbox->counters().duplicates, 1);
  // An application transaction that rolls back takes its row with it.
  {
    pqxx::work w(app);
    EXPECT_TRUE(outbox->enqueue(w, msg("events/carol", "gone", "z")).ok());
    w.abort();
  }
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE message_id = 'gone'"), 0);
  // A nontransaction commits each statement: refused as no open transaction, nothing written.
  {
    pqxx::nontransaction n(app);
    const Status s = outbox->enqueue(n, msg("events/carol", "autocommit", "z"));
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("open transaction"), std::string::npos) << s.message();
  }
  EXPECT_EQ(
      q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE message_id = 'autocommit'"), 0);
  EXPECT_EQ(q(db, "SELECT rows FROM mqtt_inbox.outbox_usage WHERE class = ''"), 3);
}

// An inbox made by the previous release (schema version 1: no outbox tables) is brought
// to the current version at open, its claims kept, and the outbox then works on it.
TEST(PgOutbox, SchemaVersionOneIsMigratedToTheCurrentOne) {
  const std::string db = fresh_db("migrate");
  {
    auto inbox = open_inbox(uri_of(db));
    ASSERT_TRUE(inbox);
    std::unique_ptr<Consumer> c;
    ASSERT_TRUE(Consumer::create(
                    inbox.get(), "ledger", [](pqxx::transaction_base&, const Delivery&) {},
                    fast_options(), &c)
                    .ok());
    EXPECT_EQ(c->handle(credit("old-1", "a", 1)), Outcome::kProcessed);
  }
  // Version 1 as that release left it.
  server().execute(
      "DROP TABLE mqtt_inbox.outbox_messages, mqtt_inbox.outbox_usage, mqtt_inbox.inbox_messages;"
      "DROP FUNCTION mqtt_inbox.outbox_usage_track();"
      "UPDATE mqtt_inbox.inbox_meta SET value = '1' WHERE key = 'schema_version'",
      db);
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  // Steps 2 (the outbox), 3 (store-then-process) and on, in turn.
  EXPECT_EQ(qs(db, "SELECT value FROM mqtt_inbox.inbox_meta WHERE key = 'schema_version'"),
            std::to_string(detail::postgres_schema_version()));
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 1);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_messages"), 0);
  auto outbox = make_outbox(inbox.get());
  ASSERT_TRUE(outbox);
  pqxx::connection app(uri_of(db));
  pqxx::work w(app);
  ASSERT_TRUE(outbox->enqueue(w, msg("events/a", "after-migration", "p")).ok());
  w.commit();
  EXPECT_EQ(q(db, "SELECT rows FROM mqtt_inbox.outbox_usage WHERE class = ''"), 1);
}

TEST(PgOutbox, ClassBoundsRejectAndDropOldestCountInUsage) {
  const std::string db = fresh_db("bounds");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  OutboxOptions oo;
  oo.classes.push_back({"alerts/", 2, 0, OutboxFullPolicy::kReject, 0});
  oo.classes.push_back({"telemetry/", 3, 0, OutboxFullPolicy::kDropOldest, 0});
  auto outbox = make_outbox(inbox.get(), oo);
  ASSERT_TRUE(outbox);
  pqxx::connection app(uri_of(db));
  for (int i = 0; i < 3; ++i) {
    pqxx::work w(app);
    const Status s = outbox->enqueue(w, msg("alerts/x", "a-" + std::to_string(i), "p"));
    if (i < 2) {
      EXPECT_TRUE(s.ok()) << s.to_string();
    } else {
      EXPECT_EQ(s.code(), Status::Code::kRejected) << s.to_string();
      EXPECT_NE(s.message().find("outbox full"), std::string::npos) << s.message();
    }
    w.commit();  // the refused row was taken out again: committing leaves nothing of it
  }
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE class = 'alerts/'"), 2);
  EXPECT_EQ(q(db, "SELECT rows FROM mqtt_inbox.outbox_usage WHERE class = 'alerts/'"), 2);
  // A handler's enqueue_or_throw throws OutboxFull.
  {
    pqxx::work w(app);
    EXPECT_THROW(outbox->enqueue_or_throw(w, msg("alerts/x", "a-9", "p")), OutboxFull);
  }
  for (int i = 0; i < 5; ++i) {
    pqxx::work w(app);
    ASSERT_TRUE(outbox->enqueue(w, msg("telemetry/t", "t-" + std::to_string(i), "p")).ok());
    w.commit();
  }
  EXPECT_EQ(qs(db,
               "SELECT string_agg(message_id, ',' ORDER BY seq) FROM "
               "mqtt_inbox.outbox_messages WHERE class = 'telemetry/'"),
            "t-2,t-3,t-4");
  std::vector<OutboxClassUsage> usage;
  ASSERT_TRUE(outbox->usage(&usage).ok());
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].class_prefix, "alerts/");
  EXPECT_EQ(usage[1].class_prefix, "telemetry/");
  EXPECT_EQ(usage[1].rows, 3);
  EXPECT_EQ(usage[1].dropped, 2);
  EXPECT_EQ(outbox->counters().dropped, 2);
  EXPECT_EQ(outbox->counters().rejected, 2);
  // Row measurement (InboxStats) reads the outbox too.
  ASSERT_TRUE(inbox->refresh_row_stats().ok());
  const InboxStats st = inbox->stats();
  EXPECT_EQ(st.outbox.classes.at("telemetry/").pending_rows, 3);
  EXPECT_EQ(st.outbox.classes.at("telemetry/").dropped, 2);
}

// A PgHandler's enqueue into a full kReject class: the Consumer parks the credit as a
// 'requeued' outbox_full dead letter (nothing applied, no attempt counted), and replays it
// once the relay has made room: applied once, its event enqueued.
TEST(PgOutbox, AFullClassParksTheHandlersMessageAndItIsReplayedWhenThereIsRoom) {
  const std::string db = fresh_db("parked");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  OutboxOptions oo;
  oo.classes.push_back({"events/", 1, 0, OutboxFullPolicy::kReject, 0});
  auto outbox = make_outbox(inbox.get(), oo);
  ASSERT_TRUE(outbox);
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(
      Consumer::create(inbox.get(), "ledger", crediting(outbox.get()), fast_options(), &c).ok());
  EXPECT_EQ(c->handle(credit("p-1", "alice", 10)), Outcome::kProcessed);
  const Outcome parked = c->handle(credit("p-2", "alice", 5));
  EXPECT_EQ(parked, Outcome::kDeadLettered) << to_string(parked);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'alice'"), 10);
  EXPECT_EQ(qs(db, "SELECT reason || ':' || status FROM mqtt_inbox.inbox_dead_letters"),
            "outbox_full:requeued");
  // Still full: a pass parks it again.
  int64_t replayed = -1;
  ASSERT_TRUE(c->replay_requeued(&replayed).ok());
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'alice'"), 10);
  // The relay sends the first event: room.
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[0].seq, 1}}).ok());
  ASSERT_TRUE(c->replay_requeued(&replayed).ok());
  EXPECT_EQ(replayed, 1);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'alice'"), 15);
  EXPECT_EQ(qs(db, "SELECT status FROM mqtt_inbox.inbox_dead_letters"), "replayed");
  EXPECT_EQ(qs(db,
               "SELECT string_agg(message_id || ':' || state, ',' ORDER BY seq) FROM "
               "mqtt_inbox.outbox_messages"),
            "p-1/credited:sent,p-2/credited:pending");
  EXPECT_EQ(c->handle(credit("p-2", "alice", 5)), Outcome::kDuplicate);
}

// Two transactions on two connections fit a row each into a class bounded to one row:
// the second queues up behind the first (pg_stat_activity: wait_event_type 'Lock') and,
// once the first commits, is refused (full); once the first rolls back, it fits.
void concurrent_bounded(bool first_commits) {
  const std::string db = fresh_db(first_commits ? "conc_commit" : "conc_abort");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  OutboxOptions oo;
  oo.classes.push_back({"alerts/", 1, 0, OutboxFullPolicy::kReject, 0});
  auto outbox = make_outbox(inbox.get(), oo);
  ASSERT_TRUE(outbox);
  pqxx::connection a(uri_of(db, "enqueue_a")), b(uri_of(db, "enqueue_b"));
  const int pid_b = b.backendpid();
  pqxx::work wa(a);
  ASSERT_TRUE(outbox->enqueue(wa, msg("alerts/x", "from-a", "p")).ok());
  std::promise<Status> b_done;
  auto fb = b_done.get_future();
  std::thread tb([&] {
    pqxx::work wb(b);
    Status s = outbox->enqueue(wb, msg("alerts/x", "from-b", "p"));
    if (s.ok()) wb.commit();
    b_done.set_value(s);
  });
  ASSERT_TRUE(server().wait_for_lock_wait(pid_b, 10s)) << "B's enqueue did not wait for A's";
  EXPECT_EQ(fb.wait_for(200ms), std::future_status::timeout);
  if (first_commits)
    wa.commit();
  else
    wa.abort();
  const Status sb = fb.get();
  tb.join();
  if (first_commits) {
    EXPECT_EQ(sb.code(), Status::Code::kRejected) << sb.to_string();
    EXPECT_EQ(qs(db, "SELECT string_agg(message_id, ',') FROM mqtt_inbox.outbox_messages"),
              "from-a");
  } else {
    EXPECT_TRUE(sb.ok()) << sb.to_string();
    EXPECT_EQ(qs(db, "SELECT string_agg(message_id, ',') FROM mqtt_inbox.outbox_messages"),
              "from-b");
  }
  EXPECT_EQ(q(db, "SELECT rows FROM mqtt_inbox.outbox_usage WHERE class = 'alerts/'"), 1);
}

TEST(PgOutbox, ConcurrentEnqueuesIntoABoundedClassQueueUpFirstCommits) { concurrent_bounded(true); }
TEST(PgOutbox, ConcurrentEnqueuesIntoABoundedClassQueueUpFirstRollsBack) {
  concurrent_bounded(false);
}

// Seq order is commit order: B enqueues into another class than A (no usage row shared)
// and still waits for A's transaction to end, so a relay that read B's row could never
// find A's, with its lower seq, committed after it. With A still open, no reader sees B's
// row; once both commit, A's seq is the lower.
TEST(PgOutbox, EnqueuingTransactionsTakeTurnsSoSeqOrderIsCommitOrder) {
  const std::string db = fresh_db("seq_order");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  OutboxOptions oo;
  oo.classes.push_back({"alerts/", 100, 0, OutboxFullPolicy::kReject, 0});
  auto outbox = make_outbox(inbox.get(), oo);
  ASSERT_TRUE(outbox);
  pqxx::connection a(uri_of(db, "seq_a")), b(uri_of(db, "seq_b"));
  const int pid_b = b.backendpid();
  pqxx::work wa(a);
  ASSERT_TRUE(outbox->enqueue(wa, msg("alerts/x", "first", "p")).ok());
  auto fb = std::async(std::launch::async, [&] {
    pqxx::work wb(b);
    Status st = outbox->enqueue(wb, msg("telemetry/y", "second", "p"));
    if (st.ok()) wb.commit();
    return st;
  });
  ASSERT_TRUE(server().wait_for_lock_wait(pid_b, 10s)) << "B did not wait for A's transaction";
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  EXPECT_TRUE(rows.empty());
  wa.commit();
  const Status sb = fb.get();
  ASSERT_TRUE(sb.ok()) << sb.to_string();
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].message_id, "first");
  EXPECT_EQ(rows[1].message_id, "second");
}

TEST(PgOutbox, FetchMarksReplayPurgeAndPrune) {
  const std::string db = fresh_db("relay_side");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  auto outbox = make_outbox(inbox.get());
  ASSERT_TRUE(outbox);
  pqxx::connection app(uri_of(db));
  {
    pqxx::work w(app);
    for (const char* id : {"r-1", "r-2", "r-3"})
      ASSERT_TRUE(outbox->enqueue(w, msg("events/x", id, std::string("\0bin", 4))).ok());
    w.commit();
  }
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].payload, std::string("\0bin", 4));  // bytea, byte for byte
  const int64_t s1 = rows[0].seq, s2 = rows[1].seq, s3 = rows[2].seq;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(s1, 1, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].seq, s2);
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{s1, 2}}).ok());
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{s1, 1}}).ok());  // no longer pending: skipped
  ASSERT_TRUE(
      relay_side(*outbox).mark_dead({s2, 1}, OutboxDeadReason::kRejectedByBroker, 0x87, "no").ok());
  EXPECT_EQ(qs(db,
               "SELECT state || ':' || attempts FROM mqtt_inbox.outbox_messages WHERE "
               "message_id = 'r-1'"),
            "sent:2");
  EXPECT_EQ(qs(db,
               "SELECT state || ':' || dead_reason || ':' || reason_code FROM "
               "mqtt_inbox.outbox_messages WHERE message_id = 'r-2'"),
            "dead:rejected_by_broker:135");
  EXPECT_EQ(q(db, "SELECT rows FROM mqtt_inbox.outbox_usage WHERE class = ''"), 1);
  EXPECT_EQ(outbox->counters().sent, 1);
  EXPECT_EQ(outbox->counters().dead, 1);
  OutboxSummary sum;
  ASSERT_TRUE(outbox->summary(&sum).ok());
  EXPECT_EQ(sum.pending_rows, 1);
  EXPECT_EQ(sum.sent_rows, 1);
  EXPECT_EQ(sum.dead_rows, 1);
  EXPECT_GT(sum.oldest_pending_enqueued_at_ms, 0);
  OutboxRow got;
  ASSERT_TRUE(outbox->get("r-2", &got).ok());
  EXPECT_EQ(got.state, OutboxState::kDead);
  EXPECT_EQ(got.reason_code, 0x87);
  EXPECT_EQ(outbox->get("nope", &got).code(), Status::Code::kNotFound);
  ASSERT_TRUE(outbox->list(OutboxState::kDead, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);

  // Replay: pending again under a new seq past every seq taken, attempts 0, counted again.
  ASSERT_TRUE(outbox->replay_dead("r-2").ok());
  EXPECT_EQ(outbox->replay_dead("r-1").code(), Status::Code::kInvalidArgument);  // sent
  EXPECT_EQ(outbox->replay_dead("nope").code(), Status::Code::kNotFound);
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(s3, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].message_id, "r-2");
  EXPECT_GT(rows[0].seq, s3);
  EXPECT_EQ(rows[0].attempts, 0);
  EXPECT_FALSE(rows[0].dead_reason);
  EXPECT_EQ(q(db, "SELECT rows FROM mqtt_inbox.outbox_usage WHERE class = ''"), 2);

  // Purge: sent rows only when asked for them; never pending.
  int64_t removed = -1;
  OutboxPurgeFilter f;
  f.state = OutboxState::kSent;
  ASSERT_TRUE(outbox->purge(f, &removed).ok());
  EXPECT_EQ(removed, 1);
  f.state = OutboxState::kPending;
  EXPECT_EQ(outbox->purge(f, &removed).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages"), 2);

  // The Pruner deletes sent and dead rows past their windows (retention_at on the
  // server's clock), never pending ones.
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[0].seq, 1}}).ok());
  ASSERT_TRUE(relay_side(*outbox).mark_dead({s3, 0}, OutboxDeadReason::kExpired, 0, "old").ok());
  server().execute("UPDATE mqtt_inbox.outbox_messages SET retention_at = retention_at - 7200000",
                   db);
  {
    pqxx::work w(app);
    ASSERT_TRUE(outbox->enqueue(w, msg("events/x", "r-4", "p")).ok());
    w.commit();
  }
  RetentionOptions ro;
  ro.window = std::chrono::hours(1);
  ro.dead_letter_window = std::chrono::hours(1);
  ro.allow_window_below_horizon = true;  // the horizon is not this case's subject
  std::unique_ptr<Pruner> pruner;
  const Status ps = Pruner::create(inbox.get(), ro, &pruner);
  ASSERT_TRUE(ps.ok()) << ps.to_string();
  PruneResult pr;
  const Status run = pruner->prune_once(&pr);
  ASSERT_TRUE(run.ok()) << run.to_string();
  EXPECT_EQ(qs(db,
               "SELECT string_agg(message_id || ':' || state, ',') FROM "
               "mqtt_inbox.outbox_messages"),
            "r-4:pending");
}

// What a raw MQTT subscriber saw: payload ids in arrival order.
struct Seen {
  std::mutex mu;
  std::vector<nlohmann::json> events;
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return events.size();
  }
};

// What `seen` holds is `count` distinct message ids, each once, and per account in the order of
// their "n" field (the enqueue order).
void expect_each_once_in_order(Seen& seen, size_t count) {
  std::lock_guard<std::mutex> l(seen.mu);
  std::map<std::string, int> times;
  std::map<std::string, int64_t> last_n;
  for (const auto& e : seen.events) {
    ++times[e["message_id"].get<std::string>()];
    const std::string acct = e["account"].get<std::string>();
    const int64_t n = e["n"].get<int64_t>();
    auto it = last_n.find(acct);
    if (it != last_n.end()) {
      EXPECT_GT(n, it->second) << acct << " out of order";
    }
    last_n[acct] = n;
  }
  EXPECT_EQ(times.size(), count);
  for (const auto& t : times) EXPECT_EQ(t.second, 1) << t.first;
}

std::unique_ptr<mqtt::async_client> subscribe(const std::string& uri, const std::string& client,
                                              Seen* seen) {
  auto c = std::make_unique<mqtt::async_client>(uri, client);
  c->set_message_callback([seen](mqtt::const_message_ptr m) {
    std::lock_guard<std::mutex> l(seen->mu);
    seen->events.push_back(nlohmann::json::parse(m->get_payload_str()));
  });
  auto opts = mqtt::connect_options_builder().clean_session(true).finalize();
  c->connect(opts)->wait();
  c->subscribe("events/#", 1)->wait();
  return c;
}

bool wait_until(const std::function<bool()>& f, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return f();
}

std::unique_ptr<Relay> make_relay(Outbox* outbox, const std::string& uri, MqttVersion v,
                                  int poll_ms, const std::string& lock_dir) {
  RelayOptions o;
  o.mqtt_version = v;
  o.broker_uri = uri;
  o.client_id = "pg-relay";
  o.client_id_lock_dir = lock_dir;
  o.poll_interval_ms = poll_ms;
  o.reconnect_backoff_initial_ms = 50;
  o.reconnect_backoff_max_ms = 300;
  std::unique_ptr<Relay> r;
  const Status s = Relay::create(outbox, o, &r);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return r;
}

// Rows `<prefix>from` .. `<prefix>(to-1)` on `topic`, each enqueued through `outbox` in an
// application transaction of its own, for accounts acct0..acct2 in turn (the order
// expect_each_once_in_order checks).
void enqueue_rows(const std::string& db, Outbox* outbox, const std::string& topic,
                  const std::string& prefix, int from, int to) {
  for (int i = from; i < to; ++i) {
    pqxx::connection app(uri_of(db, "app"));
    pqxx::work w(app);
    const std::string id = prefix + std::to_string(i);
    ASSERT_TRUE(
        outbox
            ->enqueue(w, msg(topic, id,
                             R"({"message_id":")" + id + R"(","account":"acct)" +
                                 std::to_string(i % 3) + R"(","n":)" + std::to_string(i) + "}"))
            .ok());
    w.commit();
  }
}

class PgRelay : public ::testing::TestWithParam<MqttVersion> {
 protected:
  void two_relays_take_turns(const std::string& db, bool one_host);
  Broker broker_;
  TempDir dir_;
};

// Rows a Consumer's PgHandler enqueued go out once each, in order per key, and are marked
// sent; a row committed by another connection (another Inbox's Outbox, in an application
// transaction: no commit of this Inbox) wakes the relay through NOTIFY long before its
// 30 s poll.
TEST_P(PgRelay, PublishesHandlerRowsOnceInOrderAndWakesOnNotify) {
  const std::string db = fresh_db(GetParam() == MqttVersion::kV5 ? "relay_v5" : "relay_v311");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  auto outbox = make_outbox(inbox.get());
  ASSERT_TRUE(outbox);
  Seen seen;
  auto sub = subscribe(broker_.uri(), "pg-outbox-watcher", &seen);
  auto relay = make_relay(outbox.get(), broker_.uri(), GetParam(), 30000, dir_.path());
  ASSERT_TRUE(relay);
  ASSERT_TRUE(relay->start().ok());
  ASSERT_TRUE(wait_until([&] { return relay->counters().connected; }, 10s));

  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(
      Consumer::create(inbox.get(), "ledger", crediting(outbox.get()), fast_options(), &c).ok());
  const int kCredits = 60;
  for (int i = 0; i < kCredits; ++i)
    ASSERT_EQ(c->handle(credit("c-" + std::to_string(i), "acct" + std::to_string(i % 3), i + 1)),
              Outcome::kProcessed);
  ASSERT_TRUE(wait_until(
      [&] {
        return q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE state = 'sent'") ==
               kCredits;
      },
      20s))
      << q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE state = 'sent'");
  ASSERT_TRUE(wait_until([&] { return seen.size() >= static_cast<size_t>(kCredits); }, 10s));
  std::this_thread::sleep_for(300ms);  // room for a duplicate to show
  {
    std::lock_guard<std::mutex> l(seen.mu);
    EXPECT_EQ(seen.events.size(), static_cast<size_t>(kCredits));
  }
  expect_each_once_in_order(seen, kCredits);

  // Another Inbox on the same database (as another gateway's would be), enqueuing in the
  // application's own transaction: only NOTIFY can wake this relay before its poll.
  auto other = open_inbox(uri_of(db, "other_gateway"));
  ASSERT_TRUE(other);
  auto other_outbox = make_outbox(other.get());
  std::this_thread::sleep_for(500ms);  // the relay is idle in its 30 s poll
  pqxx::connection app(uri_of(db, "other_app"));
  const auto t0 = std::chrono::steady_clock::now();
  {
    pqxx::work w(app);
    ASSERT_TRUE(other_outbox
                    ->enqueue(w, msg("events/zed", "elsewhere-1",
                                     R"({"message_id":"elsewhere-1","account":"zed","n":1})"))
                    .ok());
    w.commit();
  }
  ASSERT_TRUE(wait_until([&] { return seen.size() > static_cast<size_t>(kCredits); }, 10s))
      << "the row committed elsewhere did not wake the relay";
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  EXPECT_LT(waited, 10s) << waited.count() << " ms";
  std::printf("row committed elsewhere arrived after %lld ms (relay poll 30000 ms)\n",
              static_cast<long long>(waited.count()));
  {
    std::lock_guard<std::mutex> l(seen.mu);
    EXPECT_EQ(seen.events.back()["message_id"], "elsewhere-1");
  }

  // The listening connection is cut (its backend terminated, as a server restart or a
  // failover would): the inbox LISTENs again by itself, and the next row committed
  // elsewhere still wakes the relay long before its poll.
  EXPECT_EQ(q(db,
              "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE "
              "'LISTEN%' AND pid <> pg_backend_pid()"),
            1);
  ASSERT_TRUE(wait_until(
      [&] {
        return q(db,
                 "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> "
                 "pg_backend_pid()") == 1;
      },
      10s))
      << "the inbox did not LISTEN again";
  std::this_thread::sleep_for(300ms);
  const auto t1 = std::chrono::steady_clock::now();
  {
    pqxx::work w(app);
    ASSERT_TRUE(other_outbox
                    ->enqueue(w, msg("events/zed", "elsewhere-2",
                                     R"({"message_id":"elsewhere-2","account":"zed","n":2})"))
                    .ok());
    w.commit();
  }
  ASSERT_TRUE(wait_until([&] { return seen.size() > static_cast<size_t>(kCredits) + 1; }, 5s))
      << "after the LISTEN connection was cut, a row committed elsewhere did not wake the relay";
  std::printf("after the LISTEN connection was cut: arrived after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - t1)
                                         .count()));
  EXPECT_TRUE(relay->stop().ok());
  // The last waker removed: the listening connection is closed.
  EXPECT_TRUE(wait_until(
      [&] {
        return q(db,
                 "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> "
                 "pg_backend_pid()") == 0;
      },
      5s));
  sub->disconnect()->wait();
}

// A server restart under a running relay: the store's connection and the listening one
// are both cut (57P01). Rows a PgHandler enqueues after the restart, and a row committed
// by another connection, still go out once each, long before the relay's 30 s poll: the
// inbox LISTENs again by itself.
TEST_P(PgRelay, ServerRestartTheRelayAndItsWakeUpGoOn) {
  const std::string db = fresh_db(GetParam() == MqttVersion::kV5 ? "restart_v5" : "restart_v311");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  auto outbox = make_outbox(inbox.get());
  ASSERT_TRUE(outbox);
  Seen seen;
  auto sub = subscribe(broker_.uri(), "pg-outbox-watcher", &seen);
  auto relay = make_relay(outbox.get(), broker_.uri(), GetParam(), 30000, dir_.path());
  ASSERT_TRUE(relay);
  ASSERT_TRUE(relay->start().ok());
  ASSERT_TRUE(wait_until([&] { return relay->counters().connected; }, 10s));
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(
      Consumer::create(inbox.get(), "ledger", crediting(outbox.get()), fast_options(), &c).ok());
  for (int i = 0; i < 10; ++i)
    ASSERT_EQ(c->handle(credit("b-" + std::to_string(i), "acct", i + 1)), Outcome::kProcessed);
  ASSERT_TRUE(wait_until([&] { return seen.size() >= 10; }, 10s));

  server().restart();

  // The Consumer reconnects at its next message (handle() waits out the store).
  for (int i = 10; i < 20; ++i)
    ASSERT_EQ(c->handle(credit("b-" + std::to_string(i), "acct", i + 1)), Outcome::kProcessed);
  ASSERT_TRUE(wait_until([&] { return seen.size() >= 20; }, 10s))
      << "rows enqueued after the restart were not sent: " << seen.size();
  ASSERT_TRUE(wait_until(
      [&] {
        return q(db,
                 "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> "
                 "pg_backend_pid()") == 1;
      },
      10s))
      << "the inbox did not LISTEN again after the restart";
  // The restart also ended the relay turn's session: the relay learns it at its next
  // renewal, gives the turn up (unmarked rows in flight then go out again, the next hop's
  // inbox drops them) and takes it on a new session. Once it has, a row committed elsewhere
  // goes out once.
  ASSERT_TRUE(wait_until(
      [&] {
        return q(db,
                 "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                 "'mqtt-inbox outbox relay%'") == 1 &&
               relay->counters().connected;
      },
      15s))
      << "the relay did not take its turn again after the restart";
  auto other = open_inbox(uri_of(db, "other_gateway"));
  ASSERT_TRUE(other);
  auto other_outbox = make_outbox(other.get());
  pqxx::connection app(uri_of(db, "other_app"));
  const auto t0 = std::chrono::steady_clock::now();
  {
    pqxx::work w(app);
    ASSERT_TRUE(other_outbox
                    ->enqueue(w, msg("events/zed", "after-restart",
                                     R"({"message_id":"after-restart","account":"zed","n":1})"))
                    .ok());
    w.commit();
  }
  ASSERT_TRUE(wait_until([&] { return seen.size() >= 21; }, 5s))
      << "a row committed elsewhere after the restart did not wake the relay";
  std::printf("after a server restart: a row committed elsewhere arrived after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count()));
  ASSERT_TRUE(wait_until(
      [&] {
        return q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE state = 'sent'") == 21;
      },
      10s));
  std::this_thread::sleep_for(300ms);
  {
    // Every event arrived, the first copy of each in order. A mark lost with the
    // connection, or PUBACKs that came after the turn was lost, only mean a resend with the
    // same id, after the rows that followed (the next hop's inbox drops the copy): whether
    // the restart catches marks in flight is timing, so copies are allowed here. The wait
    // above (10 s, a third of the relay's 30 s poll) also says that marks failed at the
    // restart do not hold back the marks of what came after until the next poll.
    std::lock_guard<std::mutex> l(seen.mu);
    std::set<std::string> ids;
    int64_t last = 0;
    for (const auto& e : seen.events) {
      const bool first = ids.insert(e["message_id"].get<std::string>()).second;
      if (first && e["account"] == "acct") {
        EXPECT_GT(e["n"].get<int64_t>(), last) << "out of order";
        last = e["n"].get<int64_t>();
      }
    }
    EXPECT_EQ(ids.size(), 21u);
  }
  EXPECT_TRUE(relay->stop().ok());
  sub->disconnect()->wait();
}

// Two relays of one outbox, in two inboxes on one database (as two fleet members'
// would be; docs/outbox.md#several-relays): one holds the relay turn and publishes, the
// other stands by, disconnected, so each row goes out once, in order per key; when the
// holder stops, the other takes the turn and publishes what follows. Without the turn both
// published every row they found pending (issue 30: 4,000 copies of 2,000). As on two
// hosts (a client-id lock folder each) and on one (one folder: the client-id lock goes
// with the turn, so the second relay's start() is not refused and it takes over).
TEST_P(PgRelay, TwoRelaysTakeTurnsEachRowOnce) {
  two_relays_take_turns(fresh_db(GetParam() == MqttVersion::kV5 ? "turns_v5" : "turns_v311"),
                        /*one_host=*/false);
}

TEST_P(PgRelay, TwoRelaysOnOneHostTakeTurnsWithTheClientIdLock) {
  two_relays_take_turns(fresh_db(GetParam() == MqttVersion::kV5 ? "turns1_v5" : "turns1_v311"),
                        /*one_host=*/true);
}

void PgRelay::two_relays_take_turns(const std::string& db, bool one_host) {
  auto inbox_a = open_inbox(uri_of(db, "member_a"));
  auto inbox_b = open_inbox(uri_of(db, "member_b"));
  ASSERT_TRUE(inbox_a && inbox_b);
  auto outbox_a = make_outbox(inbox_a.get());
  auto outbox_b = make_outbox(inbox_b.get());
  Seen seen;
  auto sub = subscribe(broker_.uri(), "pg-outbox-watcher", &seen);
  TempDir locks_a, locks_b;  // one client id; a lock folder each, or one for both
  auto relay_a = make_relay(outbox_a.get(), broker_.uri(), GetParam(), 200, locks_a.path());
  ASSERT_TRUE(relay_a && relay_a->start().ok());
  ASSERT_TRUE(wait_until([&] { return relay_a->counters().connected; }, 10s));
  auto relay_b = make_relay(outbox_b.get(), broker_.uri(), GetParam(), 200,
                            one_host ? locks_a.path() : locks_b.path());
  ASSERT_TRUE(relay_b && relay_b->start().ok());

  enqueue_rows(db, outbox_a.get(), "events/t", "t-", 0, 40);
  enqueue_rows(db, outbox_b.get(), "events/t", "t-", 40, 80);
  ASSERT_TRUE(wait_until([&] { return seen.size() >= 80; }, 20s)) << seen.size();
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(relay_b->counters().connected) << "the relay without the turn connected";

  // The holder stops (a member leaving): the other takes the turn and goes on.
  ASSERT_TRUE(relay_a->stop().ok());
  enqueue_rows(db, outbox_b.get(), "events/t", "t-", 80, 120);
  ASSERT_TRUE(wait_until([&] { return seen.size() >= 120; }, 20s)) << seen.size();
  EXPECT_TRUE(relay_b->counters().connected);
  std::this_thread::sleep_for(500ms);  // room for a duplicate to show
  expect_each_once_in_order(seen, 120);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.outbox_messages WHERE state = 'sent'"), 120);
  EXPECT_TRUE(relay_b->stop().ok());
  sub->disconnect()->wait();
}

// Two relays on one host (one client-id lock folder). The holder is cut from the broker
// (it keeps the turn: it renews between its connection attempts) and then loses the turn
// while disconnected (its turn's server session ends, as an operator's
// pg_terminate_backend or a failover ends it); the other relay takes the turn. The
// client-id lock must follow the turn: a relay that kept it while standing by left the
// other one holding a turn it could not use, and nothing was published by either.
TEST_P(PgRelay, TurnLostWhileDisconnectedGivesTheClientIdLockBack) {
  const std::string db = fresh_db(GetParam() == MqttVersion::kV5 ? "turnlock_v5" : "turnlock_v311");
  auto inbox_a = open_inbox(uri_of(db, "member_a"));
  auto inbox_b = open_inbox(uri_of(db, "member_b"));
  ASSERT_TRUE(inbox_a && inbox_b);
  auto outbox_a = make_outbox(inbox_a.get());
  auto outbox_b = make_outbox(inbox_b.get());
  TempDir locks;
  auto relay_a = make_relay(outbox_a.get(), broker_.uri(), GetParam(), 200, locks.path());
  ASSERT_TRUE(relay_a && relay_a->start().ok());
  ASSERT_TRUE(wait_until([&] { return relay_a->counters().connected; }, 10s));
  auto relay_b = make_relay(outbox_b.get(), broker_.uri(), GetParam(), 200, locks.path());
  ASSERT_TRUE(relay_b && relay_b->start().ok());

  // The turn's holder: the backend holding the "outbox relay" group's slot 0.
  const std::string holder =
      "SELECT COALESCE((SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
      "AND objsubid = 2 AND objid = 0 AND classid = "
      "(hashtext('mqtt_inbox fleet \"mqtt_inbox\" outbox relay')::int8 & 4294967295)::oid), 0)";
  const int64_t a_pid = q(db, holder);
  ASSERT_NE(a_pid, 0);
  broker_.stop();
  std::this_thread::sleep_for(500ms);  // a is between connection attempts now
  q(db, "SELECT count(*) FROM (SELECT pg_terminate_backend(" + std::to_string(a_pid) + ")) t");
  ASSERT_TRUE(wait_until(
      [&] {
        const int64_t now = q(db, holder);
        return now != 0 && now != a_pid;
      },
      20s))
      << "b never took the turn";
  broker_.start();
  Seen seen;
  auto sub = subscribe(broker_.uri(), "pg-outbox-watcher", &seen);
  enqueue_rows(db, outbox_b.get(), "events/l", "l-", 0, 40);
  ASSERT_TRUE(wait_until([&] { return seen.size() >= 40; }, 30s))
      << seen.size() << " published: the turn's holder never got the client-id lock";
  EXPECT_TRUE(relay_b->counters().connected);
  EXPECT_FALSE(relay_a->counters().connected);
  std::this_thread::sleep_for(500ms);
  expect_each_once_in_order(seen, 40);
  EXPECT_TRUE(relay_a->stop().ok());
  EXPECT_TRUE(relay_b->stop().ok());
  sub->disconnect()->wait();
}

INSTANTIATE_TEST_SUITE_P(Versions, PgRelay,
                         ::testing::Values(MqttVersion::kV3_1_1, MqttVersion::kV5),
                         [](const ::testing::TestParamInfo<MqttVersion>& p) {
                           return std::string(p.param == MqttVersion::kV5 ? "v5" : "v311");
                         });

}  // namespace
}  // namespace mqtt_inbox::test

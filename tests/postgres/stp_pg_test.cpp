// Store-then-process on the PostgreSQL store (issue 30, the base of issue 31's fleet),
// against a real private cluster (support/postgres.h): receipt then processing applies
// each credit once (balances), duplicates are stored once, each account's credits run in
// arrival order, retries and dead letters with their reason, replay, retention; the claim
// token's fence stepped deterministically (a worker whose claim was reaped commits nothing
// over its successor); and two processes working one consumer's rows, one of them
// SIGKILLed mid-row, with every row done once and no two rows of an account at once.
// A message's lifetime (issue 42): a credit that expires in the backlog, rows a handler
// holds for a dependency ("not yet") rescheduled, then applied or dependency_unavailable.
// Receipt is mostly called directly (StoreThenProcess::handle): what happens after it is
// the store's; one case receives through a real mosquitto and the Subscriber.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <any>
#include <atomic>
#include <chrono>
#include <memory>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include <SQLiteCpp/SQLiteCpp.h>
#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/postgres.h>
#include <mqtt_inbox/store_then_process.h>
#include <mqtt_inbox/subscriber.h>
#include <nlohmann/json.hpp>

#include "store/store.h"
#include "store/stp_rows.h"
#include "support/cut_proxy.h"
#include "support/postgres.h"
#include "support/process.h"
#include "support/publisher.h"
#include "support/store_access.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

// The expiry decision a worker session asks before marking a row done: never, here.
const auto kNeverExpired = [] { return false; };

const bool kPostgresEnabled = (enable_postgres_store(), true);

Postgres& server() {
  static Postgres pg;
  return pg;
}

// A fresh database with the ledger's tables and `runs`: one row per committed handler
// run, with the server's time at its start and end (clock_timestamp(): one clock for
// every process).
std::string fresh_db(const std::string& name) {
  server().create_database(name);
  server().execute(
      "CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);"
      "CREATE TABLE ledger_entries (message_id text PRIMARY KEY, account text NOT NULL,"
      " amount bigint NOT NULL, writer text NOT NULL DEFAULT '');"
      "CREATE TABLE runs (id bigserial PRIMARY KEY, account text NOT NULL,"
      " message_id text NOT NULL, seq bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,"
      " started timestamptz NOT NULL, ended timestamptz)",
      name);
  return server().uri(name);
}

int64_t q(const std::string& uri, const std::string& sql) {
  pqxx::connection c(uri);
  pqxx::nontransaction n(c);
  const pqxx::result r = n.exec(sql);
  if (r.empty() || r[0][0].is_null()) return 0;
  return r[0][0].as<int64_t>();
}

std::vector<std::string> column(const std::string& uri, const std::string& sql) {
  pqxx::connection c(uri);
  pqxx::nontransaction n(c);
  std::vector<std::string> out;
  for (const pqxx::row& r : n.exec(sql)) out.push_back(r[0].as<std::string>());
  return out;
}

Message credit(const std::string& id, const std::string& account, int64_t amount) {
  Message m;
  m.topic = "credits/" + account;
  m.payload = "{\"message_id\":\"" + id + "\",\"account\":\"" + account +
              "\",\"amount\":" + std::to_string(amount) + "}";
  m.qos = 1;
  return m;
}

// The business change: the credit, its ledger entry, and the run's record.
void apply_credit(pqxx::transaction_base& t, const StoredDelivery& d, int sleep_us = 0) {
  const nlohmann::json j = nlohmann::json::parse(d.message.payload);
  const std::string account = j.at("account").get<std::string>();
  const int64_t amount = j.at("amount").get<int64_t>();
  const int64_t run = t.exec_params1(
                           "INSERT INTO runs (account, message_id, seq, attempt, pid, started)"
                           " VALUES ($1, $2, $3, $4, $5, clock_timestamp()) RETURNING id",
                           account, d.message_id, d.seq, d.attempt, static_cast<int>(::getpid()))[0]
                          .as<int64_t>();
  t.exec_params0("INSERT INTO ledger_entries (message_id, account, amount) VALUES ($1, $2, $3)",
                 d.message_id, account, amount);
  t.exec_params0(
      "INSERT INTO accounts (id, balance) VALUES ($1, $2)"
      " ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance",
      account, amount);
  if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  t.exec_params0("UPDATE runs SET ended = clock_timestamp() WHERE id = $1", run);
}

StoreThenProcessOptions fast_options() {
  StoreThenProcessOptions o;
  o.consumer.retry_backoff_initial = 20ms;
  o.consumer.retry_backoff_max = 40ms;
  o.consumer.store_backoff_initial = 5ms;
  o.consumer.store_backoff_max = 50ms;
  o.aggregate_key = aggregate_key_from_json_field("account");
  o.poll_interval_ms = 20;
  o.workers = 3;
  o.batch_size = 4;
  return o;
}

std::unique_ptr<Inbox> open_inbox(const std::string& uri) {
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(uri, InboxOptions{}, &inbox);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return inbox;
}

std::unique_ptr<StoreThenProcess> make(Inbox* inbox, PgStoredHandler h,
                                       const StoreThenProcessOptions& o,
                                       const std::string& name = "ledger") {
  std::unique_ptr<StoreThenProcess> s;
  const Status st = StoreThenProcess::create(inbox, name, std::move(h), o, &s);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return s;
}

bool settled(const std::string& uri, const std::string& consumer = "ledger") {
  return q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE consumer_name = '" +
                    consumer + "' AND status IN ('pending', 'processing')") == 0;
}

// Runs committed for one account overlapped in time, or ran out of arrival order.
int64_t overlaps(const std::string& uri) {
  return q(uri,
           "SELECT count(*) FROM runs a JOIN runs b ON a.account = b.account AND a.id < b.id"
           " AND a.started < b.ended AND b.started < a.ended");
}
int64_t out_of_order(const std::string& uri) {
  return q(uri,
           "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY account"
           " ORDER BY started) AS prev FROM runs) x WHERE prev >= seq");
}

TEST(StpPg, ReceiptThenProcessingAppliesEachCreditOnceInArrivalOrderPerAccount) {
  const std::string uri = fresh_db("stp_basic");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  std::atomic<int> calls{0};
  auto stp = make(
      inbox.get(),
      [&](pqxx::transaction_base& t, const StoredDelivery& d) {
        ++calls;
        apply_credit(t, d, 500);
      },
      fast_options());
  ASSERT_TRUE(stp);
  // Stored before any worker runs: receipt alone decides, duplicates included.
  int64_t expected[3] = {0, 0, 0};
  for (int i = 0; i < 60; ++i) {
    const int a = (i * 7) % 3;
    expected[a] += i + 1;
    ASSERT_EQ(stp->handle(credit("c-" + std::to_string(i), "acct-" + std::to_string(a), i + 1)),
              Outcome::kProcessed);
    if (i % 10 == 0) {
      EXPECT_EQ(stp->handle(credit("c-" + std::to_string(i), "acct-" + std::to_string(a), i + 1)),
                Outcome::kDuplicate);
    }
  }
  EXPECT_EQ(q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'pending'"), 60);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until([&] { return settled(uri); }, 30s));
  // A redelivery after processing is still a duplicate, and never runs.
  EXPECT_EQ(stp->handle(credit("c-3", "acct-0", 4)), Outcome::kDuplicate);
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(calls.load(), 60);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries"), 60);
  for (int a = 0; a < 3; ++a)
    EXPECT_EQ(q(uri, "SELECT balance FROM accounts WHERE id = 'acct-" + std::to_string(a) + "'"),
              expected[a]);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'done'"
              " AND attempts = 1 AND done_at IS NOT NULL"),
            60);
  EXPECT_EQ(overlaps(uri), 0);
  EXPECT_EQ(out_of_order(uri), 0);
  StoreThenProcessStats st;
  ASSERT_TRUE(stp->stats(&st).ok());
  EXPECT_EQ(st.done, 60);
  EXPECT_EQ(stp->counters().duplicates, 7);
  EXPECT_EQ(stp->counters().stored, 60);
  EXPECT_EQ(stp->counters().processed, 60);
}

// The same through a real mosquitto: each credit published three times (a lost PUBACK's
// redeliveries), received by the Subscriber, stored once, applied once.
TEST(StpPg, DuplicatesThroughMosquittoAreStoredOnceAndAppliedOnce) {
  const std::string uri = fresh_db("stp_broker");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  Broker broker;
  TempDir dir;
  auto stp = make(
      inbox.get(), [](pqxx::transaction_base& t, const StoredDelivery& d) { apply_credit(t, d); },
      fast_options());
  ASSERT_TRUE(stp->start().ok());
  SubscriberOptions so;
  so.broker_uri = broker.uri();
  so.client_id = "stp-pg-dups";
  so.client_id_lock_dir = dir.path();
  so.mqtt_version = MqttVersion::kV5;
  std::unique_ptr<Subscriber> sub;
  ASSERT_TRUE(Subscriber::create(so, &sub).ok());
  ASSERT_TRUE(sub->subscribe("credits/#", stp.get()).ok());
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(sub->wait_connected(10000));
  constexpr int kIds = 20;
  {
    TestPublisher pub(broker.uri(), true);
    for (int round = 0; round < 3; ++round)
      for (int i = 0; i < kIds; ++i)
        pub.credit("credits/acct-" + std::to_string(i % 4), "m-" + std::to_string(i),
                   "acct-" + std::to_string(i % 4), i + 1);
  }
  ASSERT_TRUE(wait_until([&] { return sub->messages_received() >= 3 * kIds; }, 15s));
  ASSERT_TRUE(wait_until([&] { return settled(uri); }, 15s));
  ASSERT_TRUE(sub->stop().ok());
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(q(uri, "SELECT count(*) FROM runs"), kIds);
  EXPECT_EQ(q(uri, "SELECT count(DISTINCT message_id) FROM runs"), kIds);
  EXPECT_EQ(q(uri, "SELECT sum(balance) FROM accounts"), kIds * (kIds + 1) / 2);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages"), kIds);
  EXPECT_EQ(stp->counters().duplicates, 2 * kIds);
  EXPECT_EQ(out_of_order(uri), 0);
}

TEST(StpPg, FailingRowBlocksItsAccountThenPoisonIsDeadLetteredWithItsReason) {
  const std::string uri = fresh_db("stp_retry");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  auto o = fast_options();
  o.consumer.max_attempts = 3;
  auto stp = make(
      inbox.get(),
      [&](pqxx::transaction_base& t, const StoredDelivery& d) {
        if (d.message_id == "a-2" && d.attempt < 3) throw std::runtime_error("flaky");
        if (d.message_id == "b-2") {
          // A constraint the server refuses: the message's fault, a failed attempt.
          t.exec0("INSERT INTO accounts (id, balance) VALUES (NULL, 0)");
        }
        apply_credit(t, d);
      },
      o);
  for (int i = 1; i <= 4; ++i) {
    ASSERT_EQ(stp->handle(credit("a-" + std::to_string(i), "a", i)), Outcome::kProcessed);
    ASSERT_EQ(stp->handle(credit("b-" + std::to_string(i), "b", 10 * i)), Outcome::kProcessed);
  }
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until([&] { return settled(uri); }, 30s));
  EXPECT_EQ(stp->handle(credit("b-2", "b", 20)), Outcome::kDuplicate);
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(column(uri, "SELECT message_id FROM runs WHERE account = 'a' ORDER BY id"),
            (std::vector<std::string>{"a-1", "a-2", "a-3", "a-4"}));
  EXPECT_EQ(column(uri, "SELECT message_id FROM runs WHERE account = 'b' ORDER BY id"),
            (std::vector<std::string>{"b-1", "b-3", "b-4"}));
  EXPECT_EQ(q(uri, "SELECT balance FROM accounts WHERE id = 'a'"), 1 + 2 + 3 + 4);
  EXPECT_EQ(q(uri, "SELECT balance FROM accounts WHERE id = 'b'"), 10 + 30 + 40);
  EXPECT_EQ(q(uri, "SELECT attempts FROM mqtt_inbox.inbox_messages WHERE message_id = 'a-2'"), 3);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE message_id = 'b-2'"
              " AND status = 'dead' AND attempts = 3 AND last_error LIKE '%not-null constraint%'"),
            1);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'b-2'"
              " AND reason = 'handler_failed' AND attempts = 3"),
            1);
  // Its dead letter is replayed through the rows, not requeued for a Consumer.
  const int64_t dl =
      q(uri, "SELECT id FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'b-2'");
  const Status requeue = inbox->requeue_dead_letter(dl);
  EXPECT_EQ(requeue.code(), Status::Code::kInvalidArgument) << requeue.to_string();
  EXPECT_NE(requeue.message().find("StoreThenProcess::replay"), std::string::npos);
  // a-3 ran only after a-2 finally committed: the retry blocked its account.
  EXPECT_LT(q(uri, "SELECT id FROM runs WHERE message_id = 'a-2'"),
            q(uri, "SELECT id FROM runs WHERE message_id = 'a-3'"));
  EXPECT_EQ(out_of_order(uri), 0);

  // Replay of one account's rows, the dead one included: each runs again, once (the
  // handler's ledger entry is keyed by id, so the replay clears them first, as an
  // application replaying after a bug fix would), and b-2 now passes.
  server().execute("DELETE FROM ledger_entries WHERE account = 'b'", "stp_retry");
  ReplayFilter f;
  f.aggregate_key = "b";
  f.include_dead = true;
  ReplayResult r;
  ASSERT_TRUE(stp->replay(f, &r).ok());
  EXPECT_EQ(r.reset, 4);
  EXPECT_EQ(r.in_flight, 0);
  auto again = make(
      inbox.get(), [&](pqxx::transaction_base& t, const StoredDelivery& d) { apply_credit(t, d); },
      o);
  stp.reset();
  ASSERT_TRUE(again->start().ok());
  ASSERT_TRUE(wait_until([&] { return settled(uri); }, 30s));
  ASSERT_TRUE(again->stop().ok());
  EXPECT_EQ(column(uri, "SELECT message_id FROM runs WHERE account = 'b' ORDER BY id"),
            (std::vector<std::string>{"b-1", "b-3", "b-4", "b-1", "b-2", "b-3", "b-4"}));
  EXPECT_EQ(q(uri, "SELECT balance FROM accounts WHERE id = 'b'"), (10 + 30 + 40) + 100);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'b-2'"
              " AND status = 'replayed'"),
            1);

  // Retention: every row is finished; with a zero window each is compacted, then deleted.
  StoreThenProcessOptions p = o;
  p.compact_after_ms = 0;
  p.dedup_retention_ms = 0;
  p.allow_dedup_retention_below_session = true;
  auto pruner = make(
      inbox.get(), [](pqxx::transaction_base&, const StoredDelivery&) {}, p);
  std::this_thread::sleep_for(20ms);  // received_at < now
  StoredPruneResult pr;
  ASSERT_TRUE(pruner->prune(&pr).ok());
  EXPECT_EQ(pr.compacted, 8);
  EXPECT_EQ(pr.deleted, 8);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages"), 0);
}

// The fence, stepped: worker A claims the row; inside A's handler (after A wrote its
// change) the reaper returns A's claim and worker B claims the row again. A's commit
// finds another token on the row: kLost, its write rolled back. B then commits: the row
// is done once, by B.
TEST(StpPg, WorkerWhoseClaimWasReapedCannotCommitOverItsSuccessor) {
  const std::string uri = fresh_db("stp_fence");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  detail::StpRows& api = store_of(*inbox).stp_rows();
  EXPECT_FALSE(api.single_process());
  std::unique_ptr<detail::StpConsumerRows> rows;
  ASSERT_TRUE(api.open("fence", &rows).ok());
  const Message m = credit("f-1", "acct", 5);
  bool stored = false;
  ASSERT_TRUE(rows->store_received("f-1", "acct", m, "{}", std::nullopt, &stored).ok());
  ASSERT_TRUE(stored);
  ASSERT_TRUE(rows->store_received("f-1", "acct", m, "{}", std::nullopt, &stored).ok());
  EXPECT_FALSE(stored);
  std::unique_ptr<detail::StpWorkerSession> a, b;
  ASSERT_TRUE(rows->open_worker(Synchronous::kFull, &a).ok());
  ASSERT_TRUE(rows->open_worker(Synchronous::kFull, &b).ok());
  const detail::ClaimChooser take_all = [](int64_t, const std::vector<detail::ClaimCandidate>& o,
                                           std::vector<int64_t>* take) {
    for (const auto& c : o) take->push_back(c.seq);
  };
  std::vector<detail::StoredRow> batch_a, batch_b;
  ASSERT_TRUE(a->claim("A", 4, take_all, &batch_a).ok());
  ASSERT_EQ(batch_a.size(), 1u);
  EXPECT_EQ(batch_a[0].payload, m.payload);
  // The row's aggregate is busy: B finds nothing to claim.
  ASSERT_TRUE(b->claim("B", 4, take_all, &batch_b).ok());
  EXPECT_TRUE(batch_b.empty());

  const std::any none;
  const detail::StoredRow& ra = batch_a[0];
  const StoredDelivery da{m, ra.message_id, ra.aggregate_key, ra.claim.seq, ra.received_at,
                          1, none};
  int64_t reaped = 0;
  const detail::StoredStoreHandler handler_a =
      PgStoredHandler([&](pqxx::transaction_base& t, const StoredDelivery& d) {
        t.exec_params0(
            "INSERT INTO ledger_entries (message_id, account, amount, writer)"
            " VALUES ($1, 'acct', 5, 'A')",
            d.message_id);
        // Meanwhile, on other connections: A's lease runs out; B claims the row again.
        ASSERT_TRUE(rows->reap(
                            [](const std::vector<detail::LiveClaim>& claims,
                               std::vector<detail::ReturnedClaim>* back) {
                              for (const auto& c : claims)
                                back->push_back({c.claimant, c.running_seq, "expired"});
                            },
                            &reaped)
                        .ok());
        ASSERT_TRUE(b->claim("B", 4, take_all, &batch_b).ok());
      });
  detail::StoredRunResult run_a;
  ASSERT_TRUE(a->process(ra.claim, "A", handler_a, da, kNeverExpired, &run_a).ok());
  EXPECT_EQ(reaped, 1);
  ASSERT_EQ(batch_b.size(), 1u);
  EXPECT_GT(batch_b[0].claim.token, ra.claim.token);
  EXPECT_EQ(batch_b[0].attempts, 1);  // the reaper charged A's running row
  EXPECT_EQ(run_a.kind, detail::StoredRunResult::Kind::kLost);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries"), 0);  // A's write rolled back
  // A's later writes to the row change nothing either.
  bool held = true;
  ASSERT_TRUE(a->holds(ra.claim, &held).ok());
  EXPECT_FALSE(held);
  ASSERT_TRUE(a->mark_dead(ra.claim, 1, "late", &held).ok());
  EXPECT_FALSE(held);
  ASSERT_TRUE(a->retry_later(ra.claim, 1, "late", detail::RowWait{}, 0, {}, &held).ok());
  EXPECT_FALSE(held);
  ASSERT_TRUE(a->release({ra.claim}).ok());
  detail::StoredRunResult again;
  ASSERT_TRUE(a->process(ra.claim, "A", handler_a, da, kNeverExpired, &again).ok());
  EXPECT_EQ(again.kind, detail::StoredRunResult::Kind::kLost);

  const detail::StoredRow& rb = batch_b[0];
  const StoredDelivery db{m, rb.message_id, rb.aggregate_key, rb.claim.seq, rb.received_at,
                          2, none};
  const detail::StoredStoreHandler handler_b =
      PgStoredHandler([](pqxx::transaction_base& t, const StoredDelivery& d) {
        t.exec_params0(
            "INSERT INTO ledger_entries (message_id, account, amount, writer)"
            " VALUES ($1, 'acct', 5, 'B')",
            d.message_id);
      });
  detail::StoredRunResult run_b;
  ASSERT_TRUE(b->process(rb.claim, "B", handler_b, db, kNeverExpired, &run_b).ok());
  EXPECT_EQ(run_b.kind, detail::StoredRunResult::Kind::kDone);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries WHERE writer = 'B'"), 1);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries"), 1);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'done'"
              " AND attempts = 2 AND claim_token = " +
                  std::to_string(rb.claim.token)),
            1);
}

// The claim's aggregate locks, stepped: while worker A's claim transaction holds its
// aggregates (inside its chooser, after the locks, before its UPDATE), worker B's claim
// takes none of them and does not wait for A (SKIP LOCKED semantics: a wait would run
// into lock_timeout and fail B's claim). Once A committed its claim of account x only, B
// takes account y, and x stays out of every claim while A's rows are 'processing'.
TEST(StpPg, ConcurrentClaimsNeverShareAnAggregateAndNeverWait) {
  const std::string uri = fresh_db("stp_claims");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  std::unique_ptr<detail::StpConsumerRows> rows;
  ASSERT_TRUE(store_of(*inbox).stp_rows().open("claims", &rows).ok());
  bool stored = false;
  for (const char* id : {"x-1", "y-1", "x-2", "y-2"}) {
    const std::string account(1, id[0]);
    ASSERT_TRUE(
        rows->store_received(id, account, credit(id, account, 1), "{}", std::nullopt, &stored)
            .ok());
  }
  std::unique_ptr<detail::StpWorkerSession> a, b;
  ASSERT_TRUE(rows->open_worker(Synchronous::kFull, &a).ok());
  ASSERT_TRUE(rows->open_worker(Synchronous::kFull, &b).ok());
  const detail::ClaimChooser take_all = [](int64_t, const std::vector<detail::ClaimCandidate>& o,
                                           std::vector<int64_t>* take) {
    for (const auto& c : o) take->push_back(c.seq);
  };
  std::vector<detail::StoredRow> batch_a, batch_b;
  Status inner;
  std::vector<std::string> offered_to_a;
  const auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(a->claim(
                   "A", 4,
                   [&](int64_t, const std::vector<detail::ClaimCandidate>& offered,
                       std::vector<int64_t>* take) {
                     for (const auto& c : offered) offered_to_a.push_back(c.aggregate_key);
                     inner = b->claim("B", 4, take_all, &batch_b);
                     for (const auto& c : offered)
                       if (c.aggregate_key == "x") take->push_back(c.seq);
                   },
                   &batch_a)
                  .ok());
  EXPECT_TRUE(inner.ok()) << inner.to_string();
  EXPECT_TRUE(batch_b.empty());  // both accounts were A's to choose from
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  EXPECT_EQ(offered_to_a, (std::vector<std::string>{"x", "x", "y", "y"}));
  ASSERT_EQ(batch_a.size(), 2u);
  EXPECT_EQ(batch_a[0].message_id, "x-1");
  EXPECT_EQ(batch_a[1].message_id, "x-2");
  // A committed: B takes y, never x.
  ASSERT_TRUE(b->claim("B", 4, take_all, &batch_b).ok());
  ASSERT_EQ(batch_b.size(), 2u);
  EXPECT_EQ(batch_b[0].message_id, "y-1");
  EXPECT_EQ(batch_b[1].message_id, "y-2");
  std::vector<detail::StoredRow> none;
  ASSERT_TRUE(b->claim("B2", 4, take_all, &none).ok());
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'processing'"
              " AND claimant = 'A' AND aggregate_key = 'x'"),
            2);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'processing'"
              " AND claimant = 'B' AND aggregate_key = 'y'"),
            2);
  // A releases x: it is claimable again, in arrival order.
  ASSERT_TRUE(a->release({batch_a[0].claim, batch_a[1].claim}).ok());
  ASSERT_TRUE(b->claim("B3", 1, take_all, &none).ok());
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].message_id, "x-1");
  EXPECT_EQ(none[0].claim.token, batch_a[0].claim.token + 1);
}

// The connection drops during the handler transaction's COMMIT: a store error, retried.
// If the server had committed, the retry finds the row 'done' under its claim's token and
// runs nothing (done); if it had not, the row still carries the token and runs again.
// Either way the credit is applied once, and the row after it in the batch (same
// account) goes on at once rather than after the lease (60 s here).
void cut_at_commit(CutProxy::When when) {
  const std::string name =
      when == CutProxy::When::kAfterForwarding ? "stp_doubt_committed" : "stp_doubt_lost";
  fresh_db(name);
  CutProxy proxy(CutProxy::Upstream{server().socket_path(), 0});
  const std::string uri = "postgresql:///" + name + "?host=" + proxy.socket_dir() +
                          "&port=" + std::to_string(proxy.port()) + "&user=postgres";
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  auto o = fast_options();
  o.workers = 1;
  o.prune_interval_ms = 0;  // no prune pass: its COMMIT could be the one cut
  std::atomic<int> doubt_runs{0};
  auto stp = make(
      inbox.get(),
      [&](pqxx::transaction_base& t, const StoredDelivery& d) {
        apply_credit(t, d);
        // The next COMMIT on any connection must be this transaction's: one worker,
        // receipt is over, no prune pass, and the reaper's pass at start, which the
        // maintenance thread runs beside the worker, has ended by the time the cut is
        // armed (its next one is lease_ms / 4 = 15 s away). A run of CI once cut that
        // pass's COMMIT instead, when it was armed at once.
        if (d.message_id == "m-doubt" && ++doubt_runs == 1) {
          std::this_thread::sleep_for(500ms);
          proxy.cut_when(CutProxy::Direction::kClientToServer, "COMMIT", when);
        }
      },
      o);
  for (const char* id : {"before", "m-doubt", "after"})
    ASSERT_EQ(stp->handle(credit(id, "acct", 1)), Outcome::kProcessed);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until([&] { return settled(server().uri(name)); }, 10s));
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(proxy.triggers_fired(), 1);
  EXPECT_EQ(doubt_runs.load(), when == CutProxy::When::kAfterForwarding ? 1 : 2);
  const std::string direct = server().uri(name);
  EXPECT_EQ(q(direct, "SELECT count(*) FROM ledger_entries WHERE message_id = 'm-doubt'"), 1);
  EXPECT_EQ(q(direct, "SELECT balance FROM accounts WHERE id = 'acct'"), 3);
  EXPECT_EQ(q(direct, "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'done'"), 3);
  EXPECT_EQ(stp->counters().claims_lost, 0);
  EXPECT_EQ(stp->counters().processed, 3);
  EXPECT_GE(stp->counters().worker_store_errors, 1);
  EXPECT_GE(proxy.connections_accepted(), 3);  // receipt, maintenance, worker, and again
}

TEST(StpPg, CommitCutAfterTheServerCommittedRunsNothingTwice) {
  cut_at_commit(CutProxy::When::kAfterForwarding);
}
TEST(StpPg, CommitCutBeforeTheServerSawItRunsTheRowAgain) {
  cut_at_commit(CutProxy::When::kBeforeForwarding);
}

// A handler written for the other store is refused, both ways, as for Consumer.
TEST(StpPg, HandlerOfTheOtherStoreIsRefused) {
  const std::string uri = fresh_db("stp_refused");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  std::unique_ptr<StoreThenProcess> stp;
  Status s = StoreThenProcess::create(
      inbox.get(), "s", [](SQLite::Database&, const StoredDelivery&) {}, fast_options(), &stp);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("pqxx::transaction_base&"), std::string::npos) << s.message();
  EXPECT_FALSE(stp);
  TempDir dir;
  std::unique_ptr<Inbox> lite;
  ASSERT_TRUE(Inbox::open(dir.file("lite.db"), InboxOptions{}, &lite).ok());
  s = StoreThenProcess::create(
      lite.get(), "s", [](pqxx::transaction_base&, const StoredDelivery&) {}, fast_options(), &stp);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("SQLite::Database&"), std::string::npos) << s.message();
  EXPECT_FALSE(stp);
}

// A message's lifetime on PostgreSQL (issue 42), as on SQLite (tests/broker/lifetimes_test):
// credits with an MQTT 5 message expiry, received through a real mosquitto while no worker
// runs, wait in the backlog; the one whose expiry ran out there is the dead letter
// `expired` (its deadline and interval kept with the row), never applied; the others are.
TEST(StpPg, ACreditThatExpiresInTheBacklogIsDeadLetteredAndNeverApplied) {
  const std::string uri = fresh_db("stp_expiry");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  Broker broker;
  TempDir dir;
  auto stp = make(
      inbox.get(), [](pqxx::transaction_base& t, const StoredDelivery& d) { apply_credit(t, d); },
      fast_options());
  SubscriberOptions so;
  so.broker_uri = broker.uri();
  so.client_id = "stp-pg-expiry";
  so.client_id_lock_dir = dir.path();
  so.mqtt_version = MqttVersion::kV5;
  std::unique_ptr<Subscriber> sub;
  ASSERT_TRUE(Subscriber::create(so, &sub).ok());
  ASSERT_TRUE(sub->subscribe("credits/#", stp.get()).ok());
  ASSERT_TRUE(sub->start().ok());
  ASSERT_TRUE(sub->wait_connected(10000));
  {
    TestPublisher pub(broker.uri(), true);
    pub.credit_expiring("credits/acct", "e-1", "acct", 5, 1);   // runs out in the backlog
    pub.credit_expiring("credits/acct", "e-2", "acct", 7, 60);  // time left
    pub.credit("credits/acct", "e-3", "acct", 11);              // no expiry
  }
  ASSERT_TRUE(wait_until(
      [&] { return q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages") == 3; }, 10s));
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE message_id = 'e-1'"
              " AND expires_at IS NOT NULL AND properties_json LIKE "
              "'%\"message_expiry_interval_s\":%'"),
            1);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE expires_at IS NULL"), 1);
  std::this_thread::sleep_for(1500ms);  // the backlog: no worker yet
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until([&] { return settled(uri); }, 15s));
  ASSERT_TRUE(sub->stop().ok());
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(column(uri, "SELECT status FROM mqtt_inbox.inbox_messages WHERE message_id = 'e-1'"),
            std::vector<std::string>{"dead"});
  EXPECT_EQ(
      q(uri,
        "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'e-1'"
        " AND reason = 'expired' AND reason_text LIKE 'message expiry interval % s ran out%'"),
      1);
  EXPECT_EQ(column(uri, "SELECT message_id FROM runs ORDER BY id"),
            (std::vector<std::string>{"e-2", "e-3"}));
  EXPECT_EQ(q(uri, "SELECT balance FROM accounts WHERE id = 'acct'"), 18);
  EXPECT_EQ(stp->counters().expired, 1);
}

// "Not yet" on PostgreSQL: a dependency down for longer than the immediate runs and
// max_attempts' worth of failures reschedules the rows (no attempt counted, the wait kept
// in the row), then every credit is applied once in each account's order, no dead letter;
// a credit whose dependency never comes back is dependency_unavailable after the schedule.
TEST(StpPg, RowsWaitingForADependencyAreRescheduledThenAppliedOnceInOrder) {
  const std::string uri = fresh_db("stp_not_yet");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  auto o = fast_options();
  o.consumer.max_attempts = 2;
  o.consumer.dependency_immediate_attempts = 2;
  o.consumer.dependency_backoff_initial = 50ms;
  o.consumer.dependency_backoff_max = 100ms;
  o.consumer.dependency_wait_max = 60s;
  std::atomic<bool> down{true};
  auto stp = make(
      inbox.get(),
      [&](pqxx::transaction_base& t, const StoredDelivery& d) {
        apply_credit(t, d);  // rolled back by the "not yet"
        if (down) throw RetryLater("meter gateway 10.0.0.7: connection refused");
      },
      o);
  ASSERT_TRUE(stp);
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(stp->handle(credit("n-" + std::to_string(i), "acct-" + std::to_string(i % 2), i + 1)),
              Outcome::kProcessed);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until(
      [&] {
        return q(uri,
                 "SELECT min(not_yet) FROM mqtt_inbox.inbox_messages"
                 " WHERE message_id IN ('n-0', 'n-1')") >= 5;
      },
      15s));
  EXPECT_EQ(q(uri, "SELECT max(attempts) FROM mqtt_inbox.inbox_messages"), 0);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages"
              " WHERE not_yet > 0 AND waiting_since IS NULL"),
            0);
  EXPECT_TRUE(stp->health().dependency.waiting);
  EXPECT_FALSE(stp->health().stuck);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries"), 0);
  down = false;
  ASSERT_TRUE(wait_until([&] { return settled(uri); }, 20s));
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries"), 8);
  EXPECT_EQ(q(uri, "SELECT sum(balance) FROM accounts"), 36);
  EXPECT_EQ(out_of_order(uri), 0);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages"
              " WHERE status = 'done' AND not_yet = 0 AND waiting_since IS NULL"),
            8);
  EXPECT_GE(stp->counters().not_yet, 10);
  ASSERT_TRUE(stp->stop().ok());

  // A dependency that never comes back: the schedule (here 400 ms) ends in the dead letter.
  o.consumer.dependency_wait_max = 400ms;
  auto gone = make(
      inbox.get(),
      [&](pqxx::transaction_base& t, const StoredDelivery& d) {
        apply_credit(t, d);
        throw RetryLater("meter gateway 10.0.0.7: connection refused");
      },
      o, "gone");
  ASSERT_TRUE(gone);
  ASSERT_EQ(gone->handle(credit("gone-1", "acct-9", 5)), Outcome::kProcessed);
  ASSERT_TRUE(gone->start().ok());
  ASSERT_TRUE(wait_until([&] { return settled(uri, "gone"); }, 15s));
  ASSERT_TRUE(gone->stop().ok());
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id ="
              " 'gone-1' AND reason = 'dependency_unavailable'"
              " AND reason_text LIKE '%connection refused%'"),
            1);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries WHERE message_id = 'gone-1'"), 0);
}

// A store-then-process handler that ends the library's transaction itself and swallows
// what the server says: the row is dead at once as handler_ended_transaction, nothing of
// its run commits (its credit before the statement, its write after it), and the row
// stored behind it goes through. The PostgreSQL side of StoreThenProcessEndsTransaction
// (tests/unit/error_class_test.cpp); the Consumer's is in the contract suite. ROLLBACK then
// BEGIN READ WRITE leaves an open transaction the client cannot tell from the library's:
// the library's check before it writes again finds it.
class StpPgEndsTransaction : public ::testing::TestWithParam<std::vector<const char*>> {};

TEST_P(StpPgEndsTransaction, RowIsDeadAtOnceByNameAndCommitsNothing) {
  static int n = 0;
  const std::string uri = fresh_db("stp_ends_" + std::to_string(++n));
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  auto o = fast_options();
  o.consumer.max_attempts = 3;
  o.workers = 1;
  const std::vector<const char*> statements = GetParam();
  auto stp = make(
      inbox.get(),
      [&](pqxx::transaction_base& t, const StoredDelivery& d) {
        apply_credit(t, d);
        if (d.message_id != "bad-1") return;
        for (const char* sql : statements) {
          try {
            t.exec0(sql);
          } catch (const std::exception&) {
            // swallowed: the library still judges the run
          }
        }
        try {
          t.exec0("INSERT INTO accounts (id, balance) VALUES ('after', 1)");
        } catch (const std::exception&) {
        }
      },
      o);
  ASSERT_EQ(stp->handle(credit("bad-1", "a", 5)), Outcome::kProcessed);
  ASSERT_EQ(stp->handle(credit("good-1", "a", 7)), Outcome::kProcessed);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until([&] { return settled(uri); }, 30s));
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE message_id = 'bad-1'"
              " AND status = 'dead' AND attempts = 1"),
            1);
  EXPECT_EQ(q(uri,
              "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = 'bad-1'"
              " AND reason = 'handler_ended_transaction'"),
            1);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries WHERE message_id = 'bad-1'"), 0);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM accounts WHERE id = 'after'"), 0);
  EXPECT_EQ(q(uri, "SELECT balance FROM accounts WHERE id = 'a'"), 7);
  EXPECT_EQ(stp->counters().worker_store_errors, 0) << stp->counters().last_worker_error;
}

INSTANTIATE_TEST_SUITE_P(Statements, StpPgEndsTransaction,
                         ::testing::Values(std::vector<const char*>{"COMMIT"},
                                           std::vector<const char*>{"ROLLBACK"},
                                           std::vector<const char*>{"BEGIN"},
                                           std::vector<const char*>{"ROLLBACK", "BEGIN READ WRITE"},
                                           std::vector<const char*>{"COMMIT", "BEGIN READ WRITE"}),
                         [](const ::testing::TestParamInfo<std::vector<const char*>>& i) {
                           std::string name;
                           for (const char* s : i.param)
                             name += std::string(name.empty() ? "" : "Then") + s;
                           for (char& c : name)
                             if (c == ' ') c = '_';
                           return name;
                         });

// One member of a fleet: opens its own Inbox on `uri` and works consumer "ledger" with 3
// workers until every row is finished; with `die_after` > 0 it SIGKILLs itself inside
// the handler transaction of its die_after-th row. Exits 0 when settled.
[[noreturn]] void fleet_member(const std::string& uri, int die_after, int64_t lease_ms) {
  std::unique_ptr<Inbox> inbox;
  if (!Inbox::open(uri, InboxOptions{}, &inbox).ok()) ::_exit(3);
  auto o = fast_options();
  o.lease_ms = lease_ms;
  o.reap_interval_ms = 100;
  std::atomic<int> runs{0};
  std::unique_ptr<StoreThenProcess> stp;
  if (!StoreThenProcess::create(
           inbox.get(), "ledger",
           [&](pqxx::transaction_base& t, const StoredDelivery& d) {
             apply_credit(t, d, 2000);
             if (die_after > 0 && ++runs == die_after) ::kill(::getpid(), SIGKILL);
           },
           o, &stp)
           .ok())
    ::_exit(4);
  if (!stp->start().ok()) ::_exit(5);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    StoreThenProcessStats st;
    if (stp->stats(&st).ok() && st.pending == 0 && st.processing == 0) break;
    if (std::chrono::steady_clock::now() > deadline) ::_exit(6);
    std::this_thread::sleep_for(50ms);
  }
  (void)stp->stop();
  ::_exit(0);
}

pid_t spawn_member(const std::string& uri, int die_after, int64_t lease_ms) {
  const pid_t pid = ::fork();
  if (pid == 0) fleet_member(uri, die_after, lease_ms);
  return pid;
}

int wait_for(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

// Two processes share one consumer's rows: every row done exactly once, no two runs of
// one account overlapping, each account in arrival order; then one of them is SIGKILLed
// mid-row and the survivor's reaper returns its claims after the lease.
TEST(StpPg, TwoProcessesShareTheRowsAndSurviveOneBeingKilledMidRow) {
  const std::string uri = fresh_db("stp_fleet");
  constexpr int kAccounts = 6, kPerAccount = 40, kRows = kAccounts * kPerAccount;
  auto store_all = [&](const std::string& prefix) {
    auto inbox = open_inbox(uri);
    ASSERT_TRUE(inbox);
    auto stp = make(
        inbox.get(), [](pqxx::transaction_base&, const StoredDelivery&) {}, fast_options());
    for (int i = 0; i < kRows; ++i)
      ASSERT_EQ(stp->handle(
                    credit(prefix + std::to_string(i), "acct-" + std::to_string(i % kAccounts), 1)),
                Outcome::kProcessed);
  };

  // Round 1: both live.
  store_all("r1-");
  const pid_t p1 = spawn_member(uri, 0, 60000), p2 = spawn_member(uri, 0, 60000);
  const int s1 = wait_for(p1), s2 = wait_for(p2);
  ASSERT_TRUE(WIFEXITED(s1) && WEXITSTATUS(s1) == 0) << s1;
  ASSERT_TRUE(WIFEXITED(s2) && WEXITSTATUS(s2) == 0) << s2;
  EXPECT_EQ(q(uri, "SELECT count(*) FROM runs"), kRows);
  EXPECT_EQ(q(uri, "SELECT count(DISTINCT message_id) FROM runs"), kRows);
  EXPECT_EQ(q(uri, "SELECT count(DISTINCT pid) FROM runs"), 2);  // both took rows
  EXPECT_EQ(q(uri, "SELECT sum(balance) FROM accounts"), kRows);
  EXPECT_EQ(overlaps(uri), 0);
  EXPECT_EQ(out_of_order(uri), 0);

  // Round 2: the first member kills itself inside its 15th handler transaction.
  store_all("r2-");
  const pid_t victim = spawn_member(uri, 15, 1000), survivor = spawn_member(uri, 0, 1000);
  const int sv = wait_for(victim);
  ASSERT_TRUE(WIFSIGNALED(sv) && WTERMSIG(sv) == SIGKILL) << sv;
  const int ss = wait_for(survivor);
  ASSERT_TRUE(WIFEXITED(ss) && WEXITSTATUS(ss) == 0) << ss;
  EXPECT_EQ(q(uri, "SELECT count(*) FROM runs"), 2 * kRows);
  EXPECT_EQ(q(uri, "SELECT count(DISTINCT message_id) FROM runs"), 2 * kRows);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM ledger_entries"), 2 * kRows);
  EXPECT_EQ(q(uri, "SELECT sum(balance) FROM accounts"), 2 * kRows);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'done'"),
            2 * kRows);
  // The row the victim died in was charged an attempt by the survivor's reaper, then done.
  EXPECT_GE(q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE attempts = 2"), 1);
  EXPECT_EQ(q(uri, "SELECT count(*) FROM runs WHERE attempt = 2"),
            q(uri, "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE attempts = 2"));
  EXPECT_EQ(overlaps(uri), 0);
  EXPECT_EQ(out_of_order(uri), 0);
}

}  // namespace
}  // namespace mqtt_inbox::test

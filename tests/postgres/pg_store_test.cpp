// The PostgreSQL store (issue 30) against a real private cluster (support/postgres.h),
// fsync on: the seeds' tests (sequential duplicate; concurrent duplicate stepped
// deterministically, with the second claim seen waiting on a Lock in pg_stat_activity;
// a consumer SIGKILLed between commit and ack), a handler's constraint error counted and
// dead-lettered, a backend terminated mid-stream, retention, the READ COMMITTED rule, the
// password rule, handler overloads, and what is refused so far (store-then-process). Every case
// asserts on business rows (a ledger in the same database) and the inbox's tables.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include <SQLiteCpp/SQLiteCpp.h>
#include <mqtt_inbox/consumer.h>
#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/outbox.h>
#include <mqtt_inbox/postgres.h>
#include <mqtt_inbox/retention.h>
#include <mqtt_inbox/store_then_process.h>
#include <nlohmann/json.hpp>

#include "store/postgres/admin.h"
#include "store/postgres/errors.h"
#include "support/cut_proxy.h"
#include "support/postgres.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

// The PostgreSQL store is a library of its own (mqtt_inbox::postgres): a program enables it
// before opening a postgresql:// location (pg_enable_check proves the refusal without).
const bool kPostgresEnabled = (enable_postgres_store(), true);

// One cluster per test process (each case runs as its own process under ctest).
Postgres& server() {
  static Postgres pg;
  return pg;
}

// A fresh database per case, with the ledger's tables.
std::string fresh_db(const std::string& name) {
  server().create_database(name);
  server().execute(
      "CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0"
      " CHECK (balance >= 0));"
      "CREATE TABLE ledger_entries (message_id text PRIMARY KEY, account text NOT NULL,"
      " amount bigint NOT NULL)",
      name);
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

Message credit(const std::string& id, const std::string& account, int64_t amount,
               bool dup = false) {
  Message m;
  m.topic = "credits/" + account;
  m.payload = "{\"message_id\":\"" + id + "\",\"account\":\"" + account +
              "\",\"amount\":" + std::to_string(amount) + "}";
  m.qos = 1;
  m.dup = dup;
  return m;
}

// The ledger's business change, on PostgreSQL.
void apply_credit(pqxx::transaction_base& txn, const Delivery& d) {
  const nlohmann::json& j = *d.payload_json;
  const std::string account = j.at("account").get<std::string>();
  const int64_t amount = j.at("amount").get<int64_t>();
  txn.exec_params0("INSERT INTO ledger_entries (message_id, account, amount) VALUES ($1, $2, $3)",
                   d.message_id, account, amount);
  txn.exec_params0(
      "INSERT INTO accounts (id, balance) VALUES ($1, $2)"
      " ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance",
      account, amount);
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

std::unique_ptr<Inbox> open_inbox(const std::string& uri, InboxOptions o = {}) {
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(uri, o, &inbox);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return inbox;
}

TEST(PgStore, OpensCreatesItsSchemaAndAppliesOnce) {
  const std::string db = fresh_db("seq");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  EXPECT_EQ(inbox->path(), uri_of(db));
  EXPECT_EQ(server().query_value("SELECT value FROM mqtt_inbox.inbox_meta WHERE key = "
                                 "'schema_version'",
                                 db),
            std::to_string(detail::postgres_schema_version()));
  std::unique_ptr<Consumer> c;
  int runs = 0;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    ++runs;
                    apply_credit(t, d);
                  },
                  fast_options(), &c)
                  .ok());
  // The seeds' first test: the same message twice in a row.
  EXPECT_EQ(c->handle(credit("m-1", "alice", 10)), Outcome::kProcessed);
  EXPECT_EQ(c->handle(credit("m-1", "alice", 10, /*dup=*/true)), Outcome::kDuplicate);
  EXPECT_EQ(c->handle(credit("m-1", "alice", 10)), Outcome::kDuplicate);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 1);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'alice'"), 10);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 1);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_attempts"), 0);
  // received_at is the server's clock.
  EXPECT_LT(q(db,
              "SELECT abs(extract(epoch from now() - received_at))::bigint FROM "
              "mqtt_inbox.inbox_processed"),
            60);
  EXPECT_EQ(inbox->stats().processed, 1);
  EXPECT_EQ(inbox->stats().duplicates, 2);
  // A second open finds the schema at its version and migrates nothing.
  inbox.reset();
  c.reset();
  auto again = open_inbox(uri_of(db));
  ASSERT_TRUE(again);
}

TEST(PgStore, SchemaNameIsTheUsers) {
  const std::string db = fresh_db("schema_opt");
  InboxOptions o;
  o.postgres_schema = "edge_inbox";
  // Handed to libpq as passfile= (the cluster trusts its socket, so it is never read);
  // the location shown stays the one given. It must be readable: a missing one is refused
  // by name (tests/contract).
  const std::string pwdir = "/tmp/pg schema opt " + std::to_string(::getpid());
  std::filesystem::create_directories(pwdir);
  std::ofstream(pwdir + "/pgpass") << "*:*:*:*:unused\n";
  o.postgres_password_file = pwdir + "/pgpass";
  auto inbox = open_inbox(uri_of(db), o);
  ASSERT_TRUE(inbox);
  EXPECT_EQ(inbox->path(), uri_of(db));
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", apply_credit, fast_options(), &c).ok());
  EXPECT_EQ(c->handle(credit("m-1", "a", 1)), Outcome::kProcessed);
  EXPECT_EQ(q(db, "SELECT count(*) FROM edge_inbox.inbox_processed"), 1);
  EXPECT_EQ(q(db,
              "SELECT count(*) FROM information_schema.schemata WHERE schema_name = "
              "'mqtt_inbox'"),
            0);
  InboxOptions bad;
  bad.postgres_schema = "Robert'); DROP";
  std::unique_ptr<Inbox> refused;
  EXPECT_EQ(Inbox::open(uri_of(db), bad, &refused).code(), Status::Code::kInvalidArgument);
}

TEST(PgStore, HandlerOfTheOtherStoreIsRefusedNamed) {
  const std::string db = fresh_db("kinds");
  auto pg = open_inbox(uri_of(db));
  ASSERT_TRUE(pg);
  std::unique_ptr<Consumer> c;
  // A plain lambda of either kind resolves to its overload.
  const Status sqlite_on_pg = Consumer::create(
      pg.get(), "x", [](SQLite::Database&, const Delivery&) {}, fast_options(), &c);
  EXPECT_EQ(sqlite_on_pg.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(sqlite_on_pg.message().find("SQLite::Database&"), std::string::npos)
      << sqlite_on_pg.message();
  EXPECT_NE(sqlite_on_pg.message().find("pqxx::transaction_base&"), std::string::npos)
      << sqlite_on_pg.message();
  EXPECT_TRUE(
      Consumer::create(
          pg.get(), "x", [](pqxx::transaction_base&, const Delivery&) {}, fast_options(), &c)
          .ok());

  char tmpl[] = "/tmp/pg_kinds_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string file = std::string(tmpl) + "/inbox.db";
  auto lite = open_inbox(file);
  ASSERT_TRUE(lite);
  std::unique_ptr<Consumer> c2;
  const Status pg_on_sqlite = Consumer::create(
      lite.get(), "x", [](pqxx::transaction_base&, const Delivery&) {}, fast_options(), &c2);
  EXPECT_EQ(pg_on_sqlite.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(pg_on_sqlite.message().find("pqxx::transaction_base&"), std::string::npos)
      << pg_on_sqlite.message();
  EXPECT_NE(pg_on_sqlite.message().find("SQLite::Database&"), std::string::npos)
      << pg_on_sqlite.message();
  EXPECT_TRUE(Consumer::create(
                  lite.get(), "x", [](SQLite::Database&, const Delivery&) {}, fast_options(), &c2)
                  .ok());
  c2.reset();
  lite.reset();
  std::filesystem::remove_all(tmpl);
}

// Every form libpq reads as a password, not only the plain ones: a '?' inside the user
// information (libpq ends it at '@' only) and a percent-encoded parameter name (libpq
// decodes names) got past a hand-written scan, and the server logged in with them. A URI
// libpq cannot parse is refused without being repeated either.
TEST(PgStore, PasswordInTheLocationIsRefusedWithoutEchoingIt) {
  std::unique_ptr<Inbox> inbox;
  for (const std::string& uri :
       {std::string("postgresql://alice:hunter2@db.example/ledger"),
        std::string("postgres://db.example/ledger?user=alice&password=hunter2"),
        std::string("postgresql://alice:hun?ter2@db.example/ledger"),
        std::string("postgresql://alice@/ledger?host=/tmp&%70assword=hunter2"),
        std::string("postgresql://alice@/ledger?host=/tmp&pass%77ord=hunter2")}) {
    const Status s = Inbox::open(uri, InboxOptions{}, &inbox);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << uri;
    EXPECT_EQ(s.message().find("hunter2"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find("ter2"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("password file"), std::string::npos) << uri << ": " << s.message();
  }
  const Status bad = Inbox::open("postgresql://alice@/ledger?hunter2%zz", InboxOptions{}, &inbox);
  EXPECT_EQ(bad.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(bad.message().find("hunter2"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("libpq can parse"), std::string::npos) << bad.message();
}

TEST(PgStore, OutboxAndStoreThenProcessTakeHandlersOfThisStore) {
  const std::string db = fresh_db("unsupported");
  auto inbox = open_inbox(uri_of(db));
  ASSERT_TRUE(inbox);
  // The outbox is supported (tests/postgres/pg_outbox_test.cpp).
  std::unique_ptr<Outbox> outbox;
  const Status o = Outbox::create(inbox.get(), OutboxOptions{}, &outbox);
  EXPECT_TRUE(o.ok()) << o.to_string();
  // Store-then-process too (tests/postgres/stp_pg_test.cpp), with a PgStoredHandler.
  std::unique_ptr<StoreThenProcess> stp;
  const Status p = StoreThenProcess::create(
      inbox.get(), "s", [](SQLite::Database&, const StoredDelivery&) {}, StoreThenProcessOptions{},
      &stp);
  EXPECT_EQ(p.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(p.message().find("pqxx::transaction_base&"), std::string::npos) << p.message();
  EXPECT_TRUE(StoreThenProcess::create(
                  inbox.get(), "s", [](pqxx::transaction_base&, const StoredDelivery&) {},
                  StoreThenProcessOptions{}, &stp)
                  .ok());
  EXPECT_EQ(inbox->setup([](SQLite::Database&) {}).code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(inbox->setup_sql("CREATE TABLE app_t (x int)").ok());
  EXPECT_EQ(q(db, "SELECT count(*) FROM app_t"), 0);
}

// Consumers starting together run the same set-up SQL: the second one's CREATE TABLE IF
// NOT EXISTS, run while the first one's is not committed yet, would wait for it and then
// fail with 23505 (pg_type's unique index), so one member of a fleet started at once did
// not start (ledger_consumer: "rejected: application set-up"). Set-ups take turns per
// database: B waits for A's commit, then finds the table.
TEST(PgStore, SetupsRunTogetherTakeTurnsAndBothSucceed) {
  const std::string db = fresh_db("setup_race");
  auto a = open_inbox(uri_of(db, "setup_a"));
  auto b = open_inbox(uri_of(db, "setup_b"));
  ASSERT_TRUE(a && b);
  const std::string create = "CREATE TABLE IF NOT EXISTS app_t (x int PRIMARY KEY)";
  auto fa = std::async(std::launch::async,
                       [&] { return a->setup_sql(create + "; SELECT pg_sleep(1.5)"); });
  // A has created the table in its open transaction and sleeps.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (q(db,
           "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'setup_a' AND "
           "wait_event = 'PgSleep'") == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "A's set-up did not start";
    std::this_thread::sleep_for(10ms);
  }
  const Status sb = b->setup_sql(create);
  const Status sa = fa.get();
  EXPECT_TRUE(sa.ok()) << sa.to_string();
  EXPECT_TRUE(sb.ok()) << sb.to_string();
  EXPECT_EQ(q(db, "SELECT count(*) FROM pg_class WHERE relname = 'app_t'"), 1);
}

TEST(PgStore, HigherDefaultIsolationIsRefusedAtOpen) {
  const std::string db = fresh_db("iso");
  server().execute("ALTER DATABASE iso SET default_transaction_isolation = 'repeatable read'");
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(uri_of(db), InboxOptions{}, &inbox);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("READ COMMITTED"), std::string::npos) << s.message();
  EXPECT_FALSE(inbox);
}

// The seeds' second test: two consumers on two connections claim the same id at once.
// A's handler holds its transaction open; B's claim blocks on A's row (pg_stat_activity:
// wait_event_type 'Lock'); then A commits (B skips) or rolls back (B claims).
void concurrent_duplicate(bool a_commits) {
  const std::string db = fresh_db(a_commits ? "conc_commit" : "conc_abort");
  auto inbox_a = open_inbox(uri_of(db, "consumer_a"));
  auto inbox_b = open_inbox(uri_of(db, "consumer_b"));
  ASSERT_TRUE(inbox_a && inbox_b);
  std::promise<void> a_claimed, release_a;
  std::shared_future<void> release = release_a.get_future().share();
  std::atomic<int> runs_a{0}, runs_b{0};
  std::unique_ptr<Consumer> a, b;
  ConsumerOptions o = fast_options();
  o.max_attempts = 1;  // A's rollback ends its message (a dead letter): B's claim decides
  ASSERT_TRUE(Consumer::create(
                  inbox_a.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    ++runs_a;
                    apply_credit(t, d);
                    a_claimed.set_value();
                    release.wait();
                    if (!a_commits) throw std::runtime_error("A rolls back");
                  },
                  o, &a)
                  .ok());
  ASSERT_TRUE(Consumer::create(
                  inbox_b.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    ++runs_b;
                    apply_credit(t, d);
                  },
                  o, &b)
                  .ok());
  auto fa = std::async(std::launch::async, [&] { return a->handle(credit("m-1", "acct", 7)); });
  a_claimed.get_future().wait();
  auto fb = std::async(std::launch::async, [&] { return b->handle(credit("m-1", "acct", 7)); });
  const int pid_b = static_cast<int>(
      q(db,
        "SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE application_name = "
        "'consumer_b'"));
  ASSERT_GT(pid_b, 0);
  ASSERT_TRUE(server().wait_for_lock_wait(pid_b, 10s)) << "B's claim did not block on A's";
  EXPECT_EQ(fb.wait_for(200ms), std::future_status::timeout);
  release_a.set_value();
  const Outcome oa = fa.get();
  const Outcome ob = fb.get();
  if (a_commits) {
    EXPECT_EQ(oa, Outcome::kProcessed);
    EXPECT_EQ(ob, Outcome::kDuplicate);
    EXPECT_EQ(runs_b.load(), 0);
  } else {
    EXPECT_EQ(oa, Outcome::kDeadLettered);
    EXPECT_EQ(ob, Outcome::kProcessed);
    EXPECT_EQ(runs_b.load(), 1);
  }
  EXPECT_EQ(runs_a.load(), 1);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 1);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 7);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 1);
}

TEST(PgStore, ConcurrentDuplicateFirstCommitsSecondSkips) { concurrent_duplicate(true); }
TEST(PgStore, ConcurrentDuplicateFirstRollsBackSecondClaims) { concurrent_duplicate(false); }

// A slow handler on another node holds the id: the waiting claim gives up after
// lock_timeout (busy_timeout_ms) as "not yet" (a transient store error: retried, never
// counted against the message), and finds the claim once the holder has committed.
// busy_timeout_ms = 0 is "do not wait", as on SQLite, not PostgreSQL's lock_timeout = 0
// (wait for ever): the waiting claim gives up as often, never just sits behind the lock.
void lock_timeout_behind_a_slow_handler(int busy_timeout_ms) {
  const std::string db = fresh_db("lock_timeout_" + std::to_string(busy_timeout_ms));
  auto inbox_a = open_inbox(uri_of(db, "slow_a"));
  InboxOptions ob;
  ob.busy_timeout_ms = busy_timeout_ms;
  auto inbox_b = open_inbox(uri_of(db, "waiting_b"), ob);
  ASSERT_TRUE(inbox_a && inbox_b);
  std::promise<void> a_claimed;
  std::unique_ptr<Consumer> a, b;
  ASSERT_TRUE(Consumer::create(
                  inbox_a.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    apply_credit(t, d);
                    a_claimed.set_value();
                    std::this_thread::sleep_for(800ms);  // 8 of B's lock timeouts
                  },
                  fast_options(), &a)
                  .ok());
  ConsumerOptions o = fast_options();
  o.max_attempts = 1;  // a single counted failure would dead-letter it
  std::atomic<int> runs_b{0};
  ASSERT_TRUE(Consumer::create(
                  inbox_b.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    ++runs_b;
                    apply_credit(t, d);
                  },
                  o, &b)
                  .ok());
  auto fa = std::async(std::launch::async, [&] { return a->handle(credit("m-1", "acct", 3)); });
  a_claimed.get_future().wait();
  const Outcome outcome_b = b->handle(credit("m-1", "acct", 3));
  EXPECT_EQ(fa.get(), Outcome::kProcessed);
  EXPECT_EQ(outcome_b, Outcome::kDuplicate);  // waited, then skipped: never dead-lettered
  EXPECT_EQ(runs_b.load(), 0);
  EXPECT_GE(inbox_b->stats().store_errors, 2);  // the lock timeouts, counted as the store's
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_attempts"), 0);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 1);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 3);
}

TEST(PgStore, LockTimeoutBehindASlowHandlerIsNotYetNotAFailure) {
  lock_timeout_behind_a_slow_handler(100);
}
TEST(PgStore, BusyTimeoutZeroDoesNotWaitBehindTheLock) { lock_timeout_behind_a_slow_handler(0); }

// The seeds' third test: the consumer process dies (SIGKILL) after COMMIT, before the
// ack. The redelivery (DUP set) finds the claim: the handler does not run again.
TEST(PgStore, CrashBetweenCommitAndAckRedeliveryIsSkipped) {
  const std::string db = fresh_db("crash_commit");
  const std::string uri = uri_of(db);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    InboxOptions o;
    o.after_commit_hook = [](const std::string&, const std::string& id) {
      if (id == "c-3") ::kill(::getpid(), SIGKILL);
    };
    std::unique_ptr<Inbox> inbox;
    if (!Inbox::open(uri, o, &inbox).ok()) ::_exit(3);
    std::unique_ptr<Consumer> c;
    if (!Consumer::create(inbox.get(), "ledger", apply_credit, fast_options(), &c).ok()) ::_exit(4);
    for (int i = 0; i < 5; ++i) c->handle(credit("c-" + std::to_string(i), "acct", 10 + i));
    ::_exit(0);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 4);  // c-0..c-3 committed
  auto inbox = open_inbox(uri);
  std::atomic<int> runs{0};
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    ++runs;
                    apply_credit(t, d);
                  },
                  fast_options(), &c)
                  .ok());
  // The broker redelivers the unacknowledged c-3 with DUP set, then c-4.
  EXPECT_EQ(c->handle(credit("c-3", "acct", 13, true)), Outcome::kDuplicate);
  EXPECT_EQ(c->handle(credit("c-4", "acct", 14)), Outcome::kProcessed);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 5);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries WHERE message_id = 'c-3'"), 1);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 10 + 11 + 12 + 13 + 14);
}

// A message whose handler kills the process: the first delivery's attempt is not written
// in advance; every redelivery's is, so the message is dead-lettered after max_attempts.
TEST(PgStore, HandlerThatKillsTheProcessIsDeadLetteredAfterMaxAttempts) {
  const std::string db = fresh_db("crash_loop");
  const std::string uri = uri_of(db);
  ConsumerOptions o = fast_options();
  o.max_attempts = 2;
  auto run_child = [&](bool dup) {
    const pid_t child = ::fork();
    if (child == 0) {
      std::unique_ptr<Inbox> inbox;
      if (!Inbox::open(uri, InboxOptions{}, &inbox).ok()) ::_exit(3);
      std::unique_ptr<Consumer> c;
      if (!Consumer::create(
               inbox.get(), "ledger",
               [](pqxx::transaction_base& t, const Delivery& d) {
                 apply_credit(t, d);
                 ::kill(::getpid(), SIGKILL);
               },
               o, &c)
               .ok())
        ::_exit(4);
      const Outcome out = c->handle(credit("poison", "acct", 1, dup));
      ::_exit(out == Outcome::kDeadLettered ? 10 : 11);
    }
    int st = 0;
    ::waitpid(child, &st, 0);
    return st;
  };
  int st = run_child(false);  // first delivery: dies, uncounted
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_attempts"), 0);
  st = run_child(true);  // redelivery 1: counted in advance, dies
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(q(db, "SELECT attempts FROM mqtt_inbox.inbox_attempts"), 1);
  st = run_child(true);  // redelivery 2: counted in advance, dies
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(q(db, "SELECT attempts FROM mqtt_inbox.inbox_attempts"), 2);
  st = run_child(true);  // redelivery 3: max_attempts used: dead-lettered without running
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 10);
  EXPECT_EQ(q(db,
              "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE message_id = "
              "'poison' AND reason = 'handler_crashed'"),
            1);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 0);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 0);
}

// The handler's own constraint error (23514 check_violation: an overdraft) is the
// message's: counted as attempts, then a dead letter with the server's text.
TEST(PgStore, HandlerConstraintErrorIsCountedThenDeadLettered) {
  const std::string db = fresh_db("constraint");
  auto inbox = open_inbox(uri_of(db));
  ConsumerOptions o = fast_options();
  o.max_attempts = 3;
  std::atomic<int> runs{0};
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    ++runs;
                    apply_credit(t, d);
                  },
                  o, &c)
                  .ok());
  EXPECT_EQ(c->handle(credit("ok-1", "acct", 5)), Outcome::kProcessed);
  EXPECT_EQ(c->handle(credit("overdraft", "acct", -50)), Outcome::kDeadLettered);
  EXPECT_EQ(runs.load(), 1 + 3);
  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox->list_dead_letters(DeadLetterFilter{}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  EXPECT_EQ(dls[0].reason, DeadLetterReason::kHandlerFailed);
  EXPECT_EQ(dls[0].attempts, 3);
  EXPECT_EQ(dls[0].message_id.value_or(""), "overdraft");
  EXPECT_NE(dls[0].reason_text.find("violates check constraint"), std::string::npos)
      << dls[0].reason_text;
  EXPECT_NE(dls[0].payload.find("overdraft"), std::string::npos);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 1);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 5);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_attempts"), 0);
  // A redelivery of the dead-lettered message only counts on its row.
  EXPECT_EQ(c->handle(credit("overdraft", "acct", -50, true)), Outcome::kAlreadyDeadLettered);
  EXPECT_EQ(q(db, "SELECT redeliveries FROM mqtt_inbox.inbox_dead_letters"), 1);
  // RejectMessage: at once, invalid_payload.
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "strict",
                  [](pqxx::transaction_base&, const Delivery&) { throw RejectMessage("no"); }, o,
                  &c)
                  .ok());
  EXPECT_EQ(c->handle(credit("r-1", "acct", 1)), Outcome::kDeadLettered);
  EXPECT_EQ(q(db,
              "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE reason = "
              "'invalid_payload' AND attempts = 1"),
            1);
}

// Backends terminated (pg_terminate_backend: 57P01, then a closed connection) while a
// stream runs: the consumer reconnects by itself; nothing is lost, nothing doubled.
TEST(PgStore, BackendTerminatedMidStreamLosesAndDoublesNothing) {
  const std::string db = fresh_db("terminate");
  auto inbox = open_inbox(uri_of(db, "stream_consumer"));
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", apply_credit, fast_options(), &c).ok());
  std::atomic<bool> done{false};
  std::atomic<int> terminated{0};
  std::thread killer([&] {
    while (!done.load()) {
      std::this_thread::sleep_for(15ms);
      terminated += server().terminate_backends("stream_consumer");
    }
  });
  // At least 300 messages, and on until the killer has cut the stream three times: a fast
  // machine drains 300 credits in about a second, within two or three kills.
  constexpr int kMessages = 300, kMaxMessages = 20000;
  int64_t expected = 0;
  int n = 0;
  for (int i = 0; i < kMessages || (terminated.load() < 3 && i < kMaxMessages); ++i, ++n) {
    const bool redelivered = i % 7 == 3;
    // Some messages come twice, as after a lost PUBACK.
    const Outcome first = c->handle(credit("t-" + std::to_string(i), "acct", i));
    EXPECT_EQ(first, Outcome::kProcessed) << i;
    expected += i;
    if (redelivered) {
      EXPECT_EQ(c->handle(credit("t-" + std::to_string(i), "acct", i, true)), Outcome::kDuplicate);
    }
  }
  done = true;
  killer.join();
  EXPECT_GE(terminated.load(), 3) << "the stream was not interrupted";
  EXPECT_GE(inbox->stats().store_errors, 1);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), n);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), expected);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), n);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  std::printf("[figure] %d backends terminated during %d messages; %lld store errors retried\n",
              terminated.load(), n, static_cast<long long>(inbox->stats().store_errors));
}

// The server restarts (fast shutdown: 57P01 to the client, then no server at all) while a
// message waits: it is not acknowledged while its commit is not known; the consumer waits
// with backoff (health stuck, with the error), then goes on by itself once the server is
// back, and the stream applies every message once.
TEST(PgStore, ServerRestartMidStreamWaitsThenGoesOn) {
  const std::string db = fresh_db("restart");
  auto inbox = open_inbox(uri_of(db));
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", apply_credit, fast_options(), &c).ok());
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(c->handle(credit("s-" + std::to_string(i), "acct", 1)), Outcome::kProcessed);
  server().stop();
  auto during = std::async(std::launch::async, [&] { return c->handle(credit("s-5", "acct", 1)); });
  const auto t0 = std::chrono::steady_clock::now();
  while (!c->health().stuck && std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(c->health().stuck);
  EXPECT_FALSE(c->health().last_error.empty());
  EXPECT_EQ(during.wait_for(300ms), std::future_status::timeout);  // not acknowledged
  server().start();
  ASSERT_EQ(during.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(during.get(), Outcome::kProcessed);
  EXPECT_FALSE(c->health().stuck);
  for (int i = 6; i < 10; ++i)
    EXPECT_EQ(c->handle(credit("s-" + std::to_string(i), "acct", 1)), Outcome::kProcessed);
  EXPECT_EQ(c->handle(credit("s-5", "acct", 1, true)), Outcome::kDuplicate);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 10);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 10);
}

// A permission the inbox needs is taken away mid-stream (42501 insufficient_privilege):
// nothing is acknowledged, the consumer waits with the error in its health, and goes on
// once the grant is back. The message is not counted against: no attempt, no dead letter.
TEST(PgStore, PermissionLostMidStreamWaitsWithHealthThenGoesOn) {
  const std::string db = fresh_db("privilege");
  server().execute("CREATE ROLE app LOGIN; GRANT CREATE ON DATABASE privilege TO app", db);
  server().execute("GRANT ALL ON accounts, ledger_entries TO app", db);
  std::string uri = uri_of(db);
  uri.replace(uri.find("user=postgres"), 13, "user=app");
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  std::unique_ptr<Consumer> c;
  ConsumerOptions o = fast_options();
  o.max_attempts = 1;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", apply_credit, o, &c).ok());
  ASSERT_EQ(c->handle(credit("p-1", "acct", 1)), Outcome::kProcessed);
  server().execute("REVOKE INSERT ON mqtt_inbox.inbox_processed FROM app", db);
  auto during = std::async(std::launch::async, [&] { return c->handle(credit("p-2", "acct", 2)); });
  const auto t0 = std::chrono::steady_clock::now();
  while (!c->health().stuck && std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(c->health().stuck);
  EXPECT_NE(c->health().last_error.find("42501"), std::string::npos) << c->health().last_error;
  EXPECT_EQ(during.wait_for(300ms), std::future_status::timeout);
  server().execute("GRANT INSERT ON mqtt_inbox.inbox_processed TO app", db);
  ASSERT_EQ(during.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(during.get(), Outcome::kProcessed);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 3);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_attempts"), 0);
}

// A role that may use the inbox's tables but create nothing (no CREATE on the database or
// the schema: the runtime role of docs/postgres.md#privileges) opens an inbox whose schema
// an owner created, and consumes. PostgreSQL checks CREATE before IF NOT EXISTS, so the
// open must not issue CREATE for what is there: it did, got 42501 at every start and, with
// the default start-up deadline, waited for ever.
TEST(PgStore, RoleWithoutCreateOpensAnExistingSchemaAndConsumes) {
  const std::string db = fresh_db("no_create");
  { ASSERT_TRUE(open_inbox(uri_of(db))); }  // the owner (postgres) creates the schema
  server().execute(
      "CREATE ROLE runtime LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
      "GRANT USAGE ON SCHEMA mqtt_inbox TO runtime;"
      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mqtt_inbox TO runtime;"
      "GRANT USAGE ON ALL SEQUENCES IN SCHEMA mqtt_inbox TO runtime;"
      "GRANT ALL ON accounts, ledger_entries TO runtime",
      db);
  ASSERT_EQ(server().query_value("SELECT has_database_privilege('runtime', current_database(), "
                                 "'CREATE')::text",
                                 db),
            "false");
  std::string uri = uri_of(db);
  uri.replace(uri.find("user=postgres"), 13, "user=runtime");
  InboxOptions o;
  o.startup_deadline_ms = 5000;  // the old open waited for ever: fail within the test instead
  auto inbox = open_inbox(uri, o);
  ASSERT_TRUE(inbox);
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", apply_credit, fast_options(), &c).ok());
  EXPECT_EQ(c->handle(credit("r-1", "acct", 4)), Outcome::kProcessed);
  EXPECT_EQ(c->handle(credit("r-1", "acct", 4, true)), Outcome::kDuplicate);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 4);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 1);
}

// The connection drops during COMMIT (a proxy the test controls cuts it on the COMMIT
// message): the outcome is unknown, the message is not acknowledged, the store reconnects
// and the claim row decides. After forwarding (the server committed, the client never heard
// it): found, processed, the handler is not run again. Before forwarding (the server never
// saw COMMIT): absent, the message runs again. Either way the ledger has it once.
void cut_at_commit(CutProxy::When when) {
  const std::string db =
      fresh_db(when == CutProxy::When::kAfterForwarding ? "doubt_committed" : "doubt_lost");
  CutProxy proxy(CutProxy::Upstream{server().socket_path(), 0});
  const std::string uri = "postgresql:///" + db + "?host=" + proxy.socket_dir() +
                          "&port=" + std::to_string(proxy.port()) + "&user=postgres";
  auto inbox = open_inbox(uri);
  ASSERT_TRUE(inbox);
  std::atomic<int> runs{0};
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    ++runs;
                    apply_credit(t, d);
                  },
                  fast_options(), &c)
                  .ok());
  EXPECT_EQ(c->handle(credit("before", "acct", 1)), Outcome::kProcessed);
  proxy.cut_when(CutProxy::Direction::kClientToServer, "COMMIT", when);
  EXPECT_EQ(c->handle(credit("m-doubt", "acct", 5)), Outcome::kProcessed);
  EXPECT_EQ(proxy.triggers_fired(), 1);
  EXPECT_EQ(c->handle(credit("m-doubt", "acct", 5, true)), Outcome::kDuplicate);
  EXPECT_EQ(c->handle(credit("after", "acct", 2)), Outcome::kProcessed);
  EXPECT_EQ(runs.load(), when == CutProxy::When::kAfterForwarding ? 3 : 4);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries WHERE message_id = 'm-doubt'"), 1);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 8);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 3);
  EXPECT_GE(proxy.connections_accepted(), 2);  // it reconnected
}

TEST(PgStore, CommitCutAfterTheServerCommittedIsDecidedByTheClaimRow) {
  cut_at_commit(CutProxy::When::kAfterForwarding);
}
TEST(PgStore, CommitCutBeforeTheServerSawItRunsTheMessageAgain) {
  cut_at_commit(CutProxy::When::kBeforeForwarding);
}

// Retention: ids older than the window (on the server's clock) are deleted in batches;
// the window is validated against the redelivery horizon as on SQLite.
TEST(PgStore, RetentionDeletesByReceivedAtInBatchesWithTheHorizonCheck) {
  const std::string db = fresh_db("retention");
  auto inbox = open_inbox(uri_of(db));
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", apply_credit, fast_options(), &c).ok());
  for (int i = 0; i < 25; ++i)
    ASSERT_EQ(c->handle(credit("r-" + std::to_string(i), "acct", 1)), Outcome::kProcessed);
  // 20 of them received 10 days ago.
  server().execute(
      "UPDATE mqtt_inbox.inbox_processed SET received_at = now() - interval '10 days'"
      " WHERE message_id IN (SELECT message_id FROM mqtt_inbox.inbox_processed"
      " ORDER BY message_id LIMIT 20)",
      db);
  RetentionOptions ro;
  ro.window = std::chrono::hours(24 * 7);
  ro.broker_session_expiry = std::chrono::hours(24 * 8);  // longer than the window: refused
  std::unique_ptr<Pruner> pruner;
  const Status refused = Pruner::create(inbox.get(), ro, &pruner);
  EXPECT_EQ(refused.code(), Status::Code::kInvalidArgument) << refused.to_string();
  ro.broker_session_expiry = std::chrono::hours(24);
  ro.max_offline = std::chrono::hours(24);
  ro.replay_window = std::chrono::hours(24);
  ro.margin = std::chrono::hours(1);
  ro.batch_rows = 6;
  ASSERT_TRUE(Pruner::create(inbox.get(), ro, &pruner).ok());
  PruneResult r;
  ASSERT_TRUE(pruner->prune_once(&r).ok());
  EXPECT_EQ(r.processed_deleted, 20);
  EXPECT_GE(r.batches, 4);  // 20 rows in batches of 6
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 5);
  EXPECT_EQ(q(db, "SELECT count(*) FROM ledger_entries"), 25);  // business rows untouched
  EXPECT_EQ(server().query_value("SELECT value FROM mqtt_inbox.inbox_meta WHERE key = "
                                 "'required_window_ms'",
                                 db),
            std::to_string(Pruner::required_window_ms(ro)));
  // The retention clock is the server's.
  const int64_t server_ms = q(db, "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint");
  EXPECT_LT(std::llabs(inbox->retention_clock_ms() - server_ms), 5000);
  ASSERT_TRUE(inbox->refresh_row_stats().ok());
  EXPECT_EQ(inbox->stats().consumers.at("ledger").rows, 5);
}

// Session records and the dead letters' requeue and replay run on the same store.
TEST(PgStore, SessionRecordsAndRequeuedDeadLetters) {
  const std::string db = fresh_db("sessions");
  auto inbox = open_inbox(uri_of(db));
  SessionRecord r;
  r.client_id = "gw-1";
  r.topic_filters = {"b/#", "a/+", "b/#"};
  r.session_expiry_ms = 3600000;
  ASSERT_TRUE(inbox->sessions().record(r).ok());
  SessionRecord back;
  ASSERT_TRUE(inbox->sessions().load("gw-1", &back).ok());
  EXPECT_EQ(back.topic_filters, (std::vector<std::string>{"a/+", "b/#"}));
  EXPECT_EQ(back.session_expiry_ms, 3600000);
  inbox->sessions().note_lost("gw-1");
  std::vector<SessionRecord> all;
  ASSERT_TRUE(inbox->sessions().list(&all).ok());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].sessions_lost, 1);
  bool removed = false;
  ASSERT_TRUE(inbox->sessions().forget("gw-1", &removed).ok());
  EXPECT_TRUE(removed);
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_session_filters"), 0);

  // A message rejected while its account was unknown, requeued once the application can
  // take it, is replayed through the handler, once.
  std::atomic<bool> accept{false};
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "ledger",
                  [&](pqxx::transaction_base& t, const Delivery& d) {
                    if (!accept.load()) throw RejectMessage("unknown account");
                    apply_credit(t, d);
                  },
                  fast_options(), &c)
                  .ok());
  EXPECT_EQ(c->handle(credit("late", "acct", 4)), Outcome::kDeadLettered);
  std::vector<DeadLetter> dls;
  ASSERT_TRUE(inbox->list_dead_letters(DeadLetterFilter{}, &dls).ok());
  ASSERT_EQ(dls.size(), 1u);
  EXPECT_EQ(dls[0].reason, DeadLetterReason::kInvalidPayload);
  accept = true;
  ASSERT_TRUE(inbox->requeue_dead_letter(dls[0].id).ok());
  EXPECT_EQ(inbox->requeue_dead_letter(dls[0].id).code(), Status::Code::kInvalidArgument);
  int64_t replayed = 0;
  ASSERT_TRUE(c->replay_requeued(&replayed).ok());
  EXPECT_EQ(replayed, 1);
  EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'acct'"), 4);
  EXPECT_EQ(server().query_value("SELECT status FROM mqtt_inbox.inbox_dead_letters", db),
            "replayed");
  EXPECT_EQ(c->handle(credit("late", "acct", 4, true)), Outcome::kDuplicate);
  int64_t purged = 0;
  DeadLetterFilter all_rows;
  all_rows.include_replayed = true;
  ASSERT_TRUE(inbox->purge_dead_letters(all_rows, &purged).ok());
  EXPECT_EQ(purged, 1);
}

TEST(PgErrors, SqlstateClasses) {
  using detail::classify_sqlstate;
  using detail::PgErrorKind;
  for (const char* s :
       {"40001", "40P01", "55P03", "57P01", "08006", "08003", "53100", "25006", "42501", "58030"})
    EXPECT_EQ(classify_sqlstate(s).kind, PgErrorKind::kTransient) << s;
  for (const char* s : {"23505", "23514", "23503", "22003", "22P02", "42601", "P0001"})
    EXPECT_EQ(classify_sqlstate(s).kind, PgErrorKind::kMessage) << s;
  for (const char* s : {"XX001", "XX002"})
    EXPECT_EQ(classify_sqlstate(s).kind, PgErrorKind::kFatal) << s;
  EXPECT_EQ(classify_sqlstate("53100").status, Status::Code::kFull);
  EXPECT_EQ(classify_sqlstate("25006").status, Status::Code::kReadOnly);
  EXPECT_EQ(classify_sqlstate("42501").status, Status::Code::kPermissionDenied);
  EXPECT_TRUE(Status(classify_sqlstate("55P03").status, "").is_transient_store_error());
}

// libpqxx 6.4 throws 40001 and 40P01 as types that are not sql_error, and some server
// errors with an empty sqlstate(): the type decides (postgres_fixture_test shows which).
TEST(PgErrors, ExceptionTypesWithoutSqlstateAreClassifiedByType) {
  struct Case {
    std::function<void()> raise;
    std::string state;
    bool message_fault;
    Status::Code code;
  };
  const std::vector<Case> cases = {
      {[] { throw pqxx::serialization_failure("could not serialize"); }, "40001", false,
       Status::Code::kBusy},
      {[] { throw pqxx::deadlock_detected("deadlock detected"); }, "40P01", false,
       Status::Code::kBusy},
      {[] { throw pqxx::insufficient_privilege("permission denied"); }, "42501", false,
       Status::Code::kPermissionDenied},
      {[] { throw pqxx::disk_full("no space"); }, "53100", false, Status::Code::kFull},
      {[] { throw pqxx::check_violation("violates check constraint"); }, "23514", true,
       Status::Code::kRejected},
      {[] { throw pqxx::undefined_table("no such table"); }, "42P01", true,
       Status::Code::kRejected},
  };
  for (const Case& c : cases) {
    try {
      c.raise();
      FAIL() << "nothing thrown";
    } catch (const std::exception& e) {
      EXPECT_EQ(detail::pg_sqlstate(e), c.state) << e.what();
      Status s;
      bool message_fault = !c.message_fault;
      EXPECT_TRUE(detail::classify_pg_exception(e, &s, &message_fault)) << e.what();
      EXPECT_EQ(message_fault, c.message_fault) << e.what();
      EXPECT_EQ(s.code(), c.code) << s.to_string();
    }
  }
  // A broken connection is the store's, never the message's; a plain exception is not a
  // store error at all.
  Status s;
  bool message_fault = true;
  EXPECT_TRUE(detail::classify_pg_exception(pqxx::broken_connection("gone"), &s, &message_fault));
  EXPECT_FALSE(message_fault);
  EXPECT_TRUE(s.is_transient_store_error());
  EXPECT_FALSE(detail::classify_pg_exception(std::runtime_error("app"), &s, &message_fault));
}

}  // namespace
}  // namespace mqtt_inbox::test

// Issue 13, part 3: what each class of SQLite error (src/store/sqlite/errors.h) makes the
// consumer do, each triggered for real:
//  - failure of this message: a deferred foreign key that fails at COMMIT, a CHECK, the
//    commit hook's veto (SQLITE_CONSTRAINT_COMMITHOOK), NOT NULL, TOOBIG, MISMATCH. Each
//    counts as a handler attempt and ends as a dead letter after max_attempts, and the
//    valid credit behind it is applied: the stream is not stalled. (Before, the COMMIT
//    error was "internal" and retried forever.)
//  - transient: an injected error per I/O code (FaultVfs on the WAL's fsync): retried,
//    never counted as an attempt, applied once when it clears.
//  - fatal: an injected read error reporting corruption: health turns red, handle()
//    never returns (no ack), and the file is not written again (death test: the waiting
//    thread can only end with the process).
// Debian's libsqlite3 is built with the pre-update hook; its declarations need this.
#define SQLITE_ENABLE_PREUPDATE_HOOK 1
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "mqtt_inbox/outbox.h"
#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/store_then_process.h"
#include "store/sqlite/errors.h"
#include "support/fault_vfs.h"
#include "support/ledger_fixture.h"
#include "support/relay_side.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The input: ledger_entries.account REFERENCES known(account) DEFERRABLE
// INITIALLY DEFERRED; a credit for an unknown account fails at COMMIT.
void deferred_fk_schema(SQLite::Database& db) {
  db.exec(
      "CREATE TABLE known (account TEXT PRIMARY KEY);"
      "INSERT INTO known VALUES ('known');"
      "CREATE TABLE accounts (account TEXT PRIMARY KEY, balance INTEGER NOT NULL);"
      "CREATE TABLE ledger_entries (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL,"
      "  account TEXT NOT NULL REFERENCES known(account) DEFERRABLE INITIALLY DEFERRED,"
      "  amount INTEGER NOT NULL)");
}

// A CHECK in the business schema: a balance outside -1000..1000 is refused.
void check_schema(SQLite::Database& db) {
  ledger::create_tables(db);
  db.exec(
      "DROP TABLE accounts;"
      "CREATE TABLE accounts (account TEXT PRIMARY KEY,"
      "  balance INTEGER NOT NULL CHECK (balance BETWEEN -1000 AND 1000))");
}

class ErrorClassTest : public ::testing::Test {
 protected:
  void SetUp() override { db_ = dir_.file("ledger.db"); }

  void open(const std::function<void(SQLite::Database&)>& schema, InboxOptions o = {},
            Handler handler = ledger::apply_credit) {
    o.busy_timeout_ms = 100;
    ASSERT_TRUE(Inbox::open(db_, o, &inbox_).ok());
    ASSERT_TRUE(inbox_->setup(schema).ok());
    ConsumerOptions co;
    co.max_attempts = 3;
    co.retry_backoff_initial = milliseconds(1);
    co.retry_backoff_max = milliseconds(2);
    co.store_backoff_initial = milliseconds(2);
    co.store_backoff_max = milliseconds(20);
    ASSERT_TRUE(Consumer::create(inbox_.get(), "ledger", std::move(handler), co, &consumer_).ok());
  }

  // `bad` is refused by the store in its transaction: three attempts, then a dead letter
  // naming the SQLite error; the valid credit after it applies once.
  void expect_dead_letter_then_stream_goes_on(const Message& bad, const std::string& error_text) {
    EXPECT_EQ(consumer_->handle(bad), Outcome::kDeadLettered);
    EXPECT_EQ(consumer_->counters().handler_failures, 3);
    EXPECT_EQ(consumer_->counters().store_retries, 0)
        << "a failure of the message was retried as the store's";
    EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'handler_failed'"), 1);
    EXPECT_EQ(q("SELECT attempts FROM inbox_dead_letters"), 3);
    EXPECT_EQ(
        q("SELECT count(*) FROM inbox_dead_letters WHERE reason_text LIKE '%" + error_text + "%'"),
        1)
        << "the dead letter does not name the SQLite error";
    EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 0);
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 0);
    // The redelivery of the dead-lettered message is acked without running the handler.
    EXPECT_EQ(consumer_->handle(bad), Outcome::kAlreadyDeadLettered);
    EXPECT_EQ(consumer_->handle(credit_message("good-1", "known", 7)), Outcome::kProcessed);
    EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'known'"), 7);
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 1);
    EXPECT_FALSE(consumer_->health().stuck);
  }

  int64_t q(const std::string& sql) { return query_int(db_, sql); }

  TempDir dir_;
  std::string db_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
};

// The input: ledger_entries.account REFERENCES known(account) DEFERRABLE
// INITIALLY DEFERRED; a credit for an unknown account fails at COMMIT.
TEST_F(ErrorClassTest, DeferredForeignKeyAtCommitIsAFailureOfTheMessage) {
  open(deferred_fk_schema);
  expect_dead_letter_then_stream_goes_on(credit_message("fk-1", "stranger", 5), "FOREIGN KEY");
}

// A CHECK in the business schema.
TEST_F(ErrorClassTest, CheckConstraintIsAFailureOfTheMessage) {
  open(check_schema);
  expect_dead_letter_then_stream_goes_on(credit_message("chk-1", "known", 5000), "CHECK");
}

// The same two members in the store-then-process workers, where the row's transaction
// runs on a worker's own connection: a deferred foreign key refused at the handler's
// COMMIT, and a CHECK refused inside the handler's statement. Each is a failed attempt
// of that row (never a store failure retried forever): after max_attempts the row is
// dead with a dead letter naming the SQLite error, and the credit queued behind it in
// the same aggregate applies.
class StoreThenProcessErrorClassTest : public ErrorClassTest {
 protected:
  void expect_row_dead_then_stream_goes_on(const std::function<void(SQLite::Database&)>& schema,
                                           const Message& bad, const std::string& error_text,
                                           Handler handler = ledger::apply_credit,
                                           const std::string& reason = "handler_failed",
                                           int attempts = 3) {
    // The library's default busy timeout: the pool's maintenance connection reaps and
    // prunes at start while the worker claims, and under a loaded machine (ctest -j2
    // under qemu in CI) a 100 ms timeout let one of them give up on the other's commit,
    // counted as a store error though nothing about the row caused it.
    InboxOptions o;
    ASSERT_TRUE(Inbox::open(db_, o, &inbox_).ok());
    ASSERT_TRUE(inbox_->setup(schema).ok());
    StoreThenProcessOptions so;
    so.consumer.max_attempts = 3;
    so.consumer.retry_backoff_initial = milliseconds(1);
    so.consumer.retry_backoff_max = milliseconds(2);
    so.consumer.store_backoff_initial = milliseconds(2);
    so.consumer.store_backoff_max = milliseconds(20);
    so.poll_interval_ms = 10;
    so.workers = 1;
    std::unique_ptr<StoreThenProcess> stp;
    ASSERT_TRUE(StoreThenProcess::create(
                    inbox_.get(), "ledger",
                    [handler](SQLite::Database& db, const StoredDelivery& d) {
                      handler(db, Delivery{d.message, d.message_id, d.attempt});
                    },
                    so, &stp)
                    .ok());
    // Both stored before the workers start: the good credit waits behind the bad one.
    ASSERT_EQ(stp->handle(bad), Outcome::kProcessed);
    ASSERT_EQ(stp->handle(credit_message("good-1", "known", 7)), Outcome::kProcessed);
    ASSERT_TRUE(stp->start().ok());
    const bool settled = wait_until(
        [&] {
          return q("SELECT count(*) FROM inbox_messages WHERE status IN ('dead', 'done')") == 2;
        },
        seconds(15));
    ASSERT_TRUE(stp->stop().ok());
    ASSERT_TRUE(settled) << "the stream stalled: " << stp->counters().last_worker_error;
    EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE status = 'dead' AND attempts = " +
                std::to_string(attempts)),
              1);
    EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = '" + reason + "'"), 1);
    EXPECT_EQ(
        q("SELECT count(*) FROM inbox_dead_letters WHERE reason_text LIKE '%" + error_text + "%'"),
        1)
        << "the dead letter does not name the SQLite error";
    EXPECT_EQ(stp->counters().worker_store_errors, 0)
        << "a failure of the row was retried as the store's: " << stp->counters().last_worker_error;
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 1);
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'good-1'"), 1);
    EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'known'"), 7);
  }
};

TEST_F(StoreThenProcessErrorClassTest, DeferredForeignKeyAtCommitEndsTheRowDead) {
  expect_row_dead_then_stream_goes_on(deferred_fk_schema, credit_message("fk-1", "stranger", 5),
                                      "FOREIGN KEY");
}

TEST_F(StoreThenProcessErrorClassTest, CheckInTheHandlersStatementEndsTheRowDead) {
  expect_row_dead_then_stream_goes_on(check_schema, credit_message("chk-1", "known", 5000),
                                      "CHECK");
}

// A store-then-process handler that ends the library's transaction itself (COMMIT,
// ROLLBACK, or BEGIN to nest one) and swallows the refusal: the statement is refused at
// prepare time, the row is dead at once as handler_ended_transaction whatever the handler
// did next, and its write before the statement never commits apart from the row's done
// state. (The Consumer's side of the handler's contract is in the contract suite,
// tests/contract/contract_test.cpp, on every store.) `statement` runs after the credit,
// for the "stranger" account only.
Handler ending_transaction(const std::string& statement) {
  return [statement](SQLite::Database& db, const Delivery& d) {
    ledger::apply_credit(db, d);
    if (d.message.payload.find("stranger") == std::string::npos) return;
    try {
      db.exec(statement);
    } catch (const SQLite::Exception&) {
      // swallowed: the fence still judges the run
    }
  };
}

class StoreThenProcessEndsTransactionTest : public StoreThenProcessErrorClassTest,
                                            public ::testing::WithParamInterface<const char*> {};

TEST_P(StoreThenProcessEndsTransactionTest, WorkerRunIsDeadAtOnceByNameAndCommitsNothing) {
  expect_row_dead_then_stream_goes_on(
      ledger::create_tables, credit_message("tx-1", "stranger", 5),
      std::string("handler ended the transaction: it ran ") + GetParam(),
      ending_transaction(GetParam()), "handler_ended_transaction", 1);
  EXPECT_EQ(q("SELECT count(*) FROM accounts WHERE account = 'stranger'"), 0);
}

INSTANTIATE_TEST_SUITE_P(Statements, StoreThenProcessEndsTransactionTest,
                         ::testing::Values("COMMIT", "ROLLBACK", "BEGIN"));

// The application's commit hook vetoes the commit (SQLITE_CONSTRAINT_COMMITHOOK). A
// commit hook may not run SQL, so a pre-update hook marks a transaction that inserts a
// ledger entry of 666, and the commit hook vetoes that transaction only.
std::atomic<bool> g_veto{false};

TEST_F(ErrorClassTest, CommitHookVetoIsAFailureOfTheMessage) {
  open(ledger::create_tables);
  inbox_->with_connection([](SQLite::Database& db) {
    sqlite3_preupdate_hook(
        db.getHandle(),
        [](void*, sqlite3* conn, int op, const char*, const char* table, sqlite3_int64,
           sqlite3_int64) {
          sqlite3_value* amount = nullptr;
          if (op == SQLITE_INSERT && std::string(table) == "ledger_entries" &&
              sqlite3_preupdate_new(conn, 3, &amount) == SQLITE_OK &&
              sqlite3_value_int64(amount) == 666)
            g_veto = true;
        },
        nullptr);
    sqlite3_commit_hook(
        db.getHandle(), [](void*) -> int { return g_veto.exchange(false) ? 1 : 0; }, nullptr);
    sqlite3_rollback_hook(
        db.getHandle(), [](void*) { g_veto = false; }, nullptr);
  });
  expect_dead_letter_then_stream_goes_on(credit_message("hook-1", "known", 666),
                                         "constraint failed");
  inbox_->with_connection([](SQLite::Database& db) {
    sqlite3_commit_hook(db.getHandle(), nullptr, nullptr);
    sqlite3_rollback_hook(db.getHandle(), nullptr, nullptr);
    sqlite3_preupdate_hook(db.getHandle(), nullptr, nullptr);
  });
}

// A value too big for the connection's SQLITE_LIMIT_LENGTH (TOOBIG): a trigger on the
// handler's insert doubles a 60 kB account name past a 100 kB limit (the 60 kB payload
// itself still fits, so the dead letter can be written).
TEST_F(ErrorClassTest, TooBigIsAFailureOfTheMessage) {
  open([](SQLite::Database& db) {
    ledger::create_tables(db);
    db.exec(
        "CREATE TABLE audit (text TEXT);"
        "CREATE TRIGGER audit_entry AFTER INSERT ON ledger_entries"
        " BEGIN INSERT INTO audit VALUES (NEW.account || NEW.account); END");
  });
  inbox_->with_connection(
      [](SQLite::Database& db) { sqlite3_limit(db.getHandle(), SQLITE_LIMIT_LENGTH, 100000); });
  expect_dead_letter_then_stream_goes_on(credit_message("big-1", std::string(60000, 'b'), 5),
                                         "too big");
}

// A text value in an INTEGER PRIMARY KEY of the business table (MISMATCH), raised by a
// trigger on the handler's insert.
TEST_F(ErrorClassTest, DatatypeMismatchIsAFailureOfTheMessage) {
  open([](SQLite::Database& db) {
    ledger::create_tables(db);
    db.exec(
        "CREATE TABLE audit (n INTEGER PRIMARY KEY, account TEXT);"
        "CREATE TRIGGER audit_entry AFTER INSERT ON ledger_entries"
        " WHEN NEW.amount = 13 BEGIN INSERT INTO audit (n) VALUES ('thirteen'); END");
  });
  expect_dead_letter_then_stream_goes_on(credit_message("mm-1", "known", 13), "mismatch");
}

// --- transient: one injected I/O error code after another ---

class TransientCodeTest : public ErrorClassTest, public ::testing::WithParamInterface<int> {
 protected:
  FaultVfs vfs_{"error_class_transient"};
};

TEST_P(TransientCodeTest, IsRetriedNeverCountedAsAnAttemptAndAppliedOnce) {
  const int code = GetParam();
  ASSERT_EQ(detail::error_class(code), detail::ErrorClass::kTransient);
  InboxOptions o;
  o.vfs = vfs_.name();
  open(ledger::create_tables, o);
  ASSERT_EQ(consumer_->handle(credit_message("w-1", "known", 1)), Outcome::kProcessed);
  vfs_.arm(Fault::next(FaultOp::kSync, 6, code, FileKind::kWal));
  EXPECT_EQ(consumer_->handle(credit_message("t-1", "known", 2)), Outcome::kProcessed);
  EXPECT_EQ(vfs_.injected(), 6u);
  EXPECT_EQ(consumer_->counters().handler_failures, 0);
  // Each failure is a store retry (a failed sync after SQLITE_FULL may also be taken by
  // the checkpoint that gives the WAL's space back).
  EXPECT_GE(consumer_->counters().store_retries, 1);
  EXPECT_LE(consumer_->counters().store_retries, 6);
  const std::string e = consumer_->health().last_error;
  EXPECT_TRUE(e.rfind("busy:", 0) == 0 || e.rfind("full:", 0) == 0 ||
              e.rfind("io_error:", 0) == 0 || e.rfind("read_only:", 0) == 0)
      << e;
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'known'"), 3);
  EXPECT_EQ(consumer_->handle(credit_message("t-1", "known", 2)), Outcome::kDuplicate);
}

INSTANTIATE_TEST_SUITE_P(
    Codes, TransientCodeTest,
    ::testing::Values(SQLITE_IOERR, SQLITE_IOERR_FSYNC, SQLITE_IOERR_WRITE, SQLITE_IOERR_DIR_FSYNC,
                      SQLITE_IOERR_LOCK, SQLITE_IOERR_NOMEM, SQLITE_FULL, SQLITE_READONLY,
                      SQLITE_READONLY_DBMOVED, SQLITE_CANTOPEN, SQLITE_PROTOCOL, SQLITE_PERM),
    [](const ::testing::TestParamInfo<int>& p) {
      return std::string(detail::classify_sqlite_error(p.param).name).substr(7);
    });

// The outbox under a full disk (every outbox write goes through the inbox's store-error
// handling): a handler's enqueue rolls back with its claim while the commit's fsync fails,
// and the retry commits claim, credit and event once; the relay's marks (sent, dead) fail
// with the store's code and change nothing, so the row stays pending (a resend, never a
// loss) until the disk frees; nothing is ever deleted.
TEST_F(ErrorClassTest, OutboxUnderAFullDiskLosesNothingAndAddsNothingTwice) {
  FaultVfs vfs("error_class_outbox");
  struct Defer {
    std::function<void()> f;
    ~Defer() { f(); }
  } close_first{[this] {  // the inbox's last checkpoint at close still goes through `vfs`
    consumer_.reset();
    inbox_.reset();
  }};
  InboxOptions o;
  o.vfs = vfs.name();
  open(ledger::create_tables, o);
  std::unique_ptr<Outbox> outbox;
  ASSERT_TRUE(Outbox::create(inbox_.get(), {}, &outbox).ok());
  ConsumerOptions co;
  co.store_backoff_initial = milliseconds(2);
  co.store_backoff_max = milliseconds(20);
  std::unique_ptr<Consumer> emit;
  ASSERT_TRUE(Consumer::create(
                  inbox_.get(), "emit",
                  [&](SQLite::Database& db, const Delivery& d) {
                    ledger::apply_credit(db, d);
                    OutgoingMessage m;
                    m.topic = "events/credited";
                    m.payload = d.message_id;
                    m.message_id = derived_message_id(d.message_id, "credited");
                    outbox->enqueue_or_throw(db, m);
                  },
                  co, &emit)
                  .ok());
  vfs.arm(Fault::next(FaultOp::kSync, 4, SQLITE_FULL, FileKind::kWal));
  EXPECT_EQ(emit->handle(credit_message("f-1", "known", 5)), Outcome::kProcessed);
  EXPECT_EQ(vfs.injected(), 4u);
  EXPECT_EQ(emit->counters().handler_failures, 0);
  EXPECT_EQ(emit->handle(credit_message("f-1", "known", 5)), Outcome::kDuplicate);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'known'"), 5);
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages WHERE message_id = 'f-1/credited' "
              "AND state = 'pending'"),
            1);
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages"), 1);

  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);
  vfs.arm(Fault::always(FaultOp::kWrite, SQLITE_FULL, FileKind::kWal));
  const Status sent = relay_side(*outbox).mark_sent({{rows[0].seq, 1}});
  EXPECT_EQ(sent.code(), Status::Code::kFull) << sent.to_string();
  const Status dead = relay_side(*outbox).mark_dead(
      {rows[0].seq, 1}, OutboxDeadReason::kRejectedByBroker, 0x87, "acl");
  EXPECT_EQ(dead.code(), Status::Code::kFull) << dead.to_string();
  vfs.disarm();
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages WHERE state = 'pending'"), 1);
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[0].seq, 1}}).ok());
  EXPECT_EQ(q("SELECT count(*) FROM outbox_messages WHERE state = 'sent'"), 1);
}

// --- fatal: corruption reported by a read ---

class FatalCodeTest : public ErrorClassTest, public ::testing::WithParamInterface<int> {};

// Runs in a child process (a death test): the thread in handle() can only end with the
// process, exactly as in a consumer, where the process must exit to drop the message.
TEST_P(FatalCodeTest, TurnsHealthRedNeverReturnsAndLeavesTheFile) {
  // A threadsafe death test re-executes this binary; under qemu-user without binfmt_misc
  // the kernel cannot exec an aarch64 binary ("Exec format error").
  if (under_emulator()) GTEST_SKIP() << "death tests re-exec the test binary: not under qemu-user";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int code = GetParam();
  ASSERT_EQ(detail::error_class(code), detail::ErrorClass::kFatal);
  EXPECT_EXIT(
      {
        FaultVfs vfs("error_class_fatal");
        InboxOptions o;
        o.vfs = vfs.name();
        open(ledger::create_tables, o);
        if (consumer_->handle(credit_message("w-1", "known", 1)) != Outcome::kProcessed) _exit(10);
        std::unique_ptr<Outbox> outbox;
        if (!Outbox::create(inbox_.get(), {}, &outbox).ok()) _exit(11);
        inbox_->with_connection([&](SQLite::Database& db) {
          db.exec("BEGIN IMMEDIATE");
          OutgoingMessage m;
          m.topic = "events/x";
          m.message_id = "o-1";
          if (!outbox->enqueue(db, m).ok()) _exit(12);
          db.exec("COMMIT");
        });
        inbox_->with_connection(
            [](SQLite::Database& db) { db.exec("PRAGMA wal_checkpoint(TRUNCATE)"); });
        {
          // Another connection's commit: the consumer's page cache is stale, it must read.
          SQLite::Database other(db_, SQLite::OPEN_READWRITE);
          other.exec("INSERT INTO accounts (account, balance) VALUES ('other', 0)");
        }
        const std::string before = [&] {
          std::ifstream f(db_, std::ios::binary);
          return std::string(std::istreambuf_iterator<char>(f), {});
        }();
        vfs.arm(Fault::always(FaultOp::kRead, code));
        std::thread t([&] {
          consumer_->handle(credit_message("x-1", "known", 2));
          std::fprintf(stderr, "handle() returned: the message would have been acked\n");
          _exit(2);
        });
        t.detach();
        if (!wait_until([&] { return consumer_->health().fatal; }, seconds(10))) _exit(3);
        std::this_thread::sleep_for(milliseconds(300));
        const Health h = consumer_->health();
        if (level(h) != HealthLevel::kRed || h.database != db_ || !inbox_->health().fatal) _exit(4);
        std::ifstream f(db_, std::ios::binary);
        if (std::string(std::istreambuf_iterator<char>(f), {}) != before) _exit(5);
        // Every other entry refuses at once too, without touching SQLite: reads, writes,
        // the session records (which once forgot to) and the dead letters. The fault is
        // lifted first, so an entry that still went to SQLite would succeed here.
        vfs.disarm();
        const auto corrupt = [](const Status& st) {
          return st.code() == Status::Code::kCorruption;
        };
        SessionRecord rec;
        std::vector<SessionRecord> records;
        bool removed = false;
        SessionRecord mine;
        mine.client_id = "gateway-1";
        std::vector<DeadLetter> dead;
        if (!corrupt(inbox_->sessions().load("gateway-1", &rec)) ||
            !corrupt(inbox_->sessions().list(&records)) ||
            !corrupt(inbox_->sessions().record(mine)) ||
            !corrupt(inbox_->sessions().forget("gateway-1", &removed)) ||
            !corrupt(inbox_->list_dead_letters({}, &dead)))
          _exit(6);
        // The outbox lives in the same file: every call but enqueue (which runs in the
        // caller's transaction) refuses the same way, and none deletes a row.
        std::vector<OutboxRow> out_rows;
        std::vector<OutboxClassUsage> out_usage;
        OutboxSummary out_summary;
        OutboxRow out_row;
        if (!corrupt(relay_side(*outbox).fetch_pending(0, 10, &out_rows)) ||
            !corrupt(relay_side(*outbox).mark_sent({{1, 1}})) ||
            !corrupt(relay_side(*outbox).mark_dead({1, 0}, OutboxDeadReason::kExpired, 0, "x")) ||
            !corrupt(outbox->list(OutboxState::kPending, 10, &out_rows)) ||
            !corrupt(outbox->usage(&out_usage)) || !corrupt(outbox->summary(&out_summary)) ||
            !corrupt(outbox->get("o-1", &out_row)) || !corrupt(outbox->replay_dead("o-1")) ||
            !corrupt(outbox->purge(OutboxPurgeFilter{})))
          _exit(7);
        std::fprintf(stderr, "RED: %s\n", h.last_error.c_str());
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "RED: corruption");
}

INSTANTIATE_TEST_SUITE_P(
    Codes, FatalCodeTest,
    // SQLITE_IOERR_DATA is not here: from xRead it reached the consumer as plain
    // SQLITE_IOERR (transient), so only the table test covers its row.
    ::testing::Values(SQLITE_CORRUPT, SQLITE_CORRUPT_INDEX, SQLITE_CORRUPT_SEQUENCE, SQLITE_NOTADB,
                      SQLITE_IOERR_CORRUPTFS),
    [](const ::testing::TestParamInfo<int>& p) {
      return std::string(detail::classify_sqlite_error(p.param).name).substr(7);
    });

}  // namespace
}  // namespace mqtt_inbox::test

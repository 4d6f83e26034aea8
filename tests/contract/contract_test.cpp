// The contract suite: the rules every store must keep, written once and run against each
// (tests/README.md#the-contract-suite). A case is a test of ContractTest; it runs on every
// subject it applies to:
//   sqlite      the C++ API on an SQLite file
//   capi        the C API (c.h) on an SQLite file: the same rules seen from C
//   postgresql  the C++ API on a private PostgreSQL cluster (contract_pg_test, built with
//               the PostgreSQL store)
// A subject says which cases apply to it (Subject::applies): a store with no statement
// handles has no stepped statement to leave, a store whose handler gets no transaction
// object has no commit() to call. Everything else runs everywhere, and asserts on the
// business state (balances, ledger rows, claims, dead letters) read on a connection of
// its own, as a fresh process would see it.
//
// The cases: the handler's contract (it ends the library's transaction by every means a
// store offers, leaves a statement stepped, closes the connection, calls back into its
// inbox), the durability the options ask for, the error vocabulary (status.h), the
// claim race, and a message's lifetime (issue 42: a handler's "not yet" and its
// dependency schedule, a message whose MQTT 5 expiry ran out).
#include <gtest/gtest.h>

#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <mqtt_inbox/c.h>
#include <mqtt_inbox/mqtt_inbox.h>

#include <nlohmann/json.hpp>

#include "ledger.h"
#include "support/ledger_fixture.h"
#include "support/process.h"

#if MQTT_INBOX_CONTRACT_POSTGRES
#include <mqtt_inbox/postgres.h>

#include <pqxx/pqxx>

#include "ledger_postgres.h"
#include "support/postgres.h"
#endif

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

// What a case's handler does with the store's transaction. Each subject implements it on
// its own handle (SQLite::Database, sqlite3*, pqxx::transaction_base).
class TxnOps {
 public:
  virtual ~TxnOps() = default;
  // The ledger's credit of `d` (the business write).
  virtual void credit(const Delivery& d) = 0;
  // SQL text through the handler's transaction; the store's exception if it fails (the C
  // API's handler turns a failure into MQTT_INBOX_HANDLER_RETRY, see CapiSubject).
  virtual void exec(const std::string& sql) = 0;
  // The same, swallowing whatever the store says.
  void exec_quietly(const std::string& sql) {
    try {
      exec(sql);
    } catch (...) {
    }
  }
  // Closes the store's connection the handler was given.
  virtual void close_connection() = 0;
  // Prepares a statement on the connection and steps it once, and keeps it (the subject
  // finalizes it after the inbox is gone).
  virtual void leave_statement_stepped() = 0;
  // commit() on the transaction object (a store whose handler gets one).
  virtual void commit_object() = 0;
  // The store's durability setting as the handler's transaction sees it: "full"/"normal"
  // (SQLite's PRAGMA synchronous 2/1), "on"/"off" (PostgreSQL's synchronous_commit).
  virtual std::string durability() = 0;
};

using Behaviour = std::function<void(TxnOps&, const Delivery&)>;

// A store under the contract: opens an inbox with the ledger's tables and a Consumer
// "ledger" whose handler runs the case's behaviour, feeds messages, and reads state.
class Subject {
 public:
  virtual ~Subject() = default;
  virtual std::string name() const = 0;
  // Whether `aspect` applies: "statements", "transaction_object".
  virtual bool applies(const std::string& aspect) const = 0;
  // A new location for one case in `dir`.
  virtual std::string make_location(const std::string& dir) = 0;
  // Opens the inbox at `location` and its consumer. The handler calls behaviour() for
  // each message. Returns the open's status (a C code is mapped to Status::Code).
  virtual Status open(const std::string& location, const InboxOptions& options) = 0;
  virtual void close() = 0;
  // Feeds a message to the consumer as a transport would. The outcome, or kRefused for a
  // call the library refused (C: MQTT_INBOX_INVALID_ARGUMENT).
  virtual Outcome feed(const Message& m) = 0;
  // From inside the handler: the same, and setup_sql on the inbox.
  virtual Outcome feed_from_handler(const Message& m) = 0;
  virtual Status setup_from_handler() = 0;
  // One integer read on a connection of its own (NULL: 0); inbox tables by
  // inbox_table("inbox_processed").
  virtual int64_t q(const std::string& sql) = 0;
  // SQL as the store's owner, on a connection of its own.
  virtual void admin(const std::string& sql) = 0;
  virtual std::string inbox_table(const std::string& name) const = 0;
  // The health of the inbox's consumer (stuck, last_error).
  virtual Health consumer_health() = 0;

  Behaviour behaviour = [](TxnOps& t, const Delivery& d) { t.credit(d); };
  // The consumer's options, read by open() (the C subject maps them to its struct).
  ConsumerOptions consumer_options;
  std::string location;
};

// --- sqlite: the C++ API ---

class SqliteOps final : public TxnOps {
 public:
  SqliteOps(SQLite::Database& db, std::vector<sqlite3_stmt*>* kept) : db_(db), kept_(kept) {}
  void credit(const Delivery& d) override { ledger::apply_credit(db_, d); }
  void exec(const std::string& sql) override { db_.exec(sql); }
  void close_connection() override { sqlite3_close_v2(db_.getHandle()); }
  void leave_statement_stepped() override {
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db_.getHandle(), "SELECT account FROM accounts UNION ALL SELECT 1",
                                 -1, &st, nullptr),
              SQLITE_OK);
    sqlite3_step(st);
    kept_->push_back(st);
  }
  void commit_object() override {}
  std::string durability() override {
    return db_.execAndGet("PRAGMA synchronous").getInt() == 2 ? "full" : "normal";
  }

 private:
  SQLite::Database& db_;
  std::vector<sqlite3_stmt*>* kept_;
};

class SqliteSubject : public Subject {
 public:
  ~SqliteSubject() override { SqliteSubject::close(); }
  std::string name() const override { return "sqlite"; }
  bool applies(const std::string& aspect) const override { return aspect == "statements"; }
  std::string make_location(const std::string& dir) override { return dir + "/ledger.db"; }
  Status open(const std::string& loc, const InboxOptions& options) override {
    location = loc;
    Status s = Inbox::open(loc, options, &inbox_);
    if (!s.ok()) return s;
    s = inbox_->setup(ledger::create_tables);
    if (!s.ok()) return s;
    return Consumer::create(
        inbox_.get(), "ledger",
        [this](SQLite::Database& db, const Delivery& d) {
          SqliteOps ops(db, &kept_);
          behaviour(ops, d);
        },
        consumer_options, &consumer_);
  }
  void close() override {
    consumer_.reset();
    inbox_.reset();
    // The statements a handler kept: finalized after the inbox closed without them.
    for (sqlite3_stmt* st : kept_) sqlite3_finalize(st);
    kept_.clear();
  }
  Outcome feed(const Message& m) override { return consumer_->handle(m); }
  Outcome feed_from_handler(const Message& m) override { return consumer_->handle(m); }
  Status setup_from_handler() override { return inbox_->setup_sql("SELECT 1"); }
  int64_t q(const std::string& sql) override { return query_int(location, sql); }
  void admin(const std::string& sql) override {
    SQLite::Database db(location, SQLite::OPEN_READWRITE, 5000);
    db.exec(sql);
  }
  std::string inbox_table(const std::string& name) const override { return name; }
  Health consumer_health() override { return consumer_->health(); }

 protected:
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
  std::vector<sqlite3_stmt*> kept_;
};

// --- capi: the C API on SQLite ---

Status from_c(int rc, const char* what) {
  return rc == MQTT_INBOX_OK ? Status::Ok()
                             : Status(static_cast<Status::Code>(rc), what ? what : "");
}

class CapiOps final : public TxnOps {
 public:
  CapiOps(sqlite3* db, const mqtt_inbox_delivery_t* d, std::vector<sqlite3_stmt*>* kept)
      : db_(db), d_(d), kept_(kept) {}
  // The ledger's credit in C: the payload read by SQLite's JSON functions (as
  // examples/c/ledger.c does).
  void credit(const Delivery&) override {
    size_t len = 0;
    const void* payload = mqtt_inbox_delivery_payload(d_, &len);
    const char* id = mqtt_inbox_delivery_message_id(d_);
    sqlite3_stmt* st = nullptr;
    for (const char* sql :
         {"INSERT INTO accounts (account, balance) VALUES (json_extract(?1, '$.account'),"
          " json_extract(?1, '$.amount')) ON CONFLICT (account) DO UPDATE SET"
          " balance = balance + excluded.balance",
          "INSERT INTO ledger_entries (message_id, account, amount) VALUES (?2,"
          " json_extract(?1, '$.account'), json_extract(?1, '$.amount'))"}) {
      if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK)
        throw std::runtime_error(sqlite3_errmsg(db_));
      sqlite3_bind_text(st, 1, static_cast<const char*>(payload), static_cast<int>(len),
                        SQLITE_TRANSIENT);
      sqlite3_bind_text(st, 2, id, -1, SQLITE_TRANSIENT);
      const int stepped = sqlite3_step(st);
      sqlite3_finalize(st);
      if (stepped != SQLITE_DONE) throw std::runtime_error(sqlite3_errmsg(db_));
    }
  }
  void exec(const std::string& sql) override {
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK)
      throw std::runtime_error(sqlite3_errmsg(db_));
  }
  void close_connection() override { sqlite3_close_v2(db_); }
  void leave_statement_stepped() override {
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db_, "SELECT account FROM accounts UNION ALL SELECT 1", -1, &st, nullptr);
    sqlite3_step(st);
    kept_->push_back(st);
  }
  void commit_object() override {}
  std::string durability() override {
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db_, "PRAGMA synchronous", -1, &st, nullptr);
    sqlite3_step(st);
    const int v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v == 2 ? "full" : "normal";
  }
  int rc = MQTT_INBOX_HANDLER_OK;

 private:
  sqlite3* db_;
  const mqtt_inbox_delivery_t* d_;
  std::vector<sqlite3_stmt*>* kept_;
};

class CapiSubject final : public Subject {
 public:
  ~CapiSubject() override { CapiSubject::close(); }
  std::string name() const override { return "capi"; }
  bool applies(const std::string& aspect) const override { return aspect == "statements"; }
  std::string make_location(const std::string& dir) override { return dir + "/ledger.db"; }
  Status open(const std::string& loc, const InboxOptions& options) override {
    location = loc;
    mqtt_inbox_options_t o = MQTT_INBOX_OPTIONS_INIT;
    o.synchronous =
        options.synchronous == Synchronous::kFull ? MQTT_INBOX_SYNC_FULL : MQTT_INBOX_SYNC_NORMAL;
    char* err = nullptr;
    int rc = mqtt_inbox_open(loc.c_str(), &o, &inbox_, &err);
    Status s = from_c(rc, err);
    mqtt_inbox_free(err);
    if (!s.ok()) return s;
    if ((rc = mqtt_inbox_setup(
             inbox_,
             "CREATE TABLE IF NOT EXISTS accounts (account TEXT PRIMARY KEY,"
             " balance INTEGER NOT NULL);"
             "CREATE TABLE IF NOT EXISTS ledger_entries (id INTEGER PRIMARY KEY,"
             " message_id TEXT NOT NULL, account TEXT NOT NULL, amount INTEGER NOT NULL)")) !=
        MQTT_INBOX_OK)
      return from_c(rc, mqtt_inbox_errmsg(inbox_));
    mqtt_inbox_consumer_options_t co = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
    const ConsumerOptions& c = consumer_options;
    co.max_attempts = c.max_attempts;
    co.retry_backoff_initial_ms = static_cast<int>(c.retry_backoff_initial.count());
    co.retry_backoff_max_ms = static_cast<int>(c.retry_backoff_max.count());
    co.expired = c.expired == ExpiredPolicy::kApply ? MQTT_INBOX_EXPIRED_APPLY
                                                    : MQTT_INBOX_EXPIRED_DEAD_LETTER;
    co.dependency_immediate_attempts = c.dependency_immediate_attempts;
    co.dependency_backoff_initial_ms = c.dependency_backoff_initial.count();
    co.dependency_backoff_max_ms = c.dependency_backoff_max.count();
    co.dependency_wait_max_ms = c.dependency_wait_max.count();
    rc = mqtt_inbox_consumer_create(inbox_, "ledger", &CapiSubject::handler, this, &co, &consumer_);
    return from_c(rc, mqtt_inbox_errmsg(inbox_));
  }
  void close() override {
    if (consumer_) mqtt_inbox_consumer_destroy(consumer_);
    consumer_ = nullptr;
    if (inbox_) (void)mqtt_inbox_close(inbox_);
    inbox_ = nullptr;
    for (sqlite3_stmt* st : kept_) sqlite3_finalize(st);
    kept_.clear();
  }
  Outcome feed(const Message& m) override {
    mqtt_inbox_message_t cm = MQTT_INBOX_MESSAGE_INIT;
    cm.topic = m.topic.c_str();
    cm.payload = m.payload.data();
    cm.payload_len = m.payload.size();
    cm.qos = 1;
    cm.dup = m.dup ? 1 : 0;
    if (m.message_expiry_interval_s) cm.message_expiry_interval_s = *m.message_expiry_interval_s;
    int outcome = -1;
    const int rc = mqtt_inbox_consumer_feed(consumer_, &cm, &outcome);
    if (rc == MQTT_INBOX_INVALID_ARGUMENT) return Outcome::kRefused;
    EXPECT_EQ(rc, MQTT_INBOX_OK) << mqtt_inbox_errstr(rc);
    return static_cast<Outcome>(outcome);
  }
  Outcome feed_from_handler(const Message& m) override { return feed(m); }
  Status setup_from_handler() override {
    return from_c(mqtt_inbox_setup(inbox_, "SELECT 1"), "mqtt_inbox_setup");
  }
  int64_t q(const std::string& sql) override { return query_int(location, sql); }
  void admin(const std::string& sql) override {
    SQLite::Database db(location, SQLite::OPEN_READWRITE, 5000);
    db.exec(sql);
  }
  std::string inbox_table(const std::string& name) const override { return name; }
  Health consumer_health() override {
    Health h;
    char* json = nullptr;
    if (mqtt_inbox_consumer_health_json(consumer_, &json) == MQTT_INBOX_OK && json) {
      const std::string text = json;
      h.stuck = text.find("\"stuck\":true") != std::string::npos;
      h.last_error = text;
      // What a C caller reads of a wait for a dependency.
      const nlohmann::json j = nlohmann::json::parse(text);
      const nlohmann::json& dep = j.at("dependency");
      h.dependency.waiting = dep.at("waiting").get<bool>();
      h.dependency.waited_ms = dep.at("waited_ms").get<int64_t>();
      h.dependency.message_id = dep.at("message_id").get<std::string>();
      h.dependency.attempt = dep.at("attempt").get<int>();
      h.dependency.reason = dep.at("reason").get<std::string>();
      EXPECT_EQ(dep.at("text").get<std::string>(), to_string(h.dependency));
    }
    mqtt_inbox_free(json);
    return h;
  }

 private:
  static int handler(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
    auto* self = static_cast<CapiSubject*>(ctx);
    CapiOps ops(db, d, &self->kept_);
    const Message m;
    const std::string id = mqtt_inbox_delivery_message_id(d);
    const Delivery delivery{m, id, mqtt_inbox_delivery_attempt(d), nullptr};
    try {
      self->behaviour(ops, delivery);
    } catch (const RetryLater& e) {
      mqtt_inbox_delivery_set_reason(d, e.what());
      return MQTT_INBOX_HANDLER_NOT_YET;
    } catch (...) {
      return MQTT_INBOX_HANDLER_RETRY;
    }
    return ops.rc;
  }
  mqtt_inbox_t* inbox_ = nullptr;
  mqtt_inbox_consumer_t* consumer_ = nullptr;
  std::vector<sqlite3_stmt*> kept_;
};

#if MQTT_INBOX_CONTRACT_POSTGRES
// --- postgresql: the C++ API on a private cluster ---

class PgOps final : public TxnOps {
 public:
  explicit PgOps(pqxx::transaction_base& txn) : txn_(txn) {}
  void credit(const Delivery& d) override { ledger::postgres::apply_credit(txn_, d); }
  void exec(const std::string& sql) override { txn_.exec(sql); }
  void close_connection() override { txn_.conn().disconnect(); }
  void leave_statement_stepped() override {}
  void commit_object() override { txn_.commit(); }
  std::string durability() override {
    return txn_.exec1("SHOW synchronous_commit")[0].as<std::string>();
  }

 private:
  pqxx::transaction_base& txn_;
};

class PgSubject final : public Subject {
 public:
  explicit PgSubject(const Postgres& pg) : pg_(pg) { enable_postgres_store(); }
  ~PgSubject() override { PgSubject::close(); }
  std::string name() const override { return "postgresql"; }
  bool applies(const std::string& aspect) const override { return aspect == "transaction_object"; }
  std::string make_location(const std::string&) override {
    static std::atomic<int> next{0};
    db_ = "contract_" + std::to_string(++next);
    pg_.create_database(db_);
    return pg_.uri(db_);
  }
  Status open(const std::string& loc, const InboxOptions& options) override {
    location = loc;
    Status s = Inbox::open(loc, options, &inbox_);
    if (!s.ok()) return s;
    s = inbox_->setup_sql(ledger::postgres::kCreateTables);
    if (!s.ok()) return s;
    return Consumer::create(
        inbox_.get(), "ledger",
        [this](pqxx::transaction_base& txn, const Delivery& d) {
          PgOps ops(txn);
          behaviour(ops, d);
        },
        consumer_options, &consumer_);
  }
  void close() override {
    consumer_.reset();
    inbox_.reset();
  }
  Outcome feed(const Message& m) override { return consumer_->handle(m); }
  Outcome feed_from_handler(const Message& m) override { return consumer_->handle(m); }
  Status setup_from_handler() override { return inbox_->setup_sql("SELECT 1"); }
  int64_t q(const std::string& sql) override {
    const Postgres::Rows rows = pg_.query(sql, db_);
    if (rows.empty() || rows[0].empty() || !rows[0][0]) return 0;
    return std::stoll(*rows[0][0]);
  }
  void admin(const std::string& sql) override { pg_.execute(sql, db_); }
  std::string inbox_table(const std::string& name) const override { return "mqtt_inbox." + name; }
  Health consumer_health() override { return consumer_->health(); }
  const std::string& db() const { return db_; }

 private:
  const Postgres& pg_;
  std::string db_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
};
#endif

enum class Kind { kSqlite, kCapi, kPostgres };

std::string kind_name(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kSqlite:
      return "sqlite";
    case Kind::kCapi:
      return "capi";
    case Kind::kPostgres:
      return "postgresql";
  }
  return "unknown";
}

class ContractTest : public ::testing::TestWithParam<Kind> {
 protected:
#if MQTT_INBOX_CONTRACT_POSTGRES
  static void SetUpTestSuite() { pg_ = new Postgres(); }
  static void TearDownTestSuite() {
    delete pg_;
    pg_ = nullptr;
  }
  static Postgres* pg_;
#endif

  void SetUp() override {
    subject_ = make(GetParam());
    open();
  }
  void TearDown() override { subject_.reset(); }

  static std::unique_ptr<Subject> make(Kind k) {
    switch (k) {
      case Kind::kSqlite:
        return std::make_unique<SqliteSubject>();
      case Kind::kCapi:
        return std::make_unique<CapiSubject>();
      case Kind::kPostgres:
#if MQTT_INBOX_CONTRACT_POSTGRES
        return std::make_unique<PgSubject>(*pg_);
#else
        break;
#endif
    }
    return nullptr;
  }

  void open(const InboxOptions& options = {}) {
    const std::string loc =
        subject_->location.empty() ? subject_->make_location(dir_.path()) : subject_->location;
    const Status s = subject_->open(loc, options);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  void reopen(const InboxOptions& options = {}) {
    subject_->close();
    open(options);
  }

  Subject& s() { return *subject_; }
  int64_t q(const std::string& sql) { return subject_->q(sql); }
  std::string t(const std::string& table) { return subject_->inbox_table(table); }
  int64_t balance(const std::string& account) {
    return q("SELECT balance FROM accounts WHERE account = '" + account + "'");
  }
  int64_t dead(const std::string& id, const std::string& reason) {
    return q("SELECT count(*) FROM " + t("inbox_dead_letters") + " WHERE message_id = '" + id +
             "' AND reason = '" + reason + "'");
  }
  int64_t claimed(const std::string& id) {
    return q("SELECT count(*) FROM " + t("inbox_processed") + " WHERE message_id = '" + id + "'");
  }
  // The handler misbehaves on message `id` (ending the transaction as `misbehave` does);
  // asserts the contract: a dead letter handler_ended_transaction at once, nothing of it
  // committed (no claim, no business row), not a duplicate, and the next message goes
  // through.
  // `write_after`: the handler writes after it ended the transaction.
  void expect_ended_transaction(const std::function<void(TxnOps&)>& misbehave, bool then_throw,
                                bool write_after = true) {
    s().behaviour = [&](TxnOps& ops, const Delivery& d) {
      if (d.message_id != "bad-1") return ops.credit(d);
      ops.credit(d);  // a write before it ends the transaction
      misbehave(ops);
      if (write_after)
        ops.exec_quietly("INSERT INTO accounts (account, balance) VALUES ('after', 1)");
      if (then_throw) throw std::runtime_error("and then it threw");
    };
    EXPECT_EQ(s().feed(credit_message("bad-1", "ann", 5)), Outcome::kDeadLettered);
    EXPECT_EQ(dead("bad-1", "handler_ended_transaction"), 1);
    EXPECT_EQ(claimed("bad-1"), 0);
    EXPECT_EQ(balance("ann"), 0);
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'bad-1'"), 0);
    EXPECT_EQ(q("SELECT count(*) FROM accounts WHERE account = 'after'"), 0);
    EXPECT_EQ(q("SELECT attempts FROM " + t("inbox_dead_letters") + " WHERE message_id = 'bad-1'"),
              1);
    // A redelivery is the same dead letter, never a duplicate acked over a partial effect.
    EXPECT_EQ(s().feed(credit_message("bad-1", "ann", 5)), Outcome::kAlreadyDeadLettered);
    // The stream goes on.
    EXPECT_EQ(s().feed(credit_message("good-1", "bob", 7)), Outcome::kProcessed);
    EXPECT_EQ(balance("bob"), 7);
    EXPECT_EQ(balance("ann"), 0);
  }

  TempDir dir_;
  std::unique_ptr<Subject> subject_;
};

#if MQTT_INBOX_CONTRACT_POSTGRES
Postgres* ContractTest::pg_ = nullptr;
#endif

// --- the handler's contract: the library owns the transaction ---

TEST_P(ContractTest, HandlerThatCommitsThenThrowsIsDeadLetteredAndCommitsNothing) {
  expect_ended_transaction([](TxnOps& ops) { ops.exec_quietly("COMMIT"); }, true);
}

TEST_P(ContractTest, HandlerThatCommitsThenReturnsIsDeadLetteredAndCommitsNothing) {
  expect_ended_transaction([](TxnOps& ops) { ops.exec_quietly("COMMIT"); }, false);
}

TEST_P(ContractTest, HandlerThatRollsBackAndWritesOnIsDeadLetteredAndCommitsNothing) {
  expect_ended_transaction([](TxnOps& ops) { ops.exec_quietly("ROLLBACK"); }, false);
}

TEST_P(ContractTest, HandlerThatBeginsIsDeadLetteredAndCommitsNothing) {
  expect_ended_transaction([](TxnOps& ops) { ops.exec_quietly("BEGIN"); }, false);
}

// ROLLBACK then BEGIN leaves a transaction open, as the library's was: no notice, no
// status tells them apart. Committing it would ack a message whose effect rolled back.
TEST_P(ContractTest, HandlerThatRollsBackAndBeginsAnotherIsDeadLetteredAndCommitsNothing) {
  expect_ended_transaction(
      [](TxnOps& ops) {
        ops.exec_quietly("ROLLBACK");
        ops.exec_quietly("BEGIN");
      },
      false, /*write_after=*/false);
}

TEST_P(ContractTest, HandlerThatRollsBackBeginsAnotherAndWritesIsDeadLetteredAndCommitsNothing) {
  expect_ended_transaction(
      [](TxnOps& ops) {
        ops.exec_quietly("ROLLBACK");
        ops.exec_quietly("BEGIN READ WRITE");  // SQLite: a syntax error
      },
      false);
}

TEST_P(ContractTest, HandlerThatCommitsAndBeginsAnotherIsDeadLetteredAndCommitsNothing) {
  expect_ended_transaction(
      [](TxnOps& ops) {
        ops.exec_quietly("COMMIT");
        ops.exec_quietly("BEGIN READ WRITE");  // SQLite: a syntax error
      },
      false);
}

TEST_P(ContractTest, HandlerThatCommitsTheTransactionObjectIsDeadLetteredAndCommitsNothing) {
  if (!s().applies("transaction_object"))
    GTEST_SKIP() << s().name() << " hands the handler its connection, not a transaction object";
  expect_ended_transaction(
      [](TxnOps& ops) {
        try {
          ops.commit_object();
        } catch (...) {
        }
      },
      false);
}

TEST_P(ContractTest, HandlerThatClosesTheConnectionIsDeadLetteredAndTheInboxGoesOn) {
  s().behaviour = [&](TxnOps& ops, const Delivery& d) {
    if (d.message_id == "close-1") {
      ops.credit(d);
      ops.close_connection();
      return;
    }
    ops.credit(d);
  };
  EXPECT_EQ(s().feed(credit_message("close-1", "ann", 5)), Outcome::kDeadLettered);
  EXPECT_EQ(dead("close-1", "handler_ended_transaction"), 1);
  EXPECT_EQ(claimed("close-1"), 0);
  EXPECT_EQ(balance("ann"), 0);
  // A new connection in its place: the next messages are applied, once.
  EXPECT_EQ(s().feed(credit_message("after-close-1", "bob", 3)), Outcome::kProcessed);
  EXPECT_EQ(s().feed(credit_message("after-close-1", "bob", 3)), Outcome::kDuplicate);
  EXPECT_EQ(balance("bob"), 3);
  reopen();
  EXPECT_EQ(balance("bob"), 3);
}

TEST_P(ContractTest, StatementLeftSteppedIsResetAndTheInboxStillCloses) {
  if (!s().applies("statements"))
    GTEST_SKIP() << s().name() << " has no statement a handler can leave stepped";
  s().behaviour = [&](TxnOps& ops, const Delivery& d) {
    ops.credit(d);
    if (d.message_id == "stmt-1") ops.leave_statement_stepped();
  };
  EXPECT_EQ(s().feed(credit_message("stmt-0", "ann", 1)), Outcome::kProcessed);
  EXPECT_EQ(s().feed(credit_message("stmt-1", "ann", 2)), Outcome::kProcessed);
  EXPECT_EQ(s().feed(credit_message("stmt-2", "ann", 4)), Outcome::kProcessed);
  EXPECT_EQ(balance("ann"), 7);
  // Closing with the application's statement still prepared neither aborts nor loses
  // anything: the next open sees every commit.
  reopen();
  EXPECT_EQ(balance("ann"), 7);
  EXPECT_EQ(s().feed(credit_message("stmt-2", "ann", 4)), Outcome::kDuplicate);
}

// --- re-entry: refused the same way everywhere ---

TEST_P(ContractTest, FeedAndSetupFromInsideTheHandlerAreRefusedAndRecordNothing) {
  Outcome inner = Outcome::kProcessed;
  Status setup;
  s().behaviour = [&](TxnOps& ops, const Delivery& d) {
    ops.credit(d);
    if (d.message_id == "outer-1") {
      inner = s().feed_from_handler(credit_message("inner-1", "zed", 9));
      setup = s().setup_from_handler();
    }
  };
  EXPECT_EQ(s().feed(credit_message("outer-1", "ann", 5)), Outcome::kDeadLettered);
  EXPECT_EQ(inner, Outcome::kRefused);
  EXPECT_EQ(setup.code(), Status::Code::kInvalidArgument) << setup.to_string();
  EXPECT_EQ(dead("outer-1", "handler_reentered"), 1);
  // The inner message is recorded nowhere: no claim, no dead letter, no balance.
  EXPECT_EQ(claimed("inner-1"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM " + t("inbox_dead_letters") + " WHERE message_id = 'inner-1'"),
            0);
  EXPECT_EQ(balance("zed"), 0);
  EXPECT_EQ(balance("ann"), 0);
  EXPECT_EQ(s().feed(credit_message("inner-1", "zed", 9)), Outcome::kProcessed);
  EXPECT_EQ(balance("zed"), 9);
}

// --- durability is what the options say ---

TEST_P(ContractTest, DurabilityIsWhatTheOptionsSayWhateverTheStoreDefaults) {
#if MQTT_INBOX_CONTRACT_POSTGRES
  // The database's default is off: the inbox's transactions are durable all the same.
  if (GetParam() == Kind::kPostgres) {
    subject_->close();
    pg_->execute("ALTER DATABASE " + static_cast<PgSubject&>(s()).db() +
                 " SET synchronous_commit = off");
    open();
  }
#endif
  std::string seen;
  s().behaviour = [&](TxnOps& ops, const Delivery& d) {
    seen = ops.durability();
    ops.credit(d);
  };
  EXPECT_EQ(s().feed(credit_message("d-1", "ann", 1)), Outcome::kProcessed);
  const bool sqlite = GetParam() != Kind::kPostgres;
  EXPECT_EQ(seen, sqlite ? "full" : "on");
  // Relaxed only when asked for by name.
  InboxOptions relaxed;
  relaxed.synchronous = Synchronous::kNormal;
  reopen(relaxed);
  EXPECT_EQ(s().feed(credit_message("d-2", "ann", 1)), Outcome::kProcessed);
  EXPECT_EQ(seen, sqlite ? "normal" : "off");
  EXPECT_EQ(balance("ann"), 2);
}

// --- the claim race ---

TEST_P(ContractTest, TwoConsumersRacingForOneIdApplyItOnce) {
  if (GetParam() == Kind::kCapi) GTEST_SKIP() << "the race is the store's, run by the C++ subject";
  // A second process's inbox on the same store (SQLite: beside it, exclusive off).
  InboxOptions shared;
  shared.exclusive = false;
  reopen(shared);
  std::unique_ptr<Subject> other = make(GetParam());
  other->location = s().location;
  ASSERT_TRUE(other->open(s().location, shared).ok());
  for (int i = 0; i < 20; ++i) {
    const std::string id = "race-" + std::to_string(i);
    std::atomic<int> arrived{0};
    const auto together = [&] {
      arrived.fetch_add(1);
      while (arrived.load() < 2) std::this_thread::yield();
    };
    s().behaviour = other->behaviour = [&](TxnOps& ops, const Delivery& d) { ops.credit(d); };
    Outcome a = Outcome::kSkipped, b = Outcome::kSkipped;
    std::thread t1([&] {
      together();
      a = s().feed(credit_message(id, "ann", 1));
    });
    std::thread t2([&] {
      together();
      b = other->feed(credit_message(id, "ann", 1));
    });
    t1.join();
    t2.join();
    EXPECT_TRUE((a == Outcome::kProcessed && b == Outcome::kDuplicate) ||
                (a == Outcome::kDuplicate && b == Outcome::kProcessed))
        << id << ": " << to_string(a) << ", " << to_string(b);
  }
  EXPECT_EQ(balance("ann"), 20);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 20);
  other.reset();
}

// --- the error vocabulary (status.h): the same kinds and names on every store ---

TEST_P(ContractTest, SchemaNewerThanTheLibraryIsASchemaError) {
  subject_->close();
  s().admin(GetParam() == Kind::kPostgres
                ? "UPDATE mqtt_inbox.inbox_meta SET value = '99' WHERE key = 'schema_version'"
                : "PRAGMA user_version = 99");
  const Status st = s().open(s().location, {});
  EXPECT_EQ(st.code(), Status::Code::kSchema) << st.to_string();
  EXPECT_NE(st.message().find("newer"), std::string::npos) << st.to_string();
}

TEST_P(ContractTest, AWaitForAnotherWritersLockIsBusyAndNeverAnAttempt) {
  if (GetParam() == Kind::kCapi) GTEST_SKIP() << "the C subject's health is JSON; sqlite covers it";
  // Another connection holds the lock the claim needs, longer than the busy timeout: the
  // message waits ("busy", retried, no attempt counted), then goes through once.
  std::atomic<bool> release{false};
  std::thread holder;
#if MQTT_INBOX_CONTRACT_POSTGRES
  std::unique_ptr<pqxx::connection> pgc;
#endif
  std::unique_ptr<SQLite::Database> lite;
  if (GetParam() == Kind::kPostgres) {
#if MQTT_INBOX_CONTRACT_POSTGRES
    pgc = std::make_unique<pqxx::connection>(s().location);
    holder = std::thread([&] {
      pqxx::work w(*pgc);
      w.exec(
          "INSERT INTO mqtt_inbox.inbox_processed (consumer_name, message_id)"
          " VALUES ('ledger', 'busy-1')");
      while (!release) std::this_thread::sleep_for(10ms);
      w.abort();
    });
#endif
  } else {
    lite = std::make_unique<SQLite::Database>(s().location, SQLite::OPEN_READWRITE);
    lite->exec("BEGIN IMMEDIATE");
  }
  std::this_thread::sleep_for(200ms);
  Outcome o = Outcome::kSkipped;
  std::thread feeder([&] { o = s().feed(credit_message("busy-1", "ann", 3)); });
  bool stuck_busy = false;
  for (int i = 0; i < 200 && !stuck_busy; ++i) {
    const Health h = s().consumer_health();
    stuck_busy = h.stuck && h.last_error.find("busy") != std::string::npos;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(stuck_busy) << "the wait was not reported as busy";
  release = true;
  if (lite) lite->exec("ROLLBACK");
  feeder.join();
  if (holder.joinable()) holder.join();
  EXPECT_EQ(o, Outcome::kProcessed);
  EXPECT_EQ(balance("ann"), 3);
  EXPECT_EQ(q("SELECT count(*) FROM " + t("inbox_attempts")), 0);
}

// --- a message's lifetime (issue 42): the same rules on every store and from C ---

// The dependency schedule with short, configured durations: 2 immediate runs 10 and 20 ms
// apart, then 30 ms doubling to 80 ms, for at most `wait_max`.
ConsumerOptions short_dependency_schedule(std::chrono::milliseconds wait_max) {
  ConsumerOptions o;
  o.retry_backoff_initial = 10ms;
  o.retry_backoff_max = 20ms;
  o.dependency_immediate_attempts = 2;
  o.dependency_backoff_initial = 30ms;
  o.dependency_backoff_max = 80ms;
  o.dependency_wait_max = wait_max;
  o.store_backoff_max = 200ms;
  return o;
}

TEST_P(ContractTest, ADependencyDownLongerThanTheImmediateRunsIsWaitedOutAndAppliedOnce) {
  s().consumer_options = short_dependency_schedule(20s);
  reopen();
  std::atomic<int> runs{0};
  s().behaviour = [&](TxnOps& ops, const Delivery& d) {
    ops.credit(d);  // written, and rolled back by the "not yet"
    if (++runs <= 8) throw RetryLater("meter gateway 10.0.0.7: connection refused");
  };
  // A redelivery (DUP): a store without a running-attempt marker counts its attempt before
  // the run; a "not yet" takes it back, so 8 of them spend none of max_attempts (5).
  Message m = credit_message("dep-1", "ann", 5);
  m.dup = true;
  EXPECT_EQ(s().feed(m), Outcome::kProcessed);
  EXPECT_EQ(runs.load(), 9);
  EXPECT_EQ(balance("ann"), 5);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'dep-1'"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM " + t("inbox_dead_letters")), 0);
  EXPECT_EQ(q("SELECT count(*) FROM " + t("inbox_attempts")), 0);
  EXPECT_FALSE(s().consumer_health().dependency.waiting);
  EXPECT_EQ(s().feed(m), Outcome::kDuplicate);
  EXPECT_EQ(balance("ann"), 5);
}

TEST_P(ContractTest, ADependencyThatNeverComesBackIsDependencyUnavailableAfterTheSchedule) {
  s().consumer_options = short_dependency_schedule(400ms);
  reopen();
  int runs = 0;
  s().behaviour = [&](TxnOps& ops, const Delivery& d) {
    ops.credit(d);
    if (d.message_id != "dep-2") return;
    ++runs;
    throw RetryLater("meter gateway 10.0.0.7: connection refused");
  };
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(s().feed(credit_message("dep-2", "ann", 5)), Outcome::kDeadLettered);
  const auto took = std::chrono::steady_clock::now() - t0;
  // The schedule: runs at 0, 10, 30 ms (immediate), then 60, 120, 200, 280, 360, 400 ms:
  // the last one when the wait is over.
  EXPECT_GE(took, 400ms);
  EXPECT_LT(took, 5s);
  EXPECT_GE(runs, 8);
  EXPECT_LE(runs, 10);
  EXPECT_EQ(dead("dep-2", "dependency_unavailable"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM " + t("inbox_dead_letters") +
              " WHERE message_id = 'dep-2' AND reason_text LIKE '%connection refused%'"
              "   AND reason_text LIKE '%not yet%'"),
            1);
  EXPECT_EQ(claimed("dep-2"), 0);
  EXPECT_EQ(balance("ann"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM " + t("inbox_attempts")), 0);
  // Its redelivery is the same dead letter; the stream goes on.
  EXPECT_EQ(s().feed(credit_message("dep-2", "ann", 5)), Outcome::kAlreadyDeadLettered);
  EXPECT_EQ(s().feed(credit_message("dep-3", "bob", 7)), Outcome::kProcessed);
  EXPECT_EQ(balance("bob"), 7);
}

TEST_P(ContractTest, AMessageHeldForADependencyIsShownInHealthAndIsNotStuck) {
  s().consumer_options = short_dependency_schedule(30s);
  s().consumer_options.dependency_backoff_max = 50ms;
  reopen();
  std::atomic<bool> down{true};
  s().behaviour = [&](TxnOps& ops, const Delivery& d) {
    ops.credit(d);
    if (down) throw RetryLater("meter gateway 10.0.0.7: connection refused");
  };
  Outcome o = Outcome::kSkipped;
  std::thread feeder([&] { o = s().feed(credit_message("dep-4", "ann", 5)); });
  Health seen;
  const bool shown = wait_until(
      [&] {
        seen = s().consumer_health();
        return seen.dependency.waiting && seen.dependency.attempt >= 5;
      },
      10s);
  down = false;
  feeder.join();
  ASSERT_TRUE(shown) << "the wait never showed in health()";
  EXPECT_FALSE(seen.stuck) << "a wait for a dependency is not a stuck store";
  EXPECT_EQ(seen.dependency.message_id, "dep-4");
  EXPECT_NE(seen.dependency.reason.find("connection refused"), std::string::npos);
  EXPECT_EQ(to_string(seen.dependency).rfind("waiting for a dependency: ", 0), 0u);
  EXPECT_NE(to_string(seen.dependency).find("message 'dep-4', attempt "), std::string::npos);
  EXPECT_EQ(o, Outcome::kProcessed);
  EXPECT_EQ(balance("ann"), 5);
  EXPECT_FALSE(s().consumer_health().dependency.waiting);
}

TEST_P(ContractTest, AMessageWhoseExpiryRunsOutWhileTheStoreIsLockedIsNeverApplied) {
  // Another connection holds the lock the claim needs (SQLite: the write lock; PostgreSQL:
  // an uncommitted claim of the same id) for longer than the message's 1 s expiry.
  s().consumer_options.store_backoff_max = 200ms;
  InboxOptions o;
  o.busy_timeout_ms = 200;
  reopen(o);
  std::atomic<bool> release{false};
  std::thread holder;
#if MQTT_INBOX_CONTRACT_POSTGRES
  std::unique_ptr<pqxx::connection> pgc;
#endif
  std::unique_ptr<SQLite::Database> lite;
  if (GetParam() == Kind::kPostgres) {
#if MQTT_INBOX_CONTRACT_POSTGRES
    pgc = std::make_unique<pqxx::connection>(s().location);
    std::atomic<bool> held{false};
    holder = std::thread([&] {
      pqxx::work w(*pgc);
      w.exec(
          "INSERT INTO mqtt_inbox.inbox_processed (consumer_name, message_id)"
          " VALUES ('ledger', 'exp-1')");
      held = true;
      while (!release) std::this_thread::sleep_for(10ms);
      w.abort();
    });
    ASSERT_TRUE(wait_until([&] { return held.load(); }, 5s));
#endif
  } else {
    lite = std::make_unique<SQLite::Database>(s().location, SQLite::OPEN_READWRITE);
    lite->exec("BEGIN IMMEDIATE");
  }
  Message m = credit_message("exp-1", "ann", 5);
  m.message_expiry_interval_s = 1;
  Outcome out = Outcome::kSkipped;
  std::thread feeder([&] { out = s().feed(m); });
  std::this_thread::sleep_for(2500ms);  // the expiry runs out while the claim waits
  release = true;
  if (lite) lite->exec("ROLLBACK");
  feeder.join();
  if (holder.joinable()) holder.join();
  EXPECT_EQ(out, Outcome::kDeadLettered);
  EXPECT_EQ(dead("exp-1", "expired"), 1);
  EXPECT_EQ(claimed("exp-1"), 0);
  EXPECT_EQ(balance("ann"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries WHERE message_id = 'exp-1'"), 0);
  // The dead letter keeps the interval the message arrived with, and says how long it
  // waited.
  EXPECT_EQ(q("SELECT count(*) FROM " + t("inbox_dead_letters") +
              " WHERE message_id = 'exp-1' AND properties LIKE '%\"message_expiry_interval_s\":1%'"
              "   AND reason_text LIKE 'message expiry interval 1 s ran out%waited %'"),
            1);
  EXPECT_EQ(s().feed(m), Outcome::kAlreadyDeadLettered);
  // A message with time left is applied; one without an expiry (MQTT 3.1.1) never expires.
  Message later = credit_message("exp-2", "bob", 3);
  later.message_expiry_interval_s = 60;
  EXPECT_EQ(s().feed(later), Outcome::kProcessed);
  EXPECT_EQ(s().feed(credit_message("exp-3", "bob", 4)), Outcome::kProcessed);
  EXPECT_EQ(balance("bob"), 7);
}

TEST_P(ContractTest, AHandlerThatOutlastsItsMessagesExpiryCommitsNothingUnlessToldToApplyIt) {
  s().behaviour = [&](TxnOps& ops, const Delivery& d) {
    ops.credit(d);
    std::this_thread::sleep_for(1300ms);  // past the 1 s expiry, inside the transaction
  };
  Message m = credit_message("exp-4", "ann", 5);
  m.message_expiry_interval_s = 1;
  EXPECT_EQ(s().feed(m), Outcome::kDeadLettered);
  EXPECT_EQ(dead("exp-4", "expired"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM " + t("inbox_dead_letters") +
              " WHERE message_id = 'exp-4' AND reason_text LIKE '%before its claim could commit%'"),
            1);
  EXPECT_EQ(claimed("exp-4"), 0);
  EXPECT_EQ(balance("ann"), 0);
  // ExpiredPolicy::kApply: the producer's expiry is for the broker's queue only.
  s().consumer_options.expired = ExpiredPolicy::kApply;
  reopen();
  Message n = credit_message("exp-5", "bob", 3);
  n.message_expiry_interval_s = 1;
  EXPECT_EQ(s().feed(n), Outcome::kProcessed);
  EXPECT_EQ(balance("bob"), 3);
}

#if MQTT_INBOX_CONTRACT_POSTGRES
// The kinds only a server has, on the PostgreSQL subject; SQLite's own kinds
// (permission on a file, corruption, a full disk) are in tests/crash and tests/unit.

class PgErrorKindTest : public ContractTest {};

TEST_P(PgErrorKindTest, AMissingDatabaseIsNotFound) {
  subject_->close();
  const Status st = s().open(pg_->uri("no_such_db"), {});
  EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("no_such_db"), std::string::npos) << st.to_string();
}

TEST_P(PgErrorKindTest, AWrongPasswordIsAuthenticationAndAnUnreadablePasswordFileIsNamed) {
  subject_->close();
  const std::string db = static_cast<PgSubject&>(s()).db();
  pg_->execute("CREATE ROLE contract_pw LOGIN PASSWORD 'right'");
  // The cluster trusts its socket; this role must give its password.
  {
    std::ifstream in(pg_->data_dir() + "/pg_hba.conf");
    const std::string rest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(pg_->data_dir() + "/pg_hba.conf");
    out << "local all contract_pw scram-sha-256\n" << rest;
  }
  pg_->execute("SELECT pg_reload_conf()");
  std::this_thread::sleep_for(300ms);
  const std::string pwfile = dir_.path() + "/pgpass";
  {
    std::ofstream f(pwfile);
    f << "*:*:*:contract_pw:wrong\n";
  }
  ::chmod(pwfile.c_str(), 0600);
  InboxOptions o;
  o.postgres_password_file = pwfile;
  o.startup_deadline_ms = 3000;
  std::string uri = pg_->uri(db);
  uri.replace(uri.find("user=postgres"), 13, "user=contract_pw");
  Status st = s().open(uri, o);
  EXPECT_EQ(st.code(), Status::Code::kAuthentication) << st.to_string();
  EXPECT_NE(st.message().find(pwfile), std::string::npos) << st.to_string();
  EXPECT_EQ(st.message().find("wrong"), std::string::npos) << "the password leaked";
  o.postgres_password_file = dir_.path() + "/no_such_file";
  st = s().open(uri, o);
  EXPECT_EQ(st.code(), Status::Code::kPermissionDenied) << st.to_string();
  EXPECT_NE(st.message().find("no_such_file"), std::string::npos) << st.to_string();
}

TEST_P(PgErrorKindTest, ARuntimeRoleWithoutTheSchemaIsToldToMigrateAsTheOwner) {
  subject_->close();
  const std::string db = static_cast<PgSubject&>(s()).db();
  pg_->execute("CREATE ROLE contract_rt LOGIN");
  pg_->execute("REVOKE CREATE ON DATABASE " + db + " FROM PUBLIC");
  pg_->execute("DROP SCHEMA mqtt_inbox CASCADE", db);
  std::string uri = pg_->uri(db);
  uri.replace(uri.find("user=postgres"), 13, "user=contract_rt");
  InboxOptions o;
  o.startup_deadline_ms = 3000;
  const Status st = s().open(uri, o);
  EXPECT_EQ(st.code(), Status::Code::kSchema) << st.to_string();
  EXPECT_NE(st.message().find("mqtt-inbox migrate"), std::string::npos) << st.to_string();
}

TEST_P(PgErrorKindTest, AMissingGrantIsAPermissionErrorNamingTheTable) {
  subject_->close();
  const std::string db = static_cast<PgSubject&>(s()).db();
  pg_->execute("CREATE ROLE contract_ng LOGIN");
  pg_->execute("GRANT USAGE ON SCHEMA mqtt_inbox TO contract_ng", db);
  pg_->execute(
      "GRANT SELECT, INSERT, UPDATE, DELETE ON mqtt_inbox.inbox_meta,"
      " mqtt_inbox.inbox_attempts, mqtt_inbox.inbox_dead_letters,"
      " mqtt_inbox.inbox_sessions, mqtt_inbox.inbox_session_filters"
      " TO contract_ng",
      db);
  pg_->execute("GRANT SELECT, INSERT, UPDATE ON accounts, ledger_entries TO contract_ng", db);
  pg_->execute("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO contract_ng", db);
  std::string uri = pg_->uri(db);
  uri.replace(uri.find("user=postgres"), 13, "user=contract_ng");
  ASSERT_TRUE(s().open(uri, {}).ok());
  // The claim meets the missing GRANT on inbox_processed: the message waits (never
  // acked), named as a permission error with the table and what to grant.
  Outcome o = Outcome::kSkipped;
  std::thread feeder([&] { o = s().feed(credit_message("grant-1", "ann", 2)); });
  bool named = false;
  std::string last;
  for (int i = 0; i < 200 && !named; ++i) {
    last = s().consumer_health().last_error;
    named = last.find("permission_denied") != std::string::npos &&
            last.find("inbox_processed") != std::string::npos &&
            last.find("GRANT") != std::string::npos;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(named) << last;
  pg_->execute("GRANT SELECT, INSERT, UPDATE, DELETE ON mqtt_inbox.inbox_processed TO contract_ng",
               db);
  feeder.join();
  EXPECT_EQ(o, Outcome::kProcessed);
  EXPECT_EQ(balance("ann"), 2);
}

INSTANTIATE_TEST_SUITE_P(Stores, PgErrorKindTest, ::testing::Values(Kind::kPostgres), kind_name);
INSTANTIATE_TEST_SUITE_P(Stores, ContractTest, ::testing::Values(Kind::kPostgres), kind_name);
#else
INSTANTIATE_TEST_SUITE_P(Stores, ContractTest, ::testing::Values(Kind::kSqlite, Kind::kCapi),
                         kind_name);
#endif

}  // namespace
}  // namespace mqtt_inbox::test

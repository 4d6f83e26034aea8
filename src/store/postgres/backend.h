// PgBackend: the PostgreSQL store beneath the Store front (store/backend.h): one libpqxx
// connection to one server for the per-message path, the prepared statements, the
// transaction open on it, and the connections the store's other parts open. Its code is
// in this folder: open.cpp (the location and its password rule, connecting and each
// connection's session settings, the schema in versioned steps, the application's set-up,
// errors and the fatal latch), claim.cpp (the claim transaction's statements, attempts,
// the commit whose outcome is unknown, the handler's run and the transaction guard),
// dead_letters.cpp and sessions.cpp (their rows), retention_rows.cpp (the Pruner's
// deletes, row measurement), stp_rows.cpp (store-then-process's rows, each worker on a
// connection of its own), outbox_rows.cpp (the outbox's rows and their LISTEN/NOTIFY
// wake-up), slot_leases.cpp (a fleet member's slots and the relay's turn, held by advisory
// locks on a connection of their own) and errors.cpp (SQLSTATE classes).
//
// The handler's contract on this store (handler.h): a COMMIT cannot be forbidden on
// PostgreSQL, so a connection a handler runs on (the inbox's own, each store-then-process
// worker's) is set up so that nothing a handler does to end the library's transaction can
// commit part of it: the session's transactions are read only unless the library opens
// them READ WRITE (a handler's statements after a ROLLBACK of its own fail), and each
// handler transaction holds a row of a temporary guard table whose deferred trigger
// refuses any COMMIT the library did not mark as its own (the whole transaction, claim
// included, rolls back). The library then reads the connection's transaction status
// (PQtransactionStatus) to tell what the handler did. docs/postgres.md#the-handlers-transaction.
//
// Thread safety: the front serialises use of `conn` with `mu`; workers and the other parts
// use connections of their own.
#pragma once

#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "mqtt_inbox/options.h"
#include "store/backend.h"
#include "store/outbox_rows.h"
#include "store/retention_rows.h"
#include "store/store.h"
#include "store/stp_rows.h"

extern "C" {
typedef struct pg_conn PGconn;
}

namespace mqtt_inbox::detail {

class PgBackend;

// The version of the PostgreSQL schema this library writes (<schema>.inbox_meta key
// 'schema_version'); its steps are in open.cpp.
constexpr int kPgSchemaVersion = 4;

// A libpqxx connection whose libpq handle the store can read (PQtransactionStatus, the
// socket): libpqxx 6.4 exposes it only to a connection policy, which this one is. With
// `reconnects` false it never reconnects by itself (libpqxx's reactivation would lose the
// session's settings, which a connection handlers run on depends on): a broken connection
// stays broken until the store makes a new one.
class PgConnection final : public pqxx::connection_base {
 public:
  explicit PgConnection(const std::string& conninfo, bool reconnects = true);
  ~PgConnection() noexcept;
  // The libpq connection, or null once it is closed.
  PGconn* raw() const { return policy_.pg; }

 private:
  struct Policy final : pqxx::connect_direct {
    explicit Policy(const std::string& opts) : pqxx::connect_direct(opts) {}
    handle do_startconnect(handle orig) override;
    handle do_completeconnect(handle orig) override;
    handle do_dropconnect(handle orig) noexcept override;
    handle do_disconnect(handle orig) noexcept override;
    PGconn* pg = nullptr;
  };
  std::string options_;
  Policy policy_;
};

// The text of the error pg_temp.mqtt_inbox_txn_check() raises (open.cpp): the transaction
// is not the one the library began for a handler.
constexpr const char kPgNotOurs[] = "mqtt-inbox: the transaction is not the one the library began";

// A transaction of the library on one of its connections: READ WRITE (a connection a
// handler runs on reads only by default), and a failed statement leaves it to its owner
// instead of rolling back at once (so that the store can tell a handler that went on after
// an error). A guarded one is a handler's: it is marked as the library's and updates the
// guard row, and only commit_by_library() commits it; a commit() or abort() of the
// handler's own on it is refused or noted (handler_ended()). After a handler ran on it
// (handler_ran()), its commit and confirm_ours() check that it is still the transaction
// the library began, and throw TransactionNotOurs when it is not.
class PgWork final : public pqxx::dbtransaction {
 public:
  explicit PgWork(pqxx::connection_base& c, bool guarded = false);
  ~PgWork() noexcept override;
  void commit_by_library();
  // The rollback of the library, never refused. Never throws.
  void abort_by_library() noexcept;
  // What the handler called on the object ("commit() on the transaction", ...), or "".
  const char* handler_ended() const { return ended_; }
  // A handler ran on it and left it open, as far as the client can tell (run_pg_handler).
  void set_handler_ran() { unconfirmed_ = true; }
  bool unconfirmed() const { return unconfirmed_; }
  // One round trip: throws TransactionNotOurs unless the server's transaction is still the
  // library's; the library's statements after a handler's run go on only after it.
  void confirm_ours();

 private:
  void do_begin() override;
  pqxx::result do_exec(const char query[]) override;
  void do_commit() override;
  void do_abort() override;
  const bool guarded_;
  bool library_ = false;
  bool unconfirmed_ = false;
  const char* ended_ = "";
};

// Notices a connection a handler runs on receives that tell what the handler ran: the
// guard's refusal of its COMMIT, a BEGIN inside the library's transaction.
class PgNoticeWatch final : public pqxx::errorhandler {
 public:
  explicit PgNoticeWatch(pqxx::connection_base& c) : pqxx::errorhandler(c) {}
  bool operator()(const char msg[]) noexcept override;
  void reset() { commit_refused = begin_ignored = false; }
  bool commit_refused = false;
  bool begin_ignored = false;
};

// kInvalidArgument if the libpq URI carries a password (in its user information,
// "user:secret@host", or as a "password" parameter, however encoded) or is not a URI
// libpq can parse; its text never repeats the location, which may hold the secret.
// Parsed by libpq (PQconninfoParse), as the connection will be (open.cpp).
Status refuse_password_in_location(const std::string& uri);
// Percent-encodes `s` for a URI parameter value; '/' is kept (open.cpp).
std::string percent_encode(const std::string& s);

// The PostgreSQL store's retention (store/postgres/retention_rows.cpp).
std::unique_ptr<RetentionRows> make_pg_retention_rows(PgBackend& store);
// The PostgreSQL store's store-then-process rows (store/postgres/stp_rows.cpp).
std::unique_ptr<StpRows> make_pg_stp_rows(PgBackend& store);
// The PostgreSQL store's outbox rows (store/postgres/outbox_rows.cpp).
std::unique_ptr<OutboxStore> make_pg_outbox(PgBackend& store);

// Runs `call` on `w`, a guarded transaction of `conn` (its notices watched by `watch`), as a
// handler for `owner`, and fills *out: what it threw (judged with the PostgreSQL
// classifier) and what it left of the transaction (claim.cpp). For the inbox's connection
// and store-then-process workers alike.
void run_pg_handler(PgConnection& conn, PgWork& w, PgNoticeWatch& watch, const Inbox* owner,
                    FunctionRef<void(const TxnRef&)> call, HandlerRun* out);

class PgBackend final : public StoreBackend {
 public:
  explicit PgBackend(Store& front);
  ~PgBackend() override;

  // --- StoreBackend ---
  const std::string& location() const override { return uri; }
  const std::type_info& handler_type() const override { return typeid(pqxx::transaction_base*); }
  const char* handler_type_name() const override {
    return "pqxx::transaction_base& (mqtt_inbox/postgres.h)";
  }
  void file_stats(InboxStats* out) const override {
    out->db_bytes = 0;  // a server's files are not the client's to measure
    out->wal_bytes = 0;
    out->schema_version = kPgSchemaVersion;
  }
  Status open(int lock_wait_ms) override;
  Status ready() override { return connect_locked(false); }
  void name_user(const std::string& consumer) override;
  Status classify_current(const std::string& context) override;
  std::string fatal_text(const std::string& error) const override;
  std::string fatal_advice(const std::string& error) const override;
  void begin(bool for_handler) override;
  CommitOutcome commit(const ClaimKey* claim, std::string* why) override;
  void rollback() noexcept override;
  void begin_read() override;
  void end_read() noexcept override;
  bool insert_claim(const ClaimKey& key, const Message& message,
                    bool only_if_nothing_recorded) override;
  bool read_state(const ClaimKey& key, MessageState* out) override;
  void delete_attempts(const ClaimKey& key) override;
  void mark_replayed(int64_t dead_letter_id) override;
  void run_handler(const Inbox* owner, FunctionRef<void(const TxnRef&)> call,
                   HandlerRun* out) override;
  int count_attempt(const ClaimKey& key, const std::string* error) override;
  void mark_attempt_failed(const ClaimKey& key, const std::string& error) override;
  void uncount_attempt(const ClaimKey& key) override;
  bool mark_running(const ClaimKey&) override { return false; }  // no marker: see claim.cpp
  void clear_running() noexcept override {}
  std::optional<int64_t> open_dead_letter(const ClaimKey& key) override;
  void count_redelivery(int64_t dead_letter_id) override;
  bool rewrite_dead_letter(int64_t id, const DeadLetter& dl, int64_t now_ms) override;
  int64_t insert_dead_letter(const DeadLetter& dl, int64_t now_ms) override;
  void list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) override;
  bool get_dead_letter(int64_t id, DeadLetter* out) override;
  int64_t purge_dead_letters(const DeadLetterFilter& filter) override;
  RequeueFacts requeue_facts(int64_t id) override;
  void set_requeued(int64_t id) override;
  void requeued_dead_letters(const std::string& consumer, int64_t limit,
                             std::vector<int64_t>* ids) override;
  void write_session(const SessionRecord& record) override;
  void read_sessions(const std::string* client_id, std::vector<SessionRecord>* out) override;
  bool remove_session(const std::string& client_id) override;
  void add_lost_session(const std::string& client_id, int64_t at_ms) override;
  void setup(int lock_wait_ms, FunctionRef<void(const TxnRef&)> fn) override;
  void setup_sql(int lock_wait_ms, const std::string& sql) override;
  const std::type_info& connection_type() const override { return typeid(pqxx::connection_base*); }
  void with_connection(FunctionRef<void(const TxnRef&)> fn) override;
  Status measure_rows() override;
  OutboxStore& outbox() override { return *outbox_store; }
  StpRows& stp_rows() override { return *stp; }
  RetentionRows& retention_rows() override { return *retention; }
  Status open_slot_leases(const SlotLeaseOptions& options,
                          std::unique_ptr<SlotLeases>* out) override;  // slot_leases.cpp
  bool shared_by_processes() const override { return true; }

  // --- what the parts of this folder use ---
  bool unusable() const { return front().unusable(); }
  Status fatal_status() const { return front().fatal_status(); }
  Status store_error(Status s) { return front().store_error(std::move(s)); }
  const Inbox* owner() const { return front().owner(); }
  int64_t retention_clock() const { return front().retention_clock(); }

  const std::string uri;  // the location as given: it holds no password (open refuses one)
  std::string conninfo;   // uri with the password file, what libpq is given
  std::string schema;     // the quoted schema name, "\"mqtt_inbox\""
  std::string users;      // the consumers on `conn`, comma-separated (application_name)
  std::unique_ptr<PgConnection> conn;
  std::unique_ptr<PgNoticeWatch> watch;         // on conn
  std::optional<PgWork> txn;                    // the transaction open on conn, if any
  std::optional<pqxx::nontransaction> reading;  // a read on conn (begin_read), if any

  // "<schema>.<table>".
  std::string t(const char* table) const { return schema + "." + table; }
  // The transaction or read open on `conn`. Throws std::logic_error if none is.
  pqxx::transaction_base& tx();
  // Checks the options and the password file, and sets conninfo (make_postgres_backend).
  Status configure();
  // Connects (if not connected), applies the session's settings, reads the server's clock
  // and prepares the per-message statements; with `migrate`, also brings the schema to
  // kPgSchemaVersion. Under `mu`. Errors classified (pg_to_status), not counted.
  Status connect_locked(bool migrate);
  // The roles of the connections the store opens, for their settings and application_name.
  enum class Role { kInbox, kWorker, kListen, kLease, kRelayTurn, kAdmin };
  // A new connection to the server with the settings every connection of its role has:
  // application_name "mqtt-inbox <role> ..." (unless the location sets one), connect_timeout,
  // the READ COMMITTED check, lock_timeout, the durability the options ask for, and for a
  // connection handlers run on (kInbox, kWorker) the transaction guard and a read-only
  // default. No lock needed. Errors classified (a refused password: kAuthentication; a
  // database that does not exist: kNotFound; unreachable: kIoError), not counted.
  // `connect_timeout_s` > 0 bounds the connection attempt unless the location sets its
  // own. `on_open`, if set, is called once the server accepted the connection, before the
  // settings' statements run on it. `label` names the connection's user (a consumer, a
  // fleet member) in application_name.
  Status open_connection(std::unique_ptr<PgConnection>* out, Role role,
                         const std::string& label = "", int connect_timeout_s = 0,
                         const std::function<void(pqxx::connection_base&)>& on_open = {});
  // Drops the main connection and what is open on it; the next call reconnects.
  void drop_connection() noexcept;
  // Classifies a failure of the store's own statement, drops a lost connection (the next
  // call reconnects) and counts it (store_error). Under `mu`.
  Status failed(const std::exception& e, const std::string& context);
  // Runs `fn` in one READ COMMITTED, read-write transaction on the main connection and
  // commits it; a failure is rolled back and returned classified and counted. Takes `mu`.
  Status with_txn(const std::string& context, const std::function<void(PgWork&)>& fn);

  // Set by an enqueue in a transaction on `conn` (OutboxStore::wake_after_commit); the
  // commit on `conn` then calls outbox_committed(). Under `mu`.
  bool outbox_wake_armed = false;
  // After a commit on `conn`: wakes the outbox's commit wakers if an enqueue armed it
  // (outbox_rows.cpp). Under `mu`; a waker only signals.
  void outbox_committed();

 private:
  // The outcome of a COMMIT lost with its connection: the claim row decides (claim.cpp).
  CommitOutcome resolve_in_doubt(const std::exception& e, const ClaimKey& claim);
  std::unique_ptr<RetentionRows> retention;
  std::unique_ptr<StpRows> stp;
  std::unique_ptr<OutboxStore> outbox_store;
};

// Milliseconds since the Unix epoch on the server's clock, as SQL.
constexpr const char* kPgNowMs = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

}  // namespace mqtt_inbox::detail

// PgStore: the PostgreSQL store (store/store.h) behind the public Inbox, for Consumer mode:
// one libpqxx connection to one server, its mutex, the prepared statements of the
// per-message path, the retention clock read from the server, and the start-up waits. Its
// code is in this folder: open.cpp (the location and its password rule, connecting, the
// READ COMMITTED check, schema and migrations, start-up waits, the fatal latch), claim.cpp
// (PgClaims: the per-message path and the commit whose outcome is unknown),
// dead_letters.cpp (PgDeadLetters), sessions.cpp (PgSessions), retention_rows.cpp (the
// Pruner's deletes, row measurement), stp_rows.cpp (store-then-process's rows, each worker
// on a connection of its own), outbox_rows.cpp (the outbox's rows and the relays' wake-up
// by LISTEN/NOTIFY), slot_leases.cpp (a fleet member's slots, held by advisory locks on a
// connection of their own) and errors.cpp (SQLSTATE classes).
//
// Thread safety: every call takes `mu` for its use of the connection; store-then-process's
// workers and maintenance use connections of their own (open_connection()).
#pragma once

#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "mqtt_inbox/inbox.h"
#include "store/claims.h"
#include "store/dead_letters.h"
#include "store/outbox_rows.h"
#include "store/retention_rows.h"
#include "store/sessions.h"
#include "store/store.h"
#include "store/stp_rows.h"
#include "store/txn.h"

namespace mqtt_inbox::detail {

struct PgStore;

// The version of the PostgreSQL schema this library writes (<schema>.inbox_meta key
// 'schema_version'); its steps are in open.cpp.
constexpr int kPgSchemaVersion = 3;

class PgClaims final : public ClaimStore {
 public:
  explicit PgClaims(PgStore& store) : s_(store) {}
  Status process(const std::string& consumer, const Message& message, const std::string& message_id,
                 const StoreHandler& handler, int max_attempts,
                 std::optional<int64_t> replayed_dead_letter, const nlohmann::json* payload_json,
                 ProcessReport* report) override;
  Status lookup(const std::string& consumer, const std::string& message_id,
                MessageState* out) override;
  Status claim(const std::string& consumer, const Message& message, const std::string& message_id,
               int attempt, const StoreHandler& handler,
               std::optional<int64_t> replayed_dead_letter, ClaimResult* result,
               std::string* handler_error) override;
  Status begin_attempt(const std::string& consumer, const std::string& message_id,
                       int* attempt) override;
  Status record_attempt_failure(const std::string& consumer, const std::string& message_id,
                                const std::string& error) override;
  Status count_claims(const std::string& consumer, int64_t* rows) override;

 private:
  PgStore& s_;
};

class PgDeadLetters final : public DeadLetterStore {
 public:
  explicit PgDeadLetters(PgStore& store) : s_(store) {}
  Status add(const DeadLetter& dl, std::optional<int64_t> replace_id, int64_t* id) override;
  Status list(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) override;
  Status get(int64_t id, DeadLetter* out) override;
  Status purge(const DeadLetterFilter& filter, int64_t* removed) override;
  Status requeue(int64_t id) override;
  Status requeued(const std::string& consumer, int64_t limit, std::vector<int64_t>* ids) override;

 private:
  PgStore& s_;
};

class PgSessions final : public SessionStore {
 public:
  explicit PgSessions(PgStore& store);

 protected:
  Status write(const SessionRecord& record) override;
  Status read(const std::string* client_id, std::vector<SessionRecord>* out) override;
  Status remove(const std::string& client_id, bool* removed) override;
  Status add_lost(const std::string& client_id, int64_t at_ms) override;

 private:
  PgStore& s_;
};

// kInvalidArgument if the libpq URI carries a password (in its user information,
// "user:secret@host", or as a "password" parameter, however encoded) or is not a URI
// libpq can parse; its text never repeats the location, which may hold the secret.
// Parsed by libpq (PQconninfoParse), as the connection will be (open.cpp).
Status refuse_password_in_location(const std::string& uri);
// Percent-encodes `s` for a URI parameter value; '/' is kept (open.cpp).
std::string percent_encode(const std::string& s);

// The PostgreSQL store's retention (store/postgres/retention_rows.cpp).
std::unique_ptr<RetentionRows> make_pg_retention_rows(PgStore& store);
// The PostgreSQL store's store-then-process rows (store/postgres/stp_rows.cpp).
std::unique_ptr<StpRows> make_pg_stp_rows(PgStore& store);
// The PostgreSQL store's outbox rows (store/postgres/outbox_rows.cpp).
std::unique_ptr<OutboxStore> make_pg_outbox(PgStore& store);

struct PgStore final : Store {
  PgStore() : claims_(*this), dead_letters_(*this), sessions_(*this) {}
  ~PgStore() override;

  StoreKind kind() const override { return StoreKind::kPostgres; }
  const InboxOptions& inbox_options() const override { return options; }
  Status bind_consumer_handler(PgHandler handler, StoreHandler* out) override {
    *out = bind_handler<pqxx::transaction_base>(std::move(handler));
    return Status::Ok();
  }
  using Store::bind_consumer_handler;
  Status bind_stored_handler(PgStoredHandler handler, StoredStoreHandler* out) override {
    *out = bind_handler<pqxx::transaction_base, StoredDelivery>(std::move(handler));
    return Status::Ok();
  }
  using Store::bind_stored_handler;
  Status setup_sql(const std::string& sql) override;

  ClaimStore& claims() override { return claims_; }
  DeadLetterStore& dead_letters() override { return dead_letters_; }
  SessionStore& sessions() override { return sessions_; }
  RetentionRows& retention_rows() override { return *retention; }
  StpRows& stp_rows() override { return *stp; }
  OutboxStore& outbox() override { return *outbox_store; }
  Status open_slot_leases(const SlotLeaseOptions& options,
                          std::unique_ptr<SlotLeases>* out) override;  // slot_leases.cpp

  const std::string& location() const override { return uri; }
  // The server's clock (clock_timestamp() at the last connect), advanced by the monotonic
  // clock in between; never goes back.
  int64_t retention_clock() const override {
    const int64_t t = clock_base_ms.load() + (clock->steady_ms() - steady_base_ms.load());
    int64_t seen = clock_high.load(std::memory_order_relaxed);
    while (t > seen && !clock_high.compare_exchange_weak(seen, t)) {
    }
    return std::max(t, seen);
  }
  Status persist_retention_clock() override { return Status::Ok(); }  // the server's clock
  Status refresh_row_stats() override;
  void file_stats(InboxStats* out) const override {
    out->db_bytes = 0;  // a server's files are not the client's to measure
    out->wal_bytes = 0;
    out->schema_version = kPgSchemaVersion;
  }
  Status store_error(Status s, bool holding_connection = true) override {
    (void)holding_connection;
    if (s.is_transient_store_error()) ++store_errors;
    if (s.is_fatal_store_error()) latch_fatal(s);
    return s;
  }
  Status wait_at_startup(const char* what, const std::function<Status(int)>& op) override;
  void latch_fatal(const Status& s) override;
  Status fatal_status() const override;

  // --- the connection (open.cpp) ---
  std::string uri;       // the location as given: it holds no password (open refuses one)
  std::string conninfo;  // uri with the password file, what libpq is given
  InboxOptions options;
  std::string schema;  // the quoted schema name, "\"mqtt_inbox\""
  std::mutex mu;       // serialises use of `conn`
  std::unique_ptr<pqxx::connection> conn;

  // "<schema>.<table>".
  std::string t(const char* table) const { return schema + "." + table; }
  // Connects (if not connected), checks the isolation level, sets lock_timeout, reads the
  // server's clock and prepares the per-message statements; with `migrate`, also brings
  // the schema to kPgSchemaVersion. Under `mu`. Errors classified (pg_to_status).
  Status connect_locked(bool migrate);
  // A new connection to the server with the settings every connection of the store has
  // (the READ COMMITTED check, lock_timeout): the shared one (connect_locked) and each
  // store-then-process worker's. No lock needed. Errors classified as connect_locked's (a
  // refused identity: kPermissionDenied; unreachable: kIoError), not counted.
  // `connect_timeout_s` > 0 bounds the connection attempt (libpq's connect_timeout)
  // unless the location sets its own. `on_open`, if set, is called once the server
  // accepted the connection, before the settings' statements run on it.
  Status open_connection(std::unique_ptr<pqxx::connection>* out, int connect_timeout_s = 0,
                         const std::function<void(pqxx::connection&)>& on_open = {});
  // Classifies a failure of the store's own statement, drops a lost connection (the next
  // call reconnects) and counts it (store_error). Under `mu`.
  Status failed(const std::exception& e, const std::string& context);
  // Runs `fn` in one READ COMMITTED transaction on the connection and commits it; a
  // failure is rolled back and returned classified. Takes `mu`.
  Status with_txn(const std::string& context, const std::function<void(pqxx::work&)>& fn);

  // Retention clock: the server's ms at steady time steady_base_ms.
  std::atomic<int64_t> clock_base_ms{0}, steady_base_ms{0};
  mutable std::atomic<int64_t> clock_high{0};
  std::unique_ptr<RetentionRows> retention = make_pg_retention_rows(*this);
  std::unique_ptr<StpRows> stp = make_pg_stp_rows(*this);
  // Set by an enqueue in a transaction on `conn` (OutboxStore::wake_after_commit); the
  // commit on `conn` then calls outbox_committed(). Under `mu`.
  bool outbox_wake_armed = false;
  // After a commit on `conn`: wakes the outbox's commit wakers if an enqueue armed it
  // (outbox_rows.cpp). Under `mu`; a waker only signals.
  void outbox_committed();
  std::unique_ptr<OutboxStore> outbox_store = make_pg_outbox(*this);

 private:
  PgClaims claims_;
  PgDeadLetters dead_letters_;
  PgSessions sessions_;
};

inline PgSessions::PgSessions(PgStore& store) : SessionStore(store), s_(store) {}

// Milliseconds since the Unix epoch on the server's clock, as SQL.
constexpr const char* kPgNowMs = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

}  // namespace mqtt_inbox::detail

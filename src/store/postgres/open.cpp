// Opening the PostgreSQL store: the location (a libpq URI that may not hold a password)
// and the password file, each connection with the settings of its role (application_name,
// connect_timeout, the READ COMMITTED check, lock_timeout, durability, and the handler's
// transaction guard on the connections handlers run on), the schema in versioned steps
// under an advisory lock, the server's clock, the application's set-up, the connection's
// libpq handle, and the fatal latch's texts. Connection errors get the vocabulary every
// store shares (status.h): authentication, not found, permission, schema.
#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "store/postgres/backend.h"
#include "store/postgres/errors.h"
#include "store/reentry.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

namespace {

// The schema's steps: step N brings version N-1 to N, in one transaction. `@` stands for
// the quoted schema name. Never edit a step that was released: add one.
struct PgSchemaStep {
  int version;
  const char* sql;
};

constexpr PgSchemaStep kSteps[] = {
    {1,
     // The claims: the UNIQUE key is the deduplication; received_at is the server's time
     // (retention reads it). The metadata columns are filled with record_metadata only.
     "CREATE TABLE @.inbox_processed ("
     "  consumer_name text NOT NULL,"
     "  message_id text NOT NULL,"
     "  received_at timestamptz NOT NULL DEFAULT now(),"
     "  topic text,"
     "  message_type text,"
     "  correlation_id bytea,"
     "  payload_hash bigint,"
     "  CONSTRAINT inbox_processed_key UNIQUE (consumer_name, message_id));"
     "CREATE INDEX inbox_processed_received_at ON @.inbox_processed (received_at);"
     // Attempts of messages not yet processed (docs/design.md#attempts-and-crash-loops).
     "CREATE TABLE @.inbox_attempts ("
     "  consumer_name text NOT NULL,"
     "  message_id text NOT NULL,"
     "  attempts integer NOT NULL,"
     "  first_attempt_at bigint NOT NULL,"
     "  last_attempt_at bigint NOT NULL,"
     "  state text NOT NULL CHECK (state IN ('running', 'failed')),"
     "  last_error text,"
     "  PRIMARY KEY (consumer_name, message_id));"
     "CREATE TABLE @.inbox_dead_letters ("
     "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
     "  consumer_name text NOT NULL,"
     "  message_id text,"
     "  topic text NOT NULL,"
     "  payload bytea NOT NULL,"
     "  payload_size bigint NOT NULL,"
     "  properties text,"
     "  qos integer NOT NULL,"
     "  reason text NOT NULL,"
     "  reason_text text NOT NULL,"
     "  attempts integer NOT NULL,"
     "  first_attempt_at bigint NOT NULL,"
     "  last_attempt_at bigint NOT NULL,"
     "  dead_lettered_at bigint NOT NULL,"
     "  retention_at bigint NOT NULL,"
     "  redeliveries integer NOT NULL DEFAULT 0,"
     "  status text NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'requeued', 'replayed')),"
     "  replayed_at bigint);"
     "CREATE INDEX inbox_dead_letters_by_id ON @.inbox_dead_letters (consumer_name, message_id);"
     "CREATE INDEX inbox_dead_letters_by_time ON @.inbox_dead_letters (dead_lettered_at);"
     "CREATE INDEX inbox_dead_letters_retention ON @.inbox_dead_letters (retention_at);"
     "CREATE INDEX inbox_dead_letters_requeued ON @.inbox_dead_letters (consumer_name, id)"
     "  WHERE status = 'requeued';"
     "CREATE TABLE @.inbox_sessions ("
     "  client_id text PRIMARY KEY,"
     "  session_expiry_ms bigint NOT NULL,"
     "  expiry_source text NOT NULL,"
     "  updated_at bigint NOT NULL,"
     "  sessions_lost bigint NOT NULL DEFAULT 0,"
     "  last_lost_at bigint);"
     "CREATE TABLE @.inbox_session_filters ("
     "  client_id text NOT NULL REFERENCES @.inbox_sessions (client_id) ON DELETE CASCADE,"
     "  topic_filter text NOT NULL,"
     "  PRIMARY KEY (client_id, topic_filter));"},
    {2,
     // The transactional outbox (docs/outbox.md, docs/postgres.md#the-outbox), the columns
     // of the SQLite store's outbox_messages. seq is the relay's read position: it must
     // follow commit order, which the enqueue's lock makes it (store/postgres/outbox_rows.cpp).
     "CREATE TABLE @.outbox_messages ("
     "  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
     "  message_id text NOT NULL UNIQUE,"
     "  ordering_key text NOT NULL,"
     "  class text NOT NULL,"
     "  topic text NOT NULL,"
     "  payload bytea NOT NULL,"
     "  properties text NOT NULL,"
     "  qos integer NOT NULL DEFAULT 1,"
     "  size_bytes bigint NOT NULL,"
     "  enqueued_at bigint NOT NULL,"
     "  enqueued_clock bigint NOT NULL DEFAULT 0,"
     "  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),"
     "  attempts integer NOT NULL DEFAULT 0,"
     "  sent_at bigint,"
     "  dead_reason text CHECK (dead_reason IN ('rejected_by_broker', 'expired',"
     "    'payload_too_large', 'connection_dropped')),"
     "  reason_code integer,"
     "  reason_text text,"
     "  dead_at bigint,"
     "  retention_at bigint);"
     // One partial index per state, as on SQLite: the relay reads pending rows in seq
     // order, a class's oldest pending row is the first of (class, seq), the Pruner walks
     // sent and dead rows by retention_at.
     "CREATE INDEX outbox_messages_pending ON @.outbox_messages (seq) WHERE state = 'pending';"
     "CREATE INDEX outbox_messages_sent_retention ON @.outbox_messages (retention_at)"
     "  WHERE state = 'sent';"
     "CREATE INDEX outbox_messages_dead_retention ON @.outbox_messages (retention_at)"
     "  WHERE state = 'dead';"
     "CREATE INDEX outbox_messages_class ON @.outbox_messages (class, seq)"
     "  WHERE state = 'pending';"
     // Pending rows and bytes per class, kept by a trigger on every path (enqueue, marks,
     // drops, replays, purges), so the bounds never scan.
     "CREATE TABLE @.outbox_usage ("
     "  class text PRIMARY KEY,"
     "  rows bigint NOT NULL DEFAULT 0,"
     "  bytes bigint NOT NULL DEFAULT 0,"
     "  dropped bigint NOT NULL DEFAULT 0);"
     "CREATE FUNCTION @.outbox_usage_track() RETURNS trigger LANGUAGE plpgsql AS $$"
     " BEGIN"
     "  IF TG_OP <> 'INSERT' AND OLD.state = 'pending' THEN"
     "   IF TG_OP = 'DELETE' OR NEW.state <> 'pending' THEN"
     "    UPDATE @.outbox_usage SET rows = rows - 1, bytes = bytes - OLD.size_bytes"
     "     WHERE class = OLD.class;"
     "   END IF;"
     "  END IF;"
     "  IF TG_OP <> 'DELETE' AND NEW.state = 'pending' THEN"
     "   IF TG_OP = 'INSERT' OR OLD.state <> 'pending' THEN"
     "    INSERT INTO @.outbox_usage AS u (class, rows, bytes) VALUES (NEW.class, 1, "
     "NEW.size_bytes)"
     "     ON CONFLICT (class) DO UPDATE SET rows = u.rows + 1, bytes = u.bytes + excluded.bytes;"
     "   END IF;"
     "  END IF;"
     "  RETURN NULL;"
     " END $$;"
     "CREATE TRIGGER outbox_usage_track AFTER INSERT OR DELETE OR UPDATE OF state"
     "  ON @.outbox_messages FOR EACH ROW EXECUTE FUNCTION @.outbox_usage_track();"},
    {3,
     // Store-then-process (docs/store-then-process.md#postgresql): the stored messages of
     // each consumer. seq (an identity, taken by the receipt's INSERT) is arrival order at
     // the server. received_at and done_at are the server's clock in ms, next_attempt_at
     // the retention clock (the server's, as the store follows it); claimed_at is a
     // worker's wall clock, for people. claim_token fences a worker whose claim was
     // returned (store/stp_rows.h).
     "CREATE TABLE @.inbox_messages ("
     "  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
     "  consumer_name text NOT NULL,"
     "  message_id text NOT NULL,"
     "  aggregate_key text NOT NULL DEFAULT '',"
     "  topic text NOT NULL,"
     "  payload bytea,"
     "  properties_json text,"
     "  qos integer NOT NULL,"
     "  received_at bigint NOT NULL,"
     "  status text NOT NULL DEFAULT 'pending'"
     "    CHECK (status IN ('pending', 'processing', 'done', 'dead')),"
     "  attempts integer NOT NULL DEFAULT 0,"
     "  claimed_at bigint,"
     "  claimant text,"
     "  claim_token bigint NOT NULL DEFAULT 0,"
     "  next_attempt_at bigint NOT NULL DEFAULT 0,"
     "  last_error text,"
     "  done_at bigint,"
     "  CONSTRAINT inbox_messages_key UNIQUE (consumer_name, message_id));"
     // The claim: pending rows by aggregate in seq order, and 'processing' rows by
     // aggregate (and by claimant, for the reaper).
     "CREATE INDEX inbox_messages_work ON @.inbox_messages"
     "  (consumer_name, status, aggregate_key, seq);"
     "CREATE INDEX inbox_messages_received_at ON @.inbox_messages (received_at);"
     // Compaction reads only 'done' rows that still hold their payload.
     "CREATE INDEX inbox_messages_compact ON @.inbox_messages (consumer_name, done_at)"
     "  WHERE status = 'done' AND payload IS NOT NULL;"},
    {4,
     // Store-then-process rows keep their lifetime (issue 42), as SQLite's step 15:
     // expires_at, the message's expiry deadline on the retention clock (NULL: none);
     // not_yet and waiting_since, a wait for a dependency (the runs that said "not yet"
     // in a row, and the retention clock at the first; NULL with not_yet 0). The dead
     // letters' reasons ('expired', 'dependency_unavailable') need no step here: the
     // column has no CHECK.
     "ALTER TABLE @.inbox_messages ADD COLUMN expires_at bigint,"
     "  ADD COLUMN not_yet integer NOT NULL DEFAULT 0,"
     "  ADD COLUMN waiting_since bigint;"},
};

std::string with_schema(const char* sql, const std::string& schema) {
  std::string out;
  for (const char* p = sql; *p; ++p) {
    if (*p == '@')
      out += schema;
    else
      out += *p;
  }
  return out;
}

bool valid_schema_name(const std::string& s) {
  if (s.empty() || s.size() > 63 || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '_'))
      return false;
  return true;
}

}  // namespace

Status refuse_password_in_location(const std::string& uri) {
  // libpq's own parser, not ours: it decodes percent-escapes in names and values and ends
  // the user information at '@' only, so a hand-written scan misses "user:pa?ss@host" and
  // "?%70assword=..." (both found by a newcomer's test), which libpq reads as passwords.
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(uri.c_str(), &error);
  if (!options) {
    PQfreemem(error);  // its text may quote the location, password and all
    return Status::InvalidArgument(
        "the PostgreSQL location is not a connection URI libpq can parse "
        "(https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-CONNSTRING); it is not "
        "repeated here, since it may hold a secret");
  }
  bool password = false;
  for (const PQconninfoOption* o = options; o->keyword; ++o)
    if (std::strcmp(o->keyword, "password") == 0 && o->val && *o->val) password = true;
  PQconninfoFree(options);
  if (password)
    return Status::InvalidArgument(
        "the PostgreSQL location holds a password: put it in a password file (PGPASSFILE or "
        "InboxOptions::postgres_password_file), never in the location (docs/postgres.md)");
  return Status::Ok();
}

std::string percent_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

namespace {

// A failed connection attempt, classified by libpq's text (a connection has no SQLSTATE
// before the server accepted it): the same vocabulary as every store's.
Status connect_error(const std::string& uri, std::string what, const std::string& password_file) {
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  const auto has = [&](const char* s) { return what.find(s) != std::string::npos; };
  const std::string where = "connecting to " + uri + ": ";
  if (has("password authentication failed") || has("no password supplied") ||
      has("authentication failed") || has("no pg_hba.conf entry") ||
      (has("role \"") && has("does not exist")))
    return Status(Status::Code::kAuthentication,
                  where + what + " (the password comes from " +
                      (password_file.empty() ? std::string("PGPASSFILE or ~/.pgpass")
                                             : "the password file " + password_file) +
                      "; docs/postgres.md#the-password)");
  if (has("database \"") && has("does not exist"))
    return Status(Status::Code::kNotFound, where + what + " (create it, or fix the location)");
  if (has("permission denied for database"))
    return Status(Status::Code::kPermissionDenied,
                  where + what + " (GRANT CONNECT ON DATABASE ... TO the role)");
  return Status(Status::Code::kIoError, where + what);
}

const char* role_name(PgBackend::Role role) {
  switch (role) {
    case PgBackend::Role::kInbox:
      return "inbox";
    case PgBackend::Role::kWorker:
      return "stp-worker";
    case PgBackend::Role::kListen:
      return "listen";
    case PgBackend::Role::kLease:
      return "lease";
    case PgBackend::Role::kRelayTurn:
      return "relay";
    case PgBackend::Role::kAdmin:
      return "admin";
  }
  return "connection";
}

// Adds `key=value` to a libpq URI, unless it sets the key already.
void add_param(std::string* info, const std::string& key, const std::string& value) {
  if (info->find(key + "=") != std::string::npos) return;
  *info += std::string(info->find('?') == std::string::npos ? "?" : "&") + key + "=" +
           percent_encode(value);
}

// The handler's transaction guard, made on each connection a handler runs on (backend.h).
// A handler's transaction begins with mqtt_inbox_txn_begin(): it marks the transaction as
// the library's (mqtt_inbox.txn, transaction-local) and updates the guard table's one row,
// whose deferred trigger refuses a COMMIT the library did not mark as its own
// (mqtt_inbox.commit), the whole transaction rolling back with it; the warning before the
// error tells the library what the handler ran, also when the handler swallowed the error.
// The library's COMMIT first runs mqtt_inbox_txn_check(), which refuses a transaction
// without the mark: the handler ended the library's and began another (ROLLBACK then
// BEGIN, which no notice tells). One row updated in place (no ON COMMIT DELETE ROWS, whose
// truncation at every commit cost the server ~0.3 ms a transaction).
std::string guard_sql() {
  return std::string(
             "CREATE TEMPORARY TABLE IF NOT EXISTS mqtt_inbox_txn_guard (x integer NOT NULL);"
             "INSERT INTO pg_temp.mqtt_inbox_txn_guard SELECT 0"
             " WHERE NOT EXISTS (SELECT FROM pg_temp.mqtt_inbox_txn_guard);"
             "CREATE OR REPLACE FUNCTION pg_temp.mqtt_inbox_txn_guard() RETURNS trigger"
             " LANGUAGE plpgsql AS $$ BEGIN"
             "  IF current_setting('mqtt_inbox.commit', true) IS DISTINCT FROM 'on' THEN"
             "   RAISE WARNING 'mqtt-inbox: the handler ran COMMIT';"
             "   RAISE EXCEPTION 'mqtt-inbox: a handler may not end the library''s transaction;"
             " the transaction is rolled back (handler.h)' USING ERRCODE = '2D000';"
             "  END IF;"
             "  RETURN NULL;"
             " END $$;"
             "CREATE OR REPLACE FUNCTION pg_temp.mqtt_inbox_txn_begin() RETURNS void"
             " LANGUAGE plpgsql AS $$ BEGIN"
             "  PERFORM set_config('mqtt_inbox.txn', 'library', true);"
             "  UPDATE pg_temp.mqtt_inbox_txn_guard SET x = 0;"
             " END $$;"
             "CREATE OR REPLACE FUNCTION pg_temp.mqtt_inbox_txn_check() RETURNS void"
             " LANGUAGE plpgsql AS $$ BEGIN"
             "  IF current_setting('mqtt_inbox.txn', true) IS DISTINCT FROM 'library' THEN"
             "   RAISE EXCEPTION '") +
         kPgNotOurs +
         "' USING ERRCODE = '2D000';"
         "  END IF;"
         " END $$;"
         "DROP TRIGGER IF EXISTS mqtt_inbox_txn_guard ON pg_temp.mqtt_inbox_txn_guard;"
         "CREATE CONSTRAINT TRIGGER mqtt_inbox_txn_guard AFTER UPDATE ON "
         "pg_temp.mqtt_inbox_txn_guard"
         " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "
         "pg_temp.mqtt_inbox_txn_guard()";
}

}  // namespace

PgConnection::PgConnection(const std::string& conninfo, bool reconnects)
    : pqxx::connection_base(policy_), options_(conninfo), policy_(options_) {
  init();
  // libpqxx 6.4 reconnects a broken connection by itself at the next statement; the
  // session's settings (the guard, the read-only default) would be gone.
  // Deprecated in libpqxx 6.4 (7 drops reactivation altogether), and the only way to stop it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  if (!reconnects) inhibit_reactivation(true);
#pragma GCC diagnostic pop
}

PgConnection::~PgConnection() noexcept { close(); }

PgConnection::Policy::handle PgConnection::Policy::do_startconnect(handle orig) {
  pg = pqxx::connect_direct::do_startconnect(orig);
  return pg;
}

PgConnection::Policy::handle PgConnection::Policy::do_completeconnect(handle orig) {
  pg = pqxx::connect_direct::do_completeconnect(orig);
  return pg;
}

PgConnection::Policy::handle PgConnection::Policy::do_dropconnect(handle orig) noexcept {
  pg = nullptr;
  return pqxx::connect_direct::do_dropconnect(orig);
}

PgConnection::Policy::handle PgConnection::Policy::do_disconnect(handle orig) noexcept {
  pg = nullptr;
  return pqxx::connect_direct::do_disconnect(orig);
}

void prepare_pg_statements(PgBackend& s);  // claim.cpp

Status make_postgres_backend(Store& front, std::unique_ptr<StoreBackend>* out) {
  auto backend = std::make_unique<PgBackend>(front);
  if (Status s = backend->configure(); !s.ok()) return s;
  *out = std::move(backend);
  return Status::Ok();
}

PgBackend::PgBackend(Store& front)
    : StoreBackend(front), uri(front.location()), conninfo(front.location()) {
  retention = make_pg_retention_rows(*this);
  stp = make_pg_stp_rows(*this);
  outbox_store = make_pg_outbox(*this);
}

Status PgBackend::configure() {
  if (Status s = refuse_password_in_location(uri); !s.ok()) return s;
  if (!valid_schema_name(options.postgres_schema))
    return Status::InvalidArgument("postgres_schema '" + printable(options.postgres_schema) +
                                   "' must be 1..63 characters of [a-z0-9_], not starting with "
                                   "a digit");
  if (options.postgres_idle_in_transaction_timeout_ms < 0)
    return Status::InvalidArgument("postgres_idle_in_transaction_timeout_ms < 0");
  if (!options.postgres_password_file.empty()) {
    // libpq says only "no password supplied" for a password file it cannot read.
    std::ifstream f(options.postgres_password_file);
    if (!f)
      return Status(Status::Code::kPermissionDenied,
                    "the password file " + options.postgres_password_file +
                        " (InboxOptions::postgres_password_file) cannot be read by this process: " +
                        std::strerror(errno));
    conninfo += std::string(uri.find('?') == std::string::npos ? "?" : "&") +
                "passfile=" + percent_encode(options.postgres_password_file);
  }
  schema = "\"" + options.postgres_schema + "\"";
  return Status::Ok();
}

Status PgBackend::open_connection(std::unique_ptr<PgConnection>* out, Role role,
                                  const std::string& label, int connect_timeout_s,
                                  const std::function<void(pqxx::connection_base&)>& on_open) {
  out->reset();
  std::string info = conninfo;
  if (connect_timeout_s > 0) add_param(&info, "connect_timeout", std::to_string(connect_timeout_s));
  // pg_stat_activity tells which consumer and part a server process belongs to. PostgreSQL
  // keeps 63 bytes of it.
  std::string app = "mqtt-inbox " + std::string(role_name(role)) + " " +
                    (label.empty() ? std::string() : label + " ") + std::to_string(::getpid());
  if (app.size() > 63) app.resize(63);
  add_param(&info, "application_name", app);
  const bool handlers = role == Role::kInbox || role == Role::kWorker;
  std::unique_ptr<PgConnection> c;
  try {
    c = std::make_unique<PgConnection>(info, /*reconnects=*/!handlers);
  } catch (const std::exception& e) {
    return connect_error(uri, e.what(), options.postgres_password_file);
  }
  if (on_open) on_open(*c);
  try {
    pqxx::nontransaction n(*c);
    const std::string iso = n.exec1("SHOW default_transaction_isolation")[0].as<std::string>();
    if (iso != "read committed")
      return Status::InvalidArgument(
          uri + ": default_transaction_isolation is '" + iso +
          "'; the inbox's claim needs READ COMMITTED (under a higher level ON CONFLICT DO "
          "NOTHING fails with 40001 against a claim committed after the snapshot "
          "instead of skipping it): set it to 'read committed' for the inbox's role or "
          "database (docs/postgres.md#read-committed)");
    std::string settings;
    // 0 is "do not wait", as on SQLite (PRAGMA busy_timeout = 0), not PostgreSQL's
    // lock_timeout = 0, which waits for ever behind a stuck node.
    settings += "SET lock_timeout = " + std::to_string(std::max(1, options.busy_timeout_ms)) + ";";
    // A session frozen or cut off inside a claim's transaction holds its row locks until
    // the server ends it: bounded here, not by TCP (which may never tell).
    if (options.postgres_idle_in_transaction_timeout_ms > 0)
      settings += "SET idle_in_transaction_session_timeout = " +
                  std::to_string(options.postgres_idle_in_transaction_timeout_ms) + ";";
    if (handlers) {
      // Durability is what the options say, whatever the server's or the database's
      // default: a commit is acknowledged (and the PUBACK sent) only once it is durable,
      // unless the application chose kNormal by name (options.h).
      settings += options.synchronous == Synchronous::kFull ? "SET synchronous_commit = on;"
                                                            : "SET synchronous_commit = off;";
      settings += guard_sql();
      settings += ";SET default_transaction_read_only = on";
    }
    n.exec0(settings);
  } catch (const std::exception& e) {
    Status s = pg_to_status(e, "setting up a connection to " + uri);
    if (s.code() == Status::Code::kPermissionDenied)
      s = Status(Status::Code::kPermissionDenied,
                 s.message() +
                     ": the inbox's connections need the TEMPORARY privilege on the "
                     "database for the handler's transaction guard (GRANT TEMPORARY "
                     "ON DATABASE ... TO the role; docs/postgres.md#privileges)");
    return s;
  }
  *out = std::move(c);
  return Status::Ok();
}

Status PgBackend::connect_locked(bool migrate) {
  if (conn && conn->is_open()) return Status::Ok();
  drop_connection();
  if (Status s = open_connection(&conn, Role::kInbox, users); !s.ok()) return s;
  int version = -1;  // what the schema was at before migrating; -1: not read
  try {
    watch = std::make_unique<PgNoticeWatch>(*conn);
    if (migrate) {
      PgWork w(*conn);
      // One migrator at a time per schema: consumers starting together wait here.
      w.exec_params("SELECT pg_advisory_xact_lock(hashtext($1))", "mqtt_inbox schema " + schema);
      // Look before creating: PostgreSQL checks the CREATE privilege before IF NOT EXISTS,
      // so a role that may only use the inbox's tables (docs/postgres.md#privileges) would
      // get 42501 from a schema that is already there, at every start, and wait for ever.
      const auto read_version = [&]() -> int {
        const pqxx::result r =
            w.exec("SELECT value FROM " + t("inbox_meta") + " WHERE key = 'schema_version'");
        return r.empty() ? 0 : std::stoi(r[0][0].as<std::string>());
      };
      version = 0;
      if (!w.exec1("SELECT to_regclass(" + w.quote(t("inbox_meta")) + ") IS NULL")[0].as<bool>())
        version = read_version();
      if (version > kPgSchemaVersion) {
        w.abort_by_library();
        drop_connection();
        return Status(Status::Code::kSchema,
                      uri + ": schema " + schema + " is at version " + std::to_string(version) +
                          ", newer than this library's " + std::to_string(kPgSchemaVersion) +
                          ": a newer mqtt-inbox migrated it; use that version");
      }
      if (version < kPgSchemaVersion) {
        w.exec0("CREATE SCHEMA IF NOT EXISTS " + schema);
        w.exec0("CREATE TABLE IF NOT EXISTS " + t("inbox_meta") +
                " (key text PRIMARY KEY, value text NOT NULL)");
        version = read_version();
      }
      for (const PgSchemaStep& step : kSteps) {
        if (step.version <= version) continue;
        w.exec0(with_schema(step.sql, schema));
        w.exec_params0("INSERT INTO " + t("inbox_meta") +
                           " (key, value) VALUES ('schema_version', $1)"
                           " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                       std::to_string(step.version));
        if (version > 0)
          log->info("{}: schema {} migrated to version {}", uri, schema, step.version);
      }
      w.commit_by_library();
      // Settings of the server that void the guarantee are said once, loudly: the inbox
      // sets synchronous_commit itself, but cannot change these.
      pqxx::nontransaction n(*conn);
      for (const char* setting : {"fsync", "full_page_writes"})
        if (n.exec1(std::string("SHOW ") + setting)[0].as<std::string>() != "on")
          log->error(
              "{}: the server runs with {} = off: a server crash can lose commits the inbox "
              "acknowledged (docs/postgres.md#durability); `mqtt-inbox check` reports it",
              uri, setting);
      if (options.synchronous != Synchronous::kFull)
        log->warn(
            "{}: synchronous_commit = off for the inbox's transactions "
            "(InboxOptions::synchronous = kNormal): a server crash can lose the last "
            "acknowledged messages",
            uri);
    }
    {
      pqxx::nontransaction n(*conn);
      front().set_retention_clock_base(n.exec1(std::string("SELECT ") + kPgNowMs)[0].as<int64_t>());
    }
    prepare_pg_statements(*this);
  } catch (const std::exception& e) {
    Status s = pg_to_status(e, "opening " + uri);
    drop_connection();
    // A role that may use the inbox's tables but not create them meets a schema that is
    // not there, or not at this library's version: the owner migrates it.
    if (migrate && s.code() == Status::Code::kPermissionDenied && version < kPgSchemaVersion)
      return Status(Status::Code::kSchema,
                    uri + ": the schema " + schema +
                        (version <= 0 ? std::string(" is missing")
                                      : " is at version " + std::to_string(version) +
                                            ", older than this library's " +
                                            std::to_string(kPgSchemaVersion)) +
                        " and this role may not create it (" + s.message() +
                        "): run `mqtt-inbox migrate` as its owner "
                        "(docs/postgres.md#privileges)");
    return s;
  }
  return Status::Ok();
}

void PgBackend::name_user(const std::string& consumer) {
  // An application_name the location sets is the application's: kept.
  if (conninfo.find("application_name=") != std::string::npos) return;
  if (("," + users + ",").find("," + consumer + ",") != std::string::npos) return;
  users += (users.empty() ? "" : ",") + consumer;
  if (!conn || !conn->is_open()) return;  // the next connection carries it
  try {
    std::string app = "mqtt-inbox inbox " + users + " " + std::to_string(::getpid());
    if (app.size() > 63) app.resize(63);
    pqxx::nontransaction n(*conn);
    n.exec_params("SELECT set_config('application_name', $1, false)", app);
  } catch (const std::exception& e) {
    log->warn("{}: cannot name the inbox's connection for consumer '{}': {}", uri,
              printable(consumer), printable(e.what()));
  }
}

void PgBackend::drop_connection() noexcept {
  if (txn) {
    txn->abort_by_library();
    txn.reset();
  }
  reading.reset();
  watch.reset();
  conn.reset();
}

Status PgBackend::failed(const std::exception& e, const std::string& context) {
  bool lost = false;
  Status s = pg_to_status(e, context, &lost);
  if (lost || (conn && !conn->is_open())) drop_connection();  // the next call reconnects
  return store_error(s);
}

Status PgBackend::classify_current(const std::string& context) {
  try {
    throw;
  } catch (const std::exception& e) {
    bool lost = false;
    Status s = pg_to_status(e, context, &lost);
    if (lost || (conn && !conn->is_open())) drop_connection();
    return s;
  } catch (...) {
    return Status::Internal(context + ": a non-standard exception");
  }
}

Status PgBackend::with_txn(const std::string& context, const std::function<void(PgWork&)>& fn) {
  if (unusable()) return fatal_status();
  std::lock_guard<std::mutex> lock(mu);
  if (Status s = connect_locked(false); !s.ok()) return store_error(s);
  try {
    PgWork w(*conn);
    fn(w);
    w.commit_by_library();
  } catch (const std::exception& e) {
    outbox_wake_armed = false;  // rolled back: nothing to wake for
    return failed(e, context);
  }
  outbox_committed();
  return Status::Ok();
}

Status PgBackend::open(int lock_wait_ms) {
  (void)lock_wait_ms;  // lock_timeout is the session's (busy_timeout_ms)
  return connect_locked(/*migrate=*/true);
}

void PgBackend::setup(int lock_wait_ms, FunctionRef<void(const TxnRef&)> fn) {
  (void)lock_wait_ms;
  PgWork w(*conn);
  // One set-up at a time per database, as the schema's steps: consumers starting together
  // would otherwise race on the same CREATE TABLE (IF NOT EXISTS, or a DO block that looks
  // first), and the loser fails with 23505 on pg_type's unique index once the winner
  // commits. Behind the lock, the second one sees the table.
  w.exec("SELECT pg_advisory_xact_lock(hashtext('mqtt_inbox application set-up'))");
  pqxx::transaction_base& base = w;
  fn(TxnRef{&base, &typeid(pqxx::transaction_base*)});
  w.commit_by_library();
}

void PgBackend::setup_sql(int lock_wait_ms, const std::string& sql) {
  setup(lock_wait_ms,
        [&](const TxnRef& t) { static_cast<pqxx::transaction_base*>(t.handle)->exec(sql); });
}

void PgBackend::with_connection(FunctionRef<void(const TxnRef&)> fn) {
  if (unusable()) throw std::runtime_error(fatal_status().to_string());
  // The application's own transactions on it read and write as usual while it has it.
  pqxx::connection_base& c = *conn;
  {
    pqxx::nontransaction n(c);
    n.exec0("SET default_transaction_read_only = off");
  }
  struct Restore {
    pqxx::connection_base& c;
    ~Restore() {
      try {
        pqxx::nontransaction n(c);
        n.exec0("SET default_transaction_read_only = on");
      } catch (...) {
        // A connection that broke meanwhile is made anew, with its settings.
      }
    }
  } restore{c};
  fn(TxnRef{&c, &typeid(pqxx::connection_base*)});
}

std::string PgBackend::fatal_advice(const std::string& error) const {
  return "the server reports corruption (" + error +
         "); the inbox stops taking messages and acknowledges none until it is restarted "
         "(docs/postgres.md)";
}

std::string PgBackend::fatal_text(const std::string& error) const {
  return uri + " reported corruption (" + error + "); the inbox no longer uses it";
}

PgBackend::~PgBackend() {
  outbox_store.reset();  // stops its listener thread, which reads conninfo
  std::lock_guard<std::mutex> lock(mu);
  drop_connection();
}

}  // namespace mqtt_inbox::detail

namespace mqtt_inbox {

void enable_postgres_store() { detail::register_postgres_backend(&detail::make_postgres_backend); }

}  // namespace mqtt_inbox

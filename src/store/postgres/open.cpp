// Opening the PostgreSQL store: the location (a libpq URI that may not hold a password),
// the connection with its READ COMMITTED check and lock_timeout, the schema in versioned
// steps under an advisory lock, the server's clock, start-up waits and the fatal latch.
#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "store/postgres/errors.h"
#include "store/postgres/store.h"
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

// A failed connection attempt that waiting cannot cure: the server refused who we are.
bool refused_identity(const std::string& what) {
  for (const char* s : {"password authentication failed", "no pg_hba.conf entry", "does not exist",
                        "no password supplied", "authentication failed"})
    if (what.find(s) != std::string::npos) return true;
  return false;
}

}  // namespace

void prepare_pg_statements(PgStore& s);  // claim.cpp

Status PgStore::open_connection(std::unique_ptr<pqxx::connection>* out, int connect_timeout_s,
                                const std::function<void(pqxx::connection&)>& on_open) {
  out->reset();
  std::string info = conninfo;
  if (connect_timeout_s > 0 && info.find("connect_timeout=") == std::string::npos)
    info += std::string(info.find('?') == std::string::npos ? "?" : "&") +
            "connect_timeout=" + std::to_string(connect_timeout_s);
  std::unique_ptr<pqxx::connection> c;
  try {
    c = std::make_unique<pqxx::connection>(info);
  } catch (const std::exception& e) {
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    if (refused_identity(what))
      return Status(Status::Code::kPermissionDenied, "connecting to " + uri + ": " + what);
    return Status(Status::Code::kIoError, "connecting to " + uri + ": " + what);
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
    // 0 is "do not wait", as on SQLite (PRAGMA busy_timeout = 0), not PostgreSQL's
    // lock_timeout = 0, which waits for ever behind a stuck node.
    n.exec0("SET lock_timeout = " + std::to_string(std::max(1, options.busy_timeout_ms)));
    // A session frozen or cut off inside a claim's transaction holds its row locks until
    // the server ends it: bounded here, not by TCP (which may never tell).
    if (options.postgres_idle_in_transaction_timeout_ms > 0)
      n.exec0("SET idle_in_transaction_session_timeout = " +
              std::to_string(options.postgres_idle_in_transaction_timeout_ms));
  } catch (const std::exception& e) {
    return pg_to_status(e, "opening " + uri);
  }
  *out = std::move(c);
  return Status::Ok();
}

Status PgStore::connect_locked(bool migrate) {
  if (conn && conn->is_open()) return Status::Ok();
  conn.reset();
  if (Status s = open_connection(&conn); !s.ok()) return store_error(s);
  try {
    if (migrate) {
      pqxx::work w(*conn);
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
      int version = 0;
      if (!w.exec1("SELECT to_regclass(" + w.quote(t("inbox_meta")) + ") IS NULL")[0].as<bool>())
        version = read_version();
      if (version < kPgSchemaVersion) {
        w.exec0("CREATE SCHEMA IF NOT EXISTS " + schema);
        w.exec0("CREATE TABLE IF NOT EXISTS " + t("inbox_meta") +
                " (key text PRIMARY KEY, value text NOT NULL)");
        version = read_version();
      }
      if (version > kPgSchemaVersion) {
        w.abort();
        conn.reset();
        return Status(Status::Code::kCorruption,
                      uri + ": schema " + schema + " is at version " + std::to_string(version) +
                          ", newer than this library's " + std::to_string(kPgSchemaVersion));
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
      w.commit();
    }
    {
      pqxx::nontransaction n(*conn);
      const int64_t now = n.exec1(std::string("SELECT ") + kPgNowMs)[0].as<int64_t>();
      clock_base_ms = now;
      steady_base_ms = clock->steady_ms();
    }
    prepare_pg_statements(*this);
  } catch (const std::exception& e) {
    Status s = pg_to_status(e, "opening " + uri);
    conn.reset();
    return store_error(s);
  }
  return Status::Ok();
}

Status PgStore::failed(const std::exception& e, const std::string& context) {
  bool lost = false;
  Status s = pg_to_status(e, context, &lost);
  if (lost || (conn && !conn->is_open())) conn.reset();  // the next call reconnects
  return store_error(s);
}

Status PgStore::with_txn(const std::string& context, const std::function<void(pqxx::work&)>& fn) {
  if (fatal.load()) return fatal_status();
  std::lock_guard<std::mutex> lock(mu);
  if (Status s = connect_locked(false); !s.ok()) return s;
  try {
    pqxx::work w(*conn);
    fn(w);
    w.commit();
  } catch (const std::exception& e) {
    outbox_wake_armed = false;  // rolled back: nothing to wake for
    return failed(e, context);
  }
  outbox_committed();
  return Status::Ok();
}

Status PgStore::setup_sql(const std::string& sql) {
  if (Status r = refuse_if_in_handler(owner, "Inbox::setup_sql"); !r.ok()) return r;
  return wait_at_startup("running the application's set-up", [&](int) -> Status {
    return with_txn("application set-up", [&](pqxx::work& w) {
      // One set-up at a time per database, as the schema's steps: consumers starting
      // together would otherwise race on the same CREATE TABLE (IF NOT EXISTS, or a DO
      // block that looks first), and the loser fails with 23505 on pg_type's unique index
      // once the winner commits. Behind the lock, the second one sees the table.
      w.exec("SELECT pg_advisory_xact_lock(hashtext('mqtt_inbox application set-up'))");
      w.exec(sql);
    });
  });
}

Status PgStore::wait_at_startup(const char* what, const std::function<Status(int)>& op) {
  return startup->until_ready(
      what,
      [&]() -> Status {
        if (fatal.load()) return fatal_status();
        return op(options.busy_timeout_ms);
      },
      options.startup_deadline_ms, options.startup_progress);
}

void PgStore::latch_fatal(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    if (fatal.load()) return;
    fatal_error = s.to_string();
    fatal = true;
  }
  log->error(
      "{}: the server reports corruption ({}); the inbox stops taking messages and "
      "acknowledges none until it is restarted (docs/postgres.md)",
      uri, s.to_string());
}

Status PgStore::fatal_status() const {
  std::lock_guard<std::mutex> lock(stats_mu);
  return Status(Status::Code::kCorruption,
                uri + " reported corruption (" + fatal_error + "); the inbox no longer uses it");
}

PgStore::~PgStore() {
  outbox_store.reset();  // stops its listener thread, which reads conninfo
  std::lock_guard<std::mutex> lock(mu);
  conn.reset();
}

Status open_postgres_store(const std::string& uri, const InboxOptions& options,
                           std::unique_ptr<Store>* out) {
  if (Status s = refuse_password_in_location(uri); !s.ok()) return s;
  if (!valid_schema_name(options.postgres_schema))
    return Status::InvalidArgument("postgres_schema '" + printable(options.postgres_schema) +
                                   "' must be 1..63 characters of [a-z0-9_], not starting with "
                                   "a digit");
  if (options.busy_timeout_ms < 0) return Status::InvalidArgument("busy_timeout_ms < 0");
  if (options.postgres_idle_in_transaction_timeout_ms < 0)
    return Status::InvalidArgument("postgres_idle_in_transaction_timeout_ms < 0");
  if (options.startup_backoff_initial.count() < 1 ||
      options.startup_backoff_max < options.startup_backoff_initial ||
      options.startup_deadline_ms < 0 || options.startup_log_interval_ms < 0)
    return Status::InvalidArgument(
        "start-up options: need 1 ms <= startup_backoff_initial <= startup_backoff_max, "
        "startup_deadline_ms >= 0, startup_log_interval_ms >= 0");
  auto impl = std::make_unique<PgStore>();
  impl->uri = uri;
  impl->conninfo = uri;
  if (!options.postgres_password_file.empty())
    impl->conninfo += std::string(uri.find('?') == std::string::npos ? "?" : "&") +
                      "passfile=" + percent_encode(options.postgres_password_file);
  impl->options = options;
  impl->schema = "\"" + options.postgres_schema + "\"";
  impl->clock = options.clock ? options.clock : Clock::system();
  impl->log = logger_or_default(options.logger);
  impl->startup = std::make_unique<StoreRetry>(
      "inbox " + uri, uri, options.startup_backoff_initial.count(),
      options.startup_backoff_max.count(), options.startup_log_interval_ms, impl->clock, impl->log);
  PgStore* m = impl.get();
  const Status s = m->wait_at_startup("connecting to PostgreSQL", [m](int) {
    std::lock_guard<std::mutex> lock(m->mu);
    return m->connect_locked(/*migrate=*/true);
  });
  if (!s.ok()) return s;
  *out = std::move(impl);
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

namespace mqtt_inbox {

void enable_postgres_store() { detail::register_postgres_opener(&detail::open_postgres_store); }

}  // namespace mqtt_inbox

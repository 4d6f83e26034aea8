// What the admin tool reads of a PostgreSQL inbox beyond the public Inbox (admin.h): one
// connection of its own per call, one READ ONLY transaction, nothing created or written.
#include "store/postgres/admin.h"

#include <pqxx/pqxx>

#include <algorithm>
#include <memory>
#include <string>

#include "store/postgres/backend.h"
#include "store/postgres/errors.h"

namespace mqtt_inbox::detail {

int postgres_schema_version() { return kPgSchemaVersion; }

const std::vector<std::string>& postgres_inbox_tables() {
  // The tables of the schema steps in open.cpp (step 1, the inbox; step 2, the outbox;
  // step 3, store-then-process), and inbox_meta.
  static const std::vector<std::string> tables = {
      "inbox_meta",         "inbox_processed", "inbox_attempts",
      "inbox_dead_letters", "inbox_sessions",  "inbox_session_filters",
      "outbox_messages",    "outbox_usage",    "inbox_messages"};
  return tables;
}

namespace {

// Connects as Inbox::open would (the password file as a libpq parameter), or says why not.
Status connect(const std::string& uri, const InboxOptions& o,
               std::unique_ptr<pqxx::connection>* out) {
  if (Status s = refuse_password_in_location(uri); !s.ok()) return s;
  std::string conninfo = uri;
  if (!o.postgres_password_file.empty())
    conninfo += std::string(uri.find('?') == std::string::npos ? "?" : "&") +
                "passfile=" + percent_encode(o.postgres_password_file);
  try {
    *out = std::make_unique<pqxx::connection>(conninfo);
  } catch (const std::exception& e) {
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    const bool refused = what.find("authentication failed") != std::string::npos ||
                         what.find("no pg_hba.conf entry") != std::string::npos ||
                         what.find("does not exist") != std::string::npos ||
                         what.find("no password supplied") != std::string::npos;
    return Status(refused ? Status::Code::kPermissionDenied : Status::Code::kIoError,
                  "connecting to " + uri + ": " + what);
  }
  return Status::Ok();
}

// Runs `fn` in a READ ONLY transaction on a connection of its own; errors classified.
template <typename Fn>
Status read_only(const std::string& uri, const InboxOptions& o, const std::string& context,
                 Fn&& fn) {
  std::unique_ptr<pqxx::connection> conn;
  if (Status s = connect(uri, o, &conn); !s.ok()) return s;
  try {
    pqxx::read_transaction r(*conn);
    // Never wait long for a consumer's lock (only a schema change takes one these reads
    // would wait for).
    r.exec0("SET LOCAL lock_timeout = " + std::to_string(std::max(1, o.busy_timeout_ms)));
    fn(*conn, r);
  } catch (const std::exception& e) {
    return pg_to_status(e, context + " on " + uri);
  }
  return Status::Ok();
}

}  // namespace

Status inspect_postgres(const std::string& uri, const InboxOptions& o, PgInspection* out) {
  *out = PgInspection{};
  PgInspection& f = *out;
  return read_only(
      uri, o, "inspecting the inbox", [&](pqxx::connection& c, pqxx::read_transaction& r) {
        f.server_version = r.exec1("SHOW server_version")[0].as<std::string>();
        f.isolation = r.exec1("SHOW default_transaction_isolation")[0].as<std::string>();
        f.synchronous_commit = r.exec1("SHOW synchronous_commit")[0].as<std::string>();
        f.fsync = r.exec1("SHOW fsync")[0].as<std::string>();
        f.server_now_ms = r.exec1(std::string("SELECT ") + kPgNowMs)[0].as<int64_t>();
        const pqxx::row who =
            r.exec1("SELECT current_user, has_database_privilege(current_database(), 'CREATE')");
        f.role = who[0].as<std::string>();
        f.can_create_in_database = who[1].as<bool>();
        const std::string& schema = o.postgres_schema;
        f.schema_exists =
            r.exec_params1("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema)[0]
                .as<int64_t>() > 0;
        if (f.schema_exists)
          f.can_create_in_schema =
              r.exec_params1("SELECT has_schema_privilege($1, 'CREATE')", schema)[0].as<bool>();
        if (!f.schema_exists) {
          f.missing_tables = postgres_inbox_tables();
          return;
        }
        std::vector<std::string> present;
        for (const pqxx::row& row :
             r.exec_params("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = "
                           "c.relnamespace WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')",
                           schema))
          present.push_back(row[0].as<std::string>());
        auto has = [&](const std::string& t) {
          return std::find(present.begin(), present.end(), t) != present.end();
        };
        for (const std::string& t : postgres_inbox_tables())
          (has(t) ? f.tables : f.missing_tables).push_back(t);
        const std::string q = c.quote_name(schema) + ".";
        for (const std::string& t : f.tables)
          f.row_counts[t] = r.exec1("SELECT count(*) FROM " + q + c.quote_name(t))[0].as<int64_t>();
        if (has("inbox_meta")) {
          for (const pqxx::row& row : r.exec("SELECT key, value FROM " + q + "inbox_meta"))
            f.meta[row[0].as<std::string>()] = row[1].as<std::string>();
          if (auto it = f.meta.find("schema_version"); it != f.meta.end()) {
            try {
              f.schema_version = std::stoi(it->second);
            } catch (...) {
              f.schema_version = 0;
            }
          }
        }
        if (has("inbox_attempts")) {
          for (const pqxx::row& row :
               r.exec("SELECT consumer_name, count(*), count(*) FILTER (WHERE state = 'running')"
                      " FROM " +
                      q + "inbox_attempts GROUP BY consumer_name")) {
            f.attempts_by_consumer[row[0].as<std::string>()] = row[1].as<int64_t>();
            f.attempts_running += row[2].as<int64_t>();
          }
        }
        if (has("inbox_dead_letters")) {
          for (const pqxx::row& row :
               r.exec("SELECT consumer_name, reason, status, count(*) FROM " + q +
                      "inbox_dead_letters GROUP BY 1, 2, 3"))
            f.dead_letters.push_back({row[0].as<std::string>(), row[1].as<std::string>(),
                                      row[2].as<std::string>(), row[3].as<int64_t>()});
        }
      });
}

Status count_expired_postgres(const std::string& uri, const InboxOptions& o, int64_t claims_cutoff,
                              int64_t dead_letters_cutoff,
                              std::map<std::string, int64_t>* claims_by_consumer,
                              int64_t* dead_letters, int64_t* outbox_sent, int64_t* outbox_dead) {
  claims_by_consumer->clear();
  *dead_letters = 0;
  *outbox_sent = 0;
  *outbox_dead = 0;
  return read_only(
      uri, o, "counting expired rows", [&](pqxx::connection& c, pqxx::read_transaction& r) {
        const std::string q = c.quote_name(o.postgres_schema) + ".";
        // The same predicates as the Pruner's deletes (retention_rows.cpp).
        for (const pqxx::row& row :
             r.exec_params("SELECT consumer_name, count(*) FROM " + q +
                               "inbox_processed WHERE received_at < to_timestamp($1 / 1000.0)"
                               " GROUP BY consumer_name",
                           claims_cutoff))
          (*claims_by_consumer)[row[0].as<std::string>()] = row[1].as<int64_t>();
        if (dead_letters_cutoff > 0)
          *dead_letters = r.exec_params1("SELECT count(*) FROM " + q +
                                             "inbox_dead_letters WHERE retention_at < $1 AND "
                                             "status <> 'requeued'",
                                         dead_letters_cutoff)[0]
                              .as<int64_t>();
        // The outbox's finished rows (schema version 2), as the Pruner deletes them.
        if (r.exec1("SELECT to_regclass(" + r.quote(q + "outbox_messages") + ") IS NULL")[0]
                .as<bool>())
          return;
        *outbox_sent = r.exec_params1("SELECT count(*) FROM " + q +
                                          "outbox_messages WHERE state = 'sent' AND "
                                          "retention_at < $1",
                                      claims_cutoff)[0]
                           .as<int64_t>();
        if (dead_letters_cutoff > 0)
          *outbox_dead = r.exec_params1("SELECT count(*) FROM " + q +
                                            "outbox_messages WHERE state = 'dead' AND "
                                            "retention_at < $1",
                                        dead_letters_cutoff)[0]
                             .as<int64_t>();
      });
}

}  // namespace mqtt_inbox::detail

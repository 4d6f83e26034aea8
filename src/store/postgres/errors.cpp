// The classification of PostgreSQL errors (store/postgres/errors.h): a table of SQLSTATEs
// and classes, read exact code first, then the class.
#include "store/postgres/errors.h"

#include <pqxx/pqxx>

#include <cstring>

namespace mqtt_inbox::detail {

namespace {

struct Row {
  const char* code;  // 5 characters: one SQLSTATE; 2: a class
  PgErrorKind kind;
  Status::Code status;
  const char* name;
};

constexpr PgErrorKind T = PgErrorKind::kTransient;
constexpr PgErrorKind M = PgErrorKind::kMessage;
constexpr PgErrorKind F = PgErrorKind::kFatal;
using C = Status::Code;

constexpr Row kRows[] = {
    // Exact codes.
    {"40001", T, C::kBusy, "serialization_failure"},
    {"40P01", T, C::kBusy, "deadlock_detected"},
    {"40003", T, C::kIoError, "statement_completion_unknown"},
    {"55P03", T, C::kBusy, "lock_not_available"},
    {"57014", T, C::kBusy, "query_canceled"},
    {"57P01", T, C::kIoError, "admin_shutdown"},
    {"57P02", T, C::kIoError, "crash_shutdown"},
    {"57P03", T, C::kIoError, "cannot_connect_now"},
    {"57P04", T, C::kIoError, "database_dropped"},
    {"53100", T, C::kFull, "disk_full"},
    {"53200", T, C::kFull, "out_of_memory"},
    {"53300", T, C::kBusy, "too_many_connections"},
    {"25006", T, C::kReadOnly, "read_only_sql_transaction"},
    {"42501", T, C::kPermissionDenied, "insufficient_privilege"},
    {"XX001", F, C::kCorruption, "data_corrupted"},
    {"XX002", F, C::kCorruption, "index_corrupted"},
    // Classes.
    {"08", T, C::kIoError, "connection_exception"},
    {"53", T, C::kFull, "insufficient_resources"},
    {"58", T, C::kIoError, "system_error"},
    {"22", M, C::kRejected, "data_exception"},
    {"23", M, C::kRejected, "integrity_constraint_violation"},
};

template <typename E>
bool is(const std::exception& e) {
  return dynamic_cast<const E*>(&e) != nullptr;
}

}  // namespace

std::string pg_sqlstate(const std::exception& e) {
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e))
    if (!sql->sqlstate().empty()) return sql->sqlstate();
  // Most derived first.
  if (is<pqxx::serialization_failure>(e)) return "40001";
  if (is<pqxx::deadlock_detected>(e)) return "40P01";
  if (is<pqxx::statement_completion_unknown>(e)) return "40003";
  if (is<pqxx::transaction_rollback>(e)) return "40000";
  if (is<pqxx::unique_violation>(e)) return "23505";
  if (is<pqxx::check_violation>(e)) return "23514";
  if (is<pqxx::foreign_key_violation>(e)) return "23503";
  if (is<pqxx::not_null_violation>(e)) return "23502";
  if (is<pqxx::restrict_violation>(e)) return "23001";
  if (is<pqxx::integrity_constraint_violation>(e)) return "23000";
  if (is<pqxx::data_exception>(e)) return "22000";
  if (is<pqxx::insufficient_privilege>(e)) return "42501";
  if (is<pqxx::disk_full>(e)) return "53100";
  if (is<pqxx::out_of_memory>(e)) return "53200";
  if (is<pqxx::insufficient_resources>(e)) return "53000";
  if (is<pqxx::undefined_table>(e)) return "42P01";
  if (is<pqxx::undefined_column>(e)) return "42703";
  if (is<pqxx::undefined_function>(e)) return "42883";
  if (is<pqxx::syntax_error>(e)) return "42601";
  if (is<pqxx::feature_not_supported>(e)) return "0A000";
  if (is<pqxx::invalid_cursor_state>(e)) return "24000";
  if (is<pqxx::invalid_sql_statement_name>(e)) return "26000";
  if (is<pqxx::invalid_cursor_name>(e)) return "34000";
  if (is<pqxx::plpgsql_raise>(e)) return "P0001";
  if (is<pqxx::plpgsql_no_data_found>(e)) return "P0002";
  if (is<pqxx::plpgsql_too_many_rows>(e)) return "P0003";
  if (is<pqxx::plpgsql_error>(e)) return "P0000";
  return "";
}

PgErrorClass classify_sqlstate(const std::string& sqlstate) {
  for (const Row& r : kRows)
    if (std::strlen(r.code) == 5 && sqlstate == r.code) return {r.kind, r.status, r.name};
  for (const Row& r : kRows)
    if (std::strlen(r.code) == 2 && sqlstate.compare(0, 2, r.code) == 0)
      return {r.kind, r.status, r.name};
  // Anything else the handler's statements raise (42601 syntax_error, 42P01
  // undefined_table, P0001 raise_exception, ...) is this message's failure.
  return {PgErrorKind::kMessage, Status::Code::kRejected, "other"};
}

namespace {

std::string trimmed(const char* what) {
  std::string s = what;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// A server error: an sql_error, or one of libpqxx's types for a server error that is not
// one (transaction_rollback).
bool server_error(const std::exception& e) {
  return is<pqxx::sql_error>(e) || is<pqxx::transaction_rollback>(e);
}

bool connection_error(const std::exception& e) {
  return is<pqxx::in_doubt_error>(e) || is<pqxx::broken_connection>(e);
}

}  // namespace

Status pg_to_status(const std::exception& e, const std::string& context, bool* connection_lost) {
  if (connection_lost) *connection_lost = false;
  if (connection_error(e)) {
    if (connection_lost) *connection_lost = true;
    return Status(Status::Code::kIoError,
                  context + ": the connection to the server was lost (" + trimmed(e.what()) + ")");
  }
  if (server_error(e)) {
    const std::string state = pg_sqlstate(e);
    const PgErrorClass c = classify_sqlstate(state);
    if (connection_lost)
      *connection_lost = state.compare(0, 2, "08") == 0 || state.compare(0, 3, "57P") == 0;
    std::string text = context + ": " + trimmed(e.what()) + " (SQLSTATE " +
                       (state.empty() ? "unknown" : state) + " " + c.name + ")";
    // A missing privilege names its object in libpq's text ("permission denied for table
    // x"); say what to grant.
    if (state == "42501")
      text +=
          ": the role lacks a privilege on the object named; its owner grants it, e.g. GRANT "
          "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA <the inbox's schema> TO "
          "<this role>, with USAGE on the schema (docs/postgres.md#privileges)";
    return Status(c.status, text);
  }
  return Status::Internal(context + ": " + e.what());
}

bool classify_pg_exception(const std::exception& e, Status* status, bool* message_fault) {
  if (connection_error(e)) {
    *message_fault = false;
    *status = pg_to_status(e, "handler");
    return true;
  }
  if (server_error(e)) {
    *message_fault = classify_sqlstate(pg_sqlstate(e)).kind == PgErrorKind::kMessage;
    *status = pg_to_status(e, "handler");
    return true;
  }
  return false;
}

}  // namespace mqtt_inbox::detail

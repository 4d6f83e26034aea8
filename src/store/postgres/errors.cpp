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
    {"42501", T, C::kReadOnly, "insufficient_privilege"},
    {"XX001", F, C::kCorruption, "data_corrupted"},
    {"XX002", F, C::kCorruption, "index_corrupted"},
    // Classes.
    {"08", T, C::kIoError, "connection_exception"},
    {"53", T, C::kFull, "insufficient_resources"},
    {"58", T, C::kIoError, "system_error"},
    {"22", M, C::kRejected, "data_exception"},
    {"23", M, C::kRejected, "integrity_constraint_violation"},
};

}  // namespace

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

Status pg_to_status(const std::exception& e, const std::string& context, bool* connection_lost) {
  if (connection_lost) *connection_lost = false;
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) {
    const std::string& state = sql->sqlstate();
    const PgErrorClass c = classify_sqlstate(state);
    if (connection_lost)
      *connection_lost = state.compare(0, 2, "08") == 0 || state.compare(0, 3, "57P") == 0;
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    return Status(c.status, context + ": " + what + " (SQLSTATE " + state + " " + c.name + ")");
  }
  if (dynamic_cast<const pqxx::in_doubt_error*>(&e) ||
      dynamic_cast<const pqxx::broken_connection*>(&e)) {
    if (connection_lost) *connection_lost = true;
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    return Status(Status::Code::kIoError,
                  context + ": the connection to the server was lost (" + what + ")");
  }
  return Status::Internal(context + ": " + e.what());
}

bool classify_pg_exception(const std::exception& e, Status* status, bool* message_fault) {
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) {
    *message_fault = classify_sqlstate(sql->sqlstate()).kind == PgErrorKind::kMessage;
    *status = pg_to_status(e, "handler");
    return true;
  }
  if (dynamic_cast<const pqxx::in_doubt_error*>(&e) ||
      dynamic_cast<const pqxx::broken_connection*>(&e)) {
    *message_fault = false;
    *status = pg_to_status(e, "handler");
    return true;
  }
  return false;
}

}  // namespace mqtt_inbox::detail

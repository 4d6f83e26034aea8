// Internal: the one classification of PostgreSQL errors (SQLSTATE codes,
// https://www.postgresql.org/docs/15/errcodes-appendix.html, and libpqxx's connection
// errors), as store/sqlite/errors.h is for SQLite result codes. The class decides what the
// per-message path does (store/claims.h, inbox/consumer.cpp):
//
//   kTransient  the server or the connection failed in a way that clears by itself: retry
//               without limit, never acknowledge meanwhile, never count an attempt.
//               40001 serialization_failure, 40P01 deadlock_detected, 40003
//               statement_completion_unknown, 55P03 lock_not_available (lock_timeout: "not
//               yet"), 57014 query_canceled, 57P01..57P03 shutdown/cannot connect now,
//               class 08 (connection exceptions), a broken connection; and the ones that
//               need an operator but no change to the message: 53100 disk_full and the
//               rest of class 53 (insufficient resources), 25006 read_only_sql_transaction
//               (a standby after failover), 42501 insufficient_privilege (kPermissionDenied,
//               naming the GRANT: at start-up it fails at once), class 58 (system errors);
//               Health shows them (stuck, last_error) while the consumer waits.
//   kMessage    this message's change was refused: class 23 (constraints, also at COMMIT
//               for a deferred one), class 22 (data exceptions), and any other SQLSTATE the
//               handler's own statements raise (a syntax error, an undefined table): a
//               failed attempt, dead-lettered after max_attempts.
//   kFatal      the database reports corruption: XX001 data_corrupted, XX002
//               index_corrupted. The store latches (never acks again) until an operator
//               restarts it.
//
// A commit whose outcome is unknown (pqxx::in_doubt_error, a connection lost during
// COMMIT) is neither: the claim row decides (store/postgres/claim.cpp).
#pragma once

#include <exception>
#include <string>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// The three classes, as store/sqlite/errors.h's ErrorClass.
enum class PgErrorKind { kTransient, kMessage, kFatal };

struct PgErrorClass {
  PgErrorKind kind;
  Status::Code status;  // how a Status reports it (transient: a transient code)
  const char* name;     // e.g. "serialization_failure", or the class's name for a prefix
};

// The class of SQLSTATE `sqlstate` (5 characters): its own row if the table has one, else
// its class's (first two characters), else kMessage / kRejected.
PgErrorClass classify_sqlstate(const std::string& sqlstate);

// The SQLSTATE behind a libpqxx exception, "" if it has none (not a server error, or a
// broken connection). libpqxx 6.4 does not always carry it: 40001 and 40P01 come as
// serialization_failure and deadlock_detected, which derive from pqxx::failure, not from
// sql_error; and a subclass such as insufficient_privilege comes with an empty sqlstate()
// (tests/postgres/postgres_fixture_test.cpp). So the exception's type decides where
// sqlstate() is empty, most derived first.
std::string pg_sqlstate(const std::exception& e);

// The Status for an exception thrown by libpqxx (or by anything else: kInternal),
// "<context>: <what>" with the SQLSTATE, classified as above. *connection_lost (may be
// null) says whether the connection is gone (class 08, 57P0x, broken_connection,
// in_doubt_error): the store must reconnect.
Status pg_to_status(const std::exception& e, const std::string& context,
                    bool* connection_lost = nullptr);

// The PostgreSQL store's StoreErrorClassifier (store/verdict.h): true for a pqxx error a
// handler threw, with its Status and whether it is the message's fault.
bool classify_pg_exception(const std::exception& e, Status* status, bool* message_fault);

}  // namespace mqtt_inbox::detail

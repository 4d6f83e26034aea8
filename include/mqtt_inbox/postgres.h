// The PostgreSQL store: what an application writes for an inbox on a PostgreSQL server.
//
// The PostgreSQL store is a library of its own, so that a program on SQLite never loads
// libpq and what it brings (GnuTLS, Kerberos, LDAP): link mqtt_inbox_postgres (CMake
// `find_package(mqtt_inbox COMPONENTS mqtt_inbox postgres)` and `mqtt_inbox::postgres`;
// pkg-config `mqtt_inbox_postgres`) and call enable_postgres_store() once, before the
// first Inbox::open of a PostgreSQL location. Built when the library was configured with
// MQTT_INBOX_WITH_POSTGRES (the default on a host build where libpqxx is found).
//
// The store chooses itself from the location given to Inbox::open: a libpq connection URI
// ("postgresql://..." or "postgres://...",
// https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-CONNSTRING) opens the PostgreSQL
// store, anything else is an SQLite file path. Without enable_postgres_store(), opening
// such a location fails with kInvalidArgument saying what to link and call; in a build
// configured with MQTT_INBOX_WITH_POSTGRES=OFF, with kInvalidArgument saying so.
//
//   mqtt_inbox::enable_postgres_store();
//   std::unique_ptr<Inbox> inbox;
//   InboxOptions o;
//   o.postgres_schema = "mqtt_inbox";          // where the inbox's tables live (default)
//   Status s = Inbox::open("postgresql:///ledger?host=/run/postgresql", o, &inbox);
//   std::unique_ptr<Consumer> consumer;
//   s = Consumer::create(inbox.get(), "ledger",
//       [](pqxx::transaction_base& txn, const Delivery& d) {
//         txn.exec_params("UPDATE accounts SET balance = balance + $1 WHERE id = $2", ...);
//       },
//       ConsumerOptions{}, &consumer);
//
// A password never comes with the location: Inbox::open refuses a URI that holds one
// (kInvalidArgument, without repeating it). It comes from a password file: libpq's
// PGPASSFILE (default ~/.pgpass) or InboxOptions::postgres_password_file. Inbox::path()
// and every log line show the location as given, which therefore holds no password.
//
// The transactional outbox works on this store too (outbox.h): a PgHandler enqueues in its
// transaction with Outbox::enqueue_or_throw(txn, ...), and a Relay is woken through
// LISTEN/NOTIFY by a commit on any connection, in any process (docs/postgres.md#the-outbox).
//
// What is supported so far, the READ COMMITTED rule, whose clock counts, retention and
// partitioning: docs/postgres.md.
#pragma once

#include <functional>

#include "mqtt_inbox/message.h"

namespace pqxx {
class transaction_base;
}

namespace mqtt_inbox {

struct StoredDelivery;  // store_then_process.h

// Makes Inbox::open accept PostgreSQL locations ("postgresql://", "postgres://") in this
// process: registers the PostgreSQL store, which this function's library
// (mqtt_inbox_postgres) holds, with the core. Call it before the first such Inbox::open;
// an explicit call (not a static initialiser) so that it works when the library is linked
// statically too. Idempotent: a second call does nothing more. Thread safety: any thread,
// at any time, also while other threads open inboxes.
void enable_postgres_store();

// The business change of one message on the PostgreSQL store (Consumer::create): runs
// inside the library's transaction `txn`, right after the claim row was inserted, on the
// inbox's own connection, at READ COMMITTED. Everything it executes through `txn` commits
// atomically with the claim, or not at all. The rules of handler.h hold, read for
// PostgreSQL:
//  - Do not commit or abort `txn`, nor run COMMIT/ROLLBACK/BEGIN through it: the inbox
//    commits it. SAVEPOINTs (pqxx::subtransaction) are fine.
//  - Throw to fail: any exception rolls back the claim and the handler's writes; the
//    message is retried up to ConsumerOptions::max_attempts, then dead-lettered
//    (handler_failed). UndecodablePayload and RejectMessage dead-letter it at once.
//  - A pqxx error is judged by its SQLSTATE (src/store/postgres/errors.h): a failure of
//    the server or the connection (40001, 40P01, 55P03, 57P01, 08xxx, a broken
//    connection; 53100 disk full, 25006 read only, 42501 permission) is retried until
//    the server recovers and never counts as an attempt; the message's own (23xxx
//    constraints, 22xxx data errors, and any other SQLSTATE) is a failed attempt.
//  - Do not change the session's isolation level (SET default_transaction_isolation):
//    the claim needs READ COMMITTED (docs/postgres.md#read-committed).
//  - `txn` and `delivery` are valid only during the call.
//  - Do not call back into the library for the inbox it runs for (handler.h).
// Thread safety: called on the thread that called Consumer::handle.
using PgHandler = std::function<void(pqxx::transaction_base& txn, const Delivery& delivery)>;

// The business change of one stored message on the PostgreSQL store
// (StoreThenProcess::create): runs inside the worker's transaction `txn`, on the worker's
// own connection (each worker has one), at READ COMMITTED; the row is marked 'done' in
// the same transaction, so everything it executes through `txn` commits together with
// that mark, or not at all. The rules of PgHandler above hold (no COMMIT/ROLLBACK/BEGIN,
// SAVEPOINTs are fine; throw to fail; SQLSTATEs judged as there; READ COMMITTED; no call
// back into the library for this inbox). Besides:
//  - Workers of other processes may work the same consumer's rows on the same server: a
//    row is claimed by one worker at a time and the rows of one aggregate key one at a
//    time, in arrival order (docs/store-then-process.md#postgresql). A worker whose claim
//    was returned by a reaper (it exceeded StoreThenProcessOptions::lease_ms) commits
//    nothing: its transaction is rolled back at the end, after the handler ran.
//  - It holds no lock receipt needs (unlike SQLite's single write lock), only the row
//    locks its own statements take, until the commit.
//  - `txn` and `d` are valid only during the call.
// Thread safety: called on a worker thread of the StoreThenProcess; several at once, one
// per worker, each with its own `txn`.
using PgStoredHandler = std::function<void(pqxx::transaction_base& txn, const StoredDelivery& d)>;

}  // namespace mqtt_inbox

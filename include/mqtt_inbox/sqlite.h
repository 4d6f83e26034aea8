// The SQLite store: what an application writes for an inbox in an SQLite file, the store
// the library is made for (a device's own database). Every SQLite-typed name of the API
// is here; the core headers name no store type.
//
// Inbox::open of anything that is not a PostgreSQL URI opens the SQLite store: one
// connection to one database file in WAL mode (inbox.h, docs/design.md#opening-an-inbox).
// Its handlers take the inbox's own connection, inside the claim transaction the library
// opened with BEGIN IMMEDIATE:
//
//   Status s = Consumer::create(inbox.get(), "ledger",
//       [](SQLite::Database& db, const Delivery& d) {
//         SQLite::Statement q(db, "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2");
//         ...
//       },
//       ConsumerOptions{}, &consumer);
//
// Inbox::setup and Inbox::with_connection give a function of (SQLite::Database&) the
// same connection; Outbox::enqueue takes it inside an open transaction.
//
// The rules of handler.h hold; on this store:
//  - BEGIN, COMMIT, ROLLBACK and END are refused at prepare time while a handler runs
//    (an authorizer on the connection: SQLite::Exception with SQLITE_AUTH, "not
//    authorized"); SAVEPOINT, RELEASE and ROLLBACK TO are allowed.
//  - A SQLite::Exception is judged by its result code (src/store/sqlite/errors.h): BUSY,
//    FULL, IOERR, READONLY and the like are store failures, retried without counting an
//    attempt; CORRUPT and NOTADB stop the inbox without an ack; any other code (a
//    constraint, a CHECK, a syntax error) is a failed attempt.
//  - It holds SQLite's single write lock: the pruner, the admin tool and every other
//    writer wait for it.
//  - Do not keep the connection, close it (sqlite3_close*: the message is dead-lettered
//    as handler_ended_transaction and the inbox opens a new connection), or change its
//    settings (busy handler, hooks, the authorizer, PRAGMAs).
//
// Thread safety: as the calls that take these types.
#pragma once

#include <cstdint>
#include <functional>

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/message.h"

namespace SQLite {
class Database;
}

namespace mqtt_inbox {

struct StoredDelivery;  // store_then_process.h

// The business change of one message on the SQLite store (Consumer::create).
using Handler = std::function<void(SQLite::Database& db, const Delivery& delivery)>;

// The business change of one stored message on the SQLite store
// (StoreThenProcess::create). Runs inside the worker's BEGIN IMMEDIATE transaction on the
// worker's own connection; the row is marked 'done' in the same transaction. It holds
// SQLite's single write lock while it runs: receipt (handle()) waits for it, so keep it
// short, and put slow work in a PrepareFn (store_then_process.h).
using StoredHandler = std::function<void(SQLite::Database& db, const StoredDelivery& d)>;

// Adapts a Consumer's Handler to a StoredHandler: same Delivery (message, id, attempt),
// same transaction rules.
StoredHandler stored_handler(Handler handler);

// The schema version this library writes (PRAGMA user_version). Opening a database with
// a higher version fails with kCorruption: a newer library wrote it.
constexpr int kSchemaVersion = 15;

// The text of schema.sql, embedded at build time.
const char* schema_sql();

// The free space, in bytes, that the file system holding the database must keep so the
// inbox can always recover from a full disk by itself once the outside cause is gone
// (docs/operations.md#disk-space): room for its smallest WAL (32 pages) and for the
// database growth that checkpointing it needs, twice over, plus the -shm file (32 KiB):
// 544 KiB with 4 KiB pages. The growth of your own data comes on top. `mqtt-inbox check`
// warns below it.
int64_t min_free_bytes(int page_size_bytes);

}  // namespace mqtt_inbox

// Handler: the application's business change for one message.
//
// A handler runs inside the inbox's write transaction (BEGIN IMMEDIATE), on the inbox's
// own SQLite connection, right after the claim row was inserted. Everything it writes
// through `db` commits atomically with the claim, or not at all. Rules:
//  - Do not BEGIN, COMMIT, ROLLBACK or END: the inbox owns the transaction. While the
//    handler runs they are refused at prepare time (SQLite::Exception, SQLITE_AUTH), and
//    the attempt fails with the text "handler ended the transaction: it ran COMMIT" (or
//    ROLLBACK, BEGIN) whatever the handler did with the error, so nothing it wrote commits
//    apart from the claim; a run that returns after an error rolled the transaction back
//    fails by the same name. Such a failure counts as an attempt (retried, then
//    handler_failed). SAVEPOINT, RELEASE and ROLLBACK TO of your own are fine. The same
//    holds for a store-then-process handler (store_then_process.h).
//  - Signal failure by throwing. Any exception rolls back the claim and the handler's
//    writes; the message is retried (ConsumerOptions::max_attempts) and then
//    dead-lettered as handler_failed. For input that can never succeed, throw one of the
//    two permanent failures below: the message is dead-lettered at once, without retries
//    or backoff, and acked, with what() as the dead letter's reason text:
//      UndecodablePayload  the bytes cannot be decoded (bad JSON, wrong types)
//                          -> reason undecodable_payload
//      RejectMessage       it decodes, but the application refuses its content (a value
//                          out of range, an unknown account) -> reason invalid_payload
//    The outbox throws a third for you: OutboxRefused (outbox.h), when an outgoing
//    message can never be enqueued (an id too long, a topic MQTT forbids, a message
//    larger than its class) -> reason outbox_refused. OutboxFull is not a failure.
//  - A SQLite::Exception is judged by its code (the one table, src/store/sqlite/errors.h): a
//    store error code (BUSY, FULL, IOERR, READONLY, ...) is a store failure, not a
//    handler failure: it is retried until the store recovers and does not count as an
//    attempt; a corrupt file (CORRUPT, NOTADB) stops the inbox without an ack; any other
//    code (a constraint, a CHECK, a syntax error) is a failed attempt.
//  - Keep it short and local: SQLite has one writer at a time, and the PUBACK waits for
//    it. External side effects (HTTP, e-mail, other brokers) are outside the transaction
//    and may repeat; give them their own idempotency key.
//  - It may run more than once for the same message (after a rollback or a crash); only
//    its committed effect is exactly-once.
//  - `db` and `delivery` (and what delivery refers to) are valid only during the call:
//    copy what you keep (message.h, Delivery).
//  - Do not call back into the library for the inbox it runs for. While it runs, the
//    handler holds that inbox's connection (its mutex in Consumer mode, SQLite's write
//    lock in a store-then-process worker), so such a call would wait for its own thread:
//    on Paho's callback thread a silent hang, no PUBACK, no log. The library detects the
//    call on the handler's thread and refuses it: every method of that Inbox, of its
//    SessionRecords, and of a Consumer, Pruner or StoreThenProcess made on it, that takes
//    the connection returns kInvalidArgument naming the call (Inbox::with_connection
//    throws std::logic_error; Consumer/StoreThenProcess::handle and reject return
//    kDeadLettered without recording anything; Pruner::stop only asks its thread to
//    stop, ~Pruner joins it). The handler's own message is then dead-lettered at once as
//    handler_reentered, with the call in the reason text, whatever the handler did with
//    the refusal; the stream goes on with the next message. Calls that never wait stay
//    allowed: Inbox::path, options, retention_clock_ms, stats, health;
//    SessionRecords::note_lost; Consumer::name, health, counters, extract_message_id;
//    StoreThenProcess::name, health, counters; Pruner::required_window_ms. Instead of
//    the inbox's calls, read or write through the `db` the handler is given: it sees the
//    inbox's tables (inbox_processed, inbox_dead_letters, ...) inside the same
//    transaction. A PrepareFn (store_then_process.h) holds no connection and may call
//    anything.
#pragma once

#include <functional>
#include <stdexcept>

#include "mqtt_inbox/message.h"

namespace SQLite {
class Database;
}

namespace mqtt_inbox {

using Handler = std::function<void(SQLite::Database& db, const Delivery& delivery)>;

// Throw from a handler when the payload can never be processed (bad JSON, wrong types).
// The message is dead-lettered at once as undecodable_payload with what() as the reason
// text.
class UndecodablePayload : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throw from a handler when a well-formed message is invalid for the application and
// retrying cannot change that, e.g.
//   throw mqtt_inbox::RejectMessage("setpoint 95 C out of range 5..35");
// The handler's writes are rolled back and the message is dead-lettered at once (no
// retries, no backoff) as invalid_payload, with what() as the reason text, then acked.
// Works alike in Consumer mode and in store-then-process handlers and PrepareFns.
class RejectMessage : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mqtt_inbox

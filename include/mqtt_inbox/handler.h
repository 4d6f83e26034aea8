// Handler: the application's business change for one message.
//
// A handler runs inside the inbox's write transaction (BEGIN IMMEDIATE), on the inbox's
// own SQLite connection, right after the claim row was inserted. Everything it writes
// through `db` commits atomically with the claim, or not at all. Rules:
//  - Do not BEGIN, COMMIT or ROLLBACK: the inbox owns the transaction (a handler that
//    ends it is reported as failed). SAVEPOINTs are fine.
//  - Signal failure by throwing. Any exception rolls back the claim and the handler's
//    writes; the message is retried (ConsumerOptions::max_attempts) and then
//    dead-lettered as handler_failed. Throw UndecodablePayload for input that can never
//    succeed: the message is dead-lettered at once, without retries.
//  - A SQLite::Exception with a store error code (BUSY, FULL, IOERR, READONLY) is treated
//    as a store failure, not as a handler failure: it is retried until the store
//    recovers and does not count as an attempt.
//  - Keep it short and local: SQLite has one writer at a time, and the PUBACK waits for
//    it. External side effects (HTTP, e-mail, other brokers) are outside the transaction
//    and may repeat; give them their own idempotency key.
//  - It may run more than once for the same message (after a rollback or a crash); only
//    its committed effect is exactly-once.
//  - `db` and `delivery` (and what delivery refers to) are valid only during the call:
//    copy what you keep (message.h, Delivery).
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
// The message is dead-lettered as undecodable_payload with what() as the reason text.
class UndecodablePayload : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mqtt_inbox

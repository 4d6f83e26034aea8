// Outbox: the transactional outbox, the other half of exactly-once. Knows nothing of MQTT.
//
// A message to publish is written to the table outbox_messages inside the transaction
// that makes it true: a handler's claim transaction (handler.h), or the application's own
// transaction for telemetry the device produces itself (store-and-forward). It commits or
// rolls back with that transaction, so a derived message exists exactly when the effect
// that caused it does. The relay (relay.h) publishes committed rows at QoS 1 and marks a
// row sent only after its PUBACK; a crash anywhere means a resend with the same stable
// message id, never a loss, and the next hop's inbox drops the resends.
//
// Bounds, because flash is finite: classes by topic prefix, each with a row, a byte and an
// age limit on its pending rows, and a policy for when it is full: kReject (backpressure: the
// enqueue fails, so the handler's attempt fails and the incoming message is not
// acknowledged by that attempt) or kDropOldest (telemetry: the oldest pending rows of the
// class are deleted, counted in outbox_usage.dropped and logged, never silently).
//
// The relay reaches the rows through a port of the library's own (Relay::create takes the
// Outbox), on the Inbox's connection under the Inbox's mutex: its read of pending rows takes
// no write lock and writes nothing, and its marks are one short write transaction each; a
// commit that enqueued wakes it (docs/outbox.md).
//
// Thread safety: an Outbox is thread-safe. enqueue() uses only the connection it is given
// (the caller serialises its use); the other calls serialise on the Inbox's mutex.
// Errors: every method returns a Status and never throws, except enqueue_or_throw(),
// which is meant for handlers and throws as handler.h asks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "mqtt_inbox/handler.h"  // detail::TxnRef
#include "mqtt_inbox/message.h"  // MessageProperties
#include "mqtt_inbox/status.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox {

class Inbox;
// What enqueue() does when a class is full.
enum class OutboxFullPolicy {
  // enqueue() fails with kRejected ("outbox full: ..."): the caller's transaction should
  // fail. In a handler (enqueue_or_throw) the attempt fails and the incoming message is
  // retried; with a Consumer it counts as a handler attempt (ConsumerOptions::max_attempts),
  // with StoreThenProcess the row is retried after its backoff.
  kReject,
  // The oldest pending rows of the class are deleted until the new one fits; each drop is
  // counted (outbox_usage.dropped, OutboxCounters::dropped) and logged at warn.
  kDropOldest,
};

// A bounded class of outgoing messages: every topic starting with topic_prefix. A topic
// belongs to the class with the longest matching prefix; a topic matching none is not
// bounded (its rows are counted under class "").
struct OutboxClass {
  // Topic prefix, e.g. "telemetry/". "" matches every topic. Required to be unique.
  std::string topic_prefix;
  // Most pending rows of the class; 0 = no row limit. Default 0.
  int64_t max_rows = 0;
  // Most bytes of pending rows of the class (OutboxRow::size_bytes summed); 0 = no byte
  // limit. Default 0.
  int64_t max_bytes = 0;
  // Default kReject.
  OutboxFullPolicy policy = OutboxFullPolicy::kReject;
  // Oldest a pending row of the class may be, ms; 0 = no age limit. Default 0. Counted on
  // the inbox's retention clock (docs/operations.md#clock-safety), which a wall-clock jump does not
  // move and which does not run while the process is down, so a row is never taken for
  // older than it is. When the class's oldest pending row is older: kReject refuses new
  // rows ("outbox full: ... old") until the relay has sent it (the link has been down too
  // long: the input waits at the broker instead); kDropOldest drops the pending rows older
  // than the limit, counted and logged like any drop.
  int64_t max_age_ms = 0;
};

struct OutboxOptions {
  // The bounded classes. Default none (nothing bounded).
  std::vector<OutboxClass> classes;
  // Largest accepted message id, bytes (as MessageIdOptions::max_id_bytes of the next
  // hop). Default 256.
  size_t max_id_bytes = 256;
  // Logger of the outbox's warnings (drops, dead rows) and notes (replays, purges);
  // default nullptr = the Inbox's (InboxOptions::logger).
  std::shared_ptr<spdlog::logger> logger;
};

// One message to publish. QoS is always 1. Its MQTT 5 properties are the MessageProperties base
// (message.h); the relay adds the user property "message-id" to them.
struct OutgoingMessage : MessageProperties {
  // Topic name (no wildcards '+' or '#'; MQTT 3.1.1 section 4.7.1). Required.
  std::string topic;
  // Payload bytes. Default empty.
  std::string payload;
  // FIFO order holds among rows of one key. Default "" = the topic.
  std::string ordering_key;
  // The stable message id. Default "" = a random UUID (random_message_id). For a message
  // derived from an incoming one, use derived_message_id() so that re-running the handler
  // yields the same id.
  std::string message_id;
};

// The id of the outgoing message number/name `suffix` derived from the incoming message
// `incoming_id`: incoming_id + "/" + suffix. The same inputs always give the same id, so a
// handler that runs again (after a rollback, a crash, a replay) enqueues the same id.
//
// The limit: the result is incoming_id.size() + 1 + suffix.size() bytes and must be a
// valid id of at most `max_id_bytes` (pass OutboxOptions::max_id_bytes of the outbox it
// goes to; default 256, as that option's and MessageIdOptions::max_id_bytes's defaults).
// The inbox accepts incoming ids up to its own MessageIdOptions::max_id_bytes, so with
// equal limits an incoming id longer than max_id_bytes - 1 - suffix.size() bytes (a
// 250-byte id with the suffix "credited") derives one the next hop would refuse. The
// outbox does not accept longer ids instead: its limit is the next hop's inbox's. Throws
// OutboxRefused for such an id (or a `suffix` that makes it invalid, a control character):
// in a handler the incoming message is then dead-lettered at once as outbox_refused,
// with a text naming the incoming id's length and the room left. To refuse such input
// as invalid_id before the handler runs instead, set the inbox's
// MessageIdOptions::max_id_bytes to max_id_bytes - 1 - the longest suffix.
std::string derived_message_id(const std::string& incoming_id, const std::string& suffix,
                               size_t max_id_bytes = 256);

// A random RFC 4122 version 4 UUID ("xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx", lower case)
// from /dev/urandom. Errors: kIoError if /dev/urandom cannot be read.
Status random_message_id(std::string* out);

enum class OutboxState { kPending, kSent, kDead };
const char* to_string(OutboxState state);  // "pending", "sent", "dead"

// Why a row became an outbox dead letter (stored as text; never changes meaning).
enum class OutboxDeadReason {
  kRejectedByBroker,   // MQTT 5 PUBACK reason code >= 0x80 (MQTT 5.0 section 3.4.2.1)
  kExpired,            // its message expiry interval ran out while it waited
  kPayloadTooLarge,    // larger than the broker's Maximum Packet Size (announced in CONNACK,
                       // MQTT 5) or RelayOptions::max_packet_size
  kConnectionDropped,  // the broker closed the connection right after it was published, with
                       // it the oldest publish in flight, kConnectionDropsBeforeDeadLetter
                       // times in a row (relay.h): on MQTT 3.1.1 what a broker does with a
                       // packet over its unannounced limit (mosquitto max_packet_size)
};
const char* to_string(OutboxDeadReason reason);  // "rejected_by_broker", "expired",
                                                 // "payload_too_large", "connection_dropped"

// One row of outbox_messages.
struct OutboxRow {
  int64_t seq = 0;  // enqueue (and commit) order, never reused
  std::string message_id;
  std::string ordering_key;
  std::string topic;
  std::string payload;
  OutgoingMessage properties;  // topic, payload, key and id are repeated above only
  int64_t size_bytes = 0;      // id + key + topic + payload + properties JSON, bytes
  int64_t enqueued_at_ms = 0;  // wall clock
  // How long the row has waited since its enqueue (or its replay), ms, on the inbox's
  // retention clock when it was read: a wall-clock step does not change it, and time the
  // process was down does not count. The relay counts the message expiry with it.
  int64_t waited_ms = 0;
  OutboxState state = OutboxState::kPending;
  // Publishes of the row: the PUBLISH packets a relay handed to its MQTT client, the
  // resends after a reconnect included (Paho's own resends on a Subscriber's connection
  // are not counted). A relay counts them in its memory and adds them in the transaction
  // that marks the row sent or dead (OutboxMark), so that reading rows writes nothing:
  //  - a pending row shows 0 (replay_dead also sets 0);
  //  - a sent row shows the publishes of the relay run that marked it, >= 1;
  //  - a dead row those before its verdict: rejected_by_broker >= 1, connection_dropped
  //    >= kConnectionDropsBeforeDeadLetter (relay.h), expired and payload_too_large 0
  //    unless that run had published the row on an earlier connection.
  // Publishes by a relay run that ended before the verdict (a crash, a kill, a stop) are
  // lost with its memory: the next run counts its own from 0.
  int attempts = 0;
  int64_t sent_at_ms = 0;  // 0 unless sent
  std::optional<OutboxDeadReason> dead_reason;
  // The PUBACK reason code (>= 0x80) of a kRejectedByBroker row. 0 for every other row,
  // dead ones included: no PUBACK carried a code (not 0x00 Success).
  int reason_code = 0;
  std::string reason_text;
};

// Pending rows and bytes of one class (outbox_usage), and its drops ever.
struct OutboxClassUsage {
  std::string class_prefix;
  int64_t rows = 0;
  int64_t bytes = 0;
  int64_t dropped = 0;
};

// The whole table at a glance (summary()).
struct OutboxSummary {
  int64_t pending_rows = 0;
  int64_t pending_bytes = 0;
  int64_t sent_rows = 0;  // kept until the Pruner's window (RetentionOptions::window)
  int64_t dead_rows = 0;  // kept until dead_letter_window, or a purge
  // The oldest pending row is the head of the queue (lowest seq): the one that has waited
  // longest since its enqueue or its replay (a replay puts a row at the end, see
  // replay_dead). Its enqueue, wall clock ms (the first enqueue, kept by a replay), and how
  // long it has waited, ms on the inbox's retention clock (as OutboxRow::waited_ms: a
  // wall-clock step does not change it). Both 0 when nothing is pending.
  int64_t oldest_pending_enqueued_at_ms = 0;
  int64_t oldest_pending_waited_ms = 0;
  std::vector<OutboxClassUsage> classes;  // as usage()
};

// Which rows purge() deletes: all of the conditions given.
struct OutboxPurgeFilter {
  // kDead (default) or kSent. kPending is refused: a pending row is a message not yet
  // delivered, and deleting it would lose it.
  OutboxState state = OutboxState::kDead;
  std::optional<std::string> message_id;
  // Rows that became dead (dead_at) or sent (sent_at) before this wall-clock time, ms.
  std::optional<int64_t> before_ms;
};

// A row the relay marks sent or dead, and the publishes of it to add to its attempts
// (OutboxRow::attempts): those the relay made since it read the row, 0 for a verdict
// reached before any publish.
struct OutboxMark {
  int64_t seq = 0;
  int publishes = 0;
};

// Counts of this Outbox object (this process).
struct OutboxCounters {
  int64_t enqueued = 0;    // rows inserted (their transaction may still roll back)
  int64_t duplicates = 0;  // enqueue of an id already in the table: no second row
  int64_t rejected = 0;    // enqueues refused by a full kReject class
  int64_t dropped = 0;     // rows deleted by kDropOldest
  int64_t sent = 0;        // rows marked sent
  int64_t dead = 0;        // rows marked dead
};

// Thrown by Outbox::enqueue_or_throw when the enqueue was refused: as itself only when a
// random message id could not be made (/dev/urandom failed; an ordinary failed attempt,
// retried up to ConsumerOptions::max_attempts); every other refusal is one of the two
// subclasses below, OutboxRefused (never succeeds) or OutboxFull (backpressure).
class OutboxRejected : public std::runtime_error {
 public:
  explicit OutboxRejected(Status status)
      : std::runtime_error(status.to_string()), status_(std::move(status)) {}
  ~OutboxRejected() override;
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// Thrown by Outbox::enqueue_or_throw (status kInvalidArgument) and derived_message_id()
// for a refusal that no retry can change: the same message is refused on every attempt.
// The members, all checked before anything is written:
//  - no open transaction on `db` (the caller's mistake, the same on every run);
//  - the topic: empty, a wildcard '+' or '#', not valid UTF-8, a U+0000, longer than
//    65,535 bytes (MQTT 3.1.1 sections 1.5.3, 4.7.1; MQTT 5.0 sections 1.5.4, 3.3.2.1);
//  - the message id (given, or derived): not one the next hop's inbox accepts (longer
//    than OutboxOptions::max_id_bytes, not UTF-8, control characters, only whitespace);
//  - an MQTT 5 property the broker would refuse or disconnect for: a response topic held
//    to the topic rules; a content type or user property name or value that is not
//    valid UTF-8, holds U+0000 or exceeds 65,535 bytes; correlation data over 65,535
//    bytes; a payload format indicator other than 0 or 1, or 1 with a payload that is
//    not valid UTF-8 (MQTT 5.0 sections 1.5.4, 1.5.6, 3.3.2.3);
//  - the message larger than MQTT allows in one packet (268,435,455 bytes) or than its
//    class's max_bytes (it could never fit).
// The handler's incoming message is dead-lettered at once as outbox_refused
// (dead_letter.h), with what() naming the refusal: no retries, no backoff, one attempt,
// in a Consumer and in StoreThenProcess alike, and the stream goes on. Outbox::enqueue
// returns the same refusals as kInvalidArgument.
class OutboxRefused : public OutboxRejected {
 public:
  using OutboxRejected::OutboxRejected;
  ~OutboxRefused() override;
};

// Thrown by Outbox::enqueue_or_throw when a kReject class is full (rows, bytes or the age
// of its oldest row; status kRejected, text "outbox full: ..."). Not a failure of the
// message, so it never counts as an attempt:
//  - a Consumer parks the message as a dead letter with reason outbox_full and status
//    'requeued' (committed before the PUBACK, so nothing is lost) and its requeue thread
//    (ConsumerOptions::requeue_poll_ms) replays it once the relay has made room. It cannot
//    wait in the handler instead: Paho runs the relay's PUBACK callbacks on the thread the
//    handler holds (docs/guarantees.md section 7), so room would never come;
//  - StoreThenProcess leaves the row pending, with its attempts unchanged, and tries it
//    again after ConsumerOptions::retry_backoff_max (the row's aggregate waits behind it).
// A handler that catches it and throws something else turns it into an ordinary failure.
class OutboxFull : public OutboxRejected {
 public:
  using OutboxRejected::OutboxRejected;
  ~OutboxFull() override;
};

// The outbox of one Inbox: an interface implemented by the library (create() makes it).
// Its relay side (the relay turn, the read of pending rows, the marks, the wake-up on
// commit) is the library's own: a Relay (relay.h) reaches it from the Outbox given to
// Relay::create.
class Outbox {
 public:
  // An outbox over `inbox`'s store: its rows are written in the callers' transactions, and
  // the other calls use the Inbox's connection; not owned, must outlive the Outbox. On
  // success *out owns the outbox. Errors: kInvalidArgument for a null inbox, a negative
  // bound, two classes with the same prefix, or max_id_bytes 0.
  static Status create(Inbox* inbox, const OutboxOptions& options, std::unique_ptr<Outbox>* out);
  virtual ~Outbox();
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  // --- producer side ---

  // Adds `message` as a pending row inside the caller's open transaction `txn`: the
  // store's own transaction object, a handler's (SQLite::Database& on SQLite,
  // mqtt_inbox/sqlite.h; pqxx::transaction_base& on PostgreSQL, mqtt_inbox/postgres.h) or
  // one the application began on the same database (SQLite: BEGIN IMMEDIATE on a
  // connection to the file; PostgreSQL: a libpqxx transaction at READ COMMITTED, such as
  // pqxx::work). The row commits or rolls back with it. *message_id (optional) receives
  // the id, given or assigned. If a row with that id exists already (a re-run after a
  // committed enqueue, a replay), nothing is added and the call succeeds: the id names one
  // message. Errors: kInvalidArgument for every refusal that can never succeed (the
  // members are listed at OutboxRefused: no open transaction, a transaction of another
  // store, a topic, id or MQTT 5 property MQTT or the next hop refuses, a message larger
  // than MQTT or its class allows); kRejected "outbox full: ..." (a full kReject class);
  // kIoError when a random id cannot be made; the store's codes when it fails (kFull,
  // kIoError, kCorruption; on PostgreSQL a transient code for 40001, 55P03, class 08,
  // and `txn` is then aborted, as after any failed statement).
  // On PostgreSQL: the transaction holds the outbox's lock of the schema from its first
  // enqueue to its end, so that rows become visible in seq order
  // (docs/postgres.md#the-outbox), and each enqueue that adds a row notifies the relays
  // through NOTIFY, delivered when `txn` commits. Thread safety: on the thread that uses
  // `txn`.
  template <typename T>
  Status enqueue(T& txn, const OutgoingMessage& message, std::string* message_id = nullptr) {
    return enqueue_status(detail::TxnRef{static_cast<void*>(std::addressof(txn)), &typeid(T*)},
                          message, message_id);
  }

  // enqueue() for handlers: throws OutboxRefused for a refusal that can never succeed
  // (the incoming message is dead-lettered at once as outbox_refused), OutboxFull for a
  // full kReject class (backpressure), OutboxRejected when a random id cannot be made
  // (a failed attempt), and lets the store's own failure through as the exception it is
  // (SQLite::Exception, a libpqxx error), so that a Consumer treats store errors (busy,
  // full, I/O, a lost connection) as store failures, not as handler attempts (handler.h).
  template <typename T>
  void enqueue_or_throw(T& txn, const OutgoingMessage& message, std::string* message_id = nullptr) {
    enqueue_in(detail::TxnRef{static_cast<void*>(std::addressof(txn)), &typeid(T*)}, message,
               message_id);
  }

  // --- inspection ---

  // Rows in `state`, oldest first, at most `limit` (> 0).
  virtual Status list(OutboxState state, int limit, std::vector<OutboxRow>* out) = 0;
  // Pending rows and bytes per class, and drops, as kept in outbox_usage.
  virtual Status usage(std::vector<OutboxClassUsage>* out) = 0;
  // Rows per state, pending bytes, the oldest pending row's age and usage(). Counting the
  // sent and dead rows walks their indexes: meant for tools, not for every message.
  virtual Status summary(OutboxSummary* out) = 0;
  // The row with this message id, in any state. Errors: kNotFound.
  virtual Status get(const std::string& message_id, OutboxRow* out) = 0;

  // --- repair ---

  // Makes the outbox dead letter `message_id` pending again: attempts 0, the dead fields
  // cleared, and a new seq, so it goes to the end of the queue (after the rows of its
  // ordering key enqueued before the replay) and a running relay, which reads past the
  // last seq it took, publishes it. The class bounds are not applied: replaying is the
  // operator's decision, and the row was counted in them when it was enqueued; its age
  // (OutboxClass::max_age_ms) counts from the replay. Committed
  // with fsync. Errors: kNotFound; kInvalidArgument if the row is not dead (a pending row
  // is on its way; a sent one was acknowledged by the broker: enqueue a new message).
  virtual Status replay_dead(const std::string& message_id) = 0;
  // Deletes the rows `filter` selects (dead or sent; never pending) in one transaction,
  // committed with fsync. *removed (optional) receives the count. Sent and dead rows are
  // also deleted by the Pruner (retention.h) once their window has passed.
  // Errors: kInvalidArgument for filter.state kPending.
  virtual Status purge(const OutboxPurgeFilter& filter, int64_t* removed = nullptr) = 0;
  // This object's counters. Cheap; any thread.
  virtual OutboxCounters counters() const = 0;

 protected:
  Outbox() = default;

 private:
  // The enqueue in a store's transaction (handler.h's TxnRef): enqueue_or_throw's and
  // enqueue's bodies (src/outbox/outbox_impl.h).
  virtual void enqueue_in(const detail::TxnRef& txn, const OutgoingMessage& message,
                          std::string* message_id) = 0;
  virtual Status enqueue_status(const detail::TxnRef& txn, const OutgoingMessage& message,
                                std::string* message_id) = 0;
};

}  // namespace mqtt_inbox

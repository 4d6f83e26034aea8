// Consumer: the per-message policy of one named consumer on top of an Inbox.
// Transport-agnostic: the MQTT Subscriber calls handle() from Paho's message callback,
// and a firmware application that receives messages another way can call it too.
//
// handle() returns only when the message has a durable outcome: its effect committed,
// recognised as a duplicate, or written to the dead letters. The caller acknowledges the
// message (sends the PUBACK) only after handle() returns. For one message it:
//  0. a retained message (Message::retain) goes by ConsumerOptions::retained: skipped
//     (acked, counted; the default), dead-lettered as retained, or processed as below
//  1. refuses payloads over max_payload_bytes           -> dead letter payload_too_large
//  2. extracts the producer-assigned id (options.h)     -> dead letter missing_id,
//                                                          invalid_id, undecodable_payload
//  3. in one transaction with the handler (docs/design.md#the-claim-transaction): claims
//     the id, or finds it processed -> kDuplicate, or dead-lettered ->
//     kAlreadyDeadLettered, or with max_attempts already used by earlier processes
//     -> dead letter handler_crashed (the last one died in the handler) or
//     handler_failed
//  4. a message whose MQTT 5 message expiry ran out since handle() received it (checked in
//     that transaction before the handler runs, and again before it commits)
//     -> dead letter expired, never applied (ConsumerOptions::expired; never on a replay)
//  5. runs the handler inside that transaction and commits its effect with the claim; a
//     handler that throws is retried with backoff up to max_attempts -> dead letter
//     handler_failed, and one that throws a permanent failure (handler.h) is
//     dead-lettered at once (undecodable_payload, invalid_payload, outbox_refused).
//     Every attempt is counted, also one that kills the process
//     (docs/design.md#attempts-and-crash-loops). A handler that says "not yet"
//     (RetryLater) is run again on the dependency schedule without counting an attempt,
//     the message held unacked meanwhile (health().dependency) -> dead letter
//     dependency_unavailable once the schedule is over
//  6. while the store itself fails (locked, full, I/O error, read-only) it retries with
//     capped backoff for as long as it takes, never reporting an outcome it has not
//     committed. health() shows this state to other threads.
//
// Logging: to the Inbox's logger (InboxOptions::logger; default the "mqtt_inbox" logger):
// one warning per dead letter and per failed handler attempt, one line per
// store_error_log_interval_ms while the store fails, a warning when a dependency wait
// begins, one line per delayed run while it lasts and one when it ends, debug lines per
// message.
//
// Requeued dead letters: unless ConsumerOptions::requeue_poll_ms is 0, the Consumer owns
// one thread that replays dead letters the admin tool marked 'requeued' while the service
// runs (see replay_requeued()); ~Consumer stops and joins it.
//
// Thread safety: handle() may be called from several threads at once (each call waits
// for the Inbox's connection for its transactions); health() and counters() are safe
// from any thread and never wait for a running handle() (they take no lock that handle()
// holds while it waits for the store or runs the handler).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/health.h"
#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/service_notifier.h"  // HealthSource
#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

// Monotonic counters since the Consumer was created (this process only).
struct ConsumerCounters {
  int64_t processed = 0;              // effects committed
  int64_t duplicates = 0;             // deliveries skipped as already processed
  int64_t dead_lettered = 0;          // messages written to the dead letters
  int64_t already_dead_lettered = 0;  // redeliveries of dead-lettered messages
  int64_t handler_failures = 0;       // handler attempts that threw
  int64_t store_retries = 0;          // store operations retried after a failure
  int64_t retained_skipped = 0;       // retained messages acked unprocessed (RetainedPolicy::kSkip)
  int64_t outbox_full_parked = 0;     // deliveries and replays parked because a kReject
                                      // outbox class was full (dead_letter.h kOutboxFull)
  int64_t expired = 0;                // messages dead-lettered as expired (also counted in
                                      // dead_lettered)
  int64_t not_yet = 0;                // handler runs that said "not yet" (RetryLater)
};

class Consumer final : public MessageSink {
 public:
  // `inbox` must outlive the Consumer. `name` is the consumer name recorded in every row
  // (non-empty, at most 200 bytes). The handler is written for the inbox's store (handler.h):
  // a function of (SQLite::Database&, const Delivery&) for an SQLite inbox
  // (mqtt_inbox/sqlite.h: Handler), of (pqxx::transaction_base&, const Delivery&) for a
  // PostgreSQL one (mqtt_inbox/postgres.h: PgHandler). Errors: kInvalidArgument for a bad
  // name or options, an empty handler, or a handler written for the other store (the
  // message names what this store's handlers take).
  static Status create(Inbox* inbox, const std::string& name, TransactionHandler handler,
                       const ConsumerOptions& options, std::unique_ptr<Consumer>* out);
  ~Consumer() override;

  const std::string& name() const override;
  SessionRecords* sessions() const override;  // the Inbox's (Inbox::sessions())

  // Processes one delivery; see the header comment. Never throws. Blocks while the store
  // fails, for as long as it fails: a message that has not reached a durable outcome is
  // never reported as done (docs/operations.md#stopping-while-the-store-is-stuck).
  Outcome handle(const Message& message) override;
  Outcome reject(const Message& message, const std::string& why) override;

  // Sends dead letter `id` (which must belong to this consumer) back through the
  // claim-and-handler path as a new attempt series. On success the row is marked
  // replayed in the same transaction as the claim; *outcome says what happened
  // (kDuplicate if the id was processed meanwhile; kDeadLettered if it failed again, in
  // which case the same row is updated, or if a full outbox parked it again: the same
  // row, 'requeued' again). Replaying a row already replayed is refused
  // with kInvalidArgument, so a replay never applies a message twice.
  Status replay_dead_letter(int64_t id, Outcome* outcome);

  // Replays this consumer's dead letters marked 'requeued' (Inbox::requeue_dead_letter,
  // `mqtt-inbox dead-letters replay`), oldest first, each as replay_dead_letter does:
  // 'replayed' once its effect commits, 'dead' again (same row, new reason) if it fails
  // again. Messages parked by a full outbox (reason outbox_full) are 'requeued' rows too:
  // a pass stops at the first one a still-full outbox parks again, and the rest keep their
  // turn for the next pass. The Consumer's own thread calls this every
  // ConsumerOptions::requeue_poll_ms; call it yourself with requeue_poll_ms = 0 (then
  // parked messages wait for your call). *replayed (may be null) gets the number of rows
  // handled (not counting the one parked again). While the store fails it waits like handle(), but
  // gives up at ~Consumer (the row stays 'requeued' for the next run). Errors: store codes from
  // listing the rows; kAborted if the Consumer is being destroyed.
  Status replay_requeued(int64_t* replayed);

  // Extracts and validates the message id the way handle() does. On failure returns
  // false and sets *reason and *why. Exposed for tools and fuzzing.
  bool extract_message_id(const Message& message, std::string* id, DeadLetterReason* reason,
                          std::string* why) const;

  // The message path's health (health.h): stuck while a delivery waits for the store;
  // `dependency` while a handler's "not yet" holds a message.
  Health health() const;
  ConsumerCounters counters() const;

 private:
  struct Impl;
  explicit Consumer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A ServiceNotifier source (service_notifier.h) for a Consumer: name = the consumer name;
// stuck from health() (a message waits for the store), with "store failed: " and the last
// error as the reason; processed and dead_letters from counters(); dependency_wait from
// health().dependency (a message its handler holds: "not yet"). Never waits for the
// store. Keeps a reference: the consumer must outlive the notifier (declare the notifier
// after it, or destroy it first).
HealthSource health_source(const Consumer& consumer);

}  // namespace mqtt_inbox

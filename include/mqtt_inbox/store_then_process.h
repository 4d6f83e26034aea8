// StoreThenProcess: the second inbox mode. The message callback only stores the raw
// message (one INSERT, one commit) and returns, so the PUBACK follows durable *receipt*;
// worker threads process the stored rows later, in arrival order per aggregate key, each
// in a transaction that also marks the row done. No MQTT in it (it is a MessageSink, so
// the Subscriber or any other transport can feed it). What follows describes the SQLite
// store; on a PostgreSQL Inbox (postgres.h: a PgStoredHandler) the same rules hold with
// a connection per worker, no single write lock, and workers of several processes
// sharing one consumer's rows (docs/store-then-process.md#postgresql).
//
// Choose it over Consumer when the handler is too slow for Paho's receive thread, when
// messages must be processed in order per device, or when messages must be re-run after
// a bug fix (replay). It costs one extra write per message (store, then process) and the
// latency between receipt and processing. docs/store-then-process.md has the details.
//
// Receipt, in handle(), for one message:
//  0. a retained message (Message::retain) goes by options.consumer.retained: skipped
//     (acked, counted; the default), dead-lettered as retained, or stored as below
//  1. payload over max_payload_bytes                -> dead letter payload_too_large
//  2. producer id as Consumer extracts it (options.h) -> dead letter missing_id,
//                                                      invalid_id, undecodable_payload
//  3. aggregate key from options.aggregate_key (a throw -> dead letter undecodable_payload)
//  4. INSERT INTO inbox_messages ... ON CONFLICT (consumer, id) DO NOTHING, committed with
//     the Inbox's synchronous setting (FULL by default: survives power loss). No row
//     changed -> Outcome::kDuplicate; else kProcessed ("stored for the workers").
//  While the store fails, handle() does not return (capped backoff; health()).
//
// Workers (start()): `workers` threads, each with its own SQLite connection to the
// Inbox's file. A worker claims a batch in a short BEGIN IMMEDIATE transaction
// (status 'processing', claimant, and the row's next claim_token: a fencing token) and
// runs, per row in seq order: prepare (optional, no transaction) then the handler inside
// BEGIN IMMEDIATE on its own connection; the row is marked 'done' in that same
// transaction. Every write of a worker to its row requires the claim_token it claimed
// with, so a worker whose claim was reaped meanwhile commits nothing. A handler that
// throws: attempts+1, last_error, next_attempt_at = now + backoff, back to 'pending';
// after max_attempts: dead letter handler_failed (handler_crashed when the last attempts
// were reaped claims) and status 'dead' (a redelivery stays a duplicate). A handler (or
// PrepareFn) that says "not yet" (RetryLater): no attempt counted, the row rescheduled
// on the dependency schedule (ConsumerOptions::dependency_*; its count and the start of
// the wait are kept in the row, so the schedule survives claims and restarts), and
// dead-lettered as dependency_unavailable once it is over; nothing holds the session.
//
// Message expiry: a message's MQTT 5 message expiry is applied at processing, not at
// receipt: receipt only stores it, while its effect is what the producer's lifetime is
// about, and a row can wait in the backlog far longer than the broker held it. Its
// deadline (received by handle(), plus the interval it arrived with) is kept in the row
// (expires_at, on the retention clock). A row whose deadline passed before a worker could
// apply it (checked before prepare, before the handler transaction and before it commits)
// becomes the dead letter expired, status 'dead', never applied
// (options.consumer.expired; kApply processes it anyway).
//
// Clocks: no decision depends on the wall clock, so a clock stepped either way neither
// stalls rows nor reaps live work nor expires rows early. Leases are timed on the monotonic
// clock in the reaper's memory (see reap()); retry times, received_at and done_at are on
// the Inbox's retention clock; claimed_at and the dead letters' times are wall-clock
// display values.
//
// Ordering rule: within one aggregate key rows are processed in seq (arrival) order. An
// aggregate with a 'processing' row is not claimed from at all, and its first unfinished
// row (lowest seq, 'pending') must be due (next_attempt_at <= now): a row waiting for a
// retry blocks the rows after it. A 'dead' row no longer blocks: the aggregate moves on.
// Across aggregates, rows are processed in parallel by the workers.
//
// Thread safety: handle() may be called from several threads; every other method is safe
// from any thread. health() and counters() never wait for the store. Errors: methods
// return a Status and never throw; the handler signals failure by throwing.
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "mqtt_inbox/consumer.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

// One stored message as a worker hands it to the application.
struct StoredDelivery {
  const Message& message;            // topic, payload, qos, MQTT 5 properties as received
  const std::string& message_id;     // the producer's id
  const std::string& aggregate_key;  // "" unless an extractor is configured
  int64_t seq;                       // arrival order (inbox_messages.seq)
  int64_t received_at_ms;            // when it was stored (retention clock, ms)
  int attempt;                       // 1-based; counts failures and expired claims
  // What the prepare function returned for this attempt; empty without one.
  const std::any& prepared;
};

// The business change of one stored message: a function of (T& txn, const StoredDelivery&)
// where T is the store's transaction (mqtt_inbox/sqlite.h: StoredHandler, on the worker's
// own connection inside BEGIN IMMEDIATE; mqtt_inbox/postgres.h: PgStoredHandler, in the
// worker's transaction). The row is marked 'done' in the same transaction. The rules of
// handler.h apply (the library owns the transaction; throw to fail; UndecodablePayload for
// input that can never succeed). Keep it short: put slow work in a PrepareFn.
using StoredTransactionHandler = TransactionHandlerOf<StoredDelivery>;

// Optional first phase: runs before the transaction, holding no lock (d.prepared is
// empty here). Its result reaches the handler as d.prepared. Use it for slow, read-only
// or idempotent work (parsing, computing, an idempotent remote call). It may run more
// than once per message (retries, a lost claim); throwing counts as a failed attempt,
// except RetryLater (a dependency it needs is down: the row is rescheduled, handler.h).
using PrepareFn = std::function<std::any(const StoredDelivery& d)>;

// Aggregate key extractors for StoreThenProcessOptions::aggregate_key.
// The topic level at `index` (0-based; "sensors/dev-7/temp" level 1 is "dev-7"), or ""
// when the topic has fewer levels.
std::function<std::string(const Message&)> aggregate_key_from_topic_level(size_t index);
// A top-level string (or integer, as text) field of a JSON object payload, or "" when the
// payload is no JSON object or lacks the field.
std::function<std::string(const Message&)> aggregate_key_from_json_field(std::string field);

struct StoreThenProcessOptions {
  // Id extraction, payload limit and dead-letter payload cut: as for Consumer (options.h).
  // Its retry_backoff_* fields are the backoff between handler attempts of one row
  // (default 100 ms, doubled, capped at 2000 ms), max_attempts (default 5) the limit
  // after which a row is dead-lettered, store_backoff_* the receipt's wait while the
  // store fails, expired what an expired row becomes, dependency_* the reschedules of a
  // row whose handler or PrepareFn said "not yet" (RetryLater).
  ConsumerOptions consumer;

  // The aggregate key of a message (e.g. a device id). Default empty = "" for every
  // message: one aggregate, all rows in arrival order, one at a time. A throw
  // dead-letters the message as undecodable_payload at receipt.
  std::function<std::string(const Message&)> aggregate_key;

  // Optional first phase of the handler (see PrepareFn). Default none.
  PrepareFn prepare;

  // Worker threads started by start(). Default 2. 0 = receipt only (the rows are
  // processed by another StoreThenProcess with the same name, in this or another
  // process). Each worker opens its own connection.
  int workers = 2;

  // Rows claimed per claim transaction, at most. Default 16, >= 1. Larger batches cost
  // fewer claim commits; a worker that hangs holds its whole batch until the reaper
  // returns it (see reap()).
  int batch_size = 16;

  // How long an idle worker sleeps before looking again, ms. handle() in this process
  // wakes the workers at once; the poll only matters for rows stored by other processes
  // and for retries that become due. Default 200.
  int64_t poll_interval_ms = 200;

  // A claim whose running row has not changed for this long is presumed dead (the worker
  // hangs, or its process died) and the reaper returns it to 'pending', counting one
  // attempt on the row that was running (see reap()). Monotonic clock, ms, measured by the
  // reaper from when it first saw that row running. Default 60000. Must exceed the longest
  // prepare + handler run; a live worker whose claim was reaped finds its claim token gone
  // and drops the row, so a short lease costs re-runs of prepare, never a double effect.
  // Claims of a process that is gone are returned at once where the Inbox is exclusive.
  int64_t lease_ms = 60000;

  // How often the pool runs the reaper, ms. Default 0 = lease_ms / 4.
  int64_t reap_interval_ms = 0;

  // Retention of finished rows (see prune()). Durations on the retention clock, ms.
  // compact_after_ms: 'done' rows lose payload and properties this long after done_at.
  // Default 1 hour; 0 = compact at the next prune. Compacted rows cannot be replayed.
  int64_t compact_after_ms = 3600LL * 1000;
  // dedup_retention_ms: 'done' and 'dead' rows are deleted this long after received_at;
  // until then a redelivery of the id is dropped. Size it like the inbox's dedup window:
  // the broker's session expiry plus the longest offline period. prune() refuses to
  // delete (kInvalidArgument, an error logged; compaction still runs) while it is
  // shorter than the longest session expiry the subscriber recorded in the Inbox
  // (session_record.h), as the Pruner does. Default 7 days.
  int64_t dedup_retention_ms = 7LL * 24 * 3600 * 1000;
  // Delete after dedup_retention_ms even when a recorded session outlasts it (a warning
  // is logged once per requirement). Default false.
  bool allow_dedup_retention_below_session = false;
  // How often the pool runs prune(), ms. Default 600000 (10 min); 0 = never (call it
  // yourself, or let the general pruner do it).
  int64_t prune_interval_ms = 600000;

  // A handler transaction that held the write lock longer than this is logged as a
  // warning (receipt waited for it), ms. Default 1000; 0 = never.
  int64_t slow_handler_warn_ms = 1000;

  // Durability of the workers' handler commits (row 'done' + business change). Default
  // kNormal (no fsync), whatever the Inbox uses for receipt: the row is already durable
  // (receipt commits with the Inbox's setting, FULL by default), and the 'done' mark and
  // the business change are one transaction, so a power loss can only roll both back
  // together; the row is then 'pending' again and processed again: still exactly one
  // effect in the file. What a power loss can cost is the effects of the last few
  // processed rows until the workers re-run them. In exchange a worker holds the write
  // lock for microseconds instead of an fsync, and receipt (the PUBACK) waits less. Set
  // kFull if the effects must be durable the moment they commit.
  Synchronous worker_synchronous = Synchronous::kNormal;

  // Test hook: called inside a worker right before the handler transaction begins (after
  // prepare), with the message id. Lets a test kill the process mid-processing.
  std::function<void(const std::string& message_id)> before_handler_hook;
};

// Which rows a replay resets. Unset fields match everything; all set fields must match.
// The consumer is always the StoreThenProcess's own name. Times are on the Inbox's
// retention clock (Inbox::retention_clock_ms() is "now"), like received_at.
struct ReplayFilter {
  std::optional<int64_t> received_since_ms;   // received_at >= this
  std::optional<int64_t> received_before_ms;  // received_at < this
  std::optional<std::string> aggregate_key;
  std::optional<std::string> message_id;
  bool include_dead = false;  // also rows dead-lettered by the workers
};

struct ReplayResult {
  int64_t reset = 0;           // rows set back to 'pending'
  int64_t not_replayable = 0;  // matching rows whose payload was already compacted
  int64_t in_flight = 0;       // matching rows 'processing' now: left alone
};

struct StoredPruneResult {
  int64_t compacted = 0;  // done rows whose payload was dropped
  int64_t deleted = 0;    // done/dead rows deleted after the dedup window
};

// Counters since the object was created (this process only).
struct StoreThenProcessCounters {
  int64_t stored = 0;               // messages stored at receipt
  int64_t duplicates = 0;           // deliveries dropped at receipt (id already stored)
  int64_t dead_lettered = 0;        // receipt and worker dead letters written
  int64_t processed = 0;            // rows marked done by this process's workers
  int64_t handler_failures = 0;     // prepare/handler attempts that threw
  int64_t claims_lost = 0;          // rows a worker dropped because its claim was reaped
  int64_t reaped = 0;               // claimed rows returned to pending by the reaper (orphans
                                    // and claims without progress for lease_ms)
  int64_t store_retries = 0;        // receipt store operations retried
  int64_t worker_store_errors = 0;  // worker/reaper/pruner SQLite failures (retried) and
                                    // refused periodic prunes (see prune())
  std::string last_worker_error;    // text of the latest of those ("" if none)
  int64_t retained_skipped = 0;     // retained messages acked unstored (RetainedPolicy::kSkip)
  int64_t outbox_full_waits = 0;    // handler runs a full kReject outbox class refused
                                    // (OutboxFull): the row waits, no attempt counted
  int64_t expired = 0;              // rows dead-lettered as expired (also in dead_lettered)
  int64_t not_yet = 0;              // prepare/handler runs that said "not yet" (RetryLater):
                                    // the row was rescheduled, no attempt counted
};

// Row counts by status for this consumer (inspection, tests, the admin tool).
struct StoreThenProcessStats {
  int64_t pending = 0, processing = 0, done = 0, dead = 0;
};

class StoreThenProcess final : public MessageSink {
 public:
  // `inbox` must outlive the object; its path, VFS, busy timeout and synchronous setting
  // are used for the worker connections, its clock for every timestamp, its logger for
  // logs. `name`: consumer name (1..200 bytes of UTF-8). Opens one maintenance
  // connection (reaper, replay, prune); starts no thread. The handler is written for the
  // inbox's store: a function of (SQLite::Database&, const StoredDelivery&) for an SQLite
  // inbox (mqtt_inbox/sqlite.h), of (pqxx::transaction_base&, const StoredDelivery&) for a
  // PostgreSQL one (mqtt_inbox/postgres.h). Errors: kInvalidArgument for bad arguments, an
  // empty handler, or a handler written for the other store (the message names what this
  // store's handlers take); store codes if the connection cannot be opened.
  static Status create(Inbox* inbox, const std::string& name, StoredTransactionHandler handler,
                       const StoreThenProcessOptions& options,
                       std::unique_ptr<StoreThenProcess>* out);
  // Stops the workers (see stop()).
  ~StoreThenProcess() override;

  const std::string& name() const override;
  SessionRecords* sessions() const override;  // the Inbox's (Inbox::sessions())

  // Receipt; see the header comment. Never throws. Returns only once the message has a
  // durable outcome, blocking (with capped backoff) while the store fails. Safe to call
  // before start() and without workers. An internal error that is not a store failure
  // (std::bad_alloc) aborts the process rather than let an unstored message be acked.
  Outcome handle(const Message& message) override;
  Outcome reject(const Message& message, const std::string& why) override;

  // Starts the worker threads and the periodic reaper/pruner. Call once; the business
  // tables must exist. Errors: kInvalidArgument if already started; store codes if a
  // worker connection cannot be opened (then nothing is started).
  Status start();

  // Asks the workers to finish the row they are in, releases the rest of their batches
  // (back to 'pending', no attempt counted) and joins them. Idempotent; returns OK. Rows
  // it could not release (the store is failing) are orphans from then on (see reap()). Receipt
  // keeps working after stop(): stored rows wait for the next start().
  Status stop();

  // Returns claims of this consumer to 'pending' and counts one attempt on the row each
  // returned batch was running (its lowest-seq row still 'processing'); the rest of the
  // batch never started and is not counted. A claim is returned
  //  - at once if it is an orphan: the Inbox is exclusive (InboxOptions::exclusive: no
  //    other process works the file) and no started StoreThenProcess of this process made
  //    it. Every claim found at start-up after a crash is one.
  //  - once this object has seen its running row stay the same for lease_ms on the
  //    monotonic clock, counted from the first call (or pool pass) that saw it: a first
  //    call only starts watching. This is how claims of other processes sharing a
  //    non-exclusive file, and of hung workers, are returned; never early, whatever the
  //    wall clock does, and without comparing clocks between processes.
  // The pool runs it at start and every reap_interval_ms; callable at any time.
  // *reaped: rows returned.
  Status reap(int64_t* reaped);

  // Deliberate re-run: rows matching `filter` ('done', and 'dead' if include_dead) go
  // back to 'pending' with attempts 0, and the workers process them again: their
  // business effects are applied again. That is the point (after a bug fix); a handler
  // that must not double an effect has to make it idempotent itself. Rows keep their seq,
  // so a replayed row runs before the later rows of its aggregate that are still
  // unfinished. Compacted rows are counted in not_replayable and left alone.
  Status replay(const ReplayFilter& filter, ReplayResult* result);

  // Retention: compacts 'done' rows older than compact_after_ms (by done_at) and deletes
  // 'done'/'dead' rows older than dedup_retention_ms (by received_at), in short
  // transactions of at most 500 rows. Runs periodically while started (prune_interval_ms);
  // callable at any time. Errors: kInvalidArgument when dedup_retention_ms is shorter than
  // the longest session expiry recorded in the Inbox (SessionRecords::record) and
  // allow_dedup_retention_below_session is not set: compaction has run, no row is deleted,
  // an error is logged (the periodic run also counts it in worker_store_errors); store
  // codes otherwise.
  Status prune(StoredPruneResult* result);

  // Row counts by status for this consumer.
  Status stats(StoreThenProcessStats* out);

  // Receipt's view of the store (stuck = a message is waiting to be stored and so not
  // acked), and in `dependency` the row of this process's workers that has waited
  // longest for a dependency (RetryLater), if any. Never waits for the store.
  Health health() const;
  StoreThenProcessCounters counters() const;

 private:
  struct Impl;
  explicit StoreThenProcess(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A ServiceNotifier source (service_notifier.h) for a StoreThenProcess: name = the consumer
// name; stuck from health() (receipt waits for the store; no PUBACK), with "store failed at
// receipt: " and the last error as the reason; processed (rows done by the workers) and
// dead_letters from counters(); dependency_wait from health().dependency (a row
// rescheduled for a dependency; nothing is held); note "N worker store errors" once there
// were any. Never waits for the store. Keeps a reference: the object must outlive the notifier.
HealthSource health_source(const StoreThenProcess& store_then_process);

}  // namespace mqtt_inbox

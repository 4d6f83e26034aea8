// Store-then-process's view of a store: the stored messages of each consumer (SQLite: the
// rows of inbox_messages) and every write to them. The policy (stp/: receipt's checks and
// dead letters, the worker pool and its loop, which rows a claim takes, retries and their
// backoff, attempt limits, dead-letter decisions and reasons, the reaper's leases on the
// monotonic clock, replay and retention decisions, counters and health) calls this and
// nothing else of the store's. This owns the how: connections and their settings, the
// statements, transactions, row locks and the claim token, and what the store's own
// errors mean (classified into Status; the handler's judged with the store's
// StoreErrorClassifier). docs/store-then-process.md describes the SQLite store's steps.
//
// A row's life: store_received() makes it 'pending'; a worker session's claim() makes it
// 'processing' under a claimant and the row's next claim token; process() makes it 'done'
// together with the handler's change; retry_later() and release() put it back to
// 'pending'; mark_dead() ends it 'dead'; reap() returns claims the policy gives up on;
// replay() sets finished rows back to 'pending'; compact_done() and delete_finished() age
// them out. Every write a worker makes to a claimed row requires the token its claim
// took (the fence): a worker whose claim was returned and perhaps taken again changes
// nothing, and says so (kLost, *held = false).
//
// Times: received_at, done_at and next_attempt_at are on the store's retention clock
// (Store::retention_clock()), stamped by the store; expires_at and a dependency wait's
// start (waiting_since) too, stamped by the policy; claimed_at and a replayed dead
// letter's time are wall-clock values for people. Nothing here reads a lease: the reaper
// times them in the policy's memory.
//
// A PostgreSQL store implements the same calls across processes:
//  - claim(): one READ COMMITTED transaction. It takes the aggregates it offers with
//    SKIP LOCKED semantics (a transaction-scoped advisory lock per (consumer, aggregate),
//    tried, never waited for; or FOR UPDATE SKIP LOCKED on a per-aggregate row), so two
//    workers in two processes never offer or claim rows of one aggregate at once; then
//    reads, in a new statement (a snapshot after the lock), the head of each aggregate it
//    holds that has no 'processing' row; the chooser picks; one UPDATE ... SET status =
//    'processing', claim_token = claim_token + 1 ... WHERE seq = ANY($1) AND status =
//    'pending' RETURNING ... claims them. After COMMIT the 'processing' rows keep the
//    aggregate out of every other claim until they are finished or reaped.
//  - process(): the handler runs in the worker's transaction; the token is checked at
//    commit: UPDATE ... SET status = 'done' WHERE seq = $1 AND status = 'processing' AND
//    claim_token = $2 after the handler, zero rows -> ROLLBACK and kLost. That UPDATE's
//    row lock lasts to COMMIT, so a reaper's UPDATE of the row waits for it and then finds
//    the row finished. A commit whose outcome is unknown (the connection dropped at
//    COMMIT) comes back as a store error; the retried run finds the row 'done' under its
//    token (kDone: it had committed; nothing runs twice, and the rest of the batch goes
//    on) or still carrying its token (run again).
//  - reap(): reads the claims, lets the chooser pick, and in the same transaction charges
//    the running row and puts each picked claim's rows back; a lock_timeout bounds the
//    wait behind a worker finishing a row. retry_later(), release() and mark_dead() carry
//    the token in their WHERE clause as here. single_process() is false.
//
// Thread safety: StpRows and a StpConsumerRows's receipt calls and open_worker() are safe
// from any thread; its maintenance calls have one caller at a time (the policy
// serialises them). A StpWorkerSession is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/status.h"
#include "mqtt_inbox/store_then_process.h"
#include "store/verdict.h"
#include "util/function_ref.h"

namespace mqtt_inbox::detail {

// The handler of a store-then-process consumer, as the policy holds it (handler.h).
using StoredStoreHandler = TransactionHandlerOf<StoredDelivery>;

// A row as one claim holds it.
struct RowClaim {
  int64_t seq = 0;    // the row (arrival order)
  int64_t token = 0;  // the claim token this claim took: every write of the worker needs it
};

// A row's wait for a dependency (its handler's RetryLater), kept in the row so that the
// dependency schedule (store/lifetime.h) survives its claims and the process: how many
// runs said "not yet" in a row, and when the first of them did (retention clock, ms).
// runs 0: not waiting.
struct RowWait {
  int runs = 0;
  int64_t since = 0;
};

// A claimed row as the store returns it. The message's fields are as stored: the policy
// decodes them (properties_json "{}" when there are none).
struct StoredRow {
  RowClaim claim;
  std::string message_id, aggregate_key;
  std::string topic, payload, properties_json;
  int qos = 0;
  int64_t received_at = 0;            // retention clock, ms
  int attempts = 0;                   // failed attempts and returned claims so far
  std::string last_error;             // "" if none
  std::optional<int64_t> expires_at;  // the message's expiry deadline, retention clock, ms
  RowWait wait;                       // its wait for a dependency, if any
};

// A row a claim may take: one of the first rows, in seq order, of an aggregate with
// pending rows and none 'processing'.
struct ClaimCandidate {
  int64_t seq = 0;
  std::string aggregate_key;
  int64_t next_attempt_at = 0;  // retention clock, ms; 0 = due since it was stored
};

// Inside the claim's transaction: `offered` holds, aggregate after aggregate, up to the
// claim's max_rows first pending rows of each aggregate that has no 'processing' row, in
// seq order within an aggregate; `now` is the retention clock. Appends to *take the seqs
// to claim, in the order to claim them. May be called again if the store retries.
using ClaimChooser = std::function<void(int64_t now, const std::vector<ClaimCandidate>& offered,
                                        std::vector<int64_t>* take)>;

// A claim as the reaper sees it: a claimant with rows 'processing', and its running row
// (the lowest seq of them).
struct LiveClaim {
  std::string claimant;  // "" for rows without one
  int64_t running_seq = 0;
};

// A claim the reaper gives back: its rows return to 'pending' and its running row is
// charged one attempt, with `last_error` as the reason.
struct ReturnedClaim {
  std::string claimant;
  int64_t running_seq = 0;
  std::string last_error;
};

// Inside the reaper's transaction (the claims cannot change meanwhile): appends to *back
// the claims to return. May be called again if the store retries.
using ReapChooser =
    std::function<void(const std::vector<LiveClaim>& claims, std::vector<ReturnedClaim>* back)>;

// What one run of the handler transaction came to.
struct StoredRunResult {
  enum class Kind {
    kDone,     // the handler's change and the row's 'done' mark committed together
    kLost,     // the row no longer carries the claim's token: nothing committed
    kNotDone,  // rolled back; `verdict` says why: kFailed (the handler threw, ended the
               // transaction, or the store refused the row's change at commit),
               // kDeadLetter, kOutboxFull or kNotYet
    kExpired,  // the handler ran, but `expired()` said the row's expiry ran out before the
               // commit: rolled back
  };
  Kind kind = Kind::kDone;
  HandlerVerdict verdict;
  int64_t held_ms = 0;  // kDone: how long the transaction held the store's write lock (the
                        // whole transaction where the store has no single writer), ms
};

// One worker's session with the store (SQLite: its own connection). Each call is one
// transaction (holds() none); store errors come back classified and are not counted
// (the policy counts them, and latches the store on a fatal one); a retry is the policy's.
class StpWorkerSession {
 public:
  virtual ~StpWorkerSession() = default;

  // Claims, in one transaction, up to `max_rows` rows for `claimant`, out of what
  // `choose` picks (see ClaimChooser): each becomes 'processing' with the row's next
  // claim token and claimed_at = now (wall clock). *batch receives the claimed rows in
  // the order claimed; a picked row that is no longer pending is skipped.
  virtual Status claim(const std::string& claimant, int max_rows, const ClaimChooser& choose,
                       std::vector<StoredRow>* batch) = 0;

  // Whether the row still carries `c`'s token ('processing'). No transaction.
  virtual Status holds(const RowClaim& c, bool* held) = 0;

  // The handler transaction of row `c`, claimed by `claimant`: checks the token, runs
  // `handler` with `d` in the store's transaction (marking the thread for the Inbox's
  // re-entry checks, judged with the store's classifier), then marks the row 'done'
  // (attempts = d.attempt, done_at = now), closes a dead letter of d.message_id that a
  // replay left 'dead', notes the claim's progress in claimed_at, and commits, with the
  // handler's durability. Right before the row is marked 'done' it asks `expired()`, the
  // policy's expiry decision (store/lifetime.h): true rolls back as kExpired. A Status
  // error: the store failed (nothing committed; a handler's store error that is not its
  // message's fault is one): run it again.
  virtual Status process(const RowClaim& c, const std::string& claimant,
                         const StoredStoreHandler& handler, const StoredDelivery& d,
                         FunctionRef<bool()> expired, StoredRunResult* out) = 0;

  // Puts row `c` back to 'pending' with `attempts`, `error` as last_error, `wait` as its
  // dependency wait, and its next try `delay_ms` after now, and releases `release_too`
  // (see release()), in one transaction. *held: whether `c` still carried its token
  // (false: nothing of `c` changed).
  virtual Status retry_later(const RowClaim& c, int attempts, const std::string& error,
                             const RowWait& wait, int64_t delay_ms,
                             const std::vector<RowClaim>& release_too, bool* held) = 0;

  // Puts the rows back to 'pending' without counting an attempt, each only while it still
  // carries its token (a finished or returned row is left alone). One transaction.
  virtual Status release(const std::vector<RowClaim>& rows) = 0;

  // Marks row `c` 'dead' (attempts, last_error = text, done_at = now) with the handler's
  // durability. *held as for retry_later().
  virtual Status mark_dead(const RowClaim& c, int attempts, const std::string& text,
                           bool* held) = 0;
};

// One store-then-process consumer's rows (StoreThenProcess::create opens them).
class StpConsumerRows {
 public:
  virtual ~StpConsumerRows() = default;

  // --- receipt: on the store's shared connection, any thread ---

  // Stores `m` under (consumer, message_id) unless the id is stored already (*stored =
  // false), received_at = now, expires_at = `expires_at` (the message's expiry deadline,
  // retention clock; none: NULL), committed durably (the Inbox's synchronous setting)
  // before it returns.
  virtual Status store_received(const std::string& message_id, const std::string& aggregate_key,
                                const Message& m, const std::string& properties_json,
                                std::optional<int64_t> expires_at, bool* stored) = 0;
  // Whether (consumer, message_id) is stored, whatever its status.
  virtual Status is_stored(const std::string& message_id, bool* found) = 0;

  // --- workers ---

  // A session for one worker (one attempt: StoreThenProcess::start waits out a store that
  // is transiently unavailable). `handler_sync`: the durability of its handler and
  // dead-mark commits; its claim and release commits never wait for an fsync (a lost one
  // only repeats a claim or undercounts an attempt; the row itself is durable).
  virtual Status open_worker(Synchronous handler_sync, std::unique_ptr<StpWorkerSession>* out) = 0;

  // --- maintenance: on the consumer's own session, one caller at a time ---

  // Returns the claims `choose` picks (see ReapChooser) in one transaction. *rows: the
  // rows set back to 'pending'.
  virtual Status reap(const ReapChooser& choose, int64_t* rows) = 0;

  // Sets the finished rows matching `filter` back to 'pending' (attempts 0, no dependency
  // wait, due at once),
  // in one transaction; compacted ones and rows in flight are counted, not changed.
  virtual Status replay(const ReplayFilter& filter, ReplayResult* out) = 0;

  // One transaction each, of at most `limit` rows: drops payload and properties of 'done'
  // rows with done_at < done_before; deletes 'done' and 'dead' rows with received_at <
  // received_before. *rows: how many (fewer than `limit`: none are left).
  virtual Status compact_done(int64_t done_before, int limit, int64_t* rows) = 0;
  virtual Status delete_finished(int64_t received_before, int limit, int64_t* rows) = 0;

  // Row counts by status.
  virtual Status count(StoreThenProcessStats* out) = 0;
};

// Store::stp_rows(): the store's store-then-process rows.
class StpRows {
 public:
  virtual ~StpRows() = default;

  // Opens the rows of consumer `name` with its maintenance session (one attempt:
  // StoreThenProcess::create waits out a store that is transiently unavailable).
  virtual Status open(const std::string& name, std::unique_ptr<StpConsumerRows>* out) = 0;

  // True when no other process can work these rows (SQLite: InboxOptions::exclusive, the
  // lock file): a claim no running pool of this process made is then an orphan.
  virtual bool single_process() const = 0;
};

}  // namespace mqtt_inbox::detail

// StoreBackend: what one kind of store implements beneath the Store front
// (store/store.h): its connection, its SQL and row primitives, and the binding of its
// transaction type. It holds no policy. The guard against re-entry, the fatal latch, the
// connection's lock, the retries and start-up waits, the counters, the claim decision
// and the handler's contract are the front's, written once for every store; a store
// supplies primitives and facts (what a statement found, what a handler left of the
// transaction), and the front decides. docs/design.md#the-store-seam has the split.
//
// Calls are made by the front with the connection's lock held (mu), after the front
// checked the latch. A primitive throws the store's own exceptions (SQLite::Exception,
// pqxx's); the front turns them into a Status with classify(). The transaction
// primitives act on the one transaction the backend has open on its main connection
// (begin() ... commit() or rollback()).
//
// The store's other parts are row interfaces of their own, each in its header: the
// outbox's rows (store/outbox_rows.h), store-then-process's (store/stp_rows.h),
// retention's (store/retention_rows.h) and a fleet's slot leases (store/slot_leases.h).
//
// Thread safety: the front serialises every call on the main connection with `mu`;
// handler_type(), location() and file_stats() are safe from any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/session_record.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"
#include "store/claims.h"
#include "store/retention_rows.h"
#include "store/slot_leases.h"
#include "store/verdict.h"
#include "util/function_ref.h"

namespace mqtt_inbox::detail {

class Store;
class OutboxStore;
class StpRows;

// Everything recorded for one message of one consumer is keyed by this pair.
struct ClaimKey {
  const std::string& consumer;
  const std::string& message_id;
};

// What a handler's run left of the store's transaction: the facts the front's handler
// contract (store/contract.h) judges.
enum class TxnLeft {
  kOpen,     // open and usable: the library commits it
  kAborted,  // still the library's, but an error the handler did not report rolled it
             // back or aborted it (SQLite: back in autocommit; PostgreSQL: a failed
             // transaction block): nothing of it can commit
  kEnded,    // the handler ended it or tried to: COMMIT, ROLLBACK, END, BEGIN, or
             // commit()/abort() on the transaction object (`how` names it)
  kClosed,   // the handler closed the store's connection (`how` names the call)
};

// One handler run on a store's transaction, as the backend saw it.
struct HandlerRun {
  HandlerVerdict verdict;          // what it threw (store/verdict.h)
  TxnLeft left = TxnLeft::kOpen;   // what it left of the transaction
  std::string how;                 // kEnded, kClosed: what it ran
  std::vector<std::string> reset;  // statements it left stepped, reset after it (their SQL)
};

// How a commit ended (commit()).
enum class CommitOutcome {
  kCommitted,
  kRefused,  // the store refused the transaction at COMMIT because of this message's
             // change (a deferred constraint): nothing committed; the text is in *why
};

// Thrown through the front's transactions when the store refused a commit for the data's
// sake (a constraint at COMMIT): the front reports it as kRejected.
struct StoreRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown by a backend's primitive or commit() when the transaction the front goes on with
// after a handler is not the one it began for it: the handler ended that one and began
// another (on PostgreSQL, ROLLBACK then BEGIN, which no notice tells). Nothing of the
// handler's first transaction is left to commit; the front rolls back and dead-letters the
// message handler_ended_transaction. what(): what the handler ran.
struct TransactionNotOurs : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What requeue_facts() reads of a dead letter before requeueing it.
struct RequeueFacts {
  bool found = false;
  std::string status;        // 'dead', 'requeued', 'replayed'
  bool cut_payload = false;  // the payload was cut (dead_letter_payload_bytes)
  bool stored = false;       // it belongs to a store-then-process consumer
};

class StoreBackend {
 public:
  explicit StoreBackend(Store& front);
  virtual ~StoreBackend() = default;
  StoreBackend(const StoreBackend&) = delete;
  StoreBackend& operator=(const StoreBackend&) = delete;

  // Serialises use of the main connection and everything prepared on it; the front takes
  // it for every call below, and the row interfaces take it for their own calls.
  std::mutex mu;
  // The front's, fixed for the backend's life: the options the inbox was opened with, its
  // clock and its logger.
  const InboxOptions& options;
  Clock* const clock;
  const std::shared_ptr<spdlog::logger> log;

  // --- what the store is ---
  // Where the data lives, for messages: a file path, or a URI without its password.
  virtual const std::string& location() const = 0;
  // The transaction a handler of this store takes (the first parameter of its function:
  // SQLite::Database, pqxx::transaction_base) as typeid of a pointer to it, and how to
  // name it in a message.
  virtual const std::type_info& handler_type() const = 0;
  virtual const char* handler_type_name() const = 0;
  // What InboxStats says of the store's files: db_bytes, wal_bytes, schema_version. Any
  // thread, never waits.
  virtual void file_stats(InboxStats* out) const = 0;

  // --- the connection ---
  // A consumer of this name uses the main connection: a store whose server shows who
  // its connections belong to names them (PostgreSQL's application_name). Never fails.
  virtual void name_user(const std::string& consumer) { (void)consumer; }
  // One start-up attempt (Inbox::open): connects, brings the schema to the library's
  // version, applies the options, and sets the front's retention clock base. `lock_wait_ms`:
  // how long this attempt may wait for a lock. Errors classified.
  virtual Status open(int lock_wait_ms) = 0;
  // After the start-up wait of open() gave up with `s`: closes what the attempts left and
  // returns the status to report (SQLite: a new database that did not fit is kFull, and
  // its files are removed).
  virtual Status failed_open(Status s) { return s; }
  // Before a call on the main connection: reconnects a store whose connection was lost
  // (PostgreSQL). Errors classified.
  virtual Status ready() { return Status::Ok(); }
  // The Status for the exception being handled (call only inside a catch block), as
  // "<context>: <what>", classified by the store's table; drops the main connection if
  // it is lost, so that ready() makes a new one. A rolled-back transaction is forgotten.
  virtual Status classify_current(const std::string& context) = 0;
  // The store's own reaction to a store error while the caller holds the connection
  // (SQLite: on kFull, the WAL gives its space back at once).
  virtual void on_store_error(const Status& s) { (void)s; }
  // The store was found unusable: never write it again, not even on close.
  virtual void on_fatal() {}
  // The text of fatal_status(), for this store ("the database <path> is unusable").
  virtual std::string fatal_text(const std::string& error) const = 0;
  // The log line when the store is found unusable (what to do about it).
  virtual std::string fatal_advice(const std::string& error) const = 0;

  // --- transactions on the main connection (throw the store's exceptions) ---
  // Opens a write transaction (SQLite: BEGIN IMMEDIATE; PostgreSQL: READ COMMITTED, read
  // write). `for_handler`: a handler will run in it (the store arms its contract checks).
  virtual void begin(bool for_handler = false) = 0;
  // Commits the open transaction. kRefused: the store refused it for this message's
  // change, with the reason in *why, nothing committed. `claim`: the claim the
  // transaction holds, if any: a commit whose outcome is unknown (the connection lost
  // during it) is resolved by looking for it; without one it is a store error.
  virtual CommitOutcome commit(const ClaimKey* claim, std::string* why) = 0;
  // Rolls the open transaction back, if any. Never throws.
  virtual void rollback() noexcept = 0;
  // A read of one snapshot, outside any write lock (SQLite: a deferred transaction;
  // PostgreSQL: one statement at a time). end_read() ends it; never throws.
  virtual void begin_read() = 0;
  virtual void end_read() noexcept = 0;

  // --- the claims (store/claims.h), inside the open transaction ---
  // Inserts the claim of `key` (received_at: the retention clock). With
  // only_if_nothing_recorded, also skips it when the id has attempts or a dead letter
  // ('dead' or 'requeued'). True if this call claimed the id.
  virtual bool insert_claim(const ClaimKey& key, const Message& message,
                            bool only_if_nothing_recorded) = 0;
  // Everything recorded for `key`: claim, dead letter, attempts. Returns out->processed.
  // Inside a transaction or a read.
  virtual bool read_state(const ClaimKey& key, MessageState* out) = 0;
  virtual void delete_attempts(const ClaimKey& key) = 0;
  // Marks dead letter `id` 'replayed' (its message's effect is committed).
  virtual void mark_replayed(int64_t dead_letter_id) = 0;
  // Runs `call` with the store's transaction (a TxnRef of handler_type()), the thread
  // marked as running a handler for `owner` (store/reentry.h), and reports what it threw
  // and left (HandlerRun). Statements it left stepped are reset and named.
  virtual void run_handler(const Inbox* owner, FunctionRef<void(const TxnRef&)> call,
                           HandlerRun* out) = 0;

  // --- attempts, outside the claim transaction ---
  // Adds one attempt to `key`, in a transaction of its own committed without waiting for
  // durability (a lost one costs one extra attempt): 'running' before a handler run
  // (error null), 'failed' with *error after one. Returns the count.
  virtual int count_attempt(const ClaimKey& key, const std::string* error) = 0;
  // Marks the running attempt of `key` failed with `error`, the same way.
  virtual void mark_attempt_failed(const ClaimKey& key, const std::string& error) = 0;
  // Takes back the attempt count_attempt(key, nullptr) added before a run that then said
  // "not yet" (RetryLater: not an attempt), the same way: one fewer, the row gone at
  // zero; its state 'failed' again (the run did not die).
  virtual void uncount_attempt(const ClaimKey& key) = 0;
  // Records, outside the database and at no cost, that the handler of `key` is about to
  // run, so that a process that dies inside it has the attempt counted at the next open
  // (SQLite: the lock file's marker). False if the store cannot (the front then commits
  // the attempt first, for redeliveries). clear_running() forgets it.
  virtual bool mark_running(const ClaimKey& key) = 0;
  virtual void clear_running() noexcept = 0;

  // --- dead letters (store/dead_letters.cpp has the rules), inside the open transaction ---
  // The id of `key`'s dead letter with status 'dead' or 'requeued', newest first.
  virtual std::optional<int64_t> open_dead_letter(const ClaimKey& key) = 0;
  virtual void count_redelivery(int64_t dead_letter_id) = 0;
  // Rewrites row `id` with dl's reason, text, attempts and last attempt, dead_lettered_at
  // = now, status 'requeued' if dl.requeued else 'dead'; false if the row is gone.
  virtual bool rewrite_dead_letter(int64_t id, const DeadLetter& dl, int64_t now_ms) = 0;
  // Inserts `dl` (dead_lettered_at = now; retention_at on the retention clock); its id.
  virtual int64_t insert_dead_letter(const DeadLetter& dl, int64_t now_ms) = 0;
  virtual void list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) = 0;
  virtual bool get_dead_letter(int64_t id, DeadLetter* out) = 0;
  virtual int64_t purge_dead_letters(const DeadLetterFilter& filter) = 0;
  virtual RequeueFacts requeue_facts(int64_t id) = 0;
  virtual void set_requeued(int64_t id) = 0;
  virtual void requeued_dead_letters(const std::string& consumer, int64_t limit,
                                     std::vector<int64_t>* ids) = 0;

  // --- session records (store/sessions.h has the rules), each in the open transaction ---
  virtual void write_session(const SessionRecord& record) = 0;
  virtual void read_sessions(const std::string* client_id, std::vector<SessionRecord>* out) = 0;
  virtual bool remove_session(const std::string& client_id) = 0;
  virtual void add_lost_session(const std::string& client_id, int64_t at_ms) = 0;

  // --- the application's set-up (Inbox::setup, setup_sql), one start-up attempt ---
  // Runs `fn` with the store's transaction (TxnRef of handler_type()) inside one write
  // transaction, or `sql` (statements separated by ';'), waiting at most `lock_wait_ms`
  // for a lock. Throws the store's exceptions.
  virtual void setup(int lock_wait_ms, FunctionRef<void(const TxnRef&)> fn) = 0;
  virtual void setup_sql(int lock_wait_ms, const std::string& sql) = 0;
  // Runs `fn` with the main connection outside any transaction (Inbox::with_connection):
  // a TxnRef of the store's connection type (SQLite::Database, pqxx::connection_base).
  virtual const std::type_info& connection_type() const = 0;
  virtual void with_connection(FunctionRef<void(const TxnRef&)> fn) = 0;

  // --- statistics ---
  // Measures rows per consumer and the outbox's now and hands them to the front
  // (Store::set_row_stats): on a second connection where the store has one.
  virtual Status measure_rows() = 0;

  // --- the other parts, each an interface of its own; each lives as long as the backend ---
  virtual OutboxStore& outbox() = 0;
  virtual StpRows& stp_rows() = 0;
  virtual RetentionRows& retention_rows() = 0;
  // A fleet member's slot leases, on a connection of their own. Only a store every member
  // of a fleet reaches holds them: kInvalidArgument otherwise.
  virtual Status open_slot_leases(const SlotLeaseOptions& options,
                                  std::unique_ptr<SlotLeases>* out) = 0;
  // Whether several processes may work on this store at once (PostgreSQL), so that a
  // relay must take its turn (RelaySource::relays_take_turns, outbox/relay_source.h).
  virtual bool shared_by_processes() const = 0;

  Store& front() const { return front_; }

 private:
  Store& front_;
};

}  // namespace mqtt_inbox::detail

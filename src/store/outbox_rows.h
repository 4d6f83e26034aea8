// The outbox's view of a store: the rows of outgoing messages (SQLite: outbox_messages,
// and outbox_usage, the pending rows and bytes of each class, which triggers keep) and
// every read and write of them. The policy (outbox/: the validation of topics, ids and
// MQTT 5 properties, the class a topic belongs to, its row, byte and age bounds and what
// a full class means, the counters and what is logged) calls this and nothing else of
// the store's. This owns the how: the statements, the transactions, which index a query
// walks, what the store's own errors mean, and how a relay learns of a commit that
// enqueued (SQLite: store/sqlite/commit_wake.h). docs/design.md#outbox-rows has the SQLite
// store's steps.
//
// Two kinds of call:
//  - Inside the caller's open transaction (`txn`: a handler's, or one the application
//    began): the enqueue's. They throw the store's own exceptions, as the handler's own
//    statements would, so that the handler's verdict reads them with the store's
//    StoreErrorClassifier (store/verdict.h): a store failure is not the message's fault.
//  - On the store's own connection (the relay's fetch and marks, inspection, repair):
//    each takes the connection for itself, runs in one transaction (a fetch is a read:
//    no write lock, nothing written), and returns a classified, counted Status; a fatal
//    error latches the store. The caller has checked re-entry (store/reentry.h) first.
//
// Times: a row's enqueued_clock and retention_at are on the store's retention clock
// (Store::retention_clock()), enqueued_at, sent_at and dead_at are wall clock for people.
//
// A PostgreSQL store implements the same calls: enqueue's in the handler's libpqxx
// transaction (INSERT ... ON CONFLICT (message_id) DO NOTHING RETURNING seq; the class's
// usage row read FOR UPDATE, so that two transactions fitting rows into one class queue
// up on it); the wake-up from LISTEN/NOTIFY (a NOTIFY in the enqueueing transaction is
// delivered only if it commits).
//
// Thread safety: the calls on the store's connection and the commit wakers are safe from
// any thread; the transaction's calls run on the thread that holds `txn`.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/outbox.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// A new row as the policy has made it: the id assigned and checked, the ordering key
// defaulted, the properties encoded, the size counted, the class chosen.
struct NewOutboxRow {
  const std::string* message_id = nullptr;
  const std::string* ordering_key = nullptr;
  const std::string* class_prefix = nullptr;  // "" = no class
  const std::string* topic = nullptr;
  const std::string* payload = nullptr;
  const std::string* properties_json = nullptr;
  int64_t size_bytes = 0;
  int64_t enqueued_at_ms = 0;  // wall clock
  int64_t enqueued_clock = 0;  // retention clock: the start of its age (max_age_ms)
};

// The oldest pending row of a class, but the one just inserted.
struct OldestPending {
  int64_t seq = 0;
  int64_t size_bytes = 0;
  int64_t enqueued_clock = 0;  // retention clock
  std::string message_id;
};

// A row as the store reads it: every field of OutboxRow but `properties`, which the
// policy decodes from properties_json (inbox/properties_json.h); waited_ms counted on the
// retention clock at the read.
struct StoredOutboxRow {
  OutboxRow row;
  std::string properties_json;
};

class OutboxStore {
 public:
  virtual ~OutboxStore() = default;

  // --- inside the caller's transaction `txn` (throw the store's exceptions) ---

  // Whether `txn` is an open transaction (SQLite: not in autocommit mode). Throws
  // std::invalid_argument for a transaction that is not of this store's type.
  virtual bool in_transaction(const TxnRef& txn) = 0;
  // Inserts `row` as pending unless a row with its message id exists (false: nothing
  // added). *seq receives the new row's seq (enqueue order, never reused).
  virtual bool insert(const TxnRef& txn, const NewOutboxRow& row, int64_t* seq) = 0;
  // Deletes the row `seq` (an insert the policy refused).
  virtual void remove(const TxnRef& txn, int64_t seq) = 0;
  // The pending rows and bytes of class `class_prefix`, the row just inserted included
  // (0, 0 if it has none).
  virtual void class_usage(const TxnRef& txn, const std::string& class_prefix, int64_t* rows,
                           int64_t* bytes) = 0;
  // The oldest pending row of class `class_prefix` other than `except_seq`; false if none.
  virtual bool oldest_pending(const TxnRef& txn, const std::string& class_prefix,
                              int64_t except_seq, OldestPending* out) = 0;
  // Deletes the pending rows of class `class_prefix` other than `except_seq` whose
  // enqueued_clock is below `cutoff`; returns how many.
  virtual int64_t remove_pending_before(const TxnRef& txn, const std::string& class_prefix,
                                        int64_t except_seq, int64_t cutoff) = 0;
  // Adds `n` to the drops of class `class_prefix` (OutboxClassUsage::dropped).
  virtual void count_drops(const TxnRef& txn, const std::string& class_prefix, int64_t n) = 0;
  // Wakes the commit wakers once `txn` commits (not if it rolls back; SQLite: only on a
  // connection the library opened, see store/sqlite/commit_wake.h).
  virtual void wake_after_commit(const TxnRef& txn) = 0;
  // If `e` is the store's own exception (from the calls above, or the caller's own
  // statements), sets *out to the store error it stands for, with `what` as the context,
  // and returns true; else false.
  virtual bool store_error(const std::exception& e, const char* what, Status* out) = 0;

  // --- on the store's connection (classified Status) ---

  // Up to `limit` pending rows with seq > after_seq, in seq order, as one consistent
  // read that takes no write lock and writes nothing.
  virtual Status fetch_pending(int64_t after_seq, int limit, std::vector<StoredOutboxRow>* out) = 0;
  // Marks the rows sent (sent_at, retention_at now) and adds each one's publishes to its
  // attempts, skipping rows no longer pending, in one transaction committed without
  // fsync. *changed: the rows marked.
  virtual Status mark_sent(const std::vector<OutboxMark>& rows, int64_t* changed) = 0;
  // Makes a pending row dead with the reason, code and text (dead_at, retention_at now),
  // adding its publishes to its attempts; committed durably. *changed: false if it was no
  // longer pending.
  virtual Status mark_dead(const OutboxMark& row, OutboxDeadReason reason, int reason_code,
                           const std::string& text, bool* changed) = 0;
  // Rows in `state`, oldest (lowest seq) first, at most `limit`.
  virtual Status list(OutboxState state, int limit, std::vector<StoredOutboxRow>* out) = 0;
  // outbox_usage, ordered by class.
  virtual Status usage(std::vector<OutboxClassUsage>* out) = 0;
  // Rows per state, the oldest pending row's enqueue and wait, and usage(); pending_bytes
  // summed over the classes.
  virtual Status summary(OutboxSummary* out) = 0;
  // The row with `message_id` in any state; *found false if none.
  virtual Status get(const std::string& message_id, StoredOutboxRow* out, bool* found) = 0;
  // If the row `message_id` is dead, makes it pending again under a new seq (attempts 0,
  // the dead fields cleared, its age restarted, enqueued_at kept) and wakes the commit
  // wakers after the commit; one transaction, committed durably. *state: the row's state
  // before (nullopt: no such row); *new_seq: its new seq if replayed.
  virtual Status replay_dead(const std::string& message_id, std::optional<OutboxState>* state,
                             int64_t* new_seq) = 0;
  // Deletes the sent or dead rows `filter` selects (never pending: the policy refuses it)
  // in one transaction, committed durably; *removed: how many.
  virtual Status purge(const OutboxPurgeFilter& filter, int64_t* removed) = 0;

  // --- the relays' wake-up ---

  // Calls `wake` after each commit whose transaction enqueued a row or replayed one, on
  // any connection the library opened to the store in this process; on the committing
  // thread, so it must only signal. Returns its id (never 0) for remove_commit_waker().
  virtual uint64_t add_commit_waker(std::function<void()> wake) = 0;
  // After it returns, the waker is not running and is never called again.
  virtual void remove_commit_waker(uint64_t id) = 0;
};

}  // namespace mqtt_inbox::detail

// Retention's view of a store: the rows that expire, and what the store does around
// deleting them to stay small. The Pruner (retention/pruner.cpp) owns the policy: the
// window and its check against the redelivery horizon and the recorded sessions, the
// cutoffs, batch sizes, pauses and pass budget, and what it logs and exports. This owns
// the how: which rows a cutoff selects, the statements that delete them (one short write
// transaction per batch), the store's own housekeeping between batches and after a pass,
// row measurement for InboxStats, and the store's records of the retention horizon and
// clock. docs/design.md#retention-passes has the SQLite store's statements and checkpoints.
//
// Every time here is on the store's retention clock (Store::retention_clock()): a row
// expires when its clock column (received_at of a processed id; retention_at of a dead
// letter or a finished outbox row) is below the cutoff. A store whose rows carry its
// server's time (PostgreSQL: received_at from the server's clock, so several consumers
// agree) reads that same clock in retention_clock().
//
// A second store implements the same calls: PostgreSQL deletes a batch with one statement,
//   DELETE FROM inbox_processed WHERE ctid = ANY(ARRAY(
//     SELECT ctid FROM inbox_processed WHERE received_at < $1 LIMIT $2))
// (or a key subquery), and has nothing to checkpoint or vacuum by hand (autovacuum does),
// so after_batch(), reclaim_step() and finish_pass() do nothing there.
//
// Thread safety: RetentionRows is safe from any thread (each call takes the store's
// connection for itself). A RetentionSweep has one user at a time (the Pruner's pass).
#pragma once

#include <cstdint>
#include <memory>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// The rows retention deletes besides processed ids, each with its own cutoff.
enum class ExpiringRows {
  kDeadLetters,  // inbox dead letters; never a 'requeued' one, however old (work to do)
  kOutboxSent,   // outbox rows sent (PUBACKed): their UNIQUE id guards a re-enqueue
  kOutboxDead,   // outbox dead letters
};

// What one delete batch did.
struct RetentionBatch {
  bool wrote = false;    // a write transaction ran (false: the batch found nothing to delete)
  int64_t found = 0;     // expired rows it selected, at most the limit; fewer: none are left
  int64_t deleted = 0;   // rows it deleted
  int64_t write_us = 0;  // its write transaction, waiting for the store's lock included, µs
};

// What one step of giving free space back to the file system did.
struct ReclaimStep {
  bool ran = false;   // false: nothing to give back, or reclaiming is off
  int64_t freed = 0;  // pages given back (PruneResult::pages_freed)
  bool more = false;  // there may be more: another step is worth taking (after a pause)
};

// The Pruner's options that concern the store's housekeeping.
struct RetentionSweepOptions {
  bool checkpoint = true;     // RetentionOptions::checkpoint
  bool reclaim_space = true;  // RetentionOptions::incremental_vacuum
  int64_t idle_ms = 60000;  // no commit for this long: the store is idle (RetentionOptions::period)
};

// One Pruner's deletes, with whatever the store keeps for them between calls (SQLite: a
// second connection to the file, and where the walk over the processed ids stopped).
// Errors come classified and counted (Store::store_error); a fatal one latches the store.
class RetentionSweep {
 public:
  virtual ~RetentionSweep() = default;

  // Deletes up to `limit` processed ids (claims) with received_at < cutoff in one write
  // transaction. Successive calls continue where the previous one stopped, so a pass cut
  // short by its budget resumes there; a batch that finds fewer than `limit` starts the
  // next one from the beginning.
  virtual Status delete_expired_claims(int64_t cutoff, int64_t limit, RetentionBatch* out) = 0;

  // Deletes up to `limit` of `rows` with retention_at < cutoff (oldest first) in one write
  // transaction.
  virtual Status delete_expired(ExpiringRows rows, int64_t cutoff, int64_t limit,
                                RetentionBatch* out) = 0;

  // After each batch and reclaim step: the store's housekeeping that keeps message
  // commits from paying for the pruner's writes (SQLite: a checkpoint). Never fails.
  virtual void after_batch() = 0;

  // Gives a few free pages back to the file system (SQLite: incremental vacuum). Called
  // after a pass that deleted rows, step by step while out->more.
  virtual Status reclaim_step(ReclaimStep* out) = 0;

  // At the end of a pass, after the writes: shrink what the store can (SQLite: checkpoint
  // the WAL, truncating it when idle). Never fails.
  virtual void finish_pass() = 0;

  // Counts rows for InboxStats (per consumer, the outbox) without holding up message
  // commits where the store can (SQLite: on the second connection).
  virtual Status measure_rows() = 0;
};

// Store::retention_rows(): retention's records in the store and its sweeps.
class RetentionRows {
 public:
  virtual ~RetentionRows() = default;

  // Records the smallest window the application accepts (ms), so that the admin tool can
  // refuse a shorter manual prune. One attempt of a start-up write (Store::wait_at_startup
  // repeats it): waits at most lock_wait_ms for the store's write lock.
  virtual Status record_required_window(int64_t required_ms, int lock_wait_ms) = 0;

  // Stores the retention clock so that it continues from there after a restart (SQLite:
  // in inbox_meta, never moving back). A store whose clock is its server's has nothing to
  // store and returns OK.
  virtual Status persist_clock() = 0;

  // A sweep for one Pruner.
  virtual Status open_sweep(const RetentionSweepOptions& options,
                            std::unique_ptr<RetentionSweep>* out) = 0;
};

}  // namespace mqtt_inbox::detail

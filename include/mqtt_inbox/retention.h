// Retention: how long processed message ids are remembered, the pruner that forgets
// them, and the storage hygiene that keeps a flash-based inbox bounded.
//
// Retention is a correctness setting. An id pruned before its last possible redelivery
// lets that duplicate through, and nothing reports it. So the window is checked against
// a declared redelivery horizon:
//
//   horizon = max(broker session expiry, longest offline period) + replay window
//   required: window >= horizon + margin
//
// The broker session expiry in that formula has one source of truth: the session the
// subscriber actually asks for. The MQTT Subscriber records it in the inbox database
// (SessionRecords::record, session_record.h) before it connects: the Session Expiry
// Interval it sends with MQTT 5, or the one the user declares in
// SubscriberOptions::session_expiry_s for MQTT 3.1.1, where the broker sets it. The
// Pruner checks the window against the longer of the declared broker_session_expiry and
// the longest recorded session expiry:
//
//   required = max(broker_session_expiry, longest recorded session expiry, max_offline)
//              + replay_window + margin
//
// A shorter window is refused (kInvalidArgument) unless allow_window_below_horizon is
// set, and then a warning is logged once per Pruner (and once more whenever a new record
// raises the requirement). The check runs in create() and again at the start of every
// pass, because the subscriber may record its session after the Pruner was made: a pass
// that finds the window too short deletes nothing, logs an error and returns
// kInvalidArgument (the background thread goes on trying each period).
//
// Time: the pruner compares received_at with the inbox's retention clock
// (Inbox::retention_clock_ms), which advances only with the monotonic clock while the
// inbox runs and is persisted in the database. Wall-clock jumps (a gateway booting at
// 1970 and stepping forward at NTP sync, an operator setting the clock back) therefore
// never make a row look older than it is: a row is pruned only after at least `window`
// of real running time. Downtime does not count, so rows can live longer than the
// window in wall-clock terms, which is the safe direction. docs/operations.md#clock-safety.
//
// Logging: to the Inbox's logger (InboxOptions::logger; default the "mqtt_inbox" logger):
// one info line per pass that deleted something, the stats summary every
// stats_log_period_ms, and warnings (an override of the horizon, a failed pass).
//
// Thread safety: a Pruner is thread-safe. prune_once() and the background thread take
// the Inbox's connection for one batch at a time, so a message commit never waits for
// more than one batch.
//
// How a pass deletes, paces itself and keeps the files small (the statements, the
// second connection, checkpoints, what is fsynced): docs/design.md#retention-passes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

struct RetentionOptions {
  // How long a processed message id is remembered, in ms of the retention clock.
  // Default 8 days (the 7-day default session expiry plus a day of margin).
  std::chrono::milliseconds window = std::chrono::hours(8 * 24);

  // The declared redelivery horizon. broker_session_expiry is a floor for the broker's
  // session expiry: the session expiry the subscriber records in the inbox
  // (SubscriberOptions::session_expiry_s) is checked as well, whichever is longer wins, so
  // it need not repeat it (see the header comment). max_offline is the longest time a
  // device may be away; replay_window covers deliberate re-sends by producers or
  // operators. Defaults 7 days, 0, 0.
  std::chrono::milliseconds broker_session_expiry = std::chrono::hours(7 * 24);
  std::chrono::milliseconds max_offline{0};
  std::chrono::milliseconds replay_window{0};
  // Required headroom above the horizon. Default 1 hour.
  std::chrono::milliseconds margin = std::chrono::hours(1);
  // Accept a window below horizon + margin (a loud warning is logged once). Default false.
  bool allow_window_below_horizon = false;

  // Rows deleted per transaction, at most. Default 500.
  int batch_rows = 500;
  // Target time one batch may hold the store's write lock, ms. The batch size adapts to
  // it (between 10 rows and batch_rows), because a message commit waits for at most one
  // batch. Default 1: a message then waits less than its own fsync (docs/benchmarks.md).
  int max_batch_ms = 1;
  // Time one pass may spend deleting, ms; the rest is left for the next pass. Default 2000.
  std::chrono::milliseconds pass_budget{2000};
  // Pause after each batch (and vacuum step): pause_factor x the time the batch kept
  // the store busy (its transaction and the checkpoint after it), and at least
  // batch_pause. The pruner therefore uses at most 1 / (1 + pause_factor) of the
  // device's time, and a message's fsync rarely queues behind the pruner's writes.
  // Larger = gentler on message latency, slower pruning (docs/benchmarks.md has the
  // trade-off measured). Range 0..1000 (else kInvalidArgument). Default 4.
  double pause_factor = 4;
  // Minimum pause after each batch. Default 2 ms.
  std::chrono::milliseconds batch_pause{2};
  // Period of the background thread (start()). Default 60 s.
  std::chrono::milliseconds period{60000};

  // Dead letters are kept this long (retention clock), independently of the window.
  // 0 keeps them until purged by hand. A 'requeued' row (parked by a full outbox, or
  // handed back by the admin tool) is never pruned: it is a message still to apply. The
  // same holds for outbox dead letters (outbox.h); sent outbox rows are kept for `window`
  // after their PUBACK. Default 30 days.
  std::chrono::milliseconds dead_letter_window = std::chrono::hours(30 * 24);

  // After a pass that deleted rows, give the freed pages back to the file system, a few
  // at a time (incremental vacuum), so the file shrinks after a large prune. Default true.
  bool incremental_vacuum = true;
  // Checkpoint the WAL after every batch, on a second connection the Pruner opens to the
  // same file, so that message commits neither wait for it nor pay for the pruner's pages
  // at InboxOptions::wal_autocheckpoint_pages; and at the end of every pass, shrinking
  // the WAL file to zero when no claim committed during the last `period`. Default true.
  bool checkpoint = true;

  // Every pass also logs a one-line stats summary at info level when this many ms have
  // passed since the last one. 0 = never. Default 300000 (5 min).
  int64_t stats_log_period_ms = 300000;
  // If set, start() and every pass write InboxStats in Prometheus text format to this path
  // (atomically: a temporary file, then rename), for node_exporter's textfile collector.
  std::string prometheus_textfile;
};

// Outcome of one pass.
struct PruneResult {
  int64_t processed_deleted = 0;  // processed message ids (inbox_processed rows)
  int64_t dead_letters_deleted = 0;
  int64_t outbox_sent_deleted = 0;  // outbox rows sent before the window (outbox.h)
  int64_t outbox_dead_deleted = 0;  // outbox dead letters older than dead_letter_window
  int64_t batches = 0;
  bool budget_exhausted = false;  // rows were left for the next pass
  int64_t pages_freed = 0;        // by incremental_vacuum
  int64_t duration_ms = 0;
  int64_t cutoff = 0;  // rows with received_at < cutoff were eligible
};

class Pruner {
 public:
  // Validates `options` against the declared horizon and the session expiries recorded
  // in the inbox (see the header comment), and records the declared horizon in the
  // database (inbox_meta) so tools can check against it. `inbox` must outlive the Pruner.
  // Recording the horizon is a write at start-up: a store that is locked, full or
  // failing is waited out like in Inbox::open (InboxOptions::startup_*). Errors:
  // kInvalidArgument (the message names the client id whose session the window does
  // not cover); the last transient store error when startup_deadline_ms ran out;
  // kCorruption for a corrupt file; store codes if the records cannot be read.
  static Status create(Inbox* inbox, const RetentionOptions& options, std::unique_ptr<Pruner>* out);
  ~Pruner();  // stops the background thread

  // One pass: first the window is checked against the session expiries recorded now (a
  // window below them, without the override: nothing is deleted, an error is logged, and
  // kInvalidArgument is returned); then, in batches of one short transaction each,
  // delete expired ids (from where a pass that spent its budget stopped), sent outbox
  // rows past the window, expired dead letters and outbox dead letters; then give space
  // back, checkpoint, refresh row stats, and log/export stats. Never touches dead letters
  // inside the dead-letter window, nor any row younger than the window. Errors: store
  // codes (the pass stops; what was deleted stays deleted); kCorruption once the file is
  // found corrupt (nothing is touched).
  Status prune_once(PruneResult* result);

  // Runs prune_once() every `period` on a thread owned by the Pruner, until stop(). The
  // thread first measures rows (InboxStats::consumers) without waiting for a period. After
  // a pass that spent its pass_budget (rows left over), the next one starts after
  // min(period, pass_budget) instead. Errors: kInvalidArgument if already started.
  Status start();
  void stop();

  // Declared horizon + margin, in ms: max(broker_session_expiry, max_offline) +
  // replay_window + margin, from `options` alone.
  static int64_t required_window_ms(const RetentionOptions& options);
  // The smallest window accepted for `inbox` without the override, in ms: the larger of
  // required_window_ms(options) and the longest session expiry recorded in `inbox` +
  // replay_window + margin. *why (optional) says which one set it, e.g. "the session of
  // client 'gw-17' (30.0 d, requested)". Errors: store codes.
  static Status required_window_ms(Inbox* inbox, const RetentionOptions& options, int64_t* out,
                                   std::string* why);

 private:
  struct Impl;
  explicit Pruner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mqtt_inbox

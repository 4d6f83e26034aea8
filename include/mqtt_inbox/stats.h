// Stats: a snapshot of what an Inbox has done and holds. Inbox::stats() is cheap and safe
// from any thread: counters are atomics, the latency histogram is lock-free, file sizes
// come from stat(2), and row counts are those the last retention pass (or
// Inbox::refresh_row_stats) measured, so taking a snapshot never waits for the store.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace mqtt_inbox {

struct ConsumerRows {
  int64_t rows = 0;                // rows in inbox_processed for this consumer
  int64_t oldest_received_at = 0;  // retention clock, ms (0 if no rows)
  int64_t newest_received_at = 0;
};

// The transactional outbox (outbox.h) as measured with the rows.
struct OutboxClassRows {
  int64_t pending_rows = 0;
  int64_t pending_bytes = 0;
  int64_t dropped = 0;  // by drop_oldest, ever
};
struct OutboxRows {
  std::map<std::string, OutboxClassRows> classes;  // by class topic prefix ("" unbounded)
  int64_t sent_rows = 0;                           // kept until the retention window
  int64_t dead_rows = 0;                           // outbox dead letters
  // Retention clock, ms, since the oldest pending row was enqueued; 0 when none pends.
  int64_t oldest_pending_age_ms = 0;
};

struct InboxStats {
  // Counters since this Inbox was opened (this process).
  int64_t processed = 0;      // claims committed with their effect
  int64_t duplicates = 0;     // deliveries skipped because the claim existed
  int64_t dead_lettered = 0;  // dead letters written (redeliveries of one not counted,
                              // nor messages parked by a full outbox)
  int64_t retries = 0;        // handler attempts that failed and were retried or gave up
  int64_t store_errors = 0;   // store operations that failed (and were retried)
  int64_t pruned = 0;         // inbox_processed rows deleted by retention passes
  int64_t dead_letters_pruned = 0;
  // Sessions the broker lost while the inbox recorded them (SessionRecords::note_lost):
  // CONNACK said session present = 0 although the recorded session held topic filters,
  // so what was queued for it while the client was away is gone (session expiry, a
  // broker restart without persistence, a clean-session CONNECT with this client id).
  int64_t sessions_lost = 0;
  // duplicates / (processed + duplicates); 0 when nothing was seen.
  double duplicate_ratio = 0;

  // Latency of the claim transaction, from its start to its commit returned (the handler
  // and the durable commit included), in microseconds, over the last 4096 claims.
  int64_t commit_p50_us = 0;
  int64_t commit_p99_us = 0;
  int64_t commit_max_us = 0;  // since open

  // Files, bytes (0 if absent).
  int64_t db_bytes = 0;
  int64_t wal_bytes = 0;

  int schema_version = 0;
  int64_t retention_clock_ms = 0;  // see docs/operations.md#clock-safety

  // As measured by the last retention pass, Pruner::start() (which measures at once, on
  // its thread) or refresh_row_stats(); rows_measured_at is the retention clock then,
  // in ms (0 = never measured in this process: `consumers` is then empty, which does not
  // mean the inbox is).
  std::map<std::string, ConsumerRows> consumers;
  int64_t rows_measured_at = 0;
  // Measured at the same time (empty, zeros while never measured or without an outbox).
  OutboxRows outbox;
};

// One line for logs: "processed=... duplicates=... rows=... p99=...us db=...B wal=...B
// sessions_lost=...".
// rows is the sum over consumers, or "unknown" while rows_measured_at is 0.
std::string summary_line(const InboxStats& s);

// Prometheus text exposition format (version 0.0.4), for a node exporter's textfile
// collector. Metric names start with mqtt_inbox_ (mqtt_inbox_sessions_lost_total counts
// InboxStats::sessions_lost: alert on any increase). mqtt_inbox_rows has
// no samples while rows were never measured (absent, not 0). The outbox figures
// (mqtt_inbox_outbox_*: pending rows, bytes and drops per class label, sent and dead
// rows, the oldest pending row's age) are written once rows were measured.
std::string prometheus_text(const InboxStats& s);

}  // namespace mqtt_inbox

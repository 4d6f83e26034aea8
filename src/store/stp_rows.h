// Store-then-process's view of a store: the stored messages of each consumer (SQLite: the
// rows of inbox_messages). The policy (stp/: receipt's checks and dead letters, the
// reaper's leases on the monotonic clock, replay and retention decisions, counters and
// health) calls this; this owns the how: connections and their settings, the statements
// and transactions, and what the store's own errors mean (classified into Status).
// docs/store-then-process.md describes the SQLite store's steps.
//
// Times: received_at is on the store's retention clock (Store::retention_clock()),
// stamped by the store. Nothing here reads a lease: the reaper times them in the policy's
// memory.
//
// Thread safety: StpRows and a StpConsumerRows's receipt calls are safe from any thread;
// its maintenance calls have one caller at a time (the policy serialises them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/status.h"
#include "mqtt_inbox/store_then_process.h"

namespace mqtt_inbox::detail {

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

// One store-then-process consumer's rows (StoreThenProcess::create opens them).
class StpConsumerRows {
 public:
  virtual ~StpConsumerRows() = default;

  // --- receipt: on the store's shared connection, any thread ---

  // Stores `m` under (consumer, message_id) unless the id is stored already (*stored =
  // false), received_at = now, committed durably (the Inbox's synchronous setting)
  // before it returns.
  virtual Status store_received(const std::string& message_id, const std::string& aggregate_key,
                                const Message& m, const std::string& properties_json,
                                bool* stored) = 0;
  // Whether (consumer, message_id) is stored, whatever its status.
  virtual Status is_stored(const std::string& message_id, bool* found) = 0;

  // --- maintenance: on the consumer's own session, one caller at a time ---

  // Returns the claims `choose` picks (see ReapChooser) in one transaction. *rows: the
  // rows set back to 'pending'.
  virtual Status reap(const ReapChooser& choose, int64_t* rows) = 0;

  // Sets the finished rows matching `filter` back to 'pending' (attempts 0, due at once),
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

// Internal: the dead letters as a store keeps them (dead_letter.h): messages the policy
// could not process, with everything needed to understand and replay them, and their
// status ('dead', 'requeued' for the running Consumer to replay, 'replayed'). The policy
// decides what becomes a dead letter and replays them (inbox/consumer.cpp, stp/); the
// admin tool and applications reach the rows through the public Inbox. How each call
// keeps one row per message and never loses one: docs/design.md#dead-letters.
//
// Thread safety: implementations are thread-safe; calls are serialised on the store's
// connection. A call from inside a handler the store runs is refused with
// kInvalidArgument naming it (store/reentry.h). Errors: the store's codes (Status).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

class DeadLetterStore {
 public:
  virtual ~DeadLetterStore() = default;

  // Writes `dl` and clears the attempts of its (consumer, message id), in one committed
  // transaction; *id receives the row's id. A redelivery of a message that has a dead
  // letter ('dead' or 'requeued', dl.message_id set) only counts on that row
  // (redeliveries + 1): a lost PUBACK after dead-lettering must not make a second row.
  // With `replace_id` (a failed replay), that row is rewritten in place, or written anew
  // if it was purged meanwhile, so the message is never lost. A new or rewritten row gets
  // status 'requeued' if dl.requeued (a message parked by a full outbox), else 'dead'.
  virtual Status add(const DeadLetter& dl, std::optional<int64_t> replace_id, int64_t* id) = 0;

  // Rows matching `filter`, newest first, payloads included.
  virtual Status list(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) = 0;

  // Row `id`; kNotFound if absent.
  virtual Status get(int64_t id, DeadLetter* out) = 0;

  // Deletes the rows matching `filter` (its limit is ignored); *removed gets their count.
  virtual Status purge(const DeadLetterFilter& filter, int64_t* removed) = 0;

  // Marks row `id` 'requeued' for the running Consumer of its consumer name to replay.
  // kNotFound; kInvalidArgument if the row is not 'dead', its payload was cut, or it
  // belongs to a store-then-process consumer (StoreThenProcess::replay replays those).
  virtual Status requeue(int64_t id) = 0;

  // Ids of `consumer`'s rows with status 'requeued', oldest first, at most `limit` (> 0).
  // Cheap (an index probe): the Consumer polls it.
  virtual Status requeued(const std::string& consumer, int64_t limit,
                          std::vector<int64_t>* ids) = 0;
};

}  // namespace mqtt_inbox::detail

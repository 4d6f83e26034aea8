// The dead letters' rules (Store::add_dead_letter and the administration calls), once
// for every store: one row per message, a redelivery counted on its row, a failed
// replay rewriting its row (or writing it anew if it was purged meanwhile, so the
// message is never lost), and what may be requeued. The backend supplies the rows
// (store/backend.h); docs/design.md#dead-letters says why.
#include <string>
#include <vector>

#include "store/backend.h"
#include "store/store.h"

namespace mqtt_inbox::detail {

Status Store::add_dead_letter(const DeadLetter& dl, std::optional<int64_t> replace_id,
                              int64_t* id) {
  const int64_t now = clock_->wall_ms();
  bool counted = false;  // a new or rewritten dead letter, not a redelivery's count
  const Status s = write_txn("writing dead letter", [&](StoreBackend& b) {
    counted = false;
    // The row as a plain id and a flag, not an optional: GCC 12 at -Os (the firmware
    // build) takes the optional's value for maybe-uninitialized once it is inlined.
    int64_t row = replace_id.value_or(0);
    bool have_row = replace_id.has_value();
    if (!have_row && dl.message_id) {
      if (const std::optional<int64_t> open =
              b.open_dead_letter({dl.consumer_name, *dl.message_id})) {
        row = *open;
        have_row = true;
        b.count_redelivery(row);
      }
    } else if (have_row) {
      counted = true;
      // Purged while its replay ran: written again below rather than lost (and rather
      // than failing for ever in the caller's store retry).
      if (!b.rewrite_dead_letter(row, dl, now)) have_row = false;
    }
    if (!have_row) {
      row = b.insert_dead_letter(dl, now);
      counted = true;
    }
    if (dl.message_id) b.delete_attempts({dl.consumer_name, *dl.message_id});
    *id = row;
  });
  if (s.ok() && counted && !dl.requeued) ++dead_lettered_;  // a parked message is not dead
  return s;
}

Status Store::list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) {
  out->clear();
  return read_txn("listing dead letters", [&](StoreBackend& b) {
    out->clear();
    b.list_dead_letters(filter, out);
  });
}

Status Store::get_dead_letter(int64_t id, DeadLetter* out) {
  bool found = false;
  const Status s =
      read_txn("reading dead letter", [&](StoreBackend& b) { found = b.get_dead_letter(id, out); });
  if (!s.ok()) return s;
  if (!found) return Status::NotFound("dead letter " + std::to_string(id) + " not found");
  return Status::Ok();
}

Status Store::purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed) {
  return write_txn("purging dead letters",
                   [&](StoreBackend& b) { *removed = b.purge_dead_letters(filter); });
}

Status Store::requeue_dead_letter(int64_t id) {
  Status refusal;
  const Status s = write_txn("requeuing dead letter", [&](StoreBackend& b) {
    refusal = Status::Ok();
    const std::string row = "dead letter " + std::to_string(id);
    const RequeueFacts f = b.requeue_facts(id);
    if (!f.found)
      refusal = Status::NotFound(row + " not found");
    else if (f.status != "dead")
      refusal = Status::InvalidArgument(row + " is '" + f.status + "', not 'dead': refused, a " +
                                        "dead letter is replayed at most once at a time");
    else if (f.cut_payload)
      refusal = Status::InvalidArgument(row + " holds a cut payload; it cannot be replayed");
    else if (f.stored)
      refusal = Status::InvalidArgument(
          row + " belongs to a store-then-process consumer: " + "use StoreThenProcess::replay");
    if (refusal.ok()) b.set_requeued(id);
  });
  return s.ok() ? refusal : s;
}

Status Store::requeued_dead_letters(const std::string& consumer, int64_t limit,
                                    std::vector<int64_t>* ids) {
  ids->clear();
  return read_txn("listing requeued dead letters", [&](StoreBackend& b) {
    ids->clear();
    b.requeued_dead_letters(consumer, limit, ids);
  });
}

}  // namespace mqtt_inbox::detail

// Internal (outbox policy): the Outbox's state (outbox.h), shared by outbox/outbox.cpp (the
// enqueue's checks and class bounds, the relay's fetch and marks) and
// outbox/outbox_inspect.cpp (list, usage, summary, get, replay_dead, purge). The rows are
// the store's (store/outbox_rows.h); this holds no SQL.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/outbox.h"
#include "store/outbox_rows.h"
#include "store/store.h"

namespace mqtt_inbox {

namespace detail {

// `stored` as an OutboxRow, its properties decoded (inbox/properties_json.h).
OutboxRow to_outbox_row(StoredOutboxRow&& stored);
void to_outbox_rows(std::vector<StoredOutboxRow>&& stored, std::vector<OutboxRow>* out);

}  // namespace detail

struct Outbox::Impl {
  const Inbox* inbox = nullptr;  // the key of the re-entry checks (store/reentry.h)
  detail::Store* store = nullptr;
  detail::OutboxStore* rows = nullptr;  // store->outbox()
  OutboxOptions options;
  std::shared_ptr<spdlog::logger> log;
  std::atomic<int64_t> enqueued{0}, duplicates{0}, rejected{0}, dropped{0}, sent{0}, dead{0};
  // The relay turn (renew_relay_turn) on a store whose relays may run in several
  // processes; made at the first call. The Relay's thread only.
  std::unique_ptr<detail::SlotLeases> relay_turn;

  // The class of `topic`: the longest matching prefix, or nullptr.
  const OutboxClass* class_of(const std::string& topic) const {
    const OutboxClass* best = nullptr;
    for (const auto& c : options.classes)
      if (topic.compare(0, c.topic_prefix.size(), c.topic_prefix) == 0 &&
          (!best || c.topic_prefix.size() > best->topic_prefix.size()))
        best = &c;
    return best;
  }

  // enqueue_or_throw inside the store's transaction `txn`.
  void enqueue(const detail::TxnRef& txn, const OutgoingMessage& m, std::string* message_id);

  // Makes room for the row `seq` of `size` bytes in class `c`, just inserted (and so
  // already counted in the class's usage) inside the caller's transaction: OK if it fits
  // (after drops of older rows under kDropOldest), else the refusal. Throws the store's
  // errors.
  Status make_room(const detail::TxnRef& txn, const OutboxClass& c, int64_t size, int64_t seq,
                   int64_t clock_now);
  // The age bound of make_room: kRejected if the class's oldest other pending row is older
  // than c.max_age_ms (kReject), else drops those rows (kDropOldest) and returns OK.
  Status enforce_age(const detail::TxnRef& txn, const OutboxClass& c, int64_t new_seq,
                     int64_t clock_now);
  // Counts and logs `n` rows of class `c` dropped, the first with id `first_id`, because
  // of `why` ("full", "older than max_age_ms").
  void count_drops(const detail::TxnRef& txn, const OutboxClass& c, int64_t n,
                   const std::string& first_id, const char* why);
};

}  // namespace mqtt_inbox

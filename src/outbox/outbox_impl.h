// Internal (outbox policy): OutboxImpl, the public Outbox (outbox.h) as the library
// implements it, and its relay side (RelaySource, outbox/relay_source.h). Its calls are
// defined in outbox/outbox.cpp (the enqueue's checks and class bounds, the relay's turn,
// fetch, marks and wake-up) and outbox/outbox_inspect.cpp (list, usage, summary, get,
// replay_dead, purge). The rows are the store's (store/outbox_rows.h); this holds no SQL.
//
// Thread safety: as Outbox and RelaySource.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/outbox.h"
#include "outbox/relay_source.h"
#include "store/outbox_rows.h"
#include "store/store.h"

namespace mqtt_inbox::detail {

// `stored` as an OutboxRow, its properties decoded (inbox/properties_json.h).
OutboxRow to_outbox_row(StoredOutboxRow&& stored);
void to_outbox_rows(std::vector<StoredOutboxRow>&& stored, std::vector<OutboxRow>* out);

class OutboxImpl final : public Outbox, public RelaySource {
 public:
  // `owner` (the key of the re-entry checks, store/reentry.h) and its store `front` are not
  // owned. The options are checked by Outbox::create.
  OutboxImpl(const Inbox* owner, Store* front, const OutboxOptions& opts);

  // --- Outbox: inspection and repair (outbox/outbox_inspect.cpp) ---
  Status list(OutboxState state, int limit, std::vector<OutboxRow>* out) override;
  Status usage(std::vector<OutboxClassUsage>* out) override;
  Status summary(OutboxSummary* out) override;
  Status get(const std::string& message_id, OutboxRow* out) override;
  Status replay_dead(const std::string& message_id) override;
  Status purge(const OutboxPurgeFilter& filter, int64_t* removed) override;
  OutboxCounters counters() const override;

  // --- RelaySource: the relay side (outbox/outbox.cpp) ---
  Status renew_relay_turn(int lease_ms, bool* held) override;
  void give_back_relay_turn() override;
  bool relays_take_turns() const override;
  Status fetch_pending(int64_t after_seq, int limit, std::vector<OutboxRow>* out) override;
  Status mark_sent(const std::vector<OutboxMark>& marks) override;
  Status mark_dead(const OutboxMark& row, OutboxDeadReason reason, int reason_code,
                   const std::string& text) override;
  uint64_t add_commit_waker(std::function<void()> wake) override;
  void remove_commit_waker(uint64_t id) override;

 private:
  void enqueue_in(const TxnRef& txn, const OutgoingMessage& message,
                  std::string* message_id) override;
  Status enqueue_status(const TxnRef& txn, const OutgoingMessage& message,
                        std::string* message_id) override;

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
  void enqueue(const TxnRef& txn, const OutgoingMessage& m, std::string* message_id);

  // Makes room for the row `seq` of `size` bytes in class `c`, just inserted (and so
  // already counted in the class's usage) inside the caller's transaction: OK if it fits
  // (after drops of older rows under kDropOldest), else the refusal. Throws the store's
  // errors.
  Status make_room(const TxnRef& txn, const OutboxClass& c, int64_t size, int64_t seq,
                   int64_t clock_now);
  // The age bound of make_room: kRejected if the class's oldest other pending row is older
  // than c.max_age_ms (kReject), else drops those rows (kDropOldest) and returns OK.
  Status enforce_age(const TxnRef& txn, const OutboxClass& c, int64_t new_seq, int64_t clock_now);
  // Counts and logs `n` rows of class `c` dropped, the first with id `first_id`, because
  // of `why` ("full", "older than max_age_ms").
  void count_drops(const TxnRef& txn, const OutboxClass& c, int64_t n, const std::string& first_id,
                   const char* why);

  const Inbox* const inbox;  // the key of the re-entry checks (store/reentry.h)
  Store* const store;
  OutboxStore* const rows;  // store->outbox()
  const OutboxOptions options;
  const std::shared_ptr<spdlog::logger> log;
  std::atomic<int64_t> enqueued{0}, duplicates{0}, rejected{0}, dropped{0}, sent{0}, dead{0};
  // The relay turn (renew_relay_turn) on a store whose relays may run in several
  // processes; made at the first call. The Relay's thread only.
  std::unique_ptr<SlotLeases> relay_turn;
};

}  // namespace mqtt_inbox::detail

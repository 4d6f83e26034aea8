// Internal (SQLite core): the Outbox's state (outbox.h), shared by outbox/outbox.cpp (enqueue, the
// class bounds, the relay's fetch and marks) and outbox/outbox_inspect.cpp (list, usage, summary,
// get, replay_dead, purge), and how both read a row of outbox_messages.
#pragma once

#include <SQLiteCpp/SQLiteCpp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "store/sqlite/store.h"
#include "mqtt_inbox/outbox.h"
#include "store/reentry.h"
#include "store/sqlite/util.h"

namespace mqtt_inbox {
namespace detail {

// The columns read_outbox_row() reads, in its order.
inline constexpr const char* kOutboxRowColumns =
    "seq, message_id, ordering_key, topic, payload, properties, size_bytes, enqueued_at, state, "
    "attempts, sent_at, dead_reason, reason_code, reason_text, enqueued_clock";

// One row of kOutboxRowColumns; `clock_now` is the retention clock now (for waited_ms).
OutboxRow read_outbox_row(SQLite::Statement& q, int64_t clock_now);

}  // namespace detail

struct Outbox::Impl {
  Inbox* inbox = nullptr;
  OutboxOptions options;
  std::shared_ptr<spdlog::logger> log;
  std::atomic<int64_t> enqueued{0}, duplicates{0}, rejected{0}, dropped{0}, sent{0}, dead{0};

  // The class of `topic`: the longest matching prefix, or nullptr.
  const OutboxClass* class_of(const std::string& topic) const {
    const OutboxClass* best = nullptr;
    for (const auto& c : options.classes)
      if (topic.compare(0, c.topic_prefix.size(), c.topic_prefix) == 0 &&
          (!best || c.topic_prefix.size() > best->topic_prefix.size()))
        best = &c;
    return best;
  }

  // Makes room for the row `seq` of `size` bytes in class `c`, just inserted (and so
  // already counted in outbox_usage) inside the caller's transaction: OK if it fits (after
  // drops of older rows under kDropOldest), else the refusal. Throws SQLite errors.
  Status make_room(SQLite::Database& db, const OutboxClass& c, int64_t size, int64_t seq,
                   int64_t clock_now);
  // The age bound of make_room: kRejected if the class's oldest other pending row is older
  // than c.max_age_ms (kReject), else drops those rows (kDropOldest) and returns OK.
  Status enforce_age(SQLite::Database& db, const OutboxClass& c, int64_t new_seq,
                     int64_t clock_now);
  // Counts and logs `n` rows of class `c` dropped, the first with id `first_id`, because
  // of `why` ("full", "older than max_age_ms").
  void count_drops(SQLite::Database& db, const OutboxClass& c, int64_t n,
                   const std::string& first_id, const char* why);

  // Runs `fn` in a write transaction on the Inbox's connection, under its mutex; SQLite
  // errors come back classified (and a corrupt file latches the inbox). `call` names the
  // public method. Refused from inside a handler of this inbox, as every Inbox call that
  // takes its mutex (store/reentry.h): the handler's thread holds that mutex already.
  template <typename Fn>
  Status on_inbox(const char* call, bool relaxed_sync, Fn&& fn) {
    return use_inbox(call, /*write=*/true, relaxed_sync, std::forward<Fn>(fn));
  }
  // As on_inbox, but `fn` runs outside any transaction: each statement is its own read
  // transaction, which takes no write lock. For reads only.
  template <typename Fn>
  Status read_on_inbox(const char* call, Fn&& fn) {
    return use_inbox(call, /*write=*/false, /*relaxed_sync=*/false, std::forward<Fn>(fn));
  }

 private:
  template <typename Fn>
  Status use_inbox(const char* call, bool write, bool relaxed_sync, Fn&& fn) {
    if (Status r = detail::refuse_if_in_handler(inbox, call); !r.ok()) return r;
    const char* what = call;
    auto& in = detail::sqlite_store(inbox);
    std::lock_guard<std::mutex> lock(in.mu);
    if (in.fatal.load()) return in.fatal_status();
    try {
      using InboxImpl = std::remove_reference_t<decltype(in)>;  // detail::SqliteStore is private
      std::optional<InboxImpl::RelaxedSync> relaxed;
      if (relaxed_sync) relaxed.emplace(in);
      if (write)
        in.write_transaction(fn);
      else
        fn();
      return Status::Ok();
    } catch (const SQLite::Exception& e) {
      return in.store_error(detail::to_status(e, what));
    } catch (const std::exception& e) {
      return Status::Internal(std::string(what) + ": " + e.what());
    }
  }
};

}  // namespace mqtt_inbox

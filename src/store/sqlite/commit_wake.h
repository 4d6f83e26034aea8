// Internal (SQLite core): wakes the outbox relays of an Inbox after a commit on its
// connection whose transaction enqueued an outbox row, so that a row is published as soon
// as it is visible instead of at the relay's next poll (issue 27). A wake before the
// commit would be useless: the relay would read a snapshot without the row.
//
// Outbox::enqueue arms it inside the open transaction; the connection's WAL hook
// (store/sqlite/wal_guard.h), which SQLite calls after each commit on it, calls committed(). A
// transaction that rolls back leaves it armed: the next commit then wakes the relays for
// nothing, which costs them one look at the outbox. Commits of other connections (a
// StoreThenProcess worker's, the application's own) do not arm it: relay.h.
//
// Thread safety: arm() and committed() are called by whichever thread uses the watched
// connection (its users serialise on the Inbox's mutex); add() and remove() from any
// thread. A waker runs on the committing thread under this object's mutex: it must only
// signal (Relay::notify), never block or call back into the inbox.
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace mqtt_inbox::detail {

class CommitWake {
 public:
  // The connection whose commits are watched (the Inbox's, set when it is opened).
  void watch(sqlite3* db) { watched_.store(db, std::memory_order_relaxed); }

  // By Outbox::enqueue, inside the open transaction on `db`: if `db` is the watched
  // connection, its next commit wakes the wakers.
  void arm(sqlite3* db) {
    if (db == watched_.load(std::memory_order_relaxed))
      armed_.store(true, std::memory_order_relaxed);
  }

  // After each commit on the watched connection. One relaxed load when nothing was
  // enqueued: no lock, no call.
  void committed() {
    if (!armed_.load(std::memory_order_relaxed)) return;
    armed_.store(false, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : wakers_) w.second();
  }

  // Registers `wake`; returns its id for remove(). After remove() returns, `wake` is not
  // running and is never called again.
  uint64_t add(std::function<void()> wake) {
    std::lock_guard<std::mutex> lock(mu_);
    wakers_.emplace_back(++next_id_, std::move(wake));
    return next_id_;
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = wakers_.begin(); it != wakers_.end(); ++it)
      if (it->first == id) {
        wakers_.erase(it);
        return;
      }
  }

 private:
  std::atomic<sqlite3*> watched_{nullptr};
  std::atomic<bool> armed_{false};
  std::mutex mu_;
  std::vector<std::pair<uint64_t, std::function<void()>>> wakers_;
  uint64_t next_id_ = 0;
};

}  // namespace mqtt_inbox::detail

// Internal (SQLite core): wakes the outbox relays of a database file after a commit whose
// transaction enqueued an outbox row, so that a row is published as soon as it is visible
// instead of at the relay's next poll (issue 27). A wake before the commit would be
// useless: the relay would read a snapshot without the row.
//
// One CommitWake per database file in the process (of_file), shared by every Inbox of the
// process on that file, so a commit on any connection the library opened to the file
// wakes every relay of it: the Inbox's own (a handler's claim, Inbox::with_connection and
// setup, Outbox::replay_dead), each StoreThenProcess worker's, another Inbox's opened with
// exclusive = false. Each such connection has a WalGuard (store/sqlite/wal_guard.h), whose WAL
// hook, which SQLite calls after each commit on it, calls committed() with its Watch.
// Outbox::enqueue arms the connection it was given inside the open transaction; a
// connection the library did not open (the application's own sqlite3 handle) is not
// watched: its commits wake nobody, and the application calls Relay::notify() (a WAL hook
// of ours on it would replace SQLite's automatic checkpoints there). A transaction that
// rolls back leaves its connection armed: its next commit then wakes the relays for
// nothing, which costs them one read of the outbox.
//
// Thread safety: every method may be called from any thread. arm() and committed() come
// from the thread using the connection (its users serialise on it). A waker runs on the
// committing thread under this object's mutex: it must only signal (Relay::notify), never
// block or call back into the inbox.
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace mqtt_inbox::detail {

class CommitWake {
 public:
  // A watched connection, owned by its WalGuard for the connection's lifetime.
  struct Watch {
    explicit Watch(sqlite3* d) : db(d) {}
    sqlite3* const db;
    std::atomic<bool> armed{false};
  };

  // The CommitWake of the database file at `path` in this process, found by device and
  // inode and made on first use; kept while anyone holds it. A path that cannot be
  // stat'ed (not a file yet) gets one of its own.
  static std::shared_ptr<CommitWake> of_file(const std::string& path);

  // Registers a connection's Watch (not owned) / removes it, before the connection closes.
  void watch(Watch* w) {
    std::lock_guard<std::mutex> lock(mu_);
    watches_.push_back(w);
  }
  void unwatch(Watch* w) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = watches_.begin(); it != watches_.end(); ++it)
      if (*it == w) {
        watches_.erase(it);
        return;
      }
  }

  // By Outbox::enqueue, inside the open transaction on `db`: if `db` is watched, its next
  // commit wakes the wakers.
  void arm(sqlite3* db) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Watch* w : watches_)
      if (w->db == db) {
        w->armed.store(true, std::memory_order_relaxed);
        return;
      }
  }

  // After each commit on the connection of `w`. One relaxed load when nothing was
  // enqueued: no lock, no call.
  void committed(Watch& w) {
    if (!w.armed.load(std::memory_order_relaxed)) return;
    w.armed.store(false, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& waker : wakers_) waker.second();
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
  std::mutex mu_;
  std::vector<Watch*> watches_;
  std::vector<std::pair<uint64_t, std::function<void()>>> wakers_;
  uint64_t next_id_ = 0;
};

}  // namespace mqtt_inbox::detail

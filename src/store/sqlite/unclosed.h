// Internal: where the SQLite store keeps a connection wrapper it must not destroy.
#pragma once

#include <SQLiteCpp/Database.h>

#include <memory>
#include <mutex>
#include <vector>

namespace mqtt_inbox::detail {

// Keeps `db`'s SQLiteCpp wrapper for the life of the process without running its
// destructor. That destructor closes the connection and asserts when the close fails (a
// statement of the application still prepared, or a connection a handler closed itself);
// the caller has already made the connection a zombie with sqlite3_close_v2, which SQLite
// frees once its last statement is finalized. Kept reachable, so a leak checker does not
// count it: a few dozen bytes per such handler mistake. Thread-safe.
inline void keep_unclosed(std::unique_ptr<SQLite::Database> db) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<SQLite::Database>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(db));
}

}  // namespace mqtt_inbox::detail

// Which SQLite::Database a C caller's sqlite3* stands for, while the library runs its code
// inside a transaction: a handler of a C consumer, or a set-up function. The outbox's
// enqueue takes the C++ connection that is in the transaction (Outbox::enqueue); a C
// caller has only the sqlite3*, so the library keeps, per thread, the connections it has
// lent out, innermost first. Also carries what an enqueue refused, so the handler's
// outcome can follow it (c.h, mqtt_inbox_outbox_enqueue).
#pragma once

#include <sqlite3.h>

#include <string>

namespace SQLite {
class Database;
}

namespace mqtt_inbox::capi {

class ConnectionScope {
 public:
  enum class Refusal { kNone, kRefused, kFull };

  // Lends `db` to the C code run while this object lives, on this thread.
  explicit ConnectionScope(SQLite::Database* db) noexcept;
  ~ConnectionScope();
  ConnectionScope(const ConnectionScope&) = delete;
  ConnectionScope& operator=(const ConnectionScope&) = delete;

  // The innermost scope on this thread whose connection is `handle`, or null: the
  // caller is not inside a transaction the library lent it.
  static ConnectionScope* find(sqlite3* handle) noexcept;

  SQLite::Database& db() const { return *db_; }
  // An enqueue refused in this scope (the first refusal counts).
  void note_refusal(Refusal r, const std::string& text);
  Refusal refusal() const { return refusal_; }
  const std::string& refusal_text() const { return refusal_text_; }

 private:
  SQLite::Database* db_;
  ConnectionScope* outer_;
  Refusal refusal_ = Refusal::kNone;
  std::string refusal_text_;
};

}  // namespace mqtt_inbox::capi

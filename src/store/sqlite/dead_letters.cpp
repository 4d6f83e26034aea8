// SqliteDeadLetters (store/dead_letters.h): what could not be processed, written by the
// per-message path and read, replayed and purged by the application and the admin tool,
// on the SQLite store. All of their SQL is in this file.
#include <sqlite3.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <functional>
#include <mutex>
#include <vector>

#include "store/reentry.h"
#include "store/sqlite/store.h"
#include "store/sqlite/util.h"

namespace mqtt_inbox::detail {

namespace {

constexpr const char* kDeadLetterColumns =
    "id, consumer_name, message_id, topic, payload, payload_size, properties, qos, reason,"
    " reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at,"
    " redeliveries, status, replayed_at";

DeadLetter read_dead_letter(SQLite::Statement& q) {
  DeadLetter d;
  d.id = q.getColumn(0).getInt64();
  d.consumer_name = q.getColumn(1).getString();
  if (!q.getColumn(2).isNull()) d.message_id = q.getColumn(2).getString();
  d.topic = q.getColumn(3).getString();
  d.payload = q.getColumn(4).getString();
  d.payload_size = q.getColumn(5).getInt64();
  d.properties_json = q.getColumn(6).isNull() ? "{}" : q.getColumn(6).getString();
  d.qos = q.getColumn(7).getInt();
  if (!parse_dead_letter_reason(q.getColumn(8).getString(), &d.reason))
    d.reason = DeadLetterReason::kHandlerFailed;
  d.reason_text = q.getColumn(9).getString();
  d.attempts = q.getColumn(10).getInt();
  d.first_attempt_at_ms = q.getColumn(11).getInt64();
  d.last_attempt_at_ms = q.getColumn(12).getInt64();
  d.dead_lettered_at_ms = q.getColumn(13).getInt64();
  d.redeliveries = q.getColumn(14).getInt();
  d.replayed = q.getColumn(15).getString() == "replayed";
  d.requeued = q.getColumn(15).getString() == "requeued";
  if (!q.getColumn(16).isNull()) d.replayed_at_ms = q.getColumn(16).getInt64();
  return d;
}

// WHERE clause and bindings for a DeadLetterFilter.
struct FilterSql {
  std::string where;
  std::vector<std::function<void(SQLite::Statement&, int)>> binds;
};

FilterSql filter_sql(const DeadLetterFilter& f) {
  FilterSql s;
  std::vector<std::string> terms;
  if (f.consumer_name) {
    terms.push_back("consumer_name = ?");
    std::string v = *f.consumer_name;
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (f.reason) {
    terms.push_back("reason = ?");
    std::string v = to_string(*f.reason);
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (f.message_id) {
    terms.push_back("message_id = ?");
    std::string v = *f.message_id;
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (f.since_ms) {
    terms.push_back("dead_lettered_at >= ?");
    int64_t v = *f.since_ms;
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (f.before_ms) {
    terms.push_back("dead_lettered_at < ?");
    int64_t v = *f.before_ms;
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (!f.include_replayed) terms.push_back("status <> 'replayed'");
  for (size_t i = 0; i < terms.size(); ++i) s.where += (i ? " AND " : " WHERE ") + terms[i];
  return s;
}

}  // namespace

Status SqliteDeadLetters::add(const DeadLetter& dl, std::optional<int64_t> replace_id,
                              int64_t* id) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::add"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  SqliteStore& m = s_;
  SQLite::Database& db = *m.db;
  const int64_t now = m.clock->wall_ms();
  bool counted = false;  // a new or replaced dead letter, not a redelivery bump
  try {
    m.write_transaction([&] {
      // The row this call ends on (a plain pair, not an optional: GCC 12 at -O2 under TSan
      // took the optional's value for uninitialised after a reset()).
      bool have_row = replace_id.has_value();
      int64_t row = replace_id.value_or(0);
      if (!have_row && dl.message_id) {
        SQLite::Statement q(db,
                            "SELECT id FROM inbox_dead_letters WHERE consumer_name = ?1"
                            " AND message_id = ?2 AND status IN ('dead', 'requeued')"
                            " ORDER BY id DESC LIMIT 1");
        q.bind(1, dl.consumer_name);
        q.bind(2, *dl.message_id);
        if (q.executeStep()) {
          row = q.getColumn(0).getInt64();
          have_row = true;
          SQLite::Statement u(db,
                              "UPDATE inbox_dead_letters SET redeliveries = redeliveries + 1"
                              " WHERE id = ?1");
          u.bind(1, row);
          u.exec();
        }
      } else if (have_row) {
        SQLite::Statement u(db,
                            "UPDATE inbox_dead_letters SET reason = ?2, reason_text = ?3,"
                            " attempts = ?4, last_attempt_at = ?5, dead_lettered_at = ?6,"
                            " status = ?7, replayed_at = NULL WHERE id = ?1");
        u.bind(1, row);
        u.bind(2, to_string(dl.reason));
        u.bind(3, dl.reason_text);
        u.bind(4, dl.attempts);
        u.bind(5, dl.last_attempt_at_ms);
        u.bind(6, now);
        u.bind(7, dl.requeued ? "requeued" : "dead");
        // Purged while its replay ran: write it again rather than lose the message (and
        // rather than fail for ever in the caller's store retry).
        if (u.exec() == 0) have_row = false;
        counted = true;
      }
      if (!have_row) {
        SQLite::Statement q(db,
                            "INSERT INTO inbox_dead_letters (consumer_name, message_id, topic,"
                            " payload, payload_size, properties, qos, reason, reason_text,"
                            " attempts, first_attempt_at, last_attempt_at, dead_lettered_at,"
                            " retention_at, status)"
                            " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
                            " ?15)");
        q.bind(1, dl.consumer_name);
        if (dl.message_id) q.bind(2, *dl.message_id);
        q.bind(3, dl.topic);
        q.bind(4, dl.payload.data(), static_cast<int>(dl.payload.size()));
        q.bind(5, dl.payload_size);
        q.bind(6, dl.properties_json);
        q.bind(7, dl.qos);
        q.bind(8, to_string(dl.reason));
        q.bind(9, dl.reason_text);
        q.bind(10, dl.attempts);
        q.bind(11, dl.first_attempt_at_ms ? dl.first_attempt_at_ms : now);
        q.bind(12, dl.last_attempt_at_ms ? dl.last_attempt_at_ms : now);
        q.bind(13, now);
        q.bind(14, m.retention_clock());
        q.bind(15, dl.requeued ? "requeued" : "dead");
        q.exec();
        row = db.getLastInsertRowid();
        counted = true;
      }
      if (dl.message_id) {
        SQLite::Statement& q = *m.delete_attempts;
        StatementReset reset(q);
        q.bind(1, dl.consumer_name);
        q.bind(2, *dl.message_id);
        q.exec();
      }
      *id = row;
    });
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "writing dead letter"));
  }
  if (counted && !dl.requeued) ++m.dead_lettered;  // a parked message is not dead
  return Status::Ok();
}

Status SqliteDeadLetters::list(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::list"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  out->clear();
  try {
    FilterSql f = filter_sql(filter);
    std::string sql = std::string("SELECT ") + kDeadLetterColumns + " FROM inbox_dead_letters" +
                      f.where + " ORDER BY id DESC";
    if (filter.limit > 0) sql += " LIMIT " + std::to_string(filter.limit);
    SQLite::Statement q(*s_.db, sql);
    for (size_t i = 0; i < f.binds.size(); ++i) f.binds[i](q, static_cast<int>(i + 1));
    while (q.executeStep()) out->push_back(read_dead_letter(q));
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "listing dead letters"));
  }
  return Status::Ok();
}

Status SqliteDeadLetters::get(int64_t id, DeadLetter* out) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::get"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  try {
    SQLite::Statement q(*s_.db, std::string("SELECT ") + kDeadLetterColumns +
                                    " FROM inbox_dead_letters WHERE id = ?1");
    q.bind(1, id);
    if (!q.executeStep())
      return Status::NotFound("dead letter " + std::to_string(id) + " not found");
    *out = read_dead_letter(q);
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "reading dead letter"));
  }
  return Status::Ok();
}

Status SqliteDeadLetters::purge(const DeadLetterFilter& filter, int64_t* removed) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::purge"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  try {
    FilterSql f = filter_sql(filter);
    s_.write_transaction([&] {
      SQLite::Statement q(*s_.db, "DELETE FROM inbox_dead_letters" + f.where);
      for (size_t i = 0; i < f.binds.size(); ++i) f.binds[i](q, static_cast<int>(i + 1));
      *removed = q.exec();
    });
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "purging dead letters"));
  }
  return Status::Ok();
}

Status SqliteDeadLetters::requeue(int64_t id) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::requeue"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  SQLite::Database& db = *s_.db;
  Status refusal;
  try {
    s_.write_transaction([&] {
      SQLite::Statement q(db,
                          "SELECT d.status, length(d.payload) < d.payload_size,"
                          "       EXISTS(SELECT 1 FROM inbox_messages m WHERE"
                          "              m.consumer_name = d.consumer_name AND"
                          "              m.message_id = d.message_id)"
                          "  FROM inbox_dead_letters d WHERE d.id = ?1");
      q.bind(1, id);
      const std::string row = "dead letter " + std::to_string(id);
      if (!q.executeStep()) {
        refusal = Status::NotFound(row + " not found");
        return;
      }
      const std::string status = q.getColumn(0).getString();
      if (status != "dead")
        refusal = Status::InvalidArgument(row + " is '" + status + "', not 'dead': refused, a " +
                                          "dead letter is replayed at most once at a time");
      else if (q.getColumn(1).getInt() != 0)
        refusal = Status::InvalidArgument(row + " holds a cut payload; it cannot be replayed");
      else if (q.getColumn(2).getInt() != 0)
        refusal = Status::InvalidArgument(
            row + " belongs to a store-then-process consumer: " + "use StoreThenProcess::replay");
      if (!refusal.ok()) return;
      SQLite::Statement u(db, "UPDATE inbox_dead_letters SET status = 'requeued' WHERE id = ?1");
      u.bind(1, id);
      u.exec();
    });
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "requeuing dead letter"));
  }
  return refusal;
}

Status SqliteDeadLetters::requeued(const std::string& consumer, int64_t limit,
                                   std::vector<int64_t>* ids) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::requeued"); !r.ok()) return r;
  if (s_.fatal.load()) return s_.fatal_status();
  std::lock_guard<std::mutex> lock(s_.mu);
  ids->clear();
  try {
    // Served by the partial index inbox_dead_letters_requeued (schema.sql).
    SQLite::Statement q(*s_.db,
                        "SELECT id FROM inbox_dead_letters WHERE consumer_name = ?1"
                        " AND status = 'requeued' ORDER BY id LIMIT ?2");
    q.bind(1, consumer);
    q.bind(2, limit);
    while (q.executeStep()) ids->push_back(q.getColumn(0).getInt64());
  } catch (const SQLite::Exception& e) {
    return s_.store_error(to_status(e, "listing requeued dead letters"));
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

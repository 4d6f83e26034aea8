// The SQLite store's dead-letter rows (store/backend.h): what could not be processed,
// written by the per-message path and read, replayed and purged by the application and
// the admin tool. The rules are the front's (store/dead_letters.cpp). All of their SQL is
// in this file.
#include <sqlite3.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <functional>
#include <mutex>
#include <vector>

#include "store/sqlite/backend.h"
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

std::optional<int64_t> SqliteBackend::open_dead_letter(const ClaimKey& key) {
  SQLite::Statement q(*db,
                      "SELECT id FROM inbox_dead_letters WHERE consumer_name = ?1"
                      " AND message_id = ?2 AND status IN ('dead', 'requeued')"
                      " ORDER BY id DESC LIMIT 1");
  q.bind(1, key.consumer);
  q.bind(2, key.message_id);
  if (!q.executeStep()) return std::nullopt;
  return q.getColumn(0).getInt64();
}

void SqliteBackend::count_redelivery(int64_t dead_letter_id) {
  SQLite::Statement u(
      *db, "UPDATE inbox_dead_letters SET redeliveries = redeliveries + 1 WHERE id = ?1");
  u.bind(1, dead_letter_id);
  u.exec();
}

bool SqliteBackend::rewrite_dead_letter(int64_t id, const DeadLetter& dl, int64_t now_ms) {
  SQLite::Statement u(*db,
                      "UPDATE inbox_dead_letters SET reason = ?2, reason_text = ?3,"
                      " attempts = ?4, last_attempt_at = ?5, dead_lettered_at = ?6,"
                      " status = ?7, replayed_at = NULL WHERE id = ?1");
  u.bind(1, id);
  u.bind(2, to_string(dl.reason));
  u.bind(3, dl.reason_text);
  u.bind(4, dl.attempts);
  u.bind(5, dl.last_attempt_at_ms);
  u.bind(6, now_ms);
  u.bind(7, dl.requeued ? "requeued" : "dead");
  return u.exec() > 0;
}

int64_t SqliteBackend::insert_dead_letter(const DeadLetter& dl, int64_t now_ms) {
  SQLite::Statement q(*db,
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
  q.bind(11, dl.first_attempt_at_ms ? dl.first_attempt_at_ms : now_ms);
  q.bind(12, dl.last_attempt_at_ms ? dl.last_attempt_at_ms : now_ms);
  q.bind(13, now_ms);
  q.bind(14, retention_clock());
  q.bind(15, dl.requeued ? "requeued" : "dead");
  q.exec();
  return db->getLastInsertRowid();
}

void SqliteBackend::list_dead_letters(const DeadLetterFilter& filter,
                                      std::vector<DeadLetter>* out) {
  FilterSql f = filter_sql(filter);
  std::string sql = std::string("SELECT ") + kDeadLetterColumns + " FROM inbox_dead_letters" +
                    f.where + " ORDER BY id DESC";
  if (filter.limit > 0) sql += " LIMIT " + std::to_string(filter.limit);
  SQLite::Statement q(*db, sql);
  for (size_t i = 0; i < f.binds.size(); ++i) f.binds[i](q, static_cast<int>(i + 1));
  while (q.executeStep()) out->push_back(read_dead_letter(q));
}

bool SqliteBackend::get_dead_letter(int64_t id, DeadLetter* out) {
  SQLite::Statement q(
      *db, std::string("SELECT ") + kDeadLetterColumns + " FROM inbox_dead_letters WHERE id = ?1");
  q.bind(1, id);
  if (!q.executeStep()) return false;
  *out = read_dead_letter(q);
  return true;
}

int64_t SqliteBackend::purge_dead_letters(const DeadLetterFilter& filter) {
  FilterSql f = filter_sql(filter);
  SQLite::Statement q(*db, "DELETE FROM inbox_dead_letters" + f.where);
  for (size_t i = 0; i < f.binds.size(); ++i) f.binds[i](q, static_cast<int>(i + 1));
  return q.exec();
}

RequeueFacts SqliteBackend::requeue_facts(int64_t id) {
  SQLite::Statement q(*db,
                      "SELECT d.status, length(d.payload) < d.payload_size,"
                      "       EXISTS(SELECT 1 FROM inbox_messages m WHERE"
                      "              m.consumer_name = d.consumer_name AND"
                      "              m.message_id = d.message_id)"
                      "  FROM inbox_dead_letters d WHERE d.id = ?1");
  q.bind(1, id);
  RequeueFacts f;
  if (!q.executeStep()) return f;
  f.found = true;
  f.status = q.getColumn(0).getString();
  f.cut_payload = q.getColumn(1).getInt() != 0;
  f.stored = q.getColumn(2).getInt() != 0;
  return f;
}

void SqliteBackend::set_requeued(int64_t id) {
  SQLite::Statement u(*db, "UPDATE inbox_dead_letters SET status = 'requeued' WHERE id = ?1");
  u.bind(1, id);
  u.exec();
}

void SqliteBackend::requeued_dead_letters(const std::string& consumer, int64_t limit,
                                          std::vector<int64_t>* ids) {
  // Served by the partial index inbox_dead_letters_requeued (schema.sql).
  SQLite::Statement q(*db,
                      "SELECT id FROM inbox_dead_letters WHERE consumer_name = ?1"
                      " AND status = 'requeued' ORDER BY id LIMIT ?2");
  q.bind(1, consumer);
  q.bind(2, limit);
  while (q.executeStep()) ids->push_back(q.getColumn(0).getInt64());
}

}  // namespace mqtt_inbox::detail

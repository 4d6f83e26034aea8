// PgDeadLetters (store/dead_letters.h) on the PostgreSQL store: the same rows and rules as
// the SQLite store's (store/sqlite/dead_letters.cpp), one transaction per call. All of
// their SQL is in this file.
#include <pqxx/pqxx>

#include <string>
#include <vector>

#include "store/postgres/store.h"
#include "store/reentry.h"

namespace mqtt_inbox::detail {

namespace {

constexpr const char* kColumns =
    "id, consumer_name, message_id, topic, payload, payload_size, properties, qos, reason,"
    " reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at,"
    " redeliveries, status, replayed_at";

DeadLetter read_row(const pqxx::row& r) {
  DeadLetter d;
  d.id = r[0].as<int64_t>();
  d.consumer_name = r[1].as<std::string>();
  if (!r[2].is_null()) d.message_id = r[2].as<std::string>();
  d.topic = r[3].as<std::string>();
  d.payload = pqxx::binarystring(r[4]).str();
  d.payload_size = r[5].as<int64_t>();
  d.properties_json = r[6].is_null() ? "{}" : r[6].as<std::string>();
  d.qos = r[7].as<int>();
  if (!parse_dead_letter_reason(r[8].as<std::string>(), &d.reason))
    d.reason = DeadLetterReason::kHandlerFailed;
  d.reason_text = r[9].as<std::string>();
  d.attempts = r[10].as<int>();
  d.first_attempt_at_ms = r[11].as<int64_t>();
  d.last_attempt_at_ms = r[12].as<int64_t>();
  d.dead_lettered_at_ms = r[13].as<int64_t>();
  d.redeliveries = r[14].as<int>();
  const std::string status = r[15].as<std::string>();
  d.replayed = status == "replayed";
  d.requeued = status == "requeued";
  if (!r[16].is_null()) d.replayed_at_ms = r[16].as<int64_t>();
  return d;
}

// A filter's WHERE clause with its values inlined, quoted by the connection.
std::string where_of(const DeadLetterFilter& f, pqxx::transaction_base& w) {
  std::vector<std::string> terms;
  if (f.consumer_name) terms.push_back("consumer_name = " + w.quote(*f.consumer_name));
  if (f.reason) terms.push_back("reason = " + w.quote(std::string(to_string(*f.reason))));
  if (f.message_id) terms.push_back("message_id = " + w.quote(*f.message_id));
  if (f.since_ms) terms.push_back("dead_lettered_at >= " + std::to_string(*f.since_ms));
  if (f.before_ms) terms.push_back("dead_lettered_at < " + std::to_string(*f.before_ms));
  if (!f.include_replayed) terms.push_back("status <> 'replayed'");
  std::string where;
  for (size_t i = 0; i < terms.size(); ++i) where += (i ? " AND " : " WHERE ") + terms[i];
  return where;
}

}  // namespace

Status PgDeadLetters::add(const DeadLetter& dl, std::optional<int64_t> replace_id, int64_t* id) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::add"); !r.ok()) return r;
  const std::string table = s_.t("inbox_dead_letters");
  const int64_t now = s_.clock->wall_ms();
  bool counted = false;
  const Status st = s_.with_txn("writing dead letter", [&](pqxx::work& w) {
    counted = false;
    bool have_row = replace_id.has_value();
    int64_t row = replace_id.value_or(0);
    if (!have_row && dl.message_id) {
      const pqxx::result r = w.exec_params(
          "UPDATE " + table + " SET redeliveries = redeliveries + 1 WHERE id = (SELECT id FROM " +
              table +
              " WHERE consumer_name = $1 AND message_id = $2 AND status IN ('dead', 'requeued')"
              " ORDER BY id DESC LIMIT 1) RETURNING id",
          dl.consumer_name, *dl.message_id);
      if (!r.empty()) {
        row = r[0][0].as<int64_t>();
        have_row = true;
      }
    } else if (have_row) {
      const pqxx::result r = w.exec_params(
          "UPDATE " + table +
              " SET reason = $2, reason_text = $3, attempts = $4, last_attempt_at = $5,"
              " dead_lettered_at = $6, status = $7, replayed_at = NULL WHERE id = $1",
          row, std::string(to_string(dl.reason)), dl.reason_text, dl.attempts,
          dl.last_attempt_at_ms, now, std::string(dl.requeued ? "requeued" : "dead"));
      if (r.affected_rows() == 0) have_row = false;  // purged meanwhile: written anew
      counted = true;
    }
    if (!have_row) {
      const pqxx::row r = w.exec_params1(
          "INSERT INTO " + table +
              " (consumer_name, message_id, topic, payload, payload_size, properties, qos,"
              " reason, reason_text, attempts, first_attempt_at, last_attempt_at,"
              " dead_lettered_at, retention_at, status)"
              " VALUES ($1, $2, $3, $4::bytea, $5, $6, $7, $8, $9, $10, $11, $12, $13, " +
              std::string(kPgNowMs) + ", $14) RETURNING id",
          dl.consumer_name, dl.message_id ? dl.message_id->c_str() : nullptr, dl.topic,
          w.esc_raw(dl.payload), dl.payload_size, dl.properties_json, dl.qos,
          std::string(to_string(dl.reason)), dl.reason_text, dl.attempts,
          dl.first_attempt_at_ms ? dl.first_attempt_at_ms : now,
          dl.last_attempt_at_ms ? dl.last_attempt_at_ms : now, now,
          std::string(dl.requeued ? "requeued" : "dead"));
      row = r[0].as<int64_t>();
      counted = true;
    }
    if (dl.message_id)
      w.exec_params0(
          "DELETE FROM " + s_.t("inbox_attempts") + " WHERE consumer_name = $1 AND message_id = $2",
          dl.consumer_name, *dl.message_id);
    *id = row;
  });
  if (st.ok() && counted && !dl.requeued) ++s_.dead_lettered;
  return st;
}

Status PgDeadLetters::list(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::list"); !r.ok()) return r;
  out->clear();
  return s_.with_txn("listing dead letters", [&](pqxx::work& w) {
    out->clear();
    std::string sql = std::string("SELECT ") + kColumns + " FROM " + s_.t("inbox_dead_letters") +
                      where_of(filter, w) + " ORDER BY id DESC";
    if (filter.limit > 0) sql += " LIMIT " + std::to_string(filter.limit);
    for (const pqxx::row& r : w.exec(sql)) out->push_back(read_row(r));
  });
}

Status PgDeadLetters::get(int64_t id, DeadLetter* out) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::get"); !r.ok()) return r;
  bool found = false;
  const Status st = s_.with_txn("reading dead letter", [&](pqxx::work& w) {
    const pqxx::result r = w.exec_params(std::string("SELECT ") + kColumns + " FROM " +
                                             s_.t("inbox_dead_letters") + " WHERE id = $1",
                                         id);
    found = !r.empty();
    if (found) *out = read_row(r[0]);
  });
  if (!st.ok()) return st;
  if (!found) return Status::NotFound("dead letter " + std::to_string(id) + " not found");
  return Status::Ok();
}

Status PgDeadLetters::purge(const DeadLetterFilter& filter, int64_t* removed) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::purge"); !r.ok()) return r;
  return s_.with_txn("purging dead letters", [&](pqxx::work& w) {
    *removed = static_cast<int64_t>(
        w.exec("DELETE FROM " + s_.t("inbox_dead_letters") + where_of(filter, w)).affected_rows());
  });
}

Status PgDeadLetters::requeue(int64_t id) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::requeue"); !r.ok()) return r;
  Status refusal;
  const Status st = s_.with_txn("requeuing dead letter", [&](pqxx::work& w) {
    refusal = Status::Ok();
    const std::string row = "dead letter " + std::to_string(id);
    const pqxx::result r = w.exec_params(
        "SELECT d.status, length(d.payload) < d.payload_size,"
        " EXISTS (SELECT 1 FROM " +
            s_.t("inbox_messages") +
            " m WHERE m.consumer_name = d.consumer_name"
            "                AND m.message_id = d.message_id)"
            " FROM " +
            s_.t("inbox_dead_letters") + " d WHERE d.id = $1 FOR UPDATE OF d",
        id);
    if (r.empty()) {
      refusal = Status::NotFound(row + " not found");
      return;
    }
    const std::string status = r[0][0].as<std::string>();
    if (status != "dead")
      refusal = Status::InvalidArgument(row + " is '" + status + "', not 'dead': refused, a " +
                                        "dead letter is replayed at most once at a time");
    else if (r[0][1].as<bool>())
      refusal = Status::InvalidArgument(row + " holds a cut payload; it cannot be replayed");
    else if (r[0][2].as<bool>())
      refusal = Status::InvalidArgument(
          row + " belongs to a store-then-process consumer: " + "use StoreThenProcess::replay");
    if (!refusal.ok()) return;
    w.exec_params0(
        "UPDATE " + s_.t("inbox_dead_letters") + " SET status = 'requeued' WHERE id = $1", id);
  });
  return st.ok() ? refusal : st;
}

Status PgDeadLetters::requeued(const std::string& consumer, int64_t limit,
                               std::vector<int64_t>* ids) {
  if (Status r = refuse_if_in_handler(s_.owner, "DeadLetterStore::requeued"); !r.ok()) return r;
  ids->clear();
  return s_.with_txn("listing requeued dead letters", [&](pqxx::work& w) {
    ids->clear();
    for (const pqxx::row& r :
         w.exec_params("SELECT id FROM " + s_.t("inbox_dead_letters") +
                           " WHERE consumer_name = $1 AND status = 'requeued' ORDER BY id LIMIT $2",
                       consumer, limit))
      ids->push_back(r[0].as<int64_t>());
  });
}

}  // namespace mqtt_inbox::detail

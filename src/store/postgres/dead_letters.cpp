// The PostgreSQL store's dead-letter rows (store/backend.h): the same rows as the SQLite
// store's, the rules the front's (store/dead_letters.cpp). All of their SQL is in this file.
#include <pqxx/pqxx>

#include <string>
#include <vector>

#include "store/postgres/backend.h"

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

std::optional<int64_t> PgBackend::open_dead_letter(const ClaimKey& key) {
  const pqxx::result r =
      tx().exec_params("SELECT id FROM " + t("inbox_dead_letters") +
                           " WHERE consumer_name = $1 AND message_id = $2"
                           " AND status IN ('dead', 'requeued') ORDER BY id DESC LIMIT 1",
                       key.consumer, key.message_id);
  if (r.empty()) return std::nullopt;
  return r[0][0].as<int64_t>();
}

void PgBackend::count_redelivery(int64_t dead_letter_id) {
  tx().exec_params0(
      "UPDATE " + t("inbox_dead_letters") + " SET redeliveries = redeliveries + 1 WHERE id = $1",
      dead_letter_id);
}

bool PgBackend::rewrite_dead_letter(int64_t id, const DeadLetter& dl, int64_t now_ms) {
  const pqxx::result r = tx().exec_params(
      "UPDATE " + t("inbox_dead_letters") +
          " SET reason = $2, reason_text = $3, attempts = $4, last_attempt_at = $5,"
          " dead_lettered_at = $6, status = $7, replayed_at = NULL WHERE id = $1",
      id, std::string(to_string(dl.reason)), dl.reason_text, dl.attempts, dl.last_attempt_at_ms,
      now_ms, std::string(dl.requeued ? "requeued" : "dead"));
  return r.affected_rows() > 0;
}

int64_t PgBackend::insert_dead_letter(const DeadLetter& dl, int64_t now_ms) {
  pqxx::transaction_base& w = tx();
  const pqxx::row r = w.exec_params1(
      "INSERT INTO " + t("inbox_dead_letters") +
          " (consumer_name, message_id, topic, payload, payload_size, properties, qos,"
          " reason, reason_text, attempts, first_attempt_at, last_attempt_at,"
          " dead_lettered_at, retention_at, status)"
          " VALUES ($1, $2, $3, $4::bytea, $5, $6, $7, $8, $9, $10, $11, $12, $13, " +
          std::string(kPgNowMs) + ", $14) RETURNING id",
      dl.consumer_name, dl.message_id ? dl.message_id->c_str() : nullptr, dl.topic,
      w.esc_raw(dl.payload), dl.payload_size, dl.properties_json, dl.qos,
      std::string(to_string(dl.reason)), dl.reason_text, dl.attempts,
      dl.first_attempt_at_ms ? dl.first_attempt_at_ms : now_ms,
      dl.last_attempt_at_ms ? dl.last_attempt_at_ms : now_ms, now_ms,
      std::string(dl.requeued ? "requeued" : "dead"));
  return r[0].as<int64_t>();
}

void PgBackend::list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) {
  pqxx::transaction_base& w = tx();
  std::string sql = std::string("SELECT ") + kColumns + " FROM " + t("inbox_dead_letters") +
                    where_of(filter, w) + " ORDER BY id DESC";
  if (filter.limit > 0) sql += " LIMIT " + std::to_string(filter.limit);
  for (const pqxx::row& r : w.exec(sql)) out->push_back(read_row(r));
}

bool PgBackend::get_dead_letter(int64_t id, DeadLetter* out) {
  const pqxx::result r = tx().exec_params(
      std::string("SELECT ") + kColumns + " FROM " + t("inbox_dead_letters") + " WHERE id = $1",
      id);
  if (r.empty()) return false;
  *out = read_row(r[0]);
  return true;
}

int64_t PgBackend::purge_dead_letters(const DeadLetterFilter& filter) {
  pqxx::transaction_base& w = tx();
  return static_cast<int64_t>(
      w.exec("DELETE FROM " + t("inbox_dead_letters") + where_of(filter, w)).affected_rows());
}

RequeueFacts PgBackend::requeue_facts(int64_t id) {
  const pqxx::result r = tx().exec_params(
      "SELECT d.status, length(d.payload) < d.payload_size,"
      " EXISTS (SELECT 1 FROM " +
          t("inbox_messages") +
          " m WHERE m.consumer_name = d.consumer_name"
          "                AND m.message_id = d.message_id)"
          " FROM " +
          t("inbox_dead_letters") + " d WHERE d.id = $1 FOR UPDATE OF d",
      id);
  RequeueFacts f;
  if (r.empty()) return f;
  f.found = true;
  f.status = r[0][0].as<std::string>();
  f.cut_payload = r[0][1].as<bool>();
  f.stored = r[0][2].as<bool>();
  return f;
}

void PgBackend::set_requeued(int64_t id) {
  tx().exec_params0("UPDATE " + t("inbox_dead_letters") + " SET status = 'requeued' WHERE id = $1",
                    id);
}

void PgBackend::requeued_dead_letters(const std::string& consumer, int64_t limit,
                                      std::vector<int64_t>* ids) {
  for (const pqxx::row& r : tx().exec_params(
           "SELECT id FROM " + t("inbox_dead_letters") +
               " WHERE consumer_name = $1 AND status = 'requeued' ORDER BY id LIMIT $2",
           consumer, limit))
    ids->push_back(r[0].as<int64_t>());
}

}  // namespace mqtt_inbox::detail

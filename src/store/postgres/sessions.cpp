// The session records' rows on the PostgreSQL store (store/backend.h). All SQL on
// inbox_sessions and inbox_session_filters of this store is in this file; the checks are
// SessionStore's (store/sessions.cpp).
#include <pqxx/pqxx>

#include "mqtt_inbox/session_record.h"
#include "store/postgres/backend.h"

namespace mqtt_inbox::detail {

void PgBackend::write_session(const SessionRecord& record) {
  pqxx::transaction_base& w = tx();
  w.exec_params0("INSERT INTO " + t("inbox_sessions") +
                     " (client_id, session_expiry_ms, expiry_source, updated_at)"
                     " VALUES ($1, $2, $3, $4)"
                     " ON CONFLICT (client_id) DO UPDATE SET"
                     " session_expiry_ms = excluded.session_expiry_ms,"
                     " expiry_source = excluded.expiry_source, updated_at = excluded.updated_at",
                 record.client_id, record.session_expiry_ms,
                 std::string(to_string(record.expiry_source)), record.updated_at_ms);
  w.exec_params0("DELETE FROM " + t("inbox_session_filters") + " WHERE client_id = $1",
                 record.client_id);
  for (const std::string& f : record.topic_filters)
    w.exec_params0(
        "INSERT INTO " + t("inbox_session_filters") + " (client_id, topic_filter) VALUES ($1, $2)",
        record.client_id, f);
}

void PgBackend::add_lost_session(const std::string& client_id, int64_t at_ms) {
  tx().exec_params0("UPDATE " + t("inbox_sessions") +
                        " SET sessions_lost = sessions_lost + 1, last_lost_at = $2"
                        " WHERE client_id = $1",
                    client_id, at_ms);
}

void PgBackend::read_sessions(const std::string* client_id, std::vector<SessionRecord>* out) {
  pqxx::transaction_base& w = tx();
  const pqxx::result r = w.exec_params(
      "SELECT client_id, session_expiry_ms, expiry_source, updated_at, sessions_lost,"
      " coalesce(last_lost_at, 0) FROM " +
          t("inbox_sessions") + " WHERE $1::text IS NULL OR client_id = $1 ORDER BY client_id",
      client_id ? client_id->c_str() : nullptr);
  for (const pqxx::row& row : r) {
    SessionRecord rec;
    rec.client_id = row[0].as<std::string>();
    rec.session_expiry_ms = row[1].as<int64_t>();
    if (!parse_session_expiry_source(row[2].as<std::string>(), &rec.expiry_source))
      rec.expiry_source = SessionExpirySource::kDeclared;
    rec.updated_at_ms = row[3].as<int64_t>();
    rec.sessions_lost = row[4].as<int64_t>();
    rec.last_lost_at_ms = row[5].as<int64_t>();
    for (const pqxx::row& f :
         w.exec_params("SELECT topic_filter FROM " + t("inbox_session_filters") +
                           " WHERE client_id = $1 ORDER BY topic_filter",
                       rec.client_id))
      rec.topic_filters.push_back(f[0].as<std::string>());
    out->push_back(std::move(rec));
  }
}

bool PgBackend::remove_session(const std::string& client_id) {
  return tx().exec_params("DELETE FROM " + t("inbox_sessions") + " WHERE client_id = $1", client_id)
             .affected_rows() > 0;
}

}  // namespace mqtt_inbox::detail

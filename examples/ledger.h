// The ledger example's business logic: apply a JSON credit to an account balance and
// append it to a ledger, inside the inbox's transaction. Shared by ledger_consumer and
// the crash tests, so both apply exactly the same change.
//
// Payload: {"message_id": "...", "account": "...", "amount": <integer>}
#pragma once

#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>

#include <mqtt_inbox/handler.h>

namespace ledger {

// Business tables. Created through the inbox's connection at start-up.
inline void create_tables(SQLite::Database& db) {
  db.exec(
      "CREATE TABLE IF NOT EXISTS accounts ("
      "  account TEXT PRIMARY KEY, balance INTEGER NOT NULL);"
      "CREATE TABLE IF NOT EXISTS ledger_entries ("
      "  id INTEGER PRIMARY KEY, message_id TEXT NOT NULL, account TEXT NOT NULL,"
      "  amount INTEGER NOT NULL)");
}

// The handler. Bad input can never succeed, so it is reported as UndecodablePayload and
// dead-lettered at once instead of being retried.
inline void apply_credit(SQLite::Database& db, const mqtt_inbox::Delivery& d) {
  const auto j = nlohmann::json::parse(d.message.payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw mqtt_inbox::UndecodablePayload("payload is not a JSON object");
  const auto account = j.find("account");
  if (account == j.end() || !account->is_string() || account->get<std::string>().empty())
    throw mqtt_inbox::UndecodablePayload("'account' is missing or not a non-empty string");
  const auto amount = j.find("amount");
  if (amount == j.end() || !amount->is_number_integer())
    throw mqtt_inbox::UndecodablePayload("'amount' is missing or not an integer");
  if (amount->is_number_unsigned() && amount->get<uint64_t>() > INT64_MAX)
    throw mqtt_inbox::UndecodablePayload("'amount' does not fit in 64 bits");
  const int64_t value = amount->get<int64_t>();

  SQLite::Statement credit(db,
                           "INSERT INTO accounts (account, balance) VALUES (?1, ?2)"
                           " ON CONFLICT (account) DO UPDATE SET balance = balance + ?2");
  credit.bind(1, account->get<std::string>());
  credit.bind(2, value);
  credit.exec();
  SQLite::Statement entry(db,
                          "INSERT INTO ledger_entries (message_id, account, amount)"
                          " VALUES (?1, ?2, ?3)");
  entry.bind(1, d.message_id);
  entry.bind(2, account->get<std::string>());
  entry.bind(3, value);
  entry.exec();
}

}  // namespace ledger

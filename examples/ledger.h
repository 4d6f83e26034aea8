// The ledger example's business logic: apply a JSON credit to an account balance and
// append it to a ledger, inside the inbox's transaction. Shared by ledger_consumer and
// the crash tests, so both apply exactly the same change.
//
// Payload: {"message_id": "...", "account": "...", "amount": <integer>}
#pragma once

#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include <mqtt_inbox/handler.h>
#include <mqtt_inbox/payload_json.h>

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

// One credit, decoded. Bad input can never succeed, so it is reported as
// UndecodablePayload and dead-lettered at once instead of being retried.
struct Credit {
  std::string account;
  int64_t amount = 0;
};

// The payload is the consumer's parse when it took the id from the JSON field (no second
// parse), else parsed here (payload_json.h).
inline Credit decode_credit(const mqtt_inbox::Delivery& d) {
  nlohmann::json storage;
  const nlohmann::json& j = mqtt_inbox::payload_json(d, &storage);
  if (!j.is_object()) throw mqtt_inbox::UndecodablePayload("payload is not a JSON object");
  const auto account = j.find("account");
  if (account == j.end() || !account->is_string() || account->get<std::string>().empty())
    throw mqtt_inbox::UndecodablePayload("'account' is missing or not a non-empty string");
  const auto amount = j.find("amount");
  if (amount == j.end() || !amount->is_number_integer())
    throw mqtt_inbox::UndecodablePayload("'amount' is missing or not an integer");
  if (amount->is_number_unsigned() && amount->get<uint64_t>() > INT64_MAX)
    throw mqtt_inbox::UndecodablePayload("'amount' does not fit in 64 bits");
  return Credit{account->get<std::string>(), amount->get<int64_t>()};
}

constexpr const char* kCreditSql =
    "INSERT INTO accounts (account, balance) VALUES (?1, ?2)"
    " ON CONFLICT (account) DO UPDATE SET balance = balance + ?2";
constexpr const char* kEntrySql =
    "INSERT INTO ledger_entries (message_id, account, amount) VALUES (?1, ?2, ?3)";

// Writes one decoded credit with the two statements (reset afterwards, even on error).
inline void write_credit(SQLite::Statement& credit, SQLite::Statement& entry,
                         const std::string& message_id, const Credit& c) {
  struct Reset {
    SQLite::Statement& s;
    ~Reset() { s.tryReset(); }
  } reset_credit{credit}, reset_entry{entry};
  credit.bind(1, c.account);
  credit.bind(2, c.amount);
  credit.exec();
  entry.bind(1, message_id);
  entry.bind(2, c.account);
  entry.bind(3, c.amount);
  entry.exec();
}

// The handler as a plain function: prepares its two statements for every message. Fine
// for a store-then-process worker or a test; on the hot path use CreditHandler.
inline void apply_credit(SQLite::Database& db, const mqtt_inbox::Delivery& d) {
  const Credit c = decode_credit(d);
  SQLite::Statement credit(db, kCreditSql);
  SQLite::Statement entry(db, kEntrySql);
  write_credit(credit, entry, d.message_id, c);
}

// The handler as an object that prepares its statements once, on the first message, for
// the connection it is given (a Consumer always passes its inbox's connection). Preparing
// two statements per message cost more CPU than the rest of the per-message path
// together (docs/benchmarks.md, "CPU on the callback thread"). Copies share the prepared
// statements, so use one handler per Consumer. The statements belong to the inbox's
// connection: destroy the handler (the Consumer holding it) before the Inbox, as
// consumer.h requires anyway.
class CreditHandler {
 public:
  void operator()(SQLite::Database& db, const mqtt_inbox::Delivery& d) const {
    const Credit c = decode_credit(d);
    Prepared& p = *prepared_;
    if (p.db != &db) {  // first message, or another connection: prepare for this one
      p.credit = std::make_unique<SQLite::Statement>(db, kCreditSql);
      p.entry = std::make_unique<SQLite::Statement>(db, kEntrySql);
      p.db = &db;
    }
    write_credit(*p.credit, *p.entry, d.message_id, c);
  }

 private:
  struct Prepared {
    const SQLite::Database* db = nullptr;
    std::unique_ptr<SQLite::Statement> credit, entry;
  };
  std::shared_ptr<Prepared> prepared_ = std::make_shared<Prepared>();
};

// The event a credit emits downstream (ledger_consumer --emit-topic), read inside the
// credit's transaction: {"message_id", "source_message_id", "account", "amount",
// "balance" (after this credit)}. Call after the credit is written (apply_credit or
// CreditHandler).
inline std::string credited_event(SQLite::Database& db, const mqtt_inbox::Delivery& d,
                                  const std::string& event_id) {
  nlohmann::json storage;
  const nlohmann::json& j = mqtt_inbox::payload_json(d, &storage);
  const std::string account = j.at("account").get<std::string>();
  SQLite::Statement q(db, "SELECT balance FROM accounts WHERE account = ?");
  q.bind(1, account);
  q.executeStep();
  return nlohmann::json{{"message_id", event_id},
                        {"source_message_id", d.message_id},
                        {"account", account},
                        {"amount", j.at("amount")},
                        {"balance", q.getColumn(0).getInt64()}}
      .dump();
}

}  // namespace ledger

// The ledger example's business logic on PostgreSQL (ledger_consumer --db postgresql://...):
// the same tables and the same change as ledger.h, in the inbox's libpqxx transaction, so
// the credit commits with the claim or not at all. The same decode_credit: bad input is
// UndecodablePayload and dead-lettered at once.
//
// Built when the library has the PostgreSQL store (MQTT_INBOX_WITH_POSTGRES); the program
// links mqtt_inbox::postgres and calls mqtt_inbox::enable_postgres_store().
#pragma once

#include <mqtt_inbox/postgres.h>

#include <pqxx/pqxx>

#include "ledger.h"

namespace ledger::postgres {

// Business tables, in the connection's default schema (public), beside the inbox's own
// schema (InboxOptions::postgres_schema). Run by Inbox::setup_sql at start-up. They look
// before they create: PostgreSQL checks the CREATE privilege before IF NOT EXISTS, so a
// runtime role that may only use the tables (docs/postgres.md#privileges) would be refused
// at every start by CREATE TABLE IF NOT EXISTS.
constexpr const char* kCreateTables =
    "DO $$ BEGIN"
    "  IF to_regclass('accounts') IS NULL THEN"
    "    CREATE TABLE accounts (account text PRIMARY KEY, balance bigint NOT NULL);"
    "  END IF;"
    "  IF to_regclass('ledger_entries') IS NULL THEN"
    "    CREATE TABLE ledger_entries ("
    "      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text NOT NULL,"
    "      account text NOT NULL, amount bigint NOT NULL);"
    "  END IF;"
    " END $$";

// The handler (a PgHandler). A balance that would overflow is a data error (SQLSTATE
// 22003): a failed attempt, then a dead letter, as on SQLite.
inline void apply_credit(pqxx::transaction_base& txn, const mqtt_inbox::Delivery& d) {
  const Credit c = decode_credit(d);
  txn.exec_params0(
      "INSERT INTO accounts (account, balance) VALUES ($1, $2)"
      " ON CONFLICT (account) DO UPDATE SET balance = accounts.balance + excluded.balance",
      c.account, c.amount);
  txn.exec_params0("INSERT INTO ledger_entries (message_id, account, amount) VALUES ($1, $2, $3)",
                   d.message_id, c.account, c.amount);
}

// The event of an applied credit (ledger_consumer --emit-topic), as ledger::credited_event
// makes it on SQLite: the balance read in the same transaction, after the credit.
inline std::string credited_event(pqxx::transaction_base& txn, const mqtt_inbox::Delivery& d,
                                  const std::string& event_id) {
  const Credit c = decode_credit(d);
  const int64_t balance =
      txn.exec_params1("SELECT balance FROM accounts WHERE account = $1", c.account)[0]
          .as<int64_t>();
  return nlohmann::json{{"message_id", event_id},
                        {"source_message_id", d.message_id},
                        {"account", c.account},
                        {"amount", c.amount},
                        {"balance", balance}}
      .dump();
}

}  // namespace ledger::postgres

// event_consumer: the next hop after `ledger_consumer --emit-topic`: applies its
// "credited" events to a database of its own, exactly once, through mqtt-inbox.
//
//   event_consumer --broker tcp://127.0.0.1:1883 --client-id events-1
//                  --topic events/# --db events.db [--mqtt-version 3.1.1|5]
//
// Payload: {"message_id", "source_message_id", "account", "amount", "balance"}; the id
// also comes as the MQTT 5 user property message-id. A redelivered or re-sent event
// (same id) is skipped by the inbox; an event that cannot be decoded is dead-lettered.
// Each applied event adds one row to event_sources and counts in event_accounts, so the
// count per account and the set of source ids can be checked against the ledger's
// credits. The flags, start-up and stop are ledger_consumer's (consumer_service.h).
//
#include <SQLiteCpp/SQLiteCpp.h>
#include <mqtt_inbox/mqtt_inbox.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command_line.h"
#include "consumer_service.h"
#include "exit_codes.h"

namespace {

void create_tables(SQLite::Database& db) {
  db.exec(
      "CREATE TABLE IF NOT EXISTS event_accounts ("
      "  account TEXT PRIMARY KEY, events INTEGER NOT NULL, total INTEGER NOT NULL,"
      "  last_balance INTEGER NOT NULL);"
      "CREATE TABLE IF NOT EXISTS event_sources ("
      "  id INTEGER PRIMARY KEY, source_message_id TEXT NOT NULL, message_id TEXT NOT NULL,"
      "  account TEXT NOT NULL, amount INTEGER NOT NULL, balance INTEGER NOT NULL)");
}

// Runs inside the claim transaction: both writes commit with the event's id, or neither.
// The payload is the consumer's parse, made while it read the message id (payload_json.h).
void apply_event(SQLite::Database& db, const mqtt_inbox::Delivery& d) {
  nlohmann::json storage;
  const nlohmann::json& j = mqtt_inbox::payload_json(d, &storage);
  if (!j.is_object()) throw mqtt_inbox::UndecodablePayload("payload is not a JSON object");
  for (const char* field : {"source_message_id", "account"}) {
    const auto it = j.find(field);
    if (it == j.end() || !it->is_string() || it->get<std::string>().empty())
      throw mqtt_inbox::UndecodablePayload(std::string("'") + field +
                                           "' is missing or not a non-empty string");
  }
  for (const char* field : {"amount", "balance"}) {
    const auto it = j.find(field);
    if (it == j.end() || !it->is_number_integer() ||
        (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX))
      throw mqtt_inbox::UndecodablePayload(std::string("'") + field +
                                           "' is missing or not a 64-bit integer");
  }
  const std::string account = j.at("account").get<std::string>();
  const int64_t amount = j.at("amount").get<int64_t>(), balance = j.at("balance").get<int64_t>();
  SQLite::Statement count(db,
                          "INSERT INTO event_accounts (account, events, total, last_balance)"
                          " VALUES (?1, 1, ?2, ?3) ON CONFLICT (account) DO UPDATE SET"
                          " events = events + 1, total = total + ?2, last_balance = ?3");
  count.bind(1, account);
  count.bind(2, amount);
  count.bind(3, balance);
  count.exec();
  SQLite::Statement row(db,
                        "INSERT INTO event_sources (source_message_id, message_id, account,"
                        " amount, balance) VALUES (?, ?, ?, ?, ?)");
  row.bind(1, j.at("source_message_id").get<std::string>());
  row.bind(2, d.message_id);
  row.bind(3, account);
  row.bind(4, amount);
  row.bind(5, balance);
  row.exec();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Apply ledger_consumer's credited events exactly once (mqtt-inbox example)"};
  consumer_service::Flags flags;
  flags.consumer_name = "events";
  consumer_service::add(app, &flags);
  if (int rc = command_line::parse(app, argc, argv, "event_consumer"); rc >= 0) return rc;

  consumer_service::Service service("event_consumer", "events");
  if (int rc = service.open(flags, create_tables); rc != examples::kExitOk) return rc;
  return service.run(apply_event);
}

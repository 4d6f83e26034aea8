// event_consumer: the next hop after `ledger_consumer --emit-topic`: applies its
// "credited" events to a database of its own, exactly once, through mqtt-inbox.
//
//   event_consumer --broker tcp://127.0.0.1:1883 --client-id events-1
//                  --topic events/# --db events.db [--mqtt-version 3.1.1|5]
//                  [--db-password-file PATH]
//
// Payload: {"message_id", "source_message_id", "account", "amount", "balance"}; the id
// also comes as the MQTT 5 user property message-id. A redelivered or re-sent event
// (same id) is skipped by the inbox; an event that cannot be decoded is dead-lettered.
// Each applied event adds one row to event_sources and counts in event_accounts, so the
// count per account and the set of source ids can be checked against the ledger's
// credits. The flags, start-up and stop are ledger_consumer's (consumer_service.h).
//
// --db postgresql:///events?host=/run/postgresql keeps the inbox and the same two tables in
// PostgreSQL instead (docs/postgres.md#the-event-consumer-on-postgresql): the same event,
// applied by a PgHandler in the claim's transaction. The URI holds no password: it comes
// from a password file (--db-password-file, or libpq's PGPASSFILE, ~/.pgpass).
//
#include <SQLiteCpp/SQLiteCpp.h>
#include <mqtt_inbox/mqtt_inbox.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command_line.h"
#include "consumer_service.h"
#include "exit_codes.h"
#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
#include <mqtt_inbox/postgres.h>

#include <pqxx/pqxx>
#endif

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

// An event as decoded from its payload. The payload is the consumer's parse, made while
// it read the message id (payload_json.h). Bad input is UndecodablePayload: a dead letter
// at once, on either store.
struct Event {
  std::string source_message_id, account;
  int64_t amount = 0, balance = 0;
};

Event decode_event(const mqtt_inbox::Delivery& d) {
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
  return {j.at("source_message_id").get<std::string>(), j.at("account").get<std::string>(),
          j.at("amount").get<int64_t>(), j.at("balance").get<int64_t>()};
}

// Runs inside the claim transaction: both writes commit with the event's id, or neither.
void apply_event(SQLite::Database& db, const mqtt_inbox::Delivery& d) {
  const Event e = decode_event(d);
  SQLite::Statement count(db,
                          "INSERT INTO event_accounts (account, events, total, last_balance)"
                          " VALUES (?1, 1, ?2, ?3) ON CONFLICT (account) DO UPDATE SET"
                          " events = events + 1, total = total + ?2, last_balance = ?3");
  count.bind(1, e.account);
  count.bind(2, e.amount);
  count.bind(3, e.balance);
  count.exec();
  SQLite::Statement row(db,
                        "INSERT INTO event_sources (source_message_id, message_id, account,"
                        " amount, balance) VALUES (?, ?, ?, ?, ?)");
  row.bind(1, e.source_message_id);
  row.bind(2, d.message_id);
  row.bind(3, e.account);
  row.bind(4, e.amount);
  row.bind(5, e.balance);
  row.exec();
}

#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
// The same tables on PostgreSQL, in the connection's default schema (public), beside the
// inbox's own schema; created at start-up by Inbox::setup_sql, looking first, so that a
// runtime role without CREATE starts (ledger_postgres.h says why).
constexpr const char* kCreateTablesPostgres =
    "DO $$ BEGIN"
    "  IF to_regclass('event_accounts') IS NULL THEN"
    "    CREATE TABLE event_accounts ("
    "      account text PRIMARY KEY, events bigint NOT NULL, total bigint NOT NULL,"
    "      last_balance bigint NOT NULL);"
    "  END IF;"
    "  IF to_regclass('event_sources') IS NULL THEN"
    "    CREATE TABLE event_sources ("
    "      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, source_message_id text NOT NULL,"
    "      message_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL,"
    "      balance bigint NOT NULL);"
    "  END IF;"
    " END $$";

// The same change as a PgHandler, in the claim's libpqxx transaction. A total that would
// overflow is a data error (SQLSTATE 22003): a failed attempt, then a dead letter.
void apply_event_postgres(pqxx::transaction_base& txn, const mqtt_inbox::Delivery& d) {
  const Event e = decode_event(d);
  txn.exec_params0(
      "INSERT INTO event_accounts (account, events, total, last_balance) VALUES ($1, 1, $2, $3)"
      " ON CONFLICT (account) DO UPDATE SET events = event_accounts.events + 1,"
      " total = event_accounts.total + excluded.total, last_balance = excluded.last_balance",
      e.account, e.amount, e.balance);
  txn.exec_params0(
      "INSERT INTO event_sources (source_message_id, message_id, account, amount, balance)"
      " VALUES ($1, $2, $3, $4, $5)",
      e.source_message_id, d.message_id, e.account, e.amount, e.balance);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Apply ledger_consumer's credited events exactly once (mqtt-inbox example)"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  consumer_service::Flags flags;
  flags.consumer_name = "events";
  consumer_service::add(app, &flags);
  if (int rc = command_line::parse(app, argc, argv, "event_consumer"); rc >= 0) return rc;

  consumer_service::Service service("event_consumer", "events");
  if (service_frame::is_postgres_location(flags.db_path)) {
#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
    mqtt_inbox::enable_postgres_store();  // the store lives in mqtt_inbox::postgres
    if (int rc = service.open(flags, std::string(kCreateTablesPostgres)); rc != examples::kExitOk)
      return rc;
    return service.run(mqtt_inbox::PgHandler(apply_event_postgres));
#else
    // Inbox::open says why: this build of mqtt-inbox has no PostgreSQL store.
    return service.open(flags, std::string());
#endif
  }
  if (int rc = service.open(flags, create_tables); rc != examples::kExitOk) return rc;
  return service.run(apply_event);
}

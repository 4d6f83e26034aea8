// ledger_consumer: applies JSON credits from an MQTT topic to account balances, exactly
// once, through mqtt-inbox.
//
//   ledger_consumer --broker tcp://127.0.0.1:1883 --client-id ledger-1
//                   --topic credits/# --db ledger.db [--mqtt-version 3.1.1|5]
//                   [--db-password-file PATH]
//                   [--startup-deadline-ms 0] [--stop-timeout-ms 10000]
//                   [--emit-topic events/credited] [--max-packet-size 0]
//
// With --emit-topic, each applied credit also enqueues, in the same transaction, one
// event to that topic: {"message_id": "<credit id>/credited", "source_message_id": ...,
// "account": ..., "amount": ..., "balance": <after this credit>}, published by an outbox
// relay (its own connection with the same connection flags, client id "<client-id>-relay")
// with the same id as the MQTT 5 user property message-id. A downstream inbox
// (event_consumer) applies each event exactly once. --max-packet-size: the broker's largest
// packet, bytes (mosquitto max_packet_size), for MQTT 3.1.1, which cannot announce it: a
// larger event becomes an outbox dead letter payload_too_large instead of being sent
// (RelayOptions::max_packet_size; 0 = none). The flags, start-up and stop are
// consumer_service.h's; the relay's stop shares --stop-timeout-ms with the subscriber's.
//
// --db postgresql:///ledger?host=/run/postgresql keeps the inbox and the business tables
// (accounts, ledger_entries) in PostgreSQL instead
// (docs/postgres.md#the-ledger-consumer-on-postgresql): the same credit, applied by a PgHandler in
// the claim's transaction (ledger_postgres.h). The URI holds no password: it comes from a password
// file (--db-password-file, or libpq's PGPASSFILE, ~/.pgpass). --emit-topic works there too: the
// event is enqueued in the claim's libpqxx transaction (Outbox::enqueue_or_throw(txn, ...)) and
// the relay is woken by LISTEN/NOTIFY (docs/postgres.md#the-outbox).
//
#include <mqtt_inbox/mqtt_inbox.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "command_line.h"
#include "consumer_service.h"
#include "exit_codes.h"
#include "ledger.h"
#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
#include "ledger_postgres.h"
#endif

namespace {

// Makes the outbox and its relay of --emit-topic on the opened store (both stores).
int make_relay(consumer_service::Service& service, const consumer_service::Flags& flags,
               int64_t max_packet_size, std::unique_ptr<mqtt_inbox::Outbox>* outbox,
               std::unique_ptr<mqtt_inbox::Relay>* relay) {
  // No logger of its own: the outbox logs where the inbox does, to the program's log.
  if (auto s = mqtt_inbox::Outbox::create(service.inbox(), {}, outbox); !s.ok())
    return service.fail(examples::startup_exit_code(s), s);
  // The relay connects as the subscriber does: the same flags (TLS, --username,
  // --password-file), its own client id.
  mqtt_inbox::RelayOptions ro;
  if (auto s = connection_flags::to_relay_options(flags.connection, "-relay", &ro); !s.ok())
    return service.fail(examples::kExitSubscriber, s);
  ro.logger = service.log();
  ro.max_packet_size = max_packet_size;
  ro.stop_timeout_ms = flags.stop_timeout_ms;
  if (auto s = mqtt_inbox::Relay::create(outbox->get(), ro, relay); !s.ok())
    return service.fail(examples::kExitFailed, s);
  return examples::kExitOk;
}

// The ledger on PostgreSQL: the store, the business tables, the PgHandler; with
// --emit-topic, the event enqueued in the handler's transaction and the relay.
int run_on_postgres(const consumer_service::Flags& flags, const std::string& emit_topic,
                    int64_t max_packet_size) {
#if MQTT_INBOX_EXAMPLES_WITH_POSTGRES
  mqtt_inbox::enable_postgres_store();  // the store lives in mqtt_inbox::postgres
  consumer_service::Service service("ledger_consumer", "ledger");
  if (int rc = service.open(flags, ledger::postgres::kCreateTables); rc != examples::kExitOk)
    return rc;
  std::unique_ptr<mqtt_inbox::Outbox> outbox;
  std::unique_ptr<mqtt_inbox::Relay> relay;
  mqtt_inbox::PgHandler handler = ledger::postgres::apply_credit;
  if (!emit_topic.empty()) {
    if (int rc = make_relay(service, flags, max_packet_size, &outbox, &relay);
        rc != examples::kExitOk)
      return rc;
    handler = [&outbox, &emit_topic](pqxx::transaction_base& txn, const mqtt_inbox::Delivery& d) {
      ledger::postgres::apply_credit(txn, d);
      mqtt_inbox::OutgoingMessage event;
      event.topic = emit_topic;
      event.message_id = mqtt_inbox::derived_message_id(d.message_id, "credited");
      event.payload = ledger::postgres::credited_event(txn, d, event.message_id);
      outbox->enqueue_or_throw(txn, event);
    };
  }
  return service.run(
      handler, [&] { return relay ? relay->start() : mqtt_inbox::Status::Ok(); },
      [&] { return relay ? relay->stop() : mqtt_inbox::Status::Ok(); }, relay.get());
#else
  (void)emit_topic;
  (void)max_packet_size;
  // Inbox::open says why: this build of mqtt-inbox has no PostgreSQL store.
  consumer_service::Service service("ledger_consumer", "ledger");
  return service.open(flags, std::string());
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Apply JSON credits from MQTT exactly once (mqtt-inbox example)"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  consumer_service::Flags flags;
  flags.consumer_name = "ledger";
  consumer_service::add(app, &flags);
  std::string emit_topic;
  app.add_option("--emit-topic", emit_topic,
                 "Enqueue one event per applied credit to this topic (transactional outbox)")
      ->check(command_line::topic_name());
  int64_t max_packet_size = 0;
  app.add_option("--max-packet-size", max_packet_size,
                 "With --emit-topic: largest PUBLISH the relay sends, bytes (the broker's "
                 "max_packet_size; MQTT 3.1.1 cannot announce it); 0 = none")
      ->check(CLI::NonNegativeNumber);
  if (int rc = command_line::parse(app, argc, argv, "ledger_consumer"); rc >= 0) return rc;
  if (service_frame::is_postgres_location(flags.db_path))
    return run_on_postgres(flags, emit_topic, max_packet_size);

  // 1. The store, with the business tables, before anything connects.
  consumer_service::Service service("ledger_consumer", "ledger");
  if (int rc = service.open(flags, ledger::create_tables); rc != examples::kExitOk) return rc;

  // 2. The handler runs inside the claim transaction. With --emit-topic it also enqueues
  //    the credit's event there, so the event exists exactly when the credit does, and a
  //    relay publishes it until the broker's PUBACK.
  std::unique_ptr<mqtt_inbox::Outbox> outbox;
  std::unique_ptr<mqtt_inbox::Relay> relay;
  mqtt_inbox::Handler handler = ledger::CreditHandler{};
  if (!emit_topic.empty()) {
    if (int rc = make_relay(service, flags, max_packet_size, &outbox, &relay);
        rc != examples::kExitOk)
      return rc;
    handler = [credit = ledger::CreditHandler{}, &outbox, &emit_topic](
                  SQLite::Database& db, const mqtt_inbox::Delivery& d) {
      credit(db, d);
      mqtt_inbox::OutgoingMessage event;
      event.topic = emit_topic;
      event.message_id = mqtt_inbox::derived_message_id(d.message_id, "credited");
      event.payload = ledger::credited_event(db, d, event.message_id);
      outbox->enqueue_or_throw(db, event);
    };
  }

  // 3. Consumer, retention, subscriber, systemd notifications; the relay publishes while
  //    the subscriber runs, woken by each commit that enqueued, and is shown in STATUS and
  //    watched for refusals like the subscriber. Returns at SIGINT/SIGTERM, having stopped
  //    both within --stop-timeout-ms.
  return service.run(
      handler, [&] { return relay ? relay->start() : mqtt_inbox::Status::Ok(); },
      [&] { return relay ? relay->stop() : mqtt_inbox::Status::Ok(); }, relay.get());
}

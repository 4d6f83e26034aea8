/* The ledger's business logic in C (examples/c/ledger_consumer.c, and the C API's tests):
 * a JSON credit
 * {"message_id": "...", "account": "...", "amount": <integer>} added to an account's
 * balance and appended to the ledger, with the inbox's connection inside its transaction.
 * The JSON is read by SQLite's own JSON functions, so the C program needs no JSON library.
 * The same tables and rules as examples/ledger.h. */
#ifndef MQTT_INBOX_EXAMPLES_C_LEDGER_H
#define MQTT_INBOX_EXAMPLES_C_LEDGER_H

#include <mqtt_inbox/c.h>

#define LEDGER_TABLES                                                  \
  "CREATE TABLE IF NOT EXISTS accounts (account TEXT PRIMARY KEY,"     \
  " balance INTEGER NOT NULL);"                                        \
  "CREATE TABLE IF NOT EXISTS ledger_entries (id INTEGER PRIMARY KEY," \
  " message_id TEXT NOT NULL, account TEXT NOT NULL, amount INTEGER NOT NULL)"

/* Applies the delivery's credit. Returns a handler code: MQTT_INBOX_HANDLER_OK, _UNDECODABLE
 * (not a JSON object, no text account, no integer amount), _REJECT (amount <= 0), or _RETRY
 * for an SQL error; the reason text is set on `d` for each failure. */
int ledger_apply_credit(sqlite3* db, const mqtt_inbox_delivery_t* d);

/* For --emit-topic: enqueues, in the handler's transaction, the event
 * {"message_id": "<credit id>/credited", "source_message_id": "<credit id>",
 *  "account": ..., "balance": <the balance after the credit>} to `topic`, under the id
 * derived from the credit's, so a re-run enqueues the same id. Call after
 * ledger_apply_credit returned MQTT_INBOX_HANDLER_OK. Returns a handler code. */
int ledger_enqueue_credited(mqtt_inbox_outbox_t* outbox, sqlite3* db,
                            const mqtt_inbox_delivery_t* d, const char* topic);

#endif

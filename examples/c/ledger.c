/* The ledger in C (ledger.h). */
#include "ledger.h"

#include <stdio.h>
#include <string.h>

static int sql_failure(sqlite3* db, const mqtt_inbox_delivery_t* d, sqlite3_stmt* st) {
  char reason[512];
  snprintf(reason, sizeof reason, "ledger: %s", sqlite3_errmsg(db));
  sqlite3_finalize(st);
  mqtt_inbox_delivery_set_reason(d, reason);
  return MQTT_INBOX_HANDLER_RETRY;
}

int ledger_apply_credit(sqlite3* db, const mqtt_inbox_delivery_t* d) {
  size_t len = 0;
  const char* payload = (const char*)mqtt_inbox_delivery_payload(d, &len);
  sqlite3_stmt* st = NULL;
  char account[256];
  sqlite3_int64 amount;
  int ok;
  /* A CASE evaluates lazily: the JSON functions only see a valid object. */
  if (sqlite3_prepare_v2(db,
                         "SELECT CASE WHEN NOT json_valid(?1) THEN -1"
                         " WHEN json_type(?1) <> 'object' THEN -1"
                         " WHEN json_type(?1, '$.account') = 'text'"
                         "  AND json_type(?1, '$.amount') = 'integer' THEN 1 ELSE 0 END,"
                         " CASE WHEN json_valid(?1) THEN CASE WHEN json_type(?1) = 'object' THEN"
                         "  json_extract(?1, '$.account') END END,"
                         " CASE WHEN json_valid(?1) THEN CASE WHEN json_type(?1) = 'object' THEN"
                         "  json_extract(?1, '$.amount') END END",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_failure(db, d, st);
  sqlite3_bind_text(st, 1, payload, (int)len, SQLITE_STATIC);
  if (sqlite3_step(st) != SQLITE_ROW) return sql_failure(db, d, st);
  ok = sqlite3_column_int(st, 0);
  if (ok != 1) {
    sqlite3_finalize(st);
    mqtt_inbox_delivery_set_reason(d, ok < 0 ? "payload is not a JSON object"
                                             : "'account' must be text and 'amount' an integer");
    return MQTT_INBOX_HANDLER_UNDECODABLE;
  }
  snprintf(account, sizeof account, "%s", (const char*)sqlite3_column_text(st, 1));
  amount = sqlite3_column_int64(st, 2);
  sqlite3_finalize(st);
  if (account[0] == 0) {
    mqtt_inbox_delivery_set_reason(d, "'account' is empty");
    return MQTT_INBOX_HANDLER_UNDECODABLE;
  }
  if (amount <= 0) {
    char reason[128];
    snprintf(reason, sizeof reason, "amount %lld is not a credit", (long long)amount);
    mqtt_inbox_delivery_set_reason(d, reason);
    return MQTT_INBOX_HANDLER_REJECT;
  }
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO accounts (account, balance) VALUES (?1, ?2)"
                         " ON CONFLICT (account) DO UPDATE SET balance = balance + ?2",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_failure(db, d, st);
  sqlite3_bind_text(st, 1, account, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, amount);
  if (sqlite3_step(st) != SQLITE_DONE) return sql_failure(db, d, st);
  sqlite3_finalize(st);
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO ledger_entries (message_id, account, amount)"
                         " VALUES (?1, ?2, ?3)",
                         -1, &st, NULL) != SQLITE_OK)
    return sql_failure(db, d, st);
  sqlite3_bind_text(st, 1, mqtt_inbox_delivery_message_id(d), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, account, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 3, amount);
  if (sqlite3_step(st) != SQLITE_DONE) return sql_failure(db, d, st);
  sqlite3_finalize(st);
  return MQTT_INBOX_HANDLER_OK;
}

int ledger_enqueue_credited(mqtt_inbox_outbox_t* outbox, sqlite3* db,
                            const mqtt_inbox_delivery_t* d, const char* topic) {
  size_t len = 0;
  const char* payload = (const char*)mqtt_inbox_delivery_payload(d, &len);
  sqlite3_stmt* st = NULL;
  char* event_id = NULL;
  mqtt_inbox_outgoing_t event = MQTT_INBOX_OUTGOING_INIT;
  int rc;
  if (mqtt_inbox_derived_message_id(mqtt_inbox_delivery_message_id(d), "credited", &event_id) !=
      MQTT_INBOX_OK) {
    mqtt_inbox_delivery_set_reason(d, "the event id derived from this id is too long");
    return MQTT_INBOX_HANDLER_REJECT;
  }
  /* The event as JSON, built by SQLite from the balance this transaction wrote. */
  if (sqlite3_prepare_v2(db,
                         "SELECT json_object('message_id', ?1, 'source_message_id', ?2,"
                         " 'account', account, 'balance', balance) FROM accounts"
                         " WHERE account = json_extract(?3, '$.account')",
                         -1, &st, NULL) != SQLITE_OK) {
    mqtt_inbox_free(event_id);
    return sql_failure(db, d, st);
  }
  sqlite3_bind_text(st, 1, event_id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, mqtt_inbox_delivery_message_id(d), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 3, payload, (int)len, SQLITE_STATIC);
  if (sqlite3_step(st) != SQLITE_ROW) {
    mqtt_inbox_free(event_id);
    return sql_failure(db, d, st);
  }
  event.topic = topic;
  event.payload = sqlite3_column_text(st, 0);
  event.payload_len = (size_t)sqlite3_column_bytes(st, 0);
  event.message_id = event_id;
  event.content_type = "application/json";
  rc = mqtt_inbox_outbox_enqueue(outbox, db, &event, NULL);
  sqlite3_finalize(st);
  mqtt_inbox_free(event_id);
  if (rc != MQTT_INBOX_OK) {
    /* A full class is backpressure: the message is parked (outbox_full), not at fault. A
     * refusal decides the message by itself (outbox_refused); any other failure (the
     * store) is worth another attempt. */
    mqtt_inbox_delivery_set_reason(d, mqtt_inbox_outbox_errmsg(outbox));
    if (rc == MQTT_INBOX_OUTBOX_FULL) return MQTT_INBOX_HANDLER_OUTBOX_FULL;
    return rc == MQTT_INBOX_INVALID_ARGUMENT ? MQTT_INBOX_HANDLER_OK : MQTT_INBOX_HANDLER_RETRY;
  }
  return MQTT_INBOX_HANDLER_OK;
}

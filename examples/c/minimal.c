/* minimal [BROKER_URI [DATABASE [CLIENT_ID]]]: docs/c-api.md's minimal program (the ctest
 * c_api_doc_program fails if the page's copy differs; package_c_consumer builds it against
 * an installed prefix and runs it against mosquitto). Applies JSON credits
 * {"message_id": "c-1", "account": "alice", "amount": 5} from MQTT to account balances
 * exactly once, until SIGINT or SIGTERM. */
#define _POSIX_C_SOURCE 200809L /* sigaction: POSIX, not C99 */
#include <mqtt_inbox/c.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mqtt_inbox_subscriber_t* sub;

/* Async-signal-safe: it only asks; mqtt_inbox_subscriber_run below does the stop. */
static void on_stop(int sig) {
  (void)sig;
  mqtt_inbox_subscriber_request_stop(sub);
}

/* Runs inside the claim's transaction: what it writes through db commits with the claim
 * of the message id, or not at all. SQLite's JSON functions read the payload. */
static int apply_credit(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  static const char sql[] =
      "INSERT INTO accounts (account, balance)"
      " SELECT json_extract(j, '$.account'), json_extract(j, '$.amount')"
      " FROM (SELECT CASE WHEN json_valid(?1) THEN ?1 ELSE '{}' END AS j)"
      " WHERE json_type(j, '$.account') = 'text' AND json_type(j, '$.amount') = 'integer'"
      " ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance";
  sqlite3_stmt* st = NULL;
  size_t len = 0;
  const void* payload = mqtt_inbox_delivery_payload(d, &len);
  int rc;
  (void)ctx;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) return MQTT_INBOX_HANDLER_RETRY;
  sqlite3_bind_text(st, 1, (const char*)payload, (int)len, SQLITE_STATIC);
  rc = sqlite3_step(st);
  sqlite3_finalize(st); /* every statement finalized before returning */
  if (rc != SQLITE_DONE) return MQTT_INBOX_HANDLER_RETRY;
  if (sqlite3_changes(db) == 0) {
    mqtt_inbox_delivery_set_reason(d, "not a credit");
    return MQTT_INBOX_HANDLER_REJECT; /* dead-lettered as invalid_payload, acked */
  }
  return MQTT_INBOX_HANDLER_OK;
}

static int fail(const char* what, const char* why) {
  fprintf(stderr, "minimal: %s: %s\n", what, why ? why : "out of memory");
  return 1;
}

int main(int argc, char** argv) {
  const char* broker = argc > 1 ? argv[1] : "tcp://127.0.0.1:1883";
  const char* path = argc > 2 ? argv[2] : "ledger.db";
  mqtt_inbox_t* inbox = NULL;
  mqtt_inbox_consumer_t* consumer = NULL;
  mqtt_inbox_pruner_t* pruner = NULL;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  struct sigaction sa;
  char* err = NULL;
  int rc;

  /* 1. The store, your table and the consumer before anything connects: the broker
   *    redelivers unacknowledged messages right after CONNACK. */
  if (mqtt_inbox_open(path, NULL, &inbox, &err) != MQTT_INBOX_OK) {
    rc = fail("opening the inbox", err);
    mqtt_inbox_free(err);
    return rc;
  }
  if (mqtt_inbox_setup(inbox,
                       "CREATE TABLE IF NOT EXISTS accounts"
                       " (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)") ||
      mqtt_inbox_consumer_create(inbox, "ledger", apply_credit, NULL, NULL, &consumer))
    return fail("setting up", mqtt_inbox_errmsg(inbox));

  /* 2. Forget processed ids once the broker can no longer redeliver them (by default
   *    after 8 days), so that the file does not grow for ever on flash. */
  if (mqtt_inbox_pruner_create(inbox, NULL, &pruner))
    return fail("creating the pruner", mqtt_inbox_errmsg(inbox));
  if (mqtt_inbox_pruner_start(pruner))
    return fail("starting the pruner", mqtt_inbox_pruner_errmsg(pruner));

  /* 3. The subscriber: a persistent session under a stable client id, QoS 1, each PUBACK
   *    after its message's commit. */
  so.broker_uri = broker;
  so.client_id = argc > 3 ? argv[3] : "ledger-gw-17";
  if (mqtt_inbox_subscriber_create(&so, &sub, &err) != MQTT_INBOX_OK) {
    rc = fail("creating the subscriber", err);
    mqtt_inbox_free(err);
    return rc;
  }
  if (mqtt_inbox_subscriber_subscribe(sub, "credits/#", consumer))
    return fail("subscribing", mqtt_inbox_subscriber_errmsg(sub));

  /* 4. SIGTERM and SIGINT ask for a stop. SA_RESTART: no other call fails with EINTR. */
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
    return fail("sigaction", "failed");

  /* 5. Connect in the background, and wait for the stop; a message in the handler commits
   *    (and is acknowledged) first. */
  if (mqtt_inbox_subscriber_start(sub)) return fail("starting", mqtt_inbox_subscriber_errmsg(sub));
  if (mqtt_inbox_subscriber_run(sub) != MQTT_INBOX_OK)
    _Exit(3); /* stuck on the store: the
                 message is redelivered */
  /* 6. Then each in the reverse order of creation (a handle still in use refuses). A
   *    late signal must not reach the subscriber being destroyed. */
  sa.sa_handler = SIG_IGN;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  mqtt_inbox_subscriber_destroy(sub);
  mqtt_inbox_pruner_destroy(pruner);
  mqtt_inbox_consumer_destroy(consumer);
  return mqtt_inbox_close(inbox) == MQTT_INBOX_OK ? 0 : 1;
}

/* The C relay as a child process for relay_broker_test: rows enqueued from C, published by
 * a relay made from C, on a connection of its own or on a subscriber's (lent), with the
 * relay's and the connection's options of c.h.
 *
 *   relay_child URI DB 5|3.1.1 [--lent] [--rows N] [--big BYTES] [--max-packet-size N]
 *               [--tls-ca FILE] [--insecure-hostname] [--insecure-certificate]
 *               [--feed N --class-max-rows M]
 *
 * Enqueues N rows (default 10) on "events/r", ids r-0 ... r-(N-1), payload
 * {"message_id":..., "key":"k", "n":i}; with --big, a row "big-1" whose payload is BYTES
 * bytes long goes between the first and the second half. Then relays them: --lent on the
 * connection of a subscriber (client id "c-lent", subscribed to "cmd/#"), else on the
 * relay's own (client id "c-relay"). The TLS flags set that connection's fields. Prints
 * "relaying" once started, waits for SIGTERM, stops the relay, prints its counters as
 * "counters: {...}" and exits 0.
 * --feed: backpressure instead. The outbox bounds the class "events/" to M pending rows
 * (MQTT_INBOX_OUTBOX_REJECT) and no rows are enqueued at start; N messages f-0 ... f-(N-1)
 * are fed to a consumer (mqtt_inbox_consumer_feed, before the relay starts) whose handler
 * enqueues each as an event with the same id and payload, and passes a full class on as
 * MQTT_INBOX_HANDLER_OUTBOX_FULL; its requeue thread (50 ms) replays what was parked once
 * the relay makes room. Prints "fed P processed, D parked" before starting the relay. */
#define _POSIX_C_SOURCE 200809L
#include <mqtt_inbox/c.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rows {
  mqtt_inbox_outbox_t* outbox;
  int count;
  long big;
};

static int enqueue(mqtt_inbox_outbox_t* outbox, sqlite3* db, const char* id, const char* payload) {
  mqtt_inbox_outgoing_t m = MQTT_INBOX_OUTGOING_INIT;
  m.topic = "events/r";
  m.message_id = id;
  m.payload = payload;
  m.payload_len = strlen(payload);
  return mqtt_inbox_outbox_enqueue(outbox, db, &m, NULL);
}

static int enqueue_rows(void* ctx, sqlite3* db) {
  const struct rows* r = (const struct rows*)ctx;
  char id[32], payload[128];
  int i;
  for (i = 0; i < r->count; ++i) {
    if (r->big > 0 && i == r->count / 2) {
      const char* head = "{\"message_id\":\"big-1\",\"key\":\"k\",\"n\":-1,\"pad\":\"";
      char* big = (char*)malloc((size_t)r->big + 1);
      int rc;
      if (!big) return SQLITE_NOMEM;
      memset(big, 'x', (size_t)r->big);
      memcpy(big, head, strlen(head));
      memcpy(big + r->big - 2, "\"}", 2);
      big[r->big] = 0;
      rc = enqueue(r->outbox, db, "big-1", big);
      free(big);
      if (rc != MQTT_INBOX_OK) return SQLITE_ERROR;
    }
    snprintf(id, sizeof id, "r-%d", i);
    snprintf(payload, sizeof payload, "{\"message_id\":\"%s\",\"key\":\"k\",\"n\":%d}", id, i);
    if (enqueue(r->outbox, db, id, payload) != MQTT_INBOX_OK) return SQLITE_ERROR;
  }
  return SQLITE_OK;
}

/* The --feed handler: the incoming message's payload, under its id, as an event. */
static int forward(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  mqtt_inbox_outgoing_t m = MQTT_INBOX_OUTGOING_INIT;
  size_t len = 0;
  int rc;
  (void)db;
  m.topic = "events/r";
  m.message_id = mqtt_inbox_delivery_message_id(d);
  m.payload = mqtt_inbox_delivery_payload(d, &len);
  m.payload_len = len;
  rc = mqtt_inbox_outbox_enqueue((mqtt_inbox_outbox_t*)ctx, db, &m, NULL);
  if (rc == MQTT_INBOX_OUTBOX_FULL) return MQTT_INBOX_HANDLER_OUTBOX_FULL;
  return rc == MQTT_INBOX_OK ? MQTT_INBOX_HANDLER_OK : MQTT_INBOX_HANDLER_RETRY;
}

static int ignore(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  (void)ctx;
  (void)db;
  (void)d;
  return MQTT_INBOX_HANDLER_OK;
}

static int fail(const char* what, int rc, const char* msg) {
  fprintf(stderr, "%s: %s: %s\n", what, mqtt_inbox_errstr(rc), msg ? msg : "");
  return 1;
}

int main(int argc, char** argv) {
  mqtt_inbox_t* inbox = NULL;
  mqtt_inbox_outbox_t* outbox = NULL;
  mqtt_inbox_consumer_t* consumer = NULL;
  mqtt_inbox_subscriber_t* subscriber = NULL;
  mqtt_inbox_relay_t* relay = NULL;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  mqtt_inbox_relay_options_t ro = MQTT_INBOX_RELAY_OPTIONS_INIT;
  struct rows rows;
  const char* ca = NULL;
  int lent = 0, insecure_hostname = 0, insecure_certificate = 0, version, rc, i, sig;
  int feed = 0, processed = 0, parked = 0;
  long long class_max_rows = 0;
  mqtt_inbox_outbox_class_t bounded = MQTT_INBOX_OUTBOX_CLASS_INIT;
  mqtt_inbox_outbox_options_t oo = MQTT_INBOX_OUTBOX_OPTIONS_INIT;
  mqtt_inbox_consumer_options_t co = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_consumer_t* fed = NULL;
  long long max_packet_size = 0;
  char *err = NULL, *json = NULL;
  sigset_t stop_signals;
  if (argc < 4) {
    fprintf(stderr, "usage: %s URI DB 5|3.1.1 [options]\n", argv[0]);
    return 2;
  }
  rows.count = 10;
  rows.big = 0;
  for (i = 4; i < argc; ++i) {
    if (strcmp(argv[i], "--lent") == 0)
      lent = 1;
    else if (strcmp(argv[i], "--insecure-hostname") == 0)
      insecure_hostname = 1;
    else if (strcmp(argv[i], "--insecure-certificate") == 0)
      insecure_certificate = 1;
    else if (i + 1 < argc && strcmp(argv[i], "--rows") == 0)
      rows.count = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--big") == 0)
      rows.big = atol(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--max-packet-size") == 0)
      max_packet_size = atoll(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--tls-ca") == 0)
      ca = argv[++i];
    else if (i + 1 < argc && strcmp(argv[i], "--feed") == 0)
      feed = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--class-max-rows") == 0)
      class_max_rows = atoll(argv[++i]);
    else
      return 2;
  }
  if (rows.big > 0 && rows.big < 64) return 2;
  version = strcmp(argv[3], "5") == 0 ? MQTT_INBOX_MQTT_5 : MQTT_INBOX_MQTT_3_1_1;
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* SIGTERM is taken by sigwait below; blocked before any library thread starts. */
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigprocmask(SIG_BLOCK, &stop_signals, NULL);

  if ((rc = mqtt_inbox_open(argv[2], NULL, &inbox, &err)) != MQTT_INBOX_OK)
    return fail("open", rc, err);
  if (class_max_rows > 0) {
    bounded.topic_prefix = "events/";
    bounded.max_rows = class_max_rows;
    oo.classes = &bounded;
    oo.class_count = 1;
  }
  if ((rc = mqtt_inbox_outbox_create_with_options(inbox, &oo, &outbox)) != MQTT_INBOX_OK)
    return fail("outbox", rc, mqtt_inbox_errmsg(inbox));
  rows.outbox = outbox;
  if (feed > 0) {
    co.requeue_poll_ms = 50;
    co.max_attempts = 2;
    co.retry_backoff_initial_ms = 1;
    co.retry_backoff_max_ms = 1;
    if ((rc = mqtt_inbox_consumer_create(inbox, "forward", forward, outbox, &co, &fed)))
      return fail("consumer", rc, mqtt_inbox_errmsg(inbox));
    for (i = 0; i < feed; ++i) {
      char payload[128];
      mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
      int outcome = -1;
      snprintf(payload, sizeof payload, "{\"message_id\":\"f-%d\",\"key\":\"k\",\"n\":%d}", i, i);
      m.topic = "in/x";
      m.payload = payload;
      m.payload_len = strlen(payload);
      if ((rc = mqtt_inbox_consumer_feed(fed, &m, &outcome)) != MQTT_INBOX_OK)
        return fail("feed", rc, mqtt_inbox_consumer_errmsg(fed));
      if (outcome == MQTT_INBOX_OUTCOME_PROCESSED) ++processed;
      if (outcome == MQTT_INBOX_OUTCOME_DEAD_LETTERED) ++parked;
    }
    printf("fed %d processed, %d parked\n", processed, parked);
  } else if ((rc = mqtt_inbox_setup_fn(inbox, enqueue_rows, &rows)) != MQTT_INBOX_OK) {
    return fail("enqueue", rc, mqtt_inbox_errmsg(inbox));
  }

  ro.max_packet_size = max_packet_size;
  ro.poll_interval_ms = 50;
  ro.reconnect_backoff_initial_ms = 100;
  ro.reconnect_backoff_max_ms = 500;
  if (lent) {
    so.broker_uri = argv[1];
    so.client_id = "c-lent";
    so.mqtt_version = version;
    so.client_id_lock_dir = "";
    so.reconnect_backoff_initial_ms = 100;
    so.reconnect_backoff_max_ms = 500;
    so.tls_ca_file = ca;
    so.tls_insecure_skip_hostname_check = insecure_hostname;
    so.tls_insecure_skip_certificate_check = insecure_certificate;
    if ((rc = mqtt_inbox_consumer_create(inbox, "cmd", ignore, NULL, NULL, &consumer)))
      return fail("consumer", rc, mqtt_inbox_errmsg(inbox));
    if ((rc = mqtt_inbox_subscriber_create(&so, &subscriber, &err)) != MQTT_INBOX_OK)
      return fail("subscriber", rc, err);
    if ((rc = mqtt_inbox_subscriber_subscribe(subscriber, "cmd/#", consumer)) != MQTT_INBOX_OK)
      return fail("subscribe", rc, mqtt_inbox_subscriber_errmsg(subscriber));
    if ((rc = mqtt_inbox_relay_create_on(outbox, subscriber, &ro, &relay, &err)) != MQTT_INBOX_OK)
      return fail("relay", rc, err);
  } else {
    ro.broker_uri = argv[1];
    ro.client_id = "c-relay";
    ro.mqtt_version = version;
    ro.client_id_lock_dir = "";
    ro.tls_ca_file = ca;
    ro.tls_insecure_skip_hostname_check = insecure_hostname;
    ro.tls_insecure_skip_certificate_check = insecure_certificate;
    if ((rc = mqtt_inbox_relay_create(outbox, &ro, &relay, &err)) != MQTT_INBOX_OK)
      return fail("relay", rc, err);
  }
  if ((rc = mqtt_inbox_relay_start(relay)) != MQTT_INBOX_OK)
    return fail("relay start", rc, mqtt_inbox_relay_errmsg(relay));
  if (subscriber && (rc = mqtt_inbox_subscriber_start(subscriber)) != MQTT_INBOX_OK)
    return fail("subscriber start", rc, mqtt_inbox_subscriber_errmsg(subscriber));
  printf("relaying\n");

  sigwait(&stop_signals, &sig);
  if ((rc = mqtt_inbox_relay_stop(relay)) != MQTT_INBOX_OK)
    return fail("relay stop", rc, mqtt_inbox_relay_errmsg(relay));
  if (mqtt_inbox_relay_counters_json(relay, &json) == MQTT_INBOX_OK) printf("counters: %s\n", json);
  mqtt_inbox_free(json);
  mqtt_inbox_relay_destroy(relay);
  if (subscriber && (rc = mqtt_inbox_subscriber_stop(subscriber)) != MQTT_INBOX_OK)
    return fail("subscriber stop", rc, mqtt_inbox_subscriber_errmsg(subscriber));
  mqtt_inbox_subscriber_destroy(subscriber);
  mqtt_inbox_consumer_destroy(consumer);
  mqtt_inbox_consumer_destroy(fed);
  mqtt_inbox_outbox_destroy(outbox);
  mqtt_inbox_close(inbox);
  printf("stopped\n");
  return 0;
}

/* The C ledger consumer as a child process for subscriber_broker_test: the whole C API
 * path (open, set-up, consumer, subscriber, run until SIGTERM) in C99, with the ledger of
 * examples/c/ledger.h.
 *
 *   subscriber_child URI CLIENT_ID FILTER DB MQTT_VERSION [--stop-from-thread MS]
 *                    [--emit-topic TOPIC] [--crash-in-handler ID] [--stop-in-handler 1]
 *
 * MQTT_VERSION is "5" or "3.1.1". Prints "consuming" once connected and, after the stop,
 * the inbox's stats as JSON on one line starting "stats: ". --stop-from-thread stops the
 * subscriber from a second thread after MS ms (mqtt_inbox_subscriber_stop), which must
 * also end mqtt_inbox_subscriber_run in the main thread. --emit-topic enqueues a
 * credited event per credit in the handler's transaction and runs a relay (client id
 * CLIENT_ID-relay) that publishes them. --crash-in-handler kills the process (SIGKILL) inside
 * the handler of message ID, every time: poison. --stop-in-handler calls
 * mqtt_inbox_subscriber_stop from the first handler call (on Paho's receive thread), prints
 * "stop in handler: <code name> after <ms> ms: <errmsg>", then asks for the stop with
 * mqtt_inbox_subscriber_request_stop, as a handler should. Exit 0 after a clean stop. */
#define _POSIX_C_SOURCE 200809L
#include <mqtt_inbox/c.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ledger.h"

static mqtt_inbox_subscriber_t* subscriber;

static void on_signal(int sig) {
  (void)sig;
  mqtt_inbox_subscriber_request_stop(subscriber);
}

static mqtt_inbox_outbox_t* outbox;
static const char* emit_topic;
static const char* crash_id;
static int stop_in_handler;

static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int handler(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  int rc;
  (void)ctx;
  if (crash_id && strcmp(mqtt_inbox_delivery_message_id(d), crash_id) == 0) raise(SIGKILL);
  if (stop_in_handler) {
    const long long t0 = now_ms();
    const int stop_rc = mqtt_inbox_subscriber_stop(subscriber);
    printf("stop in handler: %s after %lld ms: %s\n", mqtt_inbox_errstr(stop_rc), now_ms() - t0,
           mqtt_inbox_subscriber_errmsg(subscriber));
    mqtt_inbox_subscriber_request_stop(subscriber);
    stop_in_handler = 0;
  }
  rc = ledger_apply_credit(db, d);
  if (rc == MQTT_INBOX_HANDLER_OK && emit_topic)
    rc = ledger_enqueue_credited(outbox, db, d, emit_topic);
  return rc;
}

static void* stop_later(void* arg) {
  long ms = *(long*)arg;
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
  fprintf(stderr, "stopping from a second thread\n");
  if (mqtt_inbox_subscriber_stop(subscriber) != MQTT_INBOX_OK) fprintf(stderr, "stop failed\n");
  return NULL;
}

static int fail(const char* what, int rc, const char* msg) {
  fprintf(stderr, "%s: %s: %s\n", what, mqtt_inbox_errstr(rc), msg ? msg : "");
  return 1;
}

int main(int argc, char** argv) {
  mqtt_inbox_t* inbox = NULL;
  mqtt_inbox_consumer_t* consumer = NULL;
  mqtt_inbox_consumer_options_t co = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  struct sigaction sa;
  pthread_t stopper;
  mqtt_inbox_relay_t* relay = NULL;
  mqtt_inbox_relay_options_t ro = MQTT_INBOX_RELAY_OPTIONS_INIT;
  char relay_id[256];
  long stop_ms = -1;
  char *err = NULL, *json = NULL;
  int rc, i;
  if (argc < 6 || argc % 2 != 0) {
    fprintf(stderr,
            "usage: %s URI CLIENT_ID FILTER DB 5|3.1.1 [--stop-from-thread MS]"
            " [--emit-topic TOPIC] [--crash-in-handler ID] [--stop-in-handler 1]\n",
            argv[0]);
    return 2;
  }
  for (i = 6; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--stop-from-thread") == 0)
      stop_ms = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--emit-topic") == 0)
      emit_topic = argv[i + 1];
    else if (strcmp(argv[i], "--crash-in-handler") == 0)
      crash_id = argv[i + 1];
    else if (strcmp(argv[i], "--stop-in-handler") == 0)
      stop_in_handler = atoi(argv[i + 1]);
    else
      return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);

  if ((rc = mqtt_inbox_open(argv[4], NULL, &inbox, &err)) != MQTT_INBOX_OK)
    return fail("open", rc, err);
  if ((rc = mqtt_inbox_setup(inbox, LEDGER_TABLES)) != MQTT_INBOX_OK)
    return fail("setup", rc, mqtt_inbox_errmsg(inbox));
  if (emit_topic) {
    if ((rc = mqtt_inbox_outbox_create(inbox, &outbox)) != MQTT_INBOX_OK)
      return fail("outbox", rc, mqtt_inbox_errmsg(inbox));
    snprintf(relay_id, sizeof relay_id, "%s-relay", argv[2]);
    ro.broker_uri = argv[1];
    ro.client_id = relay_id;
    ro.mqtt_version = strcmp(argv[5], "5") == 0 ? MQTT_INBOX_MQTT_5 : MQTT_INBOX_MQTT_3_1_1;
    ro.client_id_lock_dir = "";
    ro.reconnect_backoff_initial_ms = 100;
    ro.reconnect_backoff_max_ms = 500;
    if ((rc = mqtt_inbox_relay_create(outbox, &ro, &relay, &err)) != MQTT_INBOX_OK)
      return fail("relay", rc, err);
    if ((rc = mqtt_inbox_relay_start(relay)) != MQTT_INBOX_OK)
      return fail("relay start", rc, mqtt_inbox_relay_errmsg(relay));
  }
  co.retry_backoff_initial_ms = 10;
  co.retry_backoff_max_ms = 50;
  if ((rc = mqtt_inbox_consumer_create(inbox, "ledger", handler, NULL, &co, &consumer)))
    return fail("consumer", rc, mqtt_inbox_errmsg(inbox));

  so.broker_uri = argv[1];
  so.client_id = argv[2];
  so.mqtt_version = strcmp(argv[5], "5") == 0 ? MQTT_INBOX_MQTT_5 : MQTT_INBOX_MQTT_3_1_1;
  so.reconnect_backoff_initial_ms = 100;
  so.reconnect_backoff_max_ms = 500;
  so.client_id_lock_dir = "";
  if ((rc = mqtt_inbox_subscriber_create(&so, &subscriber, &err)) != MQTT_INBOX_OK)
    return fail("subscriber", rc, err);
  if ((rc = mqtt_inbox_subscriber_subscribe(subscriber, argv[3], consumer)) != MQTT_INBOX_OK)
    return fail("subscribe", rc, mqtt_inbox_subscriber_errmsg(subscriber));

  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  if ((rc = mqtt_inbox_subscriber_start(subscriber)) != MQTT_INBOX_OK)
    return fail("start", rc, mqtt_inbox_subscriber_errmsg(subscriber));
  if (mqtt_inbox_subscriber_wait_connected(subscriber, 10000)) printf("consuming\n");
  if (stop_ms >= 0) pthread_create(&stopper, NULL, stop_later, &stop_ms);
  rc = mqtt_inbox_subscriber_run(subscriber);
  if (stop_ms >= 0) pthread_join(stopper, NULL);
  if (rc != MQTT_INBOX_OK) return fail("run", rc, mqtt_inbox_subscriber_errmsg(subscriber));

  if (mqtt_inbox_stats_json(inbox, &json) == MQTT_INBOX_OK) printf("stats: %s\n", json);
  mqtt_inbox_free(json);
  mqtt_inbox_subscriber_destroy(subscriber);
  if (relay && (rc = mqtt_inbox_relay_stop(relay)) != MQTT_INBOX_OK)
    return fail("relay stop", rc, mqtt_inbox_relay_errmsg(relay));
  mqtt_inbox_relay_destroy(relay);
  mqtt_inbox_outbox_destroy(outbox);
  mqtt_inbox_consumer_destroy(consumer);
  mqtt_inbox_close(inbox);
  printf("stopped\n");
  return 0;
}

/* The C ledger consumer as a child process for subscriber_broker_test: the whole C API
 * path (open, set-up, consumer, subscriber, run until SIGTERM) in C99, with the ledger of
 * ledger_c.h.
 *
 *   subscriber_child URI CLIENT_ID FILTER DB MQTT_VERSION [--stop-from-thread MS]
 *
 * MQTT_VERSION is "5" or "3.1.1". Prints "consuming" once connected and, after the stop,
 * the inbox's stats as JSON on one line starting "stats: ". --stop-from-thread stops the
 * subscriber from a second thread after MS ms (mqtt_inbox_subscriber_stop), which must
 * also end mqtt_inbox_subscriber_run in the main thread. Exit 0 after a clean stop. */
#define _POSIX_C_SOURCE 200809L
#include <mqtt_inbox/c.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ledger_c.h"

static mqtt_inbox_subscriber_t *subscriber;

static void on_signal(int sig) {
  (void)sig;
  mqtt_inbox_subscriber_request_stop(subscriber);
}

static int handler(void *ctx, sqlite3 *db, const mqtt_inbox_delivery_t *d) {
  (void)ctx;
  return ledger_apply_credit(db, d);
}

static void *stop_later(void *arg) {
  long ms = *(long *)arg;
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
  fprintf(stderr, "stopping from a second thread\n");
  if (mqtt_inbox_subscriber_stop(subscriber) != MQTT_INBOX_OK) fprintf(stderr, "stop failed\n");
  return NULL;
}

static int fail(const char *what, int rc, const char *msg) {
  fprintf(stderr, "%s: %s: %s\n", what, mqtt_inbox_errstr(rc), msg ? msg : "");
  return 1;
}

int main(int argc, char **argv) {
  mqtt_inbox_t *inbox = NULL;
  mqtt_inbox_consumer_t *consumer = NULL;
  mqtt_inbox_consumer_options_t co = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  struct sigaction sa;
  pthread_t stopper;
  long stop_ms = -1;
  char *err = NULL, *json = NULL;
  int rc;
  if (argc != 6 && argc != 8) {
    fprintf(stderr, "usage: %s URI CLIENT_ID FILTER DB 5|3.1.1 [--stop-from-thread MS]\n",
            argv[0]);
    return 2;
  }
  if (argc == 8 && strcmp(argv[6], "--stop-from-thread") == 0) stop_ms = atol(argv[7]);
  setvbuf(stdout, NULL, _IOLBF, 0);

  if ((rc = mqtt_inbox_open(argv[4], NULL, &inbox, &err)) != MQTT_INBOX_OK)
    return fail("open", rc, err);
  if ((rc = mqtt_inbox_setup(inbox, LEDGER_TABLES)) != MQTT_INBOX_OK)
    return fail("setup", rc, mqtt_inbox_errmsg(inbox));
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
  mqtt_inbox_consumer_destroy(consumer);
  mqtt_inbox_close(inbox);
  printf("stopped\n");
  return 0;
}

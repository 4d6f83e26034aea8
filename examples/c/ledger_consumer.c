/* ledger_consumer in C: applies JSON credits from an MQTT topic to account balances,
 * exactly once, through mqtt-inbox's C API (include/mqtt_inbox/c.h). The C sibling of
 * examples/ledger_consumer.cpp: the same tables, handler rules, flags and exit codes
 * (examples/exit_codes.h), in C99 without C++.
 *
 *   c_ledger_consumer --broker tcp://127.0.0.1:1883 --client-id ledger-1
 *                     --topic credits/# --db ledger.db [--mqtt-version 3.1.1|5]
 *                     [--consumer ledger] [--emit-topic events/credited]
 *                     [--startup-deadline-ms 0] [--stop-timeout-ms 10000]
 *                     [--synchronous-normal] [--session-expiry-s 604800]
 *                     [--cafile F] [--capath D] [--cert F] [--key F]
 *                     [--key-password-file F] [--tls-version 1.2|1.3]
 *                     [--username U] [--password-file F] [--client-id-lock-dir D]
 *
 * Payload: {"message_id": "...", "account": "...", "amount": <integer>}. A payload that
 * cannot be decoded is dead-lettered as undecodable_payload, an amount <= 0 as
 * invalid_payload; both are acked. With --emit-topic each applied credit also enqueues,
 * in the same transaction, the event {"message_id": "<credit id>/credited", ...} that a
 * relay (client id "<client-id>-relay", the same connection flags) publishes. Secrets come
 * from files only. SIGTERM or SIGINT stops it: a message in the handler commits first.
 * At the stop it prints "c_ledger_consumer: stats {...}" (the inbox's counters).
 *
 * Exit codes: 0 stopped cleanly; 1 bad flags or another start-up failure; 2 the
 * subscriber could not be made (a connection flag, a TLS or password file); 3 stopped
 * while a message still waited for the store (not acked: redelivered to the next run);
 * 4 the store, the database or the client id held by someone else at start-up; 5 the
 * database is corrupt; 6 a file of the database belongs to another user. */
#define _POSIX_C_SOURCE 200809L
#include <mqtt_inbox/c.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger.h"

enum {
  EXIT_OK_ = 0,
  EXIT_FAILED = 1,
  EXIT_SUBSCRIBER = 2,
  EXIT_STOPPED_WHILE_STUCK = 3,
  EXIT_NOT_READY = 4,
  EXIT_CORRUPT = 5,
  EXIT_PERMISSION = 6
};

struct flags {
  const char *broker, *client_id, *topic, *db, *consumer, *emit_topic;
  const char *cafile, *capath, *cert, *key, *key_password_file, *username, *password_file;
  const char* client_id_lock_dir;
  int mqtt5, tls_version, synchronous_normal, stop_timeout_ms;
  long long startup_deadline_ms, session_expiry_s;
};

struct app {
  mqtt_inbox_outbox_t* outbox;
  const char* emit_topic;
};

static mqtt_inbox_subscriber_t* subscriber;

/* Async-signal-safe: only asks; mqtt_inbox_subscriber_run in main does the stop. */
static void on_stop_signal(int sig) {
  (void)sig;
  mqtt_inbox_subscriber_request_stop(subscriber);
}

/* Runs inside the claim transaction, on Paho's receive thread. */
static int handle_credit(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  const struct app* app = (const struct app*)ctx;
  int rc = ledger_apply_credit(db, d);
  if (rc == MQTT_INBOX_HANDLER_OK && app->emit_topic)
    rc = ledger_enqueue_credited(app->outbox, db, d, app->emit_topic);
  return rc;
}

static int usage(const char* program) {
  fprintf(
      stderr,
      "usage: %s --broker URI --client-id ID --topic FILTER --db FILE [--mqtt-version 3.1.1|5]\n"
      "  [--consumer NAME] [--emit-topic TOPIC] [--startup-deadline-ms MS]\n"
      "  [--stop-timeout-ms MS] [--synchronous-normal] [--session-expiry-s S]\n"
      "  [--cafile F] [--capath D] [--cert F] [--key F] [--key-password-file F]\n"
      "  [--tls-version 1.2|1.3] [--username U] [--password-file F]\n"
      "  [--client-id-lock-dir D]\n",
      program);
  return EXIT_FAILED;
}

/* Parses argv into *f; 0 on success. Every flag but --synchronous-normal takes a value. */
static int parse(int argc, char** argv, struct flags* f) {
  int i;
  memset(f, 0, sizeof *f);
  f->consumer = "ledger";
  f->stop_timeout_ms = 10000;
  f->session_expiry_s = 7LL * 24 * 3600;
  for (i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--synchronous-normal") == 0) {
      f->synchronous_normal = 1;
      continue;
    }
    if (!v) return -1;
    ++i;
    if (strcmp(a, "--broker") == 0)
      f->broker = v;
    else if (strcmp(a, "--client-id") == 0)
      f->client_id = v;
    else if (strcmp(a, "--topic") == 0)
      f->topic = v;
    else if (strcmp(a, "--db") == 0)
      f->db = v;
    else if (strcmp(a, "--consumer") == 0)
      f->consumer = v;
    else if (strcmp(a, "--emit-topic") == 0)
      f->emit_topic = v;
    else if (strcmp(a, "--cafile") == 0)
      f->cafile = v;
    else if (strcmp(a, "--capath") == 0)
      f->capath = v;
    else if (strcmp(a, "--cert") == 0)
      f->cert = v;
    else if (strcmp(a, "--key") == 0)
      f->key = v;
    else if (strcmp(a, "--key-password-file") == 0)
      f->key_password_file = v;
    else if (strcmp(a, "--username") == 0)
      f->username = v;
    else if (strcmp(a, "--password-file") == 0)
      f->password_file = v;
    else if (strcmp(a, "--client-id-lock-dir") == 0)
      f->client_id_lock_dir = v;
    else if (strcmp(a, "--startup-deadline-ms") == 0)
      f->startup_deadline_ms = atoll(v);
    else if (strcmp(a, "--stop-timeout-ms") == 0)
      f->stop_timeout_ms = atoi(v);
    else if (strcmp(a, "--session-expiry-s") == 0)
      f->session_expiry_s = atoll(v);
    else if (strcmp(a, "--mqtt-version") == 0) {
      if (strcmp(v, "5") == 0)
        f->mqtt5 = 1;
      else if (strcmp(v, "3.1.1") != 0)
        return -1;
    } else if (strcmp(a, "--tls-version") == 0) {
      if (strcmp(v, "1.2") == 0)
        f->tls_version = MQTT_INBOX_TLS_1_2;
      else if (strcmp(v, "1.3") == 0)
        f->tls_version = MQTT_INBOX_TLS_1_3;
      else
        return -1;
    } else {
      return -1;
    }
  }
  return f->broker && f->client_id && f->topic && f->db ? 0 : -1;
}

/* The exit code of a failed start-up call on the store. */
static int startup_exit_code(int rc) {
  switch (rc) {
    case MQTT_INBOX_BUSY:
    case MQTT_INBOX_FULL:
    case MQTT_INBOX_IO_ERROR:
    case MQTT_INBOX_READ_ONLY:
      return EXIT_NOT_READY;
    case MQTT_INBOX_CORRUPTION:
      return EXIT_CORRUPT;
    case MQTT_INBOX_PERMISSION_DENIED:
      return EXIT_PERMISSION;
    default:
      return EXIT_FAILED;
  }
}

static int fail(const char* what, int rc, const char* message, int code) {
  fprintf(stderr, "c_ledger_consumer: %s: %s: %s\n", what, mqtt_inbox_errstr(rc),
          message ? message : "");
  return code;
}

int main(int argc, char** argv) {
  struct flags f;
  struct app app = {NULL, NULL};
  mqtt_inbox_options_t io = MQTT_INBOX_OPTIONS_INIT;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  mqtt_inbox_relay_options_t ro = MQTT_INBOX_RELAY_OPTIONS_INIT;
  mqtt_inbox_pruner_options_t po = MQTT_INBOX_PRUNER_OPTIONS_INIT;
  mqtt_inbox_t* inbox = NULL;
  mqtt_inbox_consumer_t* consumer = NULL;
  mqtt_inbox_relay_t* relay = NULL;
  mqtt_inbox_pruner_t* pruner = NULL;
  struct sigaction sa;
  char relay_id[512];
  char *err = NULL, *stats = NULL;
  int rc, stopped, relay_stopped = MQTT_INBOX_OK;

  if (parse(argc, argv, &f) != 0) return usage(argv[0]);
  setvbuf(stdout, NULL, _IOLBF, 0);

  /* 1. The store and the business tables, before anything connects: the broker
   *    redelivers unacknowledged messages right after CONNACK. */
  io.synchronous = f.synchronous_normal ? MQTT_INBOX_SYNC_NORMAL : MQTT_INBOX_SYNC_FULL;
  io.startup_deadline_ms = f.startup_deadline_ms;
  if ((rc = mqtt_inbox_open(f.db, &io, &inbox, &err)) != MQTT_INBOX_OK)
    return fail("opening the database", rc, err, startup_exit_code(rc));
  if ((rc = mqtt_inbox_setup(inbox, LEDGER_TABLES)) != MQTT_INBOX_OK)
    return fail("creating the tables", rc, mqtt_inbox_errmsg(inbox), startup_exit_code(rc));

  /* 2. With --emit-topic, the outbox and its relay (a connection of its own). */
  if (f.emit_topic) {
    if ((rc = mqtt_inbox_outbox_create(inbox, &app.outbox)) != MQTT_INBOX_OK)
      return fail("outbox", rc, mqtt_inbox_errmsg(inbox), EXIT_FAILED);
    app.emit_topic = f.emit_topic;
    snprintf(relay_id, sizeof relay_id, "%s-relay", f.client_id);
    ro.broker_uri = f.broker;
    ro.client_id = relay_id;
    ro.mqtt_version = f.mqtt5 ? MQTT_INBOX_MQTT_5 : MQTT_INBOX_MQTT_3_1_1;
    ro.stop_timeout_ms = f.stop_timeout_ms;
    ro.tls_version = f.tls_version;
    ro.tls_ca_file = f.cafile;
    ro.tls_ca_dir = f.capath;
    ro.tls_cert_file = f.cert;
    ro.tls_key_file = f.key;
    ro.tls_key_password_file = f.key_password_file;
    ro.username = f.username;
    ro.password_file = f.password_file;
    ro.client_id_lock_dir = f.client_id_lock_dir;
    if ((rc = mqtt_inbox_relay_create(app.outbox, &ro, &relay, &err)) != MQTT_INBOX_OK)
      return fail("relay", rc, err, EXIT_SUBSCRIBER);
  }

  /* 3. The consumer: its handler runs inside the claim transaction. */
  if ((rc = mqtt_inbox_consumer_create(inbox, f.consumer, handle_credit, &app, NULL, &consumer)) !=
      MQTT_INBOX_OK)
    return fail("consumer", rc, mqtt_inbox_errmsg(inbox), EXIT_FAILED);

  /* 4. Retention: forget ids once the broker can no longer redeliver them; the window
   *    covers the session expiry asked for, plus a day. */
  po.broker_session_expiry_ms = f.session_expiry_s * 1000;
  po.window_ms = po.broker_session_expiry_ms + 24LL * 3600 * 1000;
  if ((rc = mqtt_inbox_pruner_create(inbox, &po, &pruner)) != MQTT_INBOX_OK)
    return fail("retention", rc, mqtt_inbox_errmsg(inbox), startup_exit_code(rc));
  (void)mqtt_inbox_pruner_start(pruner);

  /* 5. The subscriber: a persistent session; secrets from files. */
  so.broker_uri = f.broker;
  so.client_id = f.client_id;
  so.mqtt_version = f.mqtt5 ? MQTT_INBOX_MQTT_5 : MQTT_INBOX_MQTT_3_1_1;
  so.session_expiry_s = (uint32_t)f.session_expiry_s;
  so.stop_timeout_ms = f.stop_timeout_ms;
  so.tls_version = f.tls_version;
  so.tls_ca_file = f.cafile;
  so.tls_ca_dir = f.capath;
  so.tls_cert_file = f.cert;
  so.tls_key_file = f.key;
  so.tls_key_password_file = f.key_password_file;
  so.username = f.username;
  so.password_file = f.password_file;
  so.client_id_lock_dir = f.client_id_lock_dir;
  if ((rc = mqtt_inbox_subscriber_create(&so, &subscriber, &err)) != MQTT_INBOX_OK)
    return fail("subscriber", rc, err, EXIT_SUBSCRIBER);
  if ((rc = mqtt_inbox_subscriber_subscribe(subscriber, f.topic, consumer)) != MQTT_INBOX_OK)
    return fail("subscribe", rc, mqtt_inbox_subscriber_errmsg(subscriber), EXIT_SUBSCRIBER);

  /* 6. Stop signals ask for a stop; SA_RESTART keeps other threads' calls going. */
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  if ((rc = mqtt_inbox_subscriber_start(subscriber)) != MQTT_INBOX_OK)
    return fail("start", rc, mqtt_inbox_subscriber_errmsg(subscriber),
                rc == MQTT_INBOX_BUSY ? EXIT_NOT_READY : EXIT_SUBSCRIBER);
  if (relay && (rc = mqtt_inbox_relay_start(relay)) != MQTT_INBOX_OK)
    return fail("relay start", rc, mqtt_inbox_relay_errmsg(relay),
                rc == MQTT_INBOX_BUSY ? EXIT_NOT_READY : EXIT_SUBSCRIBER);
  if (mqtt_inbox_subscriber_wait_connected(subscriber, 0) == 0)
    printf("c_ledger_consumer: started, connecting to %s\n", f.broker);

  /* 7. Until SIGTERM/SIGINT; then the stop lets a message in the handler commit first. */
  stopped = mqtt_inbox_subscriber_run(subscriber);
  if (relay) relay_stopped = mqtt_inbox_relay_stop(relay);
  if (mqtt_inbox_stats_json(inbox, &stats) == MQTT_INBOX_OK)
    printf("c_ledger_consumer: stats %s\n", stats);
  mqtt_inbox_free(stats);
  if (stopped != MQTT_INBOX_OK || relay_stopped != MQTT_INBOX_OK) {
    /* A message (or the relay) still waits for the store: nothing unacked is lost, the
     * broker redelivers it to the next run; tearing down would wait for the store. */
    fprintf(stderr, "c_ledger_consumer: stopped while the store was stuck: %s\n",
            stopped != MQTT_INBOX_OK ? mqtt_inbox_subscriber_errmsg(subscriber)
                                     : mqtt_inbox_relay_errmsg(relay));
    fflush(NULL);
    _Exit(EXIT_STOPPED_WHILE_STUCK);
  }
  mqtt_inbox_subscriber_destroy(subscriber);
  mqtt_inbox_relay_destroy(relay);
  mqtt_inbox_pruner_destroy(pruner);
  mqtt_inbox_consumer_destroy(consumer);
  mqtt_inbox_outbox_destroy(app.outbox);
  mqtt_inbox_close(inbox);
  return EXIT_OK_;
}

/* The outbox, retention and dead letters from C, without a broker (c.h): an enqueue from
 * the handler commits with the claim or not at all, a refused enqueue decides the
 * message, an enqueue outside a lent connection is refused, the pruner's window is
 * checked and its pass deletes, and a dead letter is listed, requeued and replayed. */
#define _POSIX_C_SOURCE 200809L
#include <mqtt_inbox/c.h>
#include <time.h>

#include "c_check.h"
#include "ledger.h"

enum mode { EMIT, EMIT_THEN_RETRY, EMIT_BAD_TOPIC, EMIT_TWICE, FAIL_UNTIL_FIXED, EMIT_RAW };

struct script {
  enum mode mode;
  mqtt_inbox_outbox_t* outbox;
  int enqueue_rc;
  int fixed;
  int calls;
};

static int handler(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  struct script* s = (struct script*)ctx;
  int rc;
  ++s->calls;
  if (s->mode == FAIL_UNTIL_FIXED && !s->fixed) {
    mqtt_inbox_delivery_set_reason(d, "not fixed yet");
    return MQTT_INBOX_HANDLER_REJECT;
  }
  rc = ledger_apply_credit(db, d);
  if (rc != MQTT_INBOX_HANDLER_OK || s->mode == FAIL_UNTIL_FIXED) return rc;
  switch (s->mode) {
    case EMIT:
      return ledger_enqueue_credited(s->outbox, db, d, "events/credited");
    case EMIT_THEN_RETRY:
      rc = ledger_enqueue_credited(s->outbox, db, d, "events/credited");
      mqtt_inbox_delivery_set_reason(d, "after the enqueue");
      return rc == MQTT_INBOX_HANDLER_OK ? MQTT_INBOX_HANDLER_RETRY : rc;
    case EMIT_BAD_TOPIC: {
      mqtt_inbox_outgoing_t m = MQTT_INBOX_OUTGOING_INIT;
      m.topic = "events/#";
      m.message_id = "bad-event";
      s->enqueue_rc = mqtt_inbox_outbox_enqueue(s->outbox, db, &m, NULL);
      return MQTT_INBOX_HANDLER_OK; /* the refusal decides */
    }
    case EMIT_RAW: { /* the enqueue's own code, and the handler code for a full class */
      mqtt_inbox_outgoing_t m = MQTT_INBOX_OUTGOING_INIT;
      m.topic = "events/raw";
      m.message_id = mqtt_inbox_delivery_message_id(d);
      m.payload = "{}";
      m.payload_len = 2;
      s->enqueue_rc = mqtt_inbox_outbox_enqueue(s->outbox, db, &m, NULL);
      if (s->enqueue_rc == MQTT_INBOX_OUTBOX_FULL) return MQTT_INBOX_HANDLER_OUTBOX_FULL;
      return s->enqueue_rc == MQTT_INBOX_OK ? MQTT_INBOX_HANDLER_OK : MQTT_INBOX_HANDLER_RETRY;
    }
    case EMIT_TWICE:
      rc = ledger_enqueue_credited(s->outbox, db, d, "events/credited");
      if (rc == MQTT_INBOX_HANDLER_OK)
        rc = ledger_enqueue_credited(s->outbox, db, d, "events/credited");
      return rc;
    default:
      return MQTT_INBOX_HANDLER_OK;
  }
}

struct fixture {
  const char* path;
  mqtt_inbox_t* inbox;
  mqtt_inbox_outbox_t* outbox;
  mqtt_inbox_consumer_t* consumer;
  struct script script;
};

static void start_bounded(struct fixture* f, enum mode mode, int64_t requeue_poll_ms,
                          const mqtt_inbox_outbox_options_t* outbox_options) {
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  memset(f, 0, sizeof *f);
  f->path = c_temp_path("ledger.db");
  REQUIRE(mqtt_inbox_open(f->path, NULL, &f->inbox, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_setup(f->inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
  if (outbox_options)
    REQUIRE(mqtt_inbox_outbox_create_with_options(f->inbox, outbox_options, &f->outbox) ==
            MQTT_INBOX_OK);
  else
    REQUIRE(mqtt_inbox_outbox_create(f->inbox, &f->outbox) == MQTT_INBOX_OK);
  f->script.mode = mode;
  f->script.outbox = f->outbox;
  o.max_attempts = 2;
  o.retry_backoff_initial_ms = 1;
  o.retry_backoff_max_ms = 1;
  o.requeue_poll_ms = requeue_poll_ms;
  REQUIRE(mqtt_inbox_consumer_create(f->inbox, "ledger", handler, &f->script, &o, &f->consumer) ==
          MQTT_INBOX_OK);
}

static void start(struct fixture* f, enum mode mode, int64_t requeue_poll_ms) {
  start_bounded(f, mode, requeue_poll_ms, NULL);
}

static void stop(struct fixture* f) {
  mqtt_inbox_consumer_destroy(f->consumer);
  mqtt_inbox_outbox_destroy(f->outbox);
  mqtt_inbox_close(f->inbox);
}

static int credit(struct fixture* f, const char* id, const char* account, long long amount) {
  char payload[256];
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  int outcome = -1;
  snprintf(payload, sizeof payload, "{\"message_id\":\"%s\",\"account\":\"%s\",\"amount\":%lld}",
           id, account, amount);
  m.topic = "credits/test";
  m.payload = payload;
  m.payload_len = strlen(payload);
  REQUIRE(mqtt_inbox_consumer_feed(f->consumer, &m, &outcome) == MQTT_INBOX_OK);
  return outcome;
}

static long long q(struct fixture* f, const char* sql) { return c_query_int(f->path, sql); }

static void test_an_event_enqueued_by_the_handler_commits_with_the_claim(void) {
  struct fixture f;
  char payload[256];
  start(&f, EMIT, 0);
  CHECK_EQ_INT(credit(&f, "c-1", "alice", 10), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "c-2", "alice", 5), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "c-1", "alice", 10), MQTT_INBOX_OUTCOME_DUPLICATE);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM outbox_messages"), 2);
  CHECK_EQ_INT(q(&f,
                 "SELECT count(*) FROM outbox_messages WHERE message_id = 'c-2/credited'"
                 " AND topic = 'events/credited'"),
               1);
  c_query_text(f.path, "SELECT payload FROM outbox_messages WHERE message_id = 'c-2/credited'",
               payload, sizeof payload);
  CHECK_CONTAINS(payload, "\"balance\":15");
  CHECK_CONTAINS(payload, "\"source_message_id\":\"c-2\"");
  stop(&f);
}

static void test_an_event_of_a_failed_attempt_is_rolled_back_with_it(void) {
  struct fixture f;
  start(&f, EMIT_THEN_RETRY, 0);
  CHECK_EQ_INT(credit(&f, "r-1", "bob", 3), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.calls, 2);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM outbox_messages"), 0);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM accounts"), 0);
  stop(&f);
}

static void test_the_same_event_id_twice_is_one_row(void) {
  struct fixture f;
  start(&f, EMIT_TWICE, 0);
  CHECK_EQ_INT(credit(&f, "t-1", "carol", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM outbox_messages"), 1);
  stop(&f);
}

/* A topic MQTT refuses can never be published: the enqueue says so, and the incoming
 * message is dead-lettered at once as outbox_refused even though the handler returned OK,
 * so its effect never commits without its event. */
static void test_a_refused_enqueue_dead_letters_the_message_even_after_ok(void) {
  struct fixture f;
  char reason[64];
  start(&f, EMIT_BAD_TOPIC, 0);
  CHECK_EQ_INT(credit(&f, "b-1", "dave", 4), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.enqueue_rc, MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_EQ_INT(f.script.calls, 1);
  c_query_text(f.path, "SELECT reason FROM inbox_dead_letters WHERE message_id = 'b-1'", reason,
               sizeof reason);
  CHECK(strcmp(reason, "outbox_refused") == 0);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM accounts"), 0);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM outbox_messages"), 0);
  stop(&f);
}

static int enqueue_in_setup(void* ctx, sqlite3* db) {
  struct fixture* f = (struct fixture*)ctx;
  mqtt_inbox_outgoing_t m = MQTT_INBOX_OUTGOING_INIT;
  char* id = NULL;
  int rc;
  m.topic = "events/boot";
  m.payload = "up";
  m.payload_len = 2;
  rc = mqtt_inbox_outbox_enqueue(f->outbox, db, &m, &id);
  CHECK(id != NULL && strlen(id) == 36); /* a random UUID */
  mqtt_inbox_free(id);
  return rc == MQTT_INBOX_OK ? SQLITE_OK : SQLITE_ERROR;
}

static void test_enqueue_needs_a_connection_the_library_lent(void) {
  struct fixture f;
  sqlite3* own = NULL;
  mqtt_inbox_outgoing_t m = MQTT_INBOX_OUTGOING_INIT;
  char* id = (char*)&id;
  start(&f, EMIT, 0);
  m.topic = "events/x";
  REQUIRE(sqlite3_open(f.path, &own) == SQLITE_OK);
  sqlite3_exec(own, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  CHECK_EQ_INT(mqtt_inbox_outbox_enqueue(f.outbox, own, &m, &id), MQTT_INBOX_MISUSE);
  CHECK(id == NULL);
  CHECK_CONTAINS(mqtt_inbox_outbox_errmsg(f.outbox), "lent");
  sqlite3_exec(own, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(own);
  CHECK_EQ_INT(mqtt_inbox_outbox_enqueue(f.outbox, NULL, &m, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_outbox_enqueue(NULL, NULL, &m, NULL), MQTT_INBOX_MISUSE);
  /* A set-up function's connection is lent too. */
  CHECK_EQ_INT(mqtt_inbox_setup_fn(f.inbox, enqueue_in_setup, &f), MQTT_INBOX_OK);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM outbox_messages WHERE topic = 'events/boot'"), 1);
  mqtt_inbox_outbox_destroy(NULL);
  stop(&f);
}

static void test_derived_ids(void) {
  char* id = NULL;
  char longer[300];
  CHECK_EQ_INT(mqtt_inbox_derived_message_id("c-1", "credited", &id), MQTT_INBOX_OK);
  CHECK(id && strcmp(id, "c-1/credited") == 0);
  mqtt_inbox_free(id);
  memset(longer, 'x', sizeof longer - 1);
  longer[sizeof longer - 1] = 0;
  CHECK_EQ_INT(mqtt_inbox_derived_message_id(longer, "credited", &id), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(id == NULL);
  CHECK_EQ_INT(mqtt_inbox_derived_message_id(NULL, "x", &id), MQTT_INBOX_MISUSE);
}

static void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

static void test_the_pruner_checks_its_window_and_deletes_old_ids(void) {
  struct fixture f;
  mqtt_inbox_pruner_options_t o = MQTT_INBOX_PRUNER_OPTIONS_INIT;
  mqtt_inbox_pruner_t* p = (mqtt_inbox_pruner_t*)&p;
  int64_t deleted = -1;
  start(&f, EMIT, 0);
  /* One day cannot cover the 7-day session expiry the broker may redeliver within. */
  o.window_ms = 24LL * 3600 * 1000;
  CHECK_EQ_INT(mqtt_inbox_pruner_create(f.inbox, &o, &p), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(p == NULL);
  CHECK(strlen(mqtt_inbox_errmsg(f.inbox)) > 0);
  /* A window of 200 ms with no horizon: ids older than that are forgotten. */
  o.window_ms = 200;
  o.broker_session_expiry_ms = 0;
  o.margin_ms = 0;
  REQUIRE(mqtt_inbox_pruner_create(f.inbox, &o, &p) == MQTT_INBOX_OK);
  CHECK_EQ_INT(credit(&f, "p-1", "erin", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "p-2", "erin", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(mqtt_inbox_pruner_run_once(p, &deleted), MQTT_INBOX_OK);
  CHECK_EQ_INT(deleted, 0);
  sleep_ms(400);
  CHECK_EQ_INT(mqtt_inbox_pruner_run_once(p, &deleted), MQTT_INBOX_OK);
  CHECK_EQ_INT(deleted, 2);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_processed"), 0);
  CHECK_EQ_INT(mqtt_inbox_pruner_start(p), MQTT_INBOX_OK);
  mqtt_inbox_pruner_destroy(p);
  mqtt_inbox_pruner_destroy(NULL);
  CHECK_EQ_INT(mqtt_inbox_pruner_run_once(NULL, NULL), MQTT_INBOX_MISUSE);
  stop(&f);
}

static void test_a_dead_letter_is_listed_requeued_and_replayed_once(void) {
  struct fixture f;
  char* json = NULL;
  long long id;
  int i;
  start(&f, FAIL_UNTIL_FIXED, 50);
  CHECK_EQ_INT(credit(&f, "d-1", "frank", 7), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  REQUIRE(mqtt_inbox_dead_letters_json(f.inbox, "ledger", 0, &json) == MQTT_INBOX_OK);
  CHECK_CONTAINS(json, "\"message_id\":\"d-1\"");
  CHECK_CONTAINS(json, "\"reason\":\"invalid_payload\"");
  CHECK_CONTAINS(json, "\"reason_text\":\"not fixed yet\"");
  CHECK_CONTAINS(json, "\"status\":\"dead\"");
  mqtt_inbox_free(json);
  REQUIRE(mqtt_inbox_dead_letters_json(f.inbox, "other", 10, &json) == MQTT_INBOX_OK);
  CHECK(strcmp(json, "[]") == 0);
  mqtt_inbox_free(json);

  id = q(&f, "SELECT id FROM inbox_dead_letters WHERE message_id = 'd-1'");
  CHECK_EQ_INT(mqtt_inbox_dead_letter_requeue(f.inbox, 999999), MQTT_INBOX_NOT_FOUND);
  f.script.fixed = 1; /* the fix is deployed */
  CHECK_EQ_INT(mqtt_inbox_dead_letter_requeue(f.inbox, id), MQTT_INBOX_OK);
  for (i = 0; i < 200 && q(&f, "SELECT count(*) FROM ledger_entries") < 1; ++i) sleep_ms(20);
  CHECK_EQ_INT(q(&f, "SELECT balance FROM accounts WHERE account = 'frank'"), 7);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_dead_letters WHERE status = 'replayed'"), 1);
  /* Replayed once: requeueing it again is refused. */
  CHECK_EQ_INT(mqtt_inbox_dead_letter_requeue(f.inbox, id), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_EQ_INT(credit(&f, "d-1", "frank", 7), MQTT_INBOX_OUTCOME_DUPLICATE);
  CHECK_EQ_INT(q(&f, "SELECT balance FROM accounts WHERE account = 'frank'"), 7);
  CHECK_EQ_INT(mqtt_inbox_dead_letters_json(NULL, NULL, 0, &json), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_dead_letters_json(f.inbox, NULL, 0, NULL), MQTT_INBOX_MISUSE);
  stop(&f);
}

static void test_relay_create_refuses_misuse_and_bad_options(void) {
  struct fixture f;
  mqtt_inbox_relay_options_t o = MQTT_INBOX_RELAY_OPTIONS_INIT;
  mqtt_inbox_relay_t* r = (mqtt_inbox_relay_t*)&r;
  char *err = NULL, *json = NULL;
  start(&f, EMIT, 0);
  CHECK_EQ_INT(mqtt_inbox_relay_create(NULL, &o, &r, NULL), MQTT_INBOX_MISUSE);
  CHECK(r == NULL);
  CHECK_EQ_INT(mqtt_inbox_relay_create(f.outbox, NULL, &r, NULL), MQTT_INBOX_MISUSE);
  o.broker_uri = "tcp://127.0.0.1:1";
  CHECK_EQ_INT(mqtt_inbox_relay_create(f.outbox, &o, &r, &err), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "client_id");
  mqtt_inbox_free(err);
  o.client_id = "relay-1";
  o.client_id_lock_dir = "";
  o.password_file = c_temp_path("missing-password");
  o.username = "u";
  CHECK_EQ_INT(mqtt_inbox_relay_create(f.outbox, &o, &r, &err), MQTT_INBOX_IO_ERROR);
  CHECK_CONTAINS(err, "missing-password");
  mqtt_inbox_free(err);
  o.password_file = NULL;
  o.max_inflight = 0;
  CHECK_EQ_INT(mqtt_inbox_relay_create(f.outbox, &o, &r, NULL), MQTT_INBOX_INVALID_ARGUMENT);
  o.max_inflight = 64;
  REQUIRE(mqtt_inbox_relay_create(f.outbox, &o, &r, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_relay_counters_json(r, &json) == MQTT_INBOX_OK);
  CHECK_CONTAINS(json, "\"published\":0");
  CHECK_CONTAINS(json, "\"connected\":false");
  mqtt_inbox_free(json);
  CHECK_EQ_INT(mqtt_inbox_relay_counters_json(r, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_relay_start(NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_relay_stop(NULL), MQTT_INBOX_MISUSE);
  CHECK(mqtt_inbox_relay_errmsg(NULL) != NULL);
  mqtt_inbox_relay_destroy(r); /* never started */
  mqtt_inbox_relay_destroy(NULL);
  CHECK_EQ_INT(mqtt_inbox_outbox_create(NULL, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_pruner_create(NULL, NULL, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_dead_letter_requeue(NULL, 1), MQTT_INBOX_MISUSE);
  stop(&f);
}

/* A full MQTT_INBOX_OUTBOX_REJECT class: the enqueue says MQTT_INBOX_OUTBOX_FULL (not a
 * store's code), and a handler that passes it on with MQTT_INBOX_HANDLER_OUTBOX_FULL gets
 * its message parked, not blamed: one handler call (max_attempts is 2), no attempt
 * counted, the dead letter outbox_full 'requeued', the effect rolled back. */
static void test_a_full_class_parks_the_message_without_counting_an_attempt(void) {
  struct fixture f;
  mqtt_inbox_outbox_class_t c = MQTT_INBOX_OUTBOX_CLASS_INIT;
  mqtt_inbox_outbox_options_t oo = MQTT_INBOX_OUTBOX_OPTIONS_INIT;
  c.topic_prefix = "events/";
  c.max_rows = 2;
  oo.classes = &c;
  oo.class_count = 1;
  start_bounded(&f, EMIT_RAW, 0, &oo);
  CHECK_EQ_INT(credit(&f, "f-1", "gina", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "f-2", "gina", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  f.script.calls = 0;
  CHECK_EQ_INT(credit(&f, "f-3", "gina", 1), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.enqueue_rc, MQTT_INBOX_OUTBOX_FULL);
  CHECK(strcmp(mqtt_inbox_errstr(MQTT_INBOX_OUTBOX_FULL), "outbox full") == 0);
  CHECK_CONTAINS(mqtt_inbox_outbox_errmsg(f.outbox), "outbox full");
  CHECK_EQ_INT(f.script.calls, 1);
  CHECK_EQ_INT(q(&f,
                 "SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'f-3'"
                 " AND reason = 'outbox_full' AND status = 'requeued' AND attempts = 0"),
               1);
  CHECK_EQ_INT(q(&f, "SELECT balance FROM accounts WHERE account = 'gina'"), 2);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM outbox_messages"), 2);
  stop(&f);
}

/* The ledger's handler (examples/c/ledger.c) passes MQTT_INBOX_OUTBOX_FULL on the same
 * way. */
static void test_the_ledger_handler_parks_a_message_its_full_class_refused(void) {
  struct fixture f;
  mqtt_inbox_outbox_class_t c = MQTT_INBOX_OUTBOX_CLASS_INIT;
  mqtt_inbox_outbox_options_t oo = MQTT_INBOX_OUTBOX_OPTIONS_INIT;
  c.topic_prefix = "events/";
  c.max_rows = 2;
  oo.classes = &c;
  oo.class_count = 1;
  start_bounded(&f, EMIT, 0, &oo);
  CHECK_EQ_INT(credit(&f, "l-1", "hal", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "l-2", "hal", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "l-3", "hal", 1), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(q(&f,
                 "SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'l-3'"
                 " AND reason = 'outbox_full' AND status = 'requeued'"),
               1);
  CHECK_EQ_INT(q(&f, "SELECT balance FROM accounts WHERE account = 'hal'"), 2);
  stop(&f);
}

/* A MQTT_INBOX_OUTBOX_DROP_OLDEST class makes room by dropping its oldest pending rows:
 * every message is processed, the class keeps its newest rows, and a topic outside it is
 * not bounded. */
static void test_a_drop_oldest_class_keeps_the_newest_rows(void) {
  struct fixture f;
  mqtt_inbox_outbox_class_t c[2] = {MQTT_INBOX_OUTBOX_CLASS_INIT, MQTT_INBOX_OUTBOX_CLASS_INIT};
  mqtt_inbox_outbox_options_t oo = MQTT_INBOX_OUTBOX_OPTIONS_INIT;
  c[0].topic_prefix = "events/";
  c[0].max_rows = 2;
  c[0].policy = MQTT_INBOX_OUTBOX_DROP_OLDEST;
  c[1].topic_prefix = "alarms/";
  c[1].max_rows = 1;
  oo.classes = c;
  oo.class_count = 2;
  start_bounded(&f, EMIT_RAW, 0, &oo);
  CHECK_EQ_INT(credit(&f, "o-1", "ida", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "o-2", "ida", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "o-3", "ida", 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(f.script.enqueue_rc, MQTT_INBOX_OK);
  CHECK_EQ_INT(q(&f, "SELECT balance FROM accounts WHERE account = 'ida'"), 3);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM outbox_messages WHERE state = 'pending'"), 2);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM outbox_messages WHERE message_id = 'o-1'"), 0);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_dead_letters"), 0);
  stop(&f);
}

static void refused_outbox(mqtt_inbox_t* inbox, const mqtt_inbox_outbox_options_t* oo, int rc,
                           const char* part) {
  mqtt_inbox_outbox_t* o = (mqtt_inbox_outbox_t*)&o;
  CHECK_EQ_INT(mqtt_inbox_outbox_create_with_options(inbox, oo, &o), rc);
  CHECK(o == NULL);
  CHECK_CONTAINS(mqtt_inbox_errmsg(inbox), part);
}

static void test_outbox_options_and_every_class_are_checked(void) {
  struct fixture f;
  mqtt_inbox_outbox_class_t c[2] = {MQTT_INBOX_OUTBOX_CLASS_INIT, MQTT_INBOX_OUTBOX_CLASS_INIT};
  mqtt_inbox_outbox_options_t oo = MQTT_INBOX_OUTBOX_OPTIONS_INIT;
  mqtt_inbox_outbox_t* o = NULL;
  start(&f, EMIT, 0);
  oo.classes = c;
  oo.class_count = 1;
  refused_outbox(f.inbox, &oo, MQTT_INBOX_INVALID_ARGUMENT, "topic_prefix");
  c[0].topic_prefix = "t/";
  c[0].policy = 7;
  refused_outbox(f.inbox, &oo, MQTT_INBOX_INVALID_ARGUMENT, "policy");
  c[0].policy = MQTT_INBOX_OUTBOX_REJECT;
  c[0].max_rows = -1;
  refused_outbox(f.inbox, &oo, MQTT_INBOX_INVALID_ARGUMENT, "t/");
  c[0].max_rows = 1;
  c[1].topic_prefix = "t/";
  oo.class_count = 2;
  refused_outbox(f.inbox, &oo, MQTT_INBOX_INVALID_ARGUMENT, "twice");
  c[1].topic_prefix = "u/";
  c[1].struct_size = 8;
  refused_outbox(f.inbox, &oo, MQTT_INBOX_MISUSE, "classes[1].struct_size is 8");
  c[1].struct_size = sizeof c[1];
  memset(c[1].struct_id, 0, sizeof c[1].struct_id); /* a class not made by its _INIT */
  refused_outbox(f.inbox, &oo, MQTT_INBOX_MISUSE, "classes[1] was not initialised");
  c[1] = (mqtt_inbox_outbox_class_t)MQTT_INBOX_OUTBOX_CLASS_INIT;
  c[1].topic_prefix = "u/";
  c[0].struct_size = 12; /* not the size of any version: misaligned elements */
  refused_outbox(f.inbox, &oo, MQTT_INBOX_MISUSE, "classes[0].struct_size is 12");
  c[0].struct_size = sizeof c[0];
  oo.classes = NULL;
  refused_outbox(f.inbox, &oo, MQTT_INBOX_MISUSE, "NULL classes");
  CHECK_EQ_INT(mqtt_inbox_outbox_create_with_options(f.inbox, NULL, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_outbox_create_with_options(NULL, NULL, &o), MQTT_INBOX_MISUSE);
  oo.classes = c;
  CHECK_EQ_INT(mqtt_inbox_outbox_create_with_options(f.inbox, &oo, &o), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_outbox_destroy(o), MQTT_INBOX_OK);
  stop(&f);
}

static void refused_relay(mqtt_inbox_outbox_t* outbox, const mqtt_inbox_relay_options_t* o,
                          const char* part) {
  mqtt_inbox_relay_t* r = (mqtt_inbox_relay_t*)&r;
  char* err = NULL;
  CHECK_EQ_INT(mqtt_inbox_relay_create(outbox, o, &r, &err), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(r == NULL);
  CHECK_CONTAINS(err, part);
  mqtt_inbox_free(err);
}

/* The relay's publishing fields reach RelayOptions' checks. */
static void test_relay_publishing_options_are_checked(void) {
  struct fixture f;
  mqtt_inbox_relay_options_t o = MQTT_INBOX_RELAY_OPTIONS_INIT;
  mqtt_inbox_relay_t* r = NULL;
  char* err = NULL;
  start(&f, EMIT, 0);
  o.broker_uri = "tcp://127.0.0.1:1";
  o.client_id = "relay-1";
  o.client_id_lock_dir = "";
  o.max_packet_size = -1;
  refused_relay(f.outbox, &o, "max_packet_size");
  o.max_packet_size = 1024;
  o.mark_batch = 0;
  refused_relay(f.outbox, &o, "mark_batch");
  o.mark_batch = 1;
  o.mark_linger_ms = -1;
  refused_relay(f.outbox, &o, "mark_linger_ms");
  o.mark_linger_ms = 0;
  o.metrics_period_ms = 0;
  refused_relay(f.outbox, &o, "intervals");
  o.metrics_period_ms = 50;
  o.tls_insecure_skip_certificate_check = 1; /* TLS setting on a plaintext URI */
  refused_relay(f.outbox, &o, "plaintext");
  o.tls_insecure_skip_certificate_check = 0;
  o.wake_on_commit = 0;
  o.prometheus_textfile = c_temp_path("relay.prom");
  CHECK_EQ_INT(mqtt_inbox_relay_create(f.outbox, &o, &r, &err), MQTT_INBOX_OK);
  CHECK(err == NULL);
  CHECK_EQ_INT(mqtt_inbox_relay_destroy(r), MQTT_INBOX_OK);
  stop(&f);
}

/* A relay on a subscriber's connection: the connection fields are the subscriber's, so
 * one set is refused by name instead of dropped; the publishing fields are checked; one
 * relay per subscriber. No broker: start only attaches to the subscriber. */
static void test_a_lent_relay_refuses_connection_fields_and_a_second_relay(void) {
  struct fixture f;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  mqtt_inbox_relay_options_t o = MQTT_INBOX_RELAY_OPTIONS_INIT;
  mqtt_inbox_subscriber_t* sub = NULL;
  mqtt_inbox_relay_t *r = (mqtt_inbox_relay_t*)&r, *second = NULL;
  char* err = NULL;
  start(&f, EMIT, 0);
  so.broker_uri = "tcp://127.0.0.1:1";
  so.client_id = "lender";
  so.client_id_lock_dir = "";
  REQUIRE(mqtt_inbox_subscriber_create(&so, &sub, NULL) == MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_relay_create_on(NULL, sub, NULL, &r, NULL), MQTT_INBOX_MISUSE);
  CHECK(r == NULL);
  CHECK_EQ_INT(mqtt_inbox_relay_create_on(f.outbox, NULL, NULL, &r, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_relay_create_on(f.outbox, sub, NULL, NULL, NULL), MQTT_INBOX_MISUSE);
  o.broker_uri = "tcp://127.0.0.1:1";
  CHECK_EQ_INT(mqtt_inbox_relay_create_on(f.outbox, sub, &o, &r, &err),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "broker_uri");
  mqtt_inbox_free(err);
  o.broker_uri = NULL;
  o.tls_ca_file = "ca.pem";
  CHECK_EQ_INT(mqtt_inbox_relay_create_on(f.outbox, sub, &o, &r, &err),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "tls_ca_file");
  mqtt_inbox_free(err);
  o.tls_ca_file = NULL;
  o.tls_insecure_skip_hostname_check = 1;
  CHECK_EQ_INT(mqtt_inbox_relay_create_on(f.outbox, sub, &o, &r, &err),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "tls_insecure_skip_hostname_check");
  mqtt_inbox_free(err);
  o.tls_insecure_skip_hostname_check = 0;
  o.max_packet_size = -1;
  CHECK_EQ_INT(mqtt_inbox_relay_create_on(f.outbox, sub, &o, &r, &err),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "max_packet_size");
  mqtt_inbox_free(err);
  o.max_packet_size = 4096;
  REQUIRE(mqtt_inbox_relay_create_on(f.outbox, sub, &o, &r, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_relay_create_on(f.outbox, sub, NULL, &second, NULL) == MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_relay_start(r), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_relay_start(second), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(strlen(mqtt_inbox_relay_errmsg(second)) > 0);
  CHECK_EQ_INT(mqtt_inbox_relay_stop(r), MQTT_INBOX_OK);
  mqtt_inbox_relay_destroy(second);
  mqtt_inbox_relay_destroy(r);
  mqtt_inbox_subscriber_destroy(sub);
  stop(&f);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(an_event_enqueued_by_the_handler_commits_with_the_claim),
    CASE(an_event_of_a_failed_attempt_is_rolled_back_with_it),
    CASE(the_same_event_id_twice_is_one_row),
    CASE(a_refused_enqueue_dead_letters_the_message_even_after_ok),
    CASE(enqueue_needs_a_connection_the_library_lent),
    CASE(derived_ids),
    CASE(the_pruner_checks_its_window_and_deletes_old_ids),
    CASE(a_dead_letter_is_listed_requeued_and_replayed_once),
    CASE(relay_create_refuses_misuse_and_bad_options),
    CASE(a_full_class_parks_the_message_without_counting_an_attempt),
    CASE(the_ledger_handler_parks_a_message_its_full_class_refused),
    CASE(a_drop_oldest_class_keeps_the_newest_rows),
    CASE(outbox_options_and_every_class_are_checked),
    CASE(relay_publishing_options_are_checked),
    CASE(a_lent_relay_refuses_connection_fields_and_a_second_relay),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

/* The outbox, retention and dead letters from C, without a broker (c.h): an enqueue from
 * the handler commits with the claim or not at all, a refused enqueue decides the
 * message, an enqueue outside a lent connection is refused, the pruner's window is
 * checked and its pass deletes, and a dead letter is listed, requeued and replayed. */
#define _POSIX_C_SOURCE 200809L
#include <mqtt_inbox/c.h>
#include <time.h>

#include "c_check.h"
#include "ledger.h"

enum mode { EMIT, EMIT_THEN_RETRY, EMIT_BAD_TOPIC, EMIT_TWICE, FAIL_UNTIL_FIXED };

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

static void start(struct fixture* f, enum mode mode, int64_t requeue_poll_ms) {
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  memset(f, 0, sizeof *f);
  f->path = c_temp_path("ledger.db");
  REQUIRE(mqtt_inbox_open(f->path, NULL, &f->inbox, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_setup(f->inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
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
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

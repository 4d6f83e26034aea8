/* Out of memory inside the C API (c.h: "No C++ exception ever crosses this boundary: out
 * of memory is MQTT_INBOX_NOMEM"). A replaced operator new (alloc_fail.cpp) makes the
 * Nth C++ allocation of a call throw std::bad_alloc, for N = 0, 1, 2, ... until the call
 * runs through without reaching the Nth allocation. Every run must return
 * MQTT_INBOX_OK or MQTT_INBOX_NOMEM (never crash, never another code, never leave a lock
 * or a half-made object behind), and what the file holds must stay exactly-once: every
 * message fed under allocation failure is applied once, however its call ended. */
#include <mqtt_inbox/c.h>

#include "alloc_fail.h"
#include "c_check.h"
#include "ledger.h"

#define MAX_N 20000 /* a call needing more allocations than this is a test bug */

static int ledger(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  (void)ctx;
  return ledger_apply_credit(db, d);
}

/* One armed call: returns its result code; *fired says whether the failure happened. */
typedef int (*call_fn)(void* state);

static int armed(call_fn fn, void* state, long n, int* fired) {
  long before = c_alloc_failures();
  int rc;
  c_alloc_fail_nth(n);
  rc = fn(state);
  c_alloc_fail_off();
  *fired = c_alloc_failures() > before;
  return rc;
}

/* Runs fn with the Nth allocation failing for every N until one run does not reach it;
 * checks each run's code. Returns the number of runs that got NOMEM. */
static long every_n(const char* what, call_fn fn, void* state) {
  long n, nomem = 0;
  int fired = 1, rc;
  for (n = 0; n < MAX_N && fired; ++n) {
    rc = armed(fn, state, n, &fired);
    if (rc == MQTT_INBOX_NOMEM) {
      ++nomem;
      CHECK(fired);
    } else if (rc != MQTT_INBOX_OK) {
      fprintf(stderr, "%s: allocation %ld failing gave %d (%s)\n", what, n, rc,
              mqtt_inbox_errstr(rc));
      CHECK(rc == MQTT_INBOX_OK || rc == MQTT_INBOX_NOMEM);
    }
  }
  CHECK(!fired);
  fprintf(stderr, "%s: %ld allocations, %ld runs returned NOMEM\n", what, n - 1, nomem);
  return nomem;
}

struct open_state {
  const char* path;
  int opened;
};

static int call_open(void* p) {
  struct open_state* s = (struct open_state*)p;
  mqtt_inbox_t* inbox = NULL;
  char* errmsg = NULL;
  int rc = mqtt_inbox_open(s->path, NULL, &inbox, &errmsg);
  if (rc == MQTT_INBOX_OK) {
    CHECK(inbox != NULL);
    ++s->opened;
    mqtt_inbox_close(inbox);
  } else {
    CHECK(inbox == NULL);
    if (rc != MQTT_INBOX_NOMEM) fprintf(stderr, "mqtt_inbox_open: %s\n", errmsg ? errmsg : "");
  }
  mqtt_inbox_free(errmsg);
  return rc;
}

/* A failed open leaves no lock behind: the next run (and the last) opens the file. */
static void test_open_returns_nomem_and_leaves_no_lock(void) {
  struct open_state s;
  s.path = c_temp_path("ledger.db");
  s.opened = 0;
  CHECK(every_n("mqtt_inbox_open", call_open, &s) > 0);
  CHECK(s.opened >= 1);
  CHECK_EQ_INT(call_open(&s), MQTT_INBOX_OK);
}

struct inbox_state {
  const char* path;
  mqtt_inbox_t* inbox;
  mqtt_inbox_consumer_t* consumer;
  int next_id;
  int ok_feeds;
};

static void open_inbox(struct inbox_state* s) {
  memset(s, 0, sizeof *s);
  s->path = c_temp_path("ledger.db");
  REQUIRE(mqtt_inbox_open(s->path, NULL, &s->inbox, NULL) == MQTT_INBOX_OK);
}

static int call_setup(void* p) {
  struct inbox_state* s = (struct inbox_state*)p;
  return mqtt_inbox_setup(s->inbox, LEDGER_TABLES);
}

static int call_consumer_create(void* p) {
  struct inbox_state* s = (struct inbox_state*)p;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_consumer_t* c = NULL;
  int rc;
  o.requeue_poll_ms = 0;
  rc = mqtt_inbox_consumer_create(s->inbox, "ledger", ledger, NULL, &o, &c);
  CHECK((rc == MQTT_INBOX_OK) == (c != NULL));
  mqtt_inbox_consumer_destroy(c);
  return rc;
}

static int feed_id(struct inbox_state* s, int id, int* outcome) {
  char payload[128];
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  snprintf(payload, sizeof payload, "{\"message_id\":\"n-%d\",\"account\":\"ann\",\"amount\":1}",
           id);
  m.topic = "credits/test";
  m.payload = payload;
  m.payload_len = strlen(payload);
  return mqtt_inbox_consumer_feed(s->consumer, &m, outcome);
}

static int call_feed(void* p) {
  struct inbox_state* s = (struct inbox_state*)p;
  int outcome = -1;
  int rc = feed_id(s, s->next_id++, &outcome);
  if (rc == MQTT_INBOX_OK) {
    CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_PROCESSED);
    ++s->ok_feeds;
  }
  return rc;
}

static int call_stats(void* p) {
  struct inbox_state* s = (struct inbox_state*)p;
  char* json = NULL;
  int rc = mqtt_inbox_stats_json(s->inbox, &json);
  CHECK((rc == MQTT_INBOX_OK) == (json != NULL));
  mqtt_inbox_free(json);
  return rc;
}

static int call_health(void* p) {
  struct inbox_state* s = (struct inbox_state*)p;
  char* json = NULL;
  int rc = mqtt_inbox_health_json(s->inbox, &json);
  CHECK((rc == MQTT_INBOX_OK) == (json != NULL));
  mqtt_inbox_free(json);
  return rc;
}

static int call_consumer_health(void* p) {
  struct inbox_state* s = (struct inbox_state*)p;
  char* json = NULL;
  int rc = mqtt_inbox_consumer_health_json(s->consumer, &json);
  CHECK((rc == MQTT_INBOX_OK) == (json != NULL));
  mqtt_inbox_free(json);
  return rc;
}

static int call_dead_letters(void* p) {
  struct inbox_state* s = (struct inbox_state*)p;
  char* json = NULL;
  int rc = mqtt_inbox_dead_letters_json(s->inbox, NULL, 0, &json);
  CHECK((rc == MQTT_INBOX_OK) == (json != NULL));
  mqtt_inbox_free(json);
  return rc;
}

static int call_derived_id(void* p) {
  char* id = NULL;
  /* Longer than std::string's inline buffer, so that the id is allocated. */
  int rc = mqtt_inbox_derived_message_id("incoming-message-0001", "credited-to-ledger", &id);
  (void)p;
  if (rc == MQTT_INBOX_OK) CHECK(id && strcmp(id, "incoming-message-0001/credited-to-ledger") == 0);
  mqtt_inbox_free(id);
  return rc;
}

static void test_setup_and_consumer_create_return_nomem(void) {
  struct inbox_state s;
  open_inbox(&s);
  CHECK(every_n("mqtt_inbox_setup", call_setup, &s) > 0);
  CHECK(every_n("mqtt_inbox_consumer_create", call_consumer_create, &s) > 0);
  CHECK_EQ_INT(c_query_int(s.path, "SELECT count(*) FROM accounts"), 0);
  mqtt_inbox_close(s.inbox);
}

/* Each run feeds a new id. Afterwards, without failures, every id is fed again: each is
 * then processed or a duplicate, and the balance counts every id exactly once. */
static void test_feed_returns_nomem_and_stays_exactly_once(void) {
  struct inbox_state s;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  int i, outcome;
  open_inbox(&s);
  REQUIRE(mqtt_inbox_setup(s.inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
  o.requeue_poll_ms = 0;
  o.retry_backoff_initial_ms = 1;
  o.retry_backoff_max_ms = 2;
  REQUIRE(mqtt_inbox_consumer_create(s.inbox, "ledger", ledger, NULL, &o, &s.consumer) ==
          MQTT_INBOX_OK);
  CHECK(every_n("mqtt_inbox_consumer_feed", call_feed, &s) > 0);
  CHECK(s.ok_feeds >= 1);
  CHECK(c_query_int(s.path, "SELECT count(*) FROM ledger_entries") >= s.ok_feeds);
  for (i = 0; i < s.next_id; ++i) {
    outcome = -1;
    CHECK_EQ_INT(feed_id(&s, i, &outcome), MQTT_INBOX_OK);
    CHECK(outcome == MQTT_INBOX_OUTCOME_PROCESSED || outcome == MQTT_INBOX_OUTCOME_DUPLICATE);
  }
  CHECK_EQ_INT(c_query_int(s.path, "SELECT count(*) FROM ledger_entries"), s.next_id);
  CHECK_EQ_INT(c_query_int(s.path, "SELECT count(DISTINCT message_id) FROM ledger_entries"),
               s.next_id);
  CHECK_EQ_INT(c_query_int(s.path, "SELECT balance FROM accounts WHERE account = 'ann'"),
               s.next_id);
  CHECK_EQ_INT(c_query_int(s.path, "SELECT count(*) FROM inbox_dead_letters"), 0);
  mqtt_inbox_consumer_destroy(s.consumer);
  mqtt_inbox_close(s.inbox);
}

static void test_observing_calls_return_nomem(void) {
  struct inbox_state s;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  int outcome = -1;
  open_inbox(&s);
  REQUIRE(mqtt_inbox_setup(s.inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
  o.requeue_poll_ms = 0;
  REQUIRE(mqtt_inbox_consumer_create(s.inbox, "ledger", ledger, NULL, &o, &s.consumer) ==
          MQTT_INBOX_OK);
  /* A dead letter, so the list has a row to build. */
  {
    mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
    const char* payload = "{\"message_id\":\"bad-1\",\"account\":\"ann\",\"amount\":-1}";
    m.topic = "credits/test";
    m.payload = payload;
    m.payload_len = strlen(payload);
    REQUIRE(mqtt_inbox_consumer_feed(s.consumer, &m, &outcome) == MQTT_INBOX_OK);
    CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  }
  CHECK(every_n("mqtt_inbox_stats_json", call_stats, &s) > 0);
  CHECK(every_n("mqtt_inbox_health_json", call_health, &s) > 0);
  CHECK(every_n("mqtt_inbox_consumer_health_json", call_consumer_health, &s) > 0);
  CHECK(every_n("mqtt_inbox_dead_letters_json", call_dead_letters, &s) > 0);
  CHECK(every_n("mqtt_inbox_derived_message_id", call_derived_id, &s) > 0);
  mqtt_inbox_consumer_destroy(s.consumer);
  mqtt_inbox_close(s.inbox);
}

/* The subscriber's and the relay's JSON, made without connecting (nothing listens on
 * port 1; neither is started). */
struct connection_state {
  mqtt_inbox_subscriber_t* subscriber;
  mqtt_inbox_relay_t* relay;
};

static int call_subscriber_health(void* p) {
  struct connection_state* s = (struct connection_state*)p;
  char* json = NULL;
  int rc = mqtt_inbox_subscriber_health_json(s->subscriber, &json);
  CHECK((rc == MQTT_INBOX_OK) == (json != NULL));
  if (rc == MQTT_INBOX_OK) CHECK_CONTAINS(json, "\"connected\":false");
  mqtt_inbox_free(json);
  return rc;
}

static int call_relay_counters(void* p) {
  struct connection_state* s = (struct connection_state*)p;
  char* json = NULL;
  int rc = mqtt_inbox_relay_counters_json(s->relay, &json);
  CHECK((rc == MQTT_INBOX_OK) == (json != NULL));
  if (rc == MQTT_INBOX_OK) CHECK_CONTAINS(json, "\"published\":0");
  mqtt_inbox_free(json);
  return rc;
}

static void test_subscriber_and_relay_json_return_nomem(void) {
  struct inbox_state s;
  struct connection_state c;
  mqtt_inbox_outbox_t* outbox = NULL;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  mqtt_inbox_relay_options_t ro = MQTT_INBOX_RELAY_OPTIONS_INIT;
  memset(&c, 0, sizeof c);
  open_inbox(&s);
  REQUIRE(mqtt_inbox_setup(s.inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
  so.broker_uri = "tcp://127.0.0.1:1";
  so.client_id = "nomem-subscriber";
  so.client_id_lock_dir = "";
  REQUIRE(mqtt_inbox_subscriber_create(&so, &c.subscriber, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_outbox_create(s.inbox, &outbox) == MQTT_INBOX_OK);
  ro.broker_uri = "tcp://127.0.0.1:1";
  ro.client_id = "nomem-relay";
  ro.client_id_lock_dir = "";
  REQUIRE(mqtt_inbox_relay_create(outbox, &ro, &c.relay, NULL) == MQTT_INBOX_OK);
  CHECK(every_n("mqtt_inbox_subscriber_health_json", call_subscriber_health, &c) > 0);
  CHECK(every_n("mqtt_inbox_relay_counters_json", call_relay_counters, &c) > 0);
  mqtt_inbox_relay_destroy(c.relay);
  mqtt_inbox_outbox_destroy(outbox);
  mqtt_inbox_subscriber_destroy(c.subscriber);
  mqtt_inbox_close(s.inbox);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(open_returns_nomem_and_leaves_no_lock),     CASE(setup_and_consumer_create_return_nomem),
    CASE(feed_returns_nomem_and_stays_exactly_once), CASE(observing_calls_return_nomem),
    CASE(subscriber_and_relay_json_return_nomem),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

/* The consumer from C (c.h, "The consumer and its handler"): each handler return code
 * ends as the rows say (balances, ledger entries, claims, dead letters with their
 * reason and text), transaction control inside the handler is refused, commits nothing
 * and fails the attempt by name whatever the handler returns, a call back into the inbox is caught,
 * and the delivery view carries what was fed in. Messages are fed with mqtt_inbox_consumer_feed;
 * the subscriber's path to the same consumer is tested in subscriber_test.c. */
#include <mqtt_inbox/c.h>
#include <stddef.h>

#include "c_check.h"
#include "ledger.h"

enum mode {
  LEDGER,           /* the ledger's own codes */
  RETRY_ALWAYS,     /* writes, then RETRY with a reason */
  RETRY_FIRST,      /* RETRY on attempt 1, the ledger after */
  TX_INSIDE,        /* writes, runs `tx_sql` (COMMIT, ROLLBACK, BEGIN), returns `after` */
  SAVEPOINT_INSIDE, /* the ledger inside a SAVEPOINT of its own, RELEASEd */
  REENTER,          /* calls mqtt_inbox_setup on its own inbox */
  CODE_42,          /* returns a code c.h does not define */
  RECORD,           /* copies what the delivery view shows */
  NOT_YET,          /* writes, then NOT_YET with a reason while `down` > 0 (counted down);
                       the ledger after */
  SLOW              /* the ledger, then sleeps `sleep_ms` inside the transaction */
};

struct script {
  enum mode mode;
  int after;          /* TX_INSIDE: the code returned after the refused statement */
  const char* tx_sql; /* TX_INSIDE: the statement */
  int calls;
  int down;     /* NOT_YET: runs that still say "not yet"; -1: for ever */
  int sleep_ms; /* SLOW */
  int tx_rc;    /* its result */
  int reenter_rc;
  mqtt_inbox_t* inbox;
  /* RECORD */
  char id[64], topic[64], payload[128], prop_names[128], prop_values[128], first_tag[32];
  int qos, dup, retained, attempt;
  size_t payload_len, props;
};

static int handler(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  struct script* s = (struct script*)ctx;
  size_t i, len;
  ++s->calls;
  switch (s->mode) {
    case LEDGER:
      return ledger_apply_credit(db, d);
    case RETRY_ALWAYS:
      if (ledger_apply_credit(db, d) != MQTT_INBOX_HANDLER_OK)
        return MQTT_INBOX_HANDLER_UNDECODABLE;
      mqtt_inbox_delivery_set_reason(d, "the downstream meter is not ready");
      return MQTT_INBOX_HANDLER_RETRY;
    case RETRY_FIRST:
      if (mqtt_inbox_delivery_attempt(d) == 1) return MQTT_INBOX_HANDLER_RETRY;
      return ledger_apply_credit(db, d);
    case TX_INSIDE:
      if (ledger_apply_credit(db, d) != MQTT_INBOX_HANDLER_OK)
        return MQTT_INBOX_HANDLER_UNDECODABLE;
      s->tx_rc = sqlite3_exec(db, s->tx_sql, NULL, NULL, NULL);
      if (s->after != MQTT_INBOX_HANDLER_OK) mqtt_inbox_delivery_set_reason(d, sqlite3_errmsg(db));
      return s->after;
    case SAVEPOINT_INSIDE:
      if (sqlite3_exec(db, "SAVEPOINT mine", NULL, NULL, NULL) != SQLITE_OK)
        return MQTT_INBOX_HANDLER_RETRY;
      if (ledger_apply_credit(db, d) != MQTT_INBOX_HANDLER_OK) {
        sqlite3_exec(db, "ROLLBACK TO mine; RELEASE mine", NULL, NULL, NULL);
        return MQTT_INBOX_HANDLER_UNDECODABLE;
      }
      s->tx_rc = sqlite3_exec(db, "RELEASE mine", NULL, NULL, NULL);
      return s->tx_rc == SQLITE_OK ? MQTT_INBOX_HANDLER_OK : MQTT_INBOX_HANDLER_RETRY;
    case REENTER:
      s->reenter_rc = mqtt_inbox_setup(s->inbox, "SELECT 1");
      return ledger_apply_credit(db, d);
    case CODE_42:
      return 42;
    case NOT_YET:
      if (s->down == 0) return ledger_apply_credit(db, d);
      if (s->down > 0) --s->down;
      if (ledger_apply_credit(db, d) != MQTT_INBOX_HANDLER_OK)
        return MQTT_INBOX_HANDLER_UNDECODABLE;
      mqtt_inbox_delivery_set_reason(d, "meter gateway 10.0.0.7: connection refused");
      return MQTT_INBOX_HANDLER_NOT_YET;
    case SLOW: {
      const int rc = ledger_apply_credit(db, d);
      sqlite3_sleep(s->sleep_ms);
      return rc;
    }
    case RECORD: {
      const void* p = mqtt_inbox_delivery_payload(d, &len);
      const char* tag = mqtt_inbox_delivery_user_property_get(d, "tag");
      snprintf(s->id, sizeof s->id, "%s", mqtt_inbox_delivery_message_id(d));
      snprintf(s->topic, sizeof s->topic, "%s", mqtt_inbox_delivery_topic(d));
      s->payload_len = len;
      memcpy(s->payload, p, len < sizeof s->payload ? len : sizeof s->payload);
      s->qos = mqtt_inbox_delivery_qos(d);
      s->dup = mqtt_inbox_delivery_dup(d);
      s->retained = mqtt_inbox_delivery_retained(d);
      s->attempt = mqtt_inbox_delivery_attempt(d);
      s->props = mqtt_inbox_delivery_user_property_count(d);
      s->prop_names[0] = s->prop_values[0] = 0;
      for (i = 0; i < s->props; ++i) {
        const char *name, *value;
        size_t nl, vl;
        if (!mqtt_inbox_delivery_user_property(d, i, &name, &nl, &value, &vl)) return 1;
        strncat(s->prop_names, name, nl);
        strcat(s->prop_names, ";");
        strncat(s->prop_values, value, vl);
        strcat(s->prop_values, ";");
      }
      CHECK(!mqtt_inbox_delivery_user_property(d, s->props, NULL, NULL, NULL, NULL));
      snprintf(s->first_tag, sizeof s->first_tag, "%s", tag ? tag : "(none)");
      return MQTT_INBOX_HANDLER_OK;
    }
  }
  return MQTT_INBOX_HANDLER_RETRY;
}

struct fixture {
  const char* path;
  mqtt_inbox_t* inbox;
  mqtt_inbox_consumer_t* consumer;
  struct script script;
};

/* The dependency schedule with short durations: 2 immediate runs, then 20 ms doubling to
 * 40 ms, for at most `wait_max_ms`. */
static void short_dependency_schedule(mqtt_inbox_consumer_options_t* o, int64_t wait_max_ms) {
  o->dependency_immediate_attempts = 2;
  o->dependency_backoff_initial_ms = 20;
  o->dependency_backoff_max_ms = 40;
  o->dependency_wait_max_ms = wait_max_ms;
}

static void start_with(struct fixture* f, enum mode mode, mqtt_inbox_consumer_options_t* o) {
  int rc;
  memset(f, 0, sizeof *f);
  f->path = c_temp_path("ledger.db");
  REQUIRE(mqtt_inbox_open(f->path, NULL, &f->inbox, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_setup(f->inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
  f->script.mode = mode;
  f->script.inbox = f->inbox;
  rc = mqtt_inbox_consumer_create(f->inbox, "ledger", handler, &f->script, o, &f->consumer);
  if (rc) fprintf(stderr, "consumer: %s\n", mqtt_inbox_errmsg(f->inbox));
  REQUIRE(rc == MQTT_INBOX_OK);
}

static void start(struct fixture* f, enum mode mode) {
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  int rc;
  memset(f, 0, sizeof *f);
  f->path = c_temp_path("ledger.db");
  REQUIRE(mqtt_inbox_open(f->path, NULL, &f->inbox, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_setup(f->inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
  f->script.mode = mode;
  f->script.inbox = f->inbox;
  o.max_attempts = 3;
  o.retry_backoff_initial_ms = 1;
  o.retry_backoff_max_ms = 2;
  o.requeue_poll_ms = 0;
  rc = mqtt_inbox_consumer_create(f->inbox, "ledger", handler, &f->script, &o, &f->consumer);
  if (rc) fprintf(stderr, "consumer: %s\n", mqtt_inbox_errmsg(f->inbox));
  REQUIRE(rc == MQTT_INBOX_OK);
}

static void stop(struct fixture* f) {
  mqtt_inbox_consumer_destroy(f->consumer);
  mqtt_inbox_close(f->inbox);
}

/* Feeds a credit; returns the outcome. */
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

static int feed_payload(struct fixture* f, const char* payload) {
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  int outcome = -1;
  m.topic = "credits/test";
  m.payload = payload;
  m.payload_len = strlen(payload);
  REQUIRE(mqtt_inbox_consumer_feed(f->consumer, &m, &outcome) == MQTT_INBOX_OK);
  return outcome;
}

static long long balance(struct fixture* f, const char* account) {
  char sql[128];
  snprintf(sql, sizeof sql,
           "SELECT coalesce((SELECT balance FROM accounts WHERE account = '%s'), 0)", account);
  return c_query_int(f->path, sql);
}

static long long rows(struct fixture* f, const char* table) {
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", table);
  return c_query_int(f->path, sql);
}

static void dead_letter(struct fixture* f, const char* id, char* reason, size_t rsize, char* text,
                        size_t tsize, long long* attempts) {
  char sql[256];
  snprintf(sql, sizeof sql, "SELECT reason FROM inbox_dead_letters WHERE message_id = '%s'", id);
  c_query_text(f->path, sql, reason, rsize);
  snprintf(sql, sizeof sql, "SELECT reason_text FROM inbox_dead_letters WHERE message_id = '%s'",
           id);
  c_query_text(f->path, sql, text, tsize);
  snprintf(sql, sizeof sql, "SELECT attempts FROM inbox_dead_letters WHERE message_id = '%s'", id);
  *attempts = c_query_int(f->path, sql);
}

static void test_ok_commits_the_effect_once_and_a_duplicate_is_skipped(void) {
  struct fixture f;
  start(&f, LEDGER);
  CHECK_EQ_INT(credit(&f, "c-1", "alice", 10), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "c-2", "alice", 5), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(credit(&f, "c-1", "alice", 10), MQTT_INBOX_OUTCOME_DUPLICATE);
  CHECK_EQ_INT(f.script.calls, 2);
  CHECK_EQ_INT(balance(&f, "alice"), 15);
  CHECK_EQ_INT(rows(&f, "ledger_entries"), 2);
  CHECK_EQ_INT(rows(&f, "inbox_processed"), 2);
  CHECK_EQ_INT(rows(&f, "inbox_dead_letters"), 0);
  stop(&f);
}

static void test_retry_is_counted_then_dead_lettered_with_the_reason(void) {
  struct fixture f;
  char reason[64], text[256];
  long long attempts;
  start(&f, RETRY_ALWAYS);
  CHECK_EQ_INT(credit(&f, "r-1", "bob", 7), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.calls, 3);
  CHECK_EQ_INT(balance(&f, "bob"), 0); /* every attempt's writes rolled back */
  CHECK_EQ_INT(rows(&f, "ledger_entries"), 0);
  CHECK_EQ_INT(rows(&f, "inbox_processed"), 0);
  dead_letter(&f, "r-1", reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "handler_failed") == 0);
  CHECK_CONTAINS(text, "the downstream meter is not ready");
  CHECK_EQ_INT(attempts, 3);
  /* Its redelivery is not run again. */
  CHECK_EQ_INT(credit(&f, "r-1", "bob", 7), MQTT_INBOX_OUTCOME_ALREADY_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.calls, 3);
  stop(&f);
}

static void test_retry_then_success_commits_once(void) {
  struct fixture f;
  start(&f, RETRY_FIRST);
  CHECK_EQ_INT(credit(&f, "f-1", "carol", 4), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(f.script.calls, 2);
  CHECK_EQ_INT(balance(&f, "carol"), 4);
  CHECK_EQ_INT(rows(&f, "inbox_attempts"), 0);
  CHECK_EQ_INT(rows(&f, "inbox_dead_letters"), 0);
  stop(&f);
}

static void test_undecodable_is_dead_lettered_at_once(void) {
  struct fixture f;
  char reason[64], text[256];
  long long attempts;
  start(&f, LEDGER);
  CHECK_EQ_INT(feed_payload(&f, "{\"message_id\":\"u-1\",\"account\":\"dave\",\"amount\":\"12\"}"),
               MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.calls, 1);
  dead_letter(&f, "u-1", reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "undecodable_payload") == 0);
  CHECK_CONTAINS(text, "'amount' an integer");
  CHECK_EQ_INT(attempts, 1);
  CHECK_EQ_INT(balance(&f, "dave"), 0);
  /* The stream goes on. */
  CHECK_EQ_INT(credit(&f, "u-2", "dave", 3), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(balance(&f, "dave"), 3);
  stop(&f);
}

static void test_reject_is_dead_lettered_at_once_with_its_text(void) {
  struct fixture f;
  char reason[64], text[256];
  long long attempts;
  start(&f, LEDGER);
  CHECK_EQ_INT(credit(&f, "n-1", "erin", -5), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.calls, 1);
  dead_letter(&f, "n-1", reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "invalid_payload") == 0);
  CHECK(strcmp(text, "amount -5 is not a credit") == 0);
  CHECK_EQ_INT(balance(&f, "erin"), 0);
  stop(&f);
}

static void test_an_unknown_return_code_is_a_failed_attempt(void) {
  struct fixture f;
  char reason[64], text[256];
  long long attempts;
  start(&f, CODE_42);
  CHECK_EQ_INT(credit(&f, "x-1", "frank", 1), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.calls, 3);
  dead_letter(&f, "x-1", reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "handler_failed") == 0);
  CHECK_CONTAINS(text, "42");
  stop(&f);
}

/* A handler that ends or nests the library's transaction (COMMIT, ROLLBACK, BEGIN): the
 * statement is refused at prepare time (SQLITE_AUTH), and the message is a dead letter
 * handler_ended_transaction at once, its text "handler ended the transaction: it ran
 * <statement>", whatever the handler returns next, OK included (END is SQLite's COMMIT and
 * named so). So the write it made before the statement never commits: no balance, no
 * ledger entry, no claim. (The same contract on every store: tests/contract.) */
static void expect_ended_transaction(const char* sql, const char* named, int after, const char* id,
                                     const char* account) {
  struct fixture f;
  char reason[64], text[512], expected[64];
  long long attempts;
  start(&f, TX_INSIDE);
  f.script.tx_sql = sql;
  f.script.after = after;
  CHECK_EQ_INT(credit(&f, id, account, 9), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.tx_rc, SQLITE_AUTH);
  CHECK_EQ_INT(f.script.calls, 1);
  CHECK_EQ_INT(balance(&f, account), 0);
  CHECK_EQ_INT(rows(&f, "ledger_entries"), 0);
  CHECK_EQ_INT(rows(&f, "inbox_processed"), 0);
  dead_letter(&f, id, reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "handler_ended_transaction") == 0);
  CHECK_EQ_INT(attempts, 1);
  snprintf(expected, sizeof expected, "handler ended the transaction: it ran %s", named);
  CHECK_CONTAINS(text, expected);
  /* A redelivery stays dead-lettered; the next message is processed as usual. */
  CHECK_EQ_INT(credit(&f, id, account, 9), MQTT_INBOX_OUTCOME_ALREADY_DEAD_LETTERED);
  f.script.mode = LEDGER;
  CHECK_EQ_INT(credit(&f, "next-1", account, 4), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(balance(&f, account), 4);
  stop(&f);
}

static void test_a_handler_that_commits_and_returns_ok_fails_by_name(void) {
  expect_ended_transaction("COMMIT", "COMMIT", MQTT_INBOX_HANDLER_OK, "t-1", "gina");
}

static void test_a_handler_that_commits_and_returns_retry_fails_by_name(void) {
  expect_ended_transaction("COMMIT", "COMMIT", MQTT_INBOX_HANDLER_RETRY, "t-2", "hank");
}

static void test_a_handler_that_rolls_back_fails_by_name(void) {
  expect_ended_transaction("ROLLBACK", "ROLLBACK", MQTT_INBOX_HANDLER_OK, "t-3", "iris");
}

static void test_a_handler_that_begins_a_nested_transaction_fails_by_name(void) {
  expect_ended_transaction("BEGIN", "BEGIN", MQTT_INBOX_HANDLER_OK, "t-4", "ivan");
}

static void test_a_handler_that_ends_the_transaction_with_end_fails_by_name(void) {
  expect_ended_transaction("END", "COMMIT", MQTT_INBOX_HANDLER_OK, "t-5", "ines");
}

/* SAVEPOINT, RELEASE and ROLLBACK TO of the handler's own are allowed: the effect commits
 * once with the claim. */
static void test_a_savepoint_of_the_handlers_own_is_allowed(void) {
  struct fixture f;
  start(&f, SAVEPOINT_INSIDE);
  CHECK_EQ_INT(credit(&f, "s-1", "jill", 3), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(f.script.tx_rc, SQLITE_OK);
  CHECK_EQ_INT(credit(&f, "s-1", "jill", 3), MQTT_INBOX_OUTCOME_DUPLICATE);
  CHECK_EQ_INT(balance(&f, "jill"), 3);
  CHECK_EQ_INT(rows(&f, "inbox_processed"), 1);
  stop(&f);
}

/* A call into the handler's own inbox would wait for its own thread: refused, and the
 * message is dead-lettered as handler_reentered whatever the handler returned. */
static void test_a_call_back_into_the_inbox_is_refused_and_dead_lettered(void) {
  struct fixture f;
  char reason[64], text[256];
  long long attempts;
  start(&f, REENTER);
  CHECK_EQ_INT(credit(&f, "e-1", "jack", 1), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.script.reenter_rc, MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_EQ_INT(balance(&f, "jack"), 0);
  dead_letter(&f, "e-1", reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "handler_reentered") == 0);
  CHECK_CONTAINS(text, "Inbox::setup");
  stop(&f);
}

static void test_the_delivery_view_shows_what_was_fed(void) {
  struct fixture f;
  mqtt_inbox_user_property_t props[3];
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  const char payload[] = "{\"message_id\":\"ignored\"}\0tail";
  int outcome = -1;
  start(&f, RECORD);
  props[0].name = "message-id";
  props[0].name_len = 10;
  props[0].value = "p-1";
  props[0].value_len = 3;
  props[1].name = "tag";
  props[1].name_len = 3;
  props[1].value = "blue";
  props[1].value_len = 4;
  props[2].name = "tag";
  props[2].name_len = 3;
  props[2].value = "red";
  props[2].value_len = 3;
  m.topic = "sensors/7";
  m.payload = "raw\0bytes";
  m.payload_len = 9;
  m.qos = 1;
  m.dup = 1;
  m.user_properties = props;
  m.user_property_count = 3;
  REQUIRE(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome) == MQTT_INBOX_OK);
  CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK(strcmp(f.script.id, "p-1") == 0);
  CHECK(strcmp(f.script.topic, "sensors/7") == 0);
  CHECK_EQ_INT(f.script.payload_len, 9);
  CHECK(memcmp(f.script.payload, "raw\0bytes", 9) == 0);
  CHECK_EQ_INT(f.script.qos, 1);
  CHECK_EQ_INT(f.script.dup, 1);
  CHECK_EQ_INT(f.script.retained, 0);
  CHECK_EQ_INT(f.script.attempt, 1);
  CHECK_EQ_INT(f.script.props, 3);
  CHECK(strcmp(f.script.prop_names, "message-id;tag;tag;") == 0);
  CHECK(strcmp(f.script.prop_values, "p-1;blue;red;") == 0);
  CHECK(strcmp(f.script.first_tag, "blue") == 0);
  (void)payload;

  /* A retained message is skipped by default, and processed when asked. */
  m.retained = 1;
  props[0].value = "p-2";
  REQUIRE(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome) == MQTT_INBOX_OK);
  CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_SKIPPED);
  CHECK_EQ_INT(f.script.calls, 1);
  stop(&f);
}

/* A dependency down for longer than max_attempts' worth of runs (MQTT_INBOX_HANDLER_NOT_YET
 * six times, max_attempts 3): no attempt is spent, the message waits on the dependency
 * schedule and is applied once when the dependency is back; no dead letter. */
static void test_not_yet_is_run_again_without_an_attempt_and_applied_once(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_consumer_counters_t c = MQTT_INBOX_CONSUMER_COUNTERS_INIT;
  o.max_attempts = 3;
  o.retry_backoff_initial_ms = 1;
  o.retry_backoff_max_ms = 2;
  o.requeue_poll_ms = 0;
  short_dependency_schedule(&o, 20000);
  start_with(&f, NOT_YET, &o);
  f.script.down = 6;
  CHECK_EQ_INT(credit(&f, "n-1", "kate", 5), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(f.script.calls, 7);
  CHECK_EQ_INT(balance(&f, "kate"), 5);
  CHECK_EQ_INT(rows(&f, "ledger_entries"), 1);
  CHECK_EQ_INT(rows(&f, "inbox_dead_letters"), 0);
  CHECK_EQ_INT(rows(&f, "inbox_attempts"), 0);
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(f.consumer, &c), MQTT_INBOX_OK);
  CHECK_EQ_INT(c.not_yet, 6);
  CHECK_EQ_INT(c.handler_failures, 0);
  CHECK_EQ_INT(c.processed, 1);
  CHECK_EQ_INT(credit(&f, "n-1", "kate", 5), MQTT_INBOX_OUTCOME_DUPLICATE);
  stop(&f);
}

/* A dependency that never comes back: once the schedule is over (300 ms here) the message
 * is the dead letter dependency_unavailable, with the handler's reason, never applied. */
static void test_not_yet_past_the_schedule_is_dependency_unavailable(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  char reason[64], text[512];
  long long attempts, t0, took;
  o.requeue_poll_ms = 0;
  o.retry_backoff_initial_ms = 10; /* the immediate runs: 10 then 20 ms apart */
  o.retry_backoff_max_ms = 20;
  short_dependency_schedule(&o, 300);
  start_with(&f, NOT_YET, &o);
  f.script.down = -1;
  t0 = c_now_ms();
  CHECK_EQ_INT(credit(&f, "n-2", "liam", 5), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  took = c_now_ms() - t0;
  CHECK(took >= 300 && took < 5000);
  CHECK(f.script.calls >= 5);
  dead_letter(&f, "n-2", reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "dependency_unavailable") == 0);
  CHECK_CONTAINS(text, "connection refused");
  CHECK_CONTAINS(text, "not yet");
  CHECK_EQ_INT(attempts, f.script.calls);
  CHECK_EQ_INT(balance(&f, "liam"), 0);
  CHECK_EQ_INT(rows(&f, "inbox_processed"), 0);
  CHECK_EQ_INT(credit(&f, "n-2", "liam", 5), MQTT_INBOX_OUTCOME_ALREADY_DEAD_LETTERED);
  f.script.mode = LEDGER;
  CHECK_EQ_INT(credit(&f, "n-3", "liam", 2), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(balance(&f, "liam"), 2);
  stop(&f);
}

/* Feeds a credit carrying an MQTT 5 message expiry interval. */
static int expiring_credit(struct fixture* f, const char* id, const char* account, long long amount,
                           int64_t expiry_s) {
  char payload[256];
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  int outcome = -1;
  snprintf(payload, sizeof payload, "{\"message_id\":\"%s\",\"account\":\"%s\",\"amount\":%lld}",
           id, account, amount);
  m.topic = "credits/test";
  m.payload = payload;
  m.payload_len = strlen(payload);
  m.message_expiry_interval_s = expiry_s;
  REQUIRE(mqtt_inbox_consumer_feed(f->consumer, &m, &outcome) == MQTT_INBOX_OK);
  return outcome;
}

/* A message whose 1 s expiry runs out inside its handler (which sleeps 1.2 s) commits
 * nothing: the dead letter expired, with the interval and the wait in its text and the
 * interval in its properties; with MQTT_INBOX_EXPIRED_APPLY it is applied. */
static void test_an_expired_message_is_dead_lettered_and_never_applied(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_consumer_counters_t c = MQTT_INBOX_CONSUMER_COUNTERS_INIT;
  char reason[64], text[512], props[256];
  long long attempts;
  o.requeue_poll_ms = 0;
  start_with(&f, SLOW, &o);
  f.script.sleep_ms = 1200;
  CHECK_EQ_INT(expiring_credit(&f, "x-1", "mia", 5, 1), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  dead_letter(&f, "x-1", reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "expired") == 0);
  CHECK_CONTAINS(text, "message expiry interval 1 s ran out");
  CHECK_CONTAINS(text, "waited ");
  c_query_text(f.path, "SELECT properties FROM inbox_dead_letters WHERE message_id = 'x-1'", props,
               sizeof props);
  CHECK_CONTAINS(props, "\"message_expiry_interval_s\":1");
  CHECK_EQ_INT(balance(&f, "mia"), 0);
  CHECK_EQ_INT(rows(&f, "inbox_processed"), 0);
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(f.consumer, &c), MQTT_INBOX_OK);
  CHECK_EQ_INT(c.expired, 1);
  CHECK_EQ_INT(c.dead_lettered, 1);
  /* With time left it is applied. */
  f.script.sleep_ms = 0;
  CHECK_EQ_INT(expiring_credit(&f, "x-2", "mia", 3, 60), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(balance(&f, "mia"), 3);
  stop(&f);

  o.expired = MQTT_INBOX_EXPIRED_APPLY;
  start_with(&f, SLOW, &o);
  f.script.sleep_ms = 1200;
  CHECK_EQ_INT(expiring_credit(&f, "x-3", "noah", 4, 1), MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(balance(&f, "noah"), 4);
  stop(&f);
}

/* Bytes of version 1 of mqtt_inbox_consumer_options_t, as a program built against the c.h
 * of 0.3 sends it: the struct up to id_disagreement, padded to its alignment. */
struct c_align_probe {
  char c;
  int64_t x;
};
static size_t v1_consumer_options_size(void) {
  const size_t end = offsetof(mqtt_inbox_consumer_options_t, id_disagreement) + sizeof(int);
  const size_t align = offsetof(struct c_align_probe, x);
  return (end + align - 1) / align * align;
}

/* A caller built against the older c.h (struct_version 1) gets the new fields' defaults,
 * expired DEAD_LETTER included; an unknown expired value is refused. */
static void test_an_older_options_struct_gets_the_new_defaults(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_consumer_t* c = NULL;
  char reason[64], text[512];
  long long attempts;
  o.struct_version = 1;
  o.struct_size = v1_consumer_options_size();
  o.requeue_poll_ms = 0;
  o.expired = MQTT_INBOX_EXPIRED_APPLY; /* beyond version 1: never read */
  start_with(&f, SLOW, &o);
  f.script.sleep_ms = 1200;
  CHECK_EQ_INT(expiring_credit(&f, "v-1", "olga", 5, 1), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  dead_letter(&f, "v-1", reason, sizeof reason, text, sizeof text, &attempts);
  CHECK(strcmp(reason, "expired") == 0);
  o = (mqtt_inbox_consumer_options_t)MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  o.expired = 2;
  CHECK_EQ_INT(mqtt_inbox_consumer_create(f.inbox, "x", handler, NULL, &o, &c),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(mqtt_inbox_errmsg(f.inbox), "expired is 2");
  o = (mqtt_inbox_consumer_options_t)MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  o.dependency_backoff_initial_ms = 0;
  CHECK_EQ_INT(mqtt_inbox_consumer_create(f.inbox, "x", handler, NULL, &o, &c),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(c == NULL);
  stop(&f);
}

static void test_feed_and_create_refuse_misuse(void) {
  struct fixture f;
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_consumer_t* c = (mqtt_inbox_consumer_t*)&c;
  int outcome = -1;
  start(&f, LEDGER);
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(NULL, &m, &outcome), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(f.consumer, NULL, &outcome), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(f.consumer, &m, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(f.consumer), "NULL topic");
  m.topic = "credits/x";
  m.payload_len = 3;
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome), MQTT_INBOX_MISUSE);
  m.payload_len = 0;
  m.struct_size = 1;
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(f.script.calls, 0);

  CHECK_EQ_INT(mqtt_inbox_consumer_create(NULL, "x", handler, NULL, NULL, &c), MQTT_INBOX_MISUSE);
  CHECK(c == NULL);
  CHECK_EQ_INT(mqtt_inbox_consumer_create(f.inbox, "x", NULL, NULL, NULL, &c), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_create(f.inbox, "", handler, NULL, NULL, &c),
               MQTT_INBOX_INVALID_ARGUMENT);
  o.max_attempts = 0;
  CHECK_EQ_INT(mqtt_inbox_consumer_create(f.inbox, "x", handler, NULL, &o, &c),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(strlen(mqtt_inbox_errmsg(f.inbox)) > 0);
  o = (mqtt_inbox_consumer_options_t)MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  o.retained = 9;
  CHECK_EQ_INT(mqtt_inbox_consumer_create(f.inbox, "x", handler, NULL, &o, &c),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(c == NULL);
  mqtt_inbox_consumer_destroy(NULL);
  CHECK(mqtt_inbox_consumer_errmsg(NULL) != NULL);
  stop(&f);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(ok_commits_the_effect_once_and_a_duplicate_is_skipped),
    CASE(retry_is_counted_then_dead_lettered_with_the_reason),
    CASE(retry_then_success_commits_once),
    CASE(undecodable_is_dead_lettered_at_once),
    CASE(reject_is_dead_lettered_at_once_with_its_text),
    CASE(an_unknown_return_code_is_a_failed_attempt),
    CASE(a_handler_that_commits_and_returns_ok_fails_by_name),
    CASE(a_handler_that_commits_and_returns_retry_fails_by_name),
    CASE(a_handler_that_rolls_back_fails_by_name),
    CASE(a_handler_that_begins_a_nested_transaction_fails_by_name),
    CASE(a_handler_that_ends_the_transaction_with_end_fails_by_name),
    CASE(a_savepoint_of_the_handlers_own_is_allowed),
    CASE(a_call_back_into_the_inbox_is_refused_and_dead_lettered),
    CASE(the_delivery_view_shows_what_was_fed),
    CASE(feed_and_create_refuse_misuse),
    CASE(not_yet_is_run_again_without_an_attempt_and_applied_once),
    CASE(not_yet_past_the_schedule_is_dependency_unavailable),
    CASE(an_expired_message_is_dead_lettered_and_never_applied),
    CASE(an_older_options_struct_gets_the_new_defaults),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

/* Observing a consumer from C (c.h, mqtt_inbox_consumer_counters and
 * mqtt_inbox_consumer_health_json): the counters follow what the rows say, an older
 * program's smaller counters struct gets only the fields it knows, and the health turns
 * amber while a delivery waits for a store another connection holds locked, and green
 * again once it commits. */
#define _POSIX_C_SOURCE 200809L

#include <mqtt_inbox/c.h>
#include <pthread.h>
#include <time.h>

#include "c_check.h"
#include "ledger.h"

struct fixture {
  const char* path;
  mqtt_inbox_t* inbox;
  mqtt_inbox_consumer_t* consumer;
};

static int ledger(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  (void)ctx;
  return ledger_apply_credit(db, d);
}

static void start(struct fixture* f, int busy_timeout_ms) {
  mqtt_inbox_options_t io = MQTT_INBOX_OPTIONS_INIT;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  memset(f, 0, sizeof *f);
  f->path = c_temp_path("ledger.db");
  io.busy_timeout_ms = busy_timeout_ms;
  REQUIRE(mqtt_inbox_open(f->path, &io, &f->inbox, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_setup(f->inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
  o.requeue_poll_ms = 0;
  REQUIRE(mqtt_inbox_consumer_create(f->inbox, "ledger", ledger, NULL, &o, &f->consumer) ==
          MQTT_INBOX_OK);
}

static void stop(struct fixture* f) {
  mqtt_inbox_consumer_destroy(f->consumer);
  mqtt_inbox_close(f->inbox);
}

static int feed(mqtt_inbox_consumer_t* c, const char* payload) {
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  int outcome = -1;
  m.topic = "credits/test";
  m.payload = payload;
  m.payload_len = strlen(payload);
  REQUIRE(mqtt_inbox_consumer_feed(c, &m, &outcome) == MQTT_INBOX_OK);
  return outcome;
}

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

static void test_counters_follow_the_outcomes(void) {
  struct fixture f;
  mqtt_inbox_consumer_counters_t c = MQTT_INBOX_CONSUMER_COUNTERS_INIT;
  start(&f, 5000);
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(f.consumer, &c), MQTT_INBOX_OK);
  CHECK_EQ_INT(c.processed, 0);
  CHECK_EQ_INT(feed(f.consumer, "{\"message_id\":\"c-1\",\"account\":\"ann\",\"amount\":3}"),
               MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(feed(f.consumer, "{\"message_id\":\"c-1\",\"account\":\"ann\",\"amount\":3}"),
               MQTT_INBOX_OUTCOME_DUPLICATE);
  CHECK_EQ_INT(feed(f.consumer, "{\"message_id\":\"c-2\",\"account\":\"ann\",\"amount\":-1}"),
               MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(feed(f.consumer, "{\"message_id\":\"c-2\",\"account\":\"ann\",\"amount\":-1}"),
               MQTT_INBOX_OUTCOME_ALREADY_DEAD_LETTERED);
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(f.consumer, &c), MQTT_INBOX_OK);
  CHECK_EQ_INT(c.struct_size, sizeof c);
  CHECK_EQ_INT(c.processed, 1);
  CHECK_EQ_INT(c.duplicates, 1);
  CHECK_EQ_INT(c.dead_lettered, 1);
  CHECK_EQ_INT(c.already_dead_lettered, 1);
  CHECK_EQ_INT(c.handler_failures, 0);
  CHECK_EQ_INT(c.store_retries, 0);
  CHECK_EQ_INT(c.retained_skipped, 0);
  CHECK_EQ_INT(c.outbox_full_parked, 0);
  /* What the rows say. */
  CHECK_EQ_INT(c_query_int(f.path, "SELECT count(*) FROM inbox_processed"), c.processed);
  CHECK_EQ_INT(c_query_int(f.path, "SELECT count(*) FROM inbox_dead_letters"), c.dead_lettered);
  stop(&f);
}

static void test_counters_and_health_refuse_misuse(void) {
  struct fixture f;
  mqtt_inbox_consumer_counters_t c = MQTT_INBOX_CONSUMER_COUNTERS_INIT;
  char* json = NULL;
  start(&f, 5000);
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(NULL, &c), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(f.consumer, NULL), MQTT_INBOX_MISUSE);
  c.struct_size = 0;
  c.processed = 42;
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(f.consumer, &c), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(f.consumer), "struct_size");
  CHECK_EQ_INT(c.processed, 42);
  /* Not made by MQTT_INBOX_CONSUMER_COUNTERS_INIT: nothing written. */
  memset(&c, 0x7f, sizeof c);
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(f.consumer, &c), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(f.consumer), "MQTT_INBOX_CONSUMER_COUNTERS_INIT");
  CHECK_EQ_INT(c.processed, 0x7f7f7f7f7f7f7f7fLL);
  CHECK_EQ_INT(mqtt_inbox_consumer_health_json(NULL, &json), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_health_json(f.consumer, NULL), MQTT_INBOX_MISUSE);
  CHECK(json == NULL);
  stop(&f);
}

struct feeder {
  mqtt_inbox_consumer_t* consumer;
  int outcome;
};

static void* feed_thread(void* arg) {
  struct feeder* fd = (struct feeder*)arg;
  fd->outcome = feed(fd->consumer, "{\"message_id\":\"h-1\",\"account\":\"cid\",\"amount\":4}");
  return NULL;
}

/* Health is amber while the delivery waits for the write lock another connection holds,
 * names the wait, and is green again once the delivery committed. */
static void test_health_is_amber_while_the_store_is_locked_then_green(void) {
  struct fixture f;
  struct feeder fd;
  pthread_t t;
  sqlite3* other = NULL;
  char* json = NULL;
  int i, amber = 0;
  start(&f, 50);
  REQUIRE(mqtt_inbox_consumer_health_json(f.consumer, &json) == MQTT_INBOX_OK);
  CHECK_CONTAINS(json, "\"level\":\"green\"");
  CHECK_CONTAINS(json, "\"stuck\":false");
  CHECK_CONTAINS(json, "ledger.db");
  mqtt_inbox_free(json);
  REQUIRE(sqlite3_open(f.path, &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK);
  fd.consumer = f.consumer;
  fd.outcome = -1;
  REQUIRE(pthread_create(&t, NULL, feed_thread, &fd) == 0);
  for (i = 0; i < 400 && !amber; ++i) {
    REQUIRE(mqtt_inbox_consumer_health_json(f.consumer, &json) == MQTT_INBOX_OK);
    amber = strstr(json, "\"level\":\"amber\"") != NULL;
    if (amber) {
      CHECK_CONTAINS(json, "\"stuck\":true");
      CHECK_CONTAINS(json, "locked");
    }
    mqtt_inbox_free(json);
    if (!amber) sleep_ms(25);
  }
  CHECK(amber);
  CHECK_EQ_INT(c_query_int(f.path, "SELECT count(*) FROM inbox_processed"), 0);
  REQUIRE(sqlite3_exec(other, "COMMIT", NULL, NULL, NULL) == SQLITE_OK);
  sqlite3_close(other);
  pthread_join(t, NULL);
  CHECK_EQ_INT(fd.outcome, MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(c_query_int(f.path, "SELECT balance FROM accounts WHERE account = 'cid'"), 4);
  REQUIRE(mqtt_inbox_consumer_health_json(f.consumer, &json) == MQTT_INBOX_OK);
  CHECK_CONTAINS(json, "\"level\":\"green\"");
  mqtt_inbox_free(json);
  {
    mqtt_inbox_consumer_counters_t c = MQTT_INBOX_CONSUMER_COUNTERS_INIT;
    CHECK_EQ_INT(mqtt_inbox_consumer_counters(f.consumer, &c), MQTT_INBOX_OK);
    CHECK(c.store_retries > 0);
    CHECK_EQ_INT(c.processed, 1);
  }
  stop(&f);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(counters_follow_the_outcomes),
    CASE(counters_and_health_refuse_misuse),
    CASE(health_is_amber_while_the_store_is_locked_then_green),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

/* The C log callback (c.h, mqtt_inbox_set_log_callback): what the library logs reaches
 * the program's function with its level, filtered by min_level, and goes back to stderr
 * (never to the old callback) once the callback is cleared. The lines are real ones: a
 * handler that ends the library's transaction is logged as an error by the store. */
#include <mqtt_inbox/c.h>

#include "c_check.h"
#include "ledger.h"

struct captured {
  int lines;
  int errors;
  int below_warn;
  int named; /* error lines naming the ended transaction */
  int multiline;
};

static void capture(void* ctx, int level, const char* msg) {
  struct captured* c = (struct captured*)ctx;
  ++c->lines;
  if (level < MQTT_INBOX_LOG_WARN) ++c->below_warn;
  if (strchr(msg, '\n')) ++c->multiline;
  if (level == MQTT_INBOX_LOG_ERROR) {
    ++c->errors;
    if (strstr(msg, "handler ended the transaction: it ran COMMIT") && strstr(msg, "l-1"))
      ++c->named;
  }
}

static int commits(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  (void)ctx;
  if (ledger_apply_credit(db, d) != MQTT_INBOX_HANDLER_OK) return MQTT_INBOX_HANDLER_UNDECODABLE;
  sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  return MQTT_INBOX_HANDLER_OK;
}

struct fixture {
  const char* path;
  mqtt_inbox_t* inbox;
  mqtt_inbox_consumer_t* consumer;
};

static void start(struct fixture* f) {
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  memset(f, 0, sizeof *f);
  f->path = c_temp_path("ledger.db");
  REQUIRE(mqtt_inbox_open(f->path, NULL, &f->inbox, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_setup(f->inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
  o.max_attempts = 1;
  o.requeue_poll_ms = 0;
  REQUIRE(mqtt_inbox_consumer_create(f->inbox, "ledger", commits, NULL, &o, &f->consumer) ==
          MQTT_INBOX_OK);
}

static void stop(struct fixture* f) {
  mqtt_inbox_consumer_destroy(f->consumer);
  mqtt_inbox_close(f->inbox);
}

static int feed(struct fixture* f, const char* id, int retained) {
  char payload[128];
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  int outcome = -1;
  snprintf(payload, sizeof payload, "{\"message_id\":\"%s\",\"account\":\"ann\",\"amount\":1}", id);
  m.topic = "credits/test";
  m.payload = payload;
  m.payload_len = strlen(payload);
  m.retained = retained;
  REQUIRE(mqtt_inbox_consumer_feed(f->consumer, &m, &outcome) == MQTT_INBOX_OK);
  return outcome;
}

static void test_lines_reach_the_callback_with_their_level(void) {
  struct fixture f;
  struct captured c;
  memset(&c, 0, sizeof c);
  REQUIRE(mqtt_inbox_set_log_callback(capture, &c, MQTT_INBOX_LOG_INFO) == MQTT_INBOX_OK);
  start(&f);
  CHECK_EQ_INT(feed(&f, "l-1", 0), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK(c.errors >= 1);
  CHECK_EQ_INT(c.named, 1);
  CHECK_EQ_INT(c.multiline, 0);
  /* A retained message skipped by policy is logged at info level. */
  c.below_warn = 0;
  CHECK_EQ_INT(feed(&f, "l-2", 1), MQTT_INBOX_OUTCOME_SKIPPED);
  CHECK(c.below_warn >= 1);
  stop(&f);
  REQUIRE(mqtt_inbox_set_log_callback(NULL, NULL, MQTT_INBOX_LOG_INFO) == MQTT_INBOX_OK);
}

static void test_min_level_filters_and_clearing_restores_stderr(void) {
  struct fixture f;
  struct captured c;
  int lines;
  memset(&c, 0, sizeof c);
  REQUIRE(mqtt_inbox_set_log_callback(capture, &c, MQTT_INBOX_LOG_ERROR) == MQTT_INBOX_OK);
  start(&f);
  CHECK_EQ_INT(feed(&f, "m-1", 1), MQTT_INBOX_OUTCOME_SKIPPED);
  CHECK_EQ_INT(c.below_warn, 0);
  CHECK_EQ_INT(feed(&f, "m-2", 0), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK(c.errors >= 1);
  /* Cleared: the same error goes to stderr, not to the old callback. */
  REQUIRE(mqtt_inbox_set_log_callback(NULL, NULL, MQTT_INBOX_LOG_INFO) == MQTT_INBOX_OK);
  lines = c.lines;
  CHECK_EQ_INT(feed(&f, "m-3", 0), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(c.lines, lines);
  /* OFF: nothing at all. */
  REQUIRE(mqtt_inbox_set_log_callback(capture, &c, MQTT_INBOX_LOG_OFF) == MQTT_INBOX_OK);
  CHECK_EQ_INT(feed(&f, "m-4", 0), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(c.lines, lines);
  REQUIRE(mqtt_inbox_set_log_callback(NULL, NULL, MQTT_INBOX_LOG_INFO) == MQTT_INBOX_OK);
  stop(&f);
}

static void test_a_level_out_of_range_is_refused(void) {
  struct captured c;
  CHECK_EQ_INT(mqtt_inbox_set_log_callback(capture, &c, -1), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_EQ_INT(mqtt_inbox_set_log_callback(capture, &c, 7), MQTT_INBOX_INVALID_ARGUMENT);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(lines_reach_the_callback_with_their_level),
    CASE(min_level_filters_and_clearing_restores_stderr),
    CASE(a_level_out_of_range_is_refused),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

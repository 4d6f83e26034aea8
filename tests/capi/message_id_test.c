/* Where a C consumer takes the message id from (c.h, mqtt_inbox_consumer_options_t's id
 * fields: user property, JSON field, the application's extractor, the longest id, what
 * two disagreeing ids mean), and the MQTT 5 properties a handler reads besides user
 * properties (content type, response topic, correlation data, payload format, expiry).
 * Each case asserts on the rows: which id was claimed, which dead letter says why. */
#include <mqtt_inbox/c.h>

#include "c_check.h"
#include "ledger.h"

/* The extractor's script. */
enum extract { TOPIC_TAIL, NONE, UNDECODABLE, TOO_LONG_FOR_BUFFER };

struct extractor_script {
  enum extract mode;
  int calls;
  size_t cap;
  char seen_id[16];
  int seen_attempt;
};

/* The id is the topic's last level ("credits/x-1" -> "x-1"). */
static int extractor(void* ctx, const mqtt_inbox_delivery_t* d, char* buf, size_t cap) {
  struct extractor_script* s = (struct extractor_script*)ctx;
  const char* topic = mqtt_inbox_delivery_topic(d);
  const char* tail = strrchr(topic, '/');
  size_t n;
  ++s->calls;
  s->cap = cap;
  snprintf(s->seen_id, sizeof s->seen_id, "%s", mqtt_inbox_delivery_message_id(d));
  s->seen_attempt = mqtt_inbox_delivery_attempt(d);
  switch (s->mode) {
    case TOPIC_TAIL:
      tail = tail ? tail + 1 : topic;
      n = strlen(tail);
      memcpy(buf, tail, n < cap ? n : cap);
      return (int)n;
    case NONE:
      return MQTT_INBOX_ID_NONE;
    case UNDECODABLE:
      mqtt_inbox_delivery_set_reason(d, "the frame's checksum does not match");
      return MQTT_INBOX_ID_UNDECODABLE;
    case TOO_LONG_FOR_BUFFER:
      memset(buf, 'x', cap);
      return (int)cap + 10;
  }
  return MQTT_INBOX_ID_NONE;
}

struct recorded {
  int calls;
  char id[64];
  char content_type[32], response_topic[32];
  size_t content_type_len, correlation_len;
  unsigned char correlation[16];
  int has_correlation, pfi, has_expiry;
  uint32_t expiry;
};

static int handler(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  struct recorded* r = (struct recorded*)ctx;
  const char* t;
  const void* c;
  size_t len = 0;
  ++r->calls;
  snprintf(r->id, sizeof r->id, "%s", mqtt_inbox_delivery_message_id(d));
  t = mqtt_inbox_delivery_content_type(d, &len);
  snprintf(r->content_type, sizeof r->content_type, "%s", t ? t : "(none)");
  r->content_type_len = len;
  t = mqtt_inbox_delivery_response_topic(d, NULL);
  snprintf(r->response_topic, sizeof r->response_topic, "%s", t ? t : "(none)");
  c = mqtt_inbox_delivery_correlation_data(d, &len);
  r->has_correlation = c != NULL;
  r->correlation_len = len;
  if (c) memcpy(r->correlation, c, len < sizeof r->correlation ? len : sizeof r->correlation);
  r->pfi = mqtt_inbox_delivery_payload_format_indicator(d);
  r->expiry = 0;
  r->has_expiry = mqtt_inbox_delivery_message_expiry_interval(d, &r->expiry);
  return ledger_apply_credit(db, d);
}

struct fixture {
  const char* path;
  mqtt_inbox_t* inbox;
  mqtt_inbox_consumer_t* consumer;
  struct extractor_script x;
  struct recorded r;
};

static void open_inbox(struct fixture* f) {
  memset(f, 0, sizeof *f);
  f->path = c_temp_path("ledger.db");
  REQUIRE(mqtt_inbox_open(f->path, NULL, &f->inbox, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_setup(f->inbox, LEDGER_TABLES) == MQTT_INBOX_OK);
}

static void start(struct fixture* f, mqtt_inbox_consumer_options_t* o) {
  int rc;
  o->requeue_poll_ms = 0;
  rc = mqtt_inbox_consumer_create(f->inbox, "ledger", handler, &f->r, o, &f->consumer);
  if (rc) fprintf(stderr, "consumer: %s\n", mqtt_inbox_errmsg(f->inbox));
  REQUIRE(rc == MQTT_INBOX_OK);
}

/* Only the extractor: no user property, no JSON field. */
static void start_with_extractor(struct fixture* f, enum extract mode) {
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  open_inbox(f);
  f->x.mode = mode;
  o.id_user_property = "";
  o.id_json_field = "";
  o.id_extractor = extractor;
  o.id_extractor_ctx = &f->x;
  start(f, &o);
}

static void stop(struct fixture* f) {
  mqtt_inbox_consumer_destroy(f->consumer);
  mqtt_inbox_close(f->inbox);
}

static int feed(struct fixture* f, const char* topic, const char* payload,
                const mqtt_inbox_user_property_t* props, size_t nprops) {
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  int outcome = -1;
  m.topic = topic;
  m.payload = payload;
  m.payload_len = strlen(payload);
  m.user_properties = props;
  m.user_property_count = nprops;
  REQUIRE(mqtt_inbox_consumer_feed(f->consumer, &m, &outcome) == MQTT_INBOX_OK);
  return outcome;
}

static long long q(struct fixture* f, const char* sql) { return c_query_int(f->path, sql); }

static void test_the_extractor_gives_the_id_and_a_redelivery_is_a_duplicate(void) {
  struct fixture f;
  start_with_extractor(&f, TOPIC_TAIL);
  CHECK_EQ_INT(feed(&f, "credits/x-1", "{\"account\":\"ann\",\"amount\":5}", NULL, 0),
               MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(feed(&f, "credits/x-1", "{\"account\":\"ann\",\"amount\":5}", NULL, 0),
               MQTT_INBOX_OUTCOME_DUPLICATE);
  CHECK(strcmp(f.r.id, "x-1") == 0);
  CHECK_EQ_INT(f.r.calls, 1);
  CHECK_EQ_INT(f.x.cap, 257); /* max_id_bytes (256) + 1 */
  CHECK(strcmp(f.x.seen_id, "") == 0);
  CHECK_EQ_INT(f.x.seen_attempt, 0);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_processed WHERE message_id = 'x-1'"), 1);
  CHECK_EQ_INT(q(&f, "SELECT balance FROM accounts WHERE account = 'ann'"), 5);
  stop(&f);
}

static void test_no_id_from_the_extractor_is_missing_id(void) {
  struct fixture f;
  char text[256];
  start_with_extractor(&f, NONE);
  CHECK_EQ_INT(feed(&f, "credits/x-2", "{\"account\":\"ann\",\"amount\":5}", NULL, 0),
               MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.r.calls, 0);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_dead_letters WHERE reason = 'missing_id'"), 1);
  c_query_text(f.path, "SELECT reason_text FROM inbox_dead_letters", text, sizeof text);
  CHECK_CONTAINS(text, "the extractor");
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM accounts"), 0);
  stop(&f);
}

static void test_an_undecodable_answer_is_dead_lettered_with_its_reason(void) {
  struct fixture f;
  char text[256];
  start_with_extractor(&f, UNDECODABLE);
  CHECK_EQ_INT(feed(&f, "credits/x-3", "\x01\x02", NULL, 0), MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(f.r.calls, 0);
  CHECK_EQ_INT(
      q(&f, "SELECT count(*) FROM inbox_dead_letters WHERE reason = 'undecodable_payload'"), 1);
  c_query_text(f.path, "SELECT reason_text FROM inbox_dead_letters", text, sizeof text);
  CHECK_CONTAINS(text, "the frame's checksum does not match");
  stop(&f);
}

static void test_an_id_longer_than_the_buffer_is_invalid_id(void) {
  struct fixture f;
  start_with_extractor(&f, TOO_LONG_FOR_BUFFER);
  CHECK_EQ_INT(feed(&f, "credits/x-4", "{\"account\":\"ann\",\"amount\":5}", NULL, 0),
               MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_id'"), 1);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_processed"), 0);
  stop(&f);
}

/* max_id_bytes bounds every source: a 7-byte JSON id against a limit of 4. */
static void test_max_id_bytes_refuses_a_longer_id(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  open_inbox(&f);
  o.max_id_bytes = 4;
  start(&f, &o);
  CHECK_EQ_INT(feed(&f, "credits/a",
                    "{\"message_id\":\"m-12345\",\"account\":\"ann\",\"amount\":5}", NULL, 0),
               MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(
      feed(&f, "credits/a", "{\"message_id\":\"m-1\",\"account\":\"ann\",\"amount\":5}", NULL, 0),
      MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_id'"), 1);
  CHECK_EQ_INT(q(&f, "SELECT balance FROM accounts WHERE account = 'ann'"), 5);
  stop(&f);
}

/* A user property and a JSON field with different ids: dead-lettered by default (either
 * id could be the one a later hop sees); with _USER_PROPERTY_WINS the property is the id. */
static void disagreeing_ids(int policy, int expected_outcome) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_user_property_t p;
  p.name = "message-id";
  p.name_len = strlen(p.name);
  p.value = "prop-1";
  p.value_len = strlen(p.value);
  open_inbox(&f);
  o.id_disagreement = policy;
  start(&f, &o);
  CHECK_EQ_INT(
      feed(&f, "credits/a", "{\"message_id\":\"json-1\",\"account\":\"ann\",\"amount\":2}", &p, 1),
      expected_outcome);
  if (expected_outcome == MQTT_INBOX_OUTCOME_PROCESSED) {
    CHECK(strcmp(f.r.id, "prop-1") == 0);
    CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_processed WHERE message_id = 'prop-1'"), 1);
  } else {
    CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_id'"), 1);
    CHECK_EQ_INT(q(&f, "SELECT count(*) FROM accounts"), 0);
  }
  stop(&f);
}

static void test_disagreeing_ids_are_dead_lettered_by_default(void) {
  disagreeing_ids(MQTT_INBOX_ID_DISAGREEMENT_DEAD_LETTER, MQTT_INBOX_OUTCOME_DEAD_LETTERED);
}

static void test_disagreeing_ids_with_user_property_wins_take_the_property(void) {
  disagreeing_ids(MQTT_INBOX_ID_DISAGREEMENT_USER_PROPERTY_WINS, MQTT_INBOX_OUTCOME_PROCESSED);
}

static void test_bad_id_options_are_refused(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_consumer_t* c = NULL;
  open_inbox(&f);
  o.max_id_bytes = 0;
  CHECK_EQ_INT(mqtt_inbox_consumer_create(f.inbox, "ledger", handler, &f.r, &o, &c),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(mqtt_inbox_errmsg(f.inbox), "max_id_bytes");
  CHECK(c == NULL);
  o.max_id_bytes = 256;
  o.id_disagreement = 7;
  CHECK_EQ_INT(mqtt_inbox_consumer_create(f.inbox, "ledger", handler, &f.r, &o, &c),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(mqtt_inbox_errmsg(f.inbox), "id_disagreement");
  CHECK(c == NULL);
  mqtt_inbox_close(f.inbox);
}

static void test_the_mqtt5_properties_reach_the_handler(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  static const unsigned char corr[5] = {0x01, 0x00, 0xff, 0x7f, 0x00};
  const char* payload = "{\"message_id\":\"p-1\",\"account\":\"ann\",\"amount\":2}";
  int outcome = -1;
  open_inbox(&f);
  start(&f, &o);
  m.topic = "credits/a";
  m.payload = payload;
  m.payload_len = strlen(payload);
  m.content_type = "application/json";
  m.response_topic = "replies/ann";
  m.correlation_data = corr;
  m.correlation_data_len = sizeof corr;
  m.payload_format_indicator = 1;
  m.message_expiry_interval_s = 4294967295LL;
  REQUIRE(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome) == MQTT_INBOX_OK);
  CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK(strcmp(f.r.content_type, "application/json") == 0);
  CHECK_EQ_INT(f.r.content_type_len, strlen("application/json"));
  CHECK(strcmp(f.r.response_topic, "replies/ann") == 0);
  CHECK(f.r.has_correlation);
  CHECK_EQ_INT(f.r.correlation_len, sizeof corr);
  CHECK(memcmp(f.r.correlation, corr, sizeof corr) == 0);
  CHECK_EQ_INT(f.r.pfi, 1);
  CHECK(f.r.has_expiry);
  CHECK(f.r.expiry == 4294967295u);
  CHECK_EQ_INT(q(&f, "SELECT balance FROM accounts WHERE account = 'ann'"), 2);
  stop(&f);
}

static void test_a_message_without_them_shows_none(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  open_inbox(&f);
  start(&f, &o);
  CHECK_EQ_INT(
      feed(&f, "credits/a", "{\"message_id\":\"p-2\",\"account\":\"ann\",\"amount\":2}", NULL, 0),
      MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK(strcmp(f.r.content_type, "(none)") == 0);
  CHECK_EQ_INT(f.r.content_type_len, 0);
  CHECK(strcmp(f.r.response_topic, "(none)") == 0);
  CHECK(!f.r.has_correlation);
  CHECK_EQ_INT(f.r.pfi, -1);
  CHECK(!f.r.has_expiry);
  /* NULL views are answered, not crashed on. */
  CHECK(mqtt_inbox_delivery_content_type(NULL, NULL) == NULL);
  CHECK(mqtt_inbox_delivery_correlation_data(NULL, NULL) == NULL);
  CHECK_EQ_INT(mqtt_inbox_delivery_payload_format_indicator(NULL), -1);
  CHECK_EQ_INT(mqtt_inbox_delivery_message_expiry_interval(NULL, NULL), 0);
  stop(&f);
}

static void test_bad_property_values_are_refused_before_any_row(void) {
  struct fixture f;
  mqtt_inbox_consumer_options_t o = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  const char* payload = "{\"message_id\":\"p-3\",\"account\":\"ann\",\"amount\":2}";
  int outcome = -1;
  open_inbox(&f);
  start(&f, &o);
  m.topic = "credits/a";
  m.payload = payload;
  m.payload_len = strlen(payload);
  m.payload_format_indicator = 2;
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(f.consumer), "payload_format_indicator");
  m.payload_format_indicator = -1;
  m.message_expiry_interval_s = 4294967296LL;
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome), MQTT_INBOX_INVALID_ARGUMENT);
  m.message_expiry_interval_s = -1;
  m.correlation_data_len = 3;
  CHECK_EQ_INT(mqtt_inbox_consumer_feed(f.consumer, &m, &outcome), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(outcome, -1);
  CHECK_EQ_INT(f.r.calls, 0);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_processed"), 0);
  CHECK_EQ_INT(q(&f, "SELECT count(*) FROM inbox_dead_letters"), 0);
  stop(&f);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(the_extractor_gives_the_id_and_a_redelivery_is_a_duplicate),
    CASE(no_id_from_the_extractor_is_missing_id),
    CASE(an_undecodable_answer_is_dead_lettered_with_its_reason),
    CASE(an_id_longer_than_the_buffer_is_invalid_id),
    CASE(max_id_bytes_refuses_a_longer_id),
    CASE(disagreeing_ids_are_dead_lettered_by_default),
    CASE(disagreeing_ids_with_user_property_wins_take_the_property),
    CASE(bad_id_options_are_refused),
    CASE(the_mqtt5_properties_reach_the_handler),
    CASE(a_message_without_them_shows_none),
    CASE(bad_property_values_are_refused_before_any_row),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

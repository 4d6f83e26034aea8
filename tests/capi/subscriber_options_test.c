/* The C subscriber's options and misuse paths, without a broker (c.h, "The MQTT
 * subscriber"): what create refuses and says, secrets from files that never appear in a
 * message, older option structs, and the stop request before and without a start. */
#define _POSIX_C_SOURCE 200809L
#include <mqtt_inbox/c.h>

#include "c_check.h"

static void write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  REQUIRE(f != NULL);
  fputs(text, f);
  fclose(f);
}

static mqtt_inbox_subscriber_options_t options(void) {
  mqtt_inbox_subscriber_options_t o = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  o.broker_uri = "tcp://127.0.0.1:1";
  o.client_id = "c-test";
  o.client_id_lock_dir = "";
  return o;
}

/* Create must fail with `rc`; its message must contain `part`. */
static void refused(const mqtt_inbox_subscriber_options_t* o, int rc, const char* part) {
  mqtt_inbox_subscriber_t* s = (mqtt_inbox_subscriber_t*)&s;
  char* err = NULL;
  CHECK_EQ_INT(mqtt_inbox_subscriber_create(o, &s, &err), rc);
  CHECK(s == NULL);
  CHECK_CONTAINS(err, part);
  if (err && strstr(err, "hunter2")) {
    fprintf(stderr, "a secret in the message: %s\n", err);
    ++c_check_failures;
  }
  mqtt_inbox_free(err);
}

static void test_create_refuses_what_would_lose_messages_or_secrets(void) {
  mqtt_inbox_subscriber_options_t o = options();
  const char* pw = c_temp_path("password");
  const char* empty = c_temp_path("empty");
  write_file(pw, "hunter2\n");
  write_file(empty, "");

  refused(NULL, MQTT_INBOX_MISUSE, "NULL");
  o.broker_uri = NULL;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "broker_uri");
  o = options();
  o.client_id = NULL;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "client_id");
  o = options();
  o.mqtt_version = MQTT_INBOX_MQTT_5;
  o.session_expiry_s = 0; /* would void redelivery */
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "expiry");
  o = options();
  o.mqtt_version = 9;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "mqtt_version");
  o = options();
  o.receive_maximum = 0;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "receive_maximum");
  o = options();
  o.tls_ca_file = pw; /* TLS settings on a plaintext URI: no silent plaintext */
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "plaintext");
  o = options();
  o.password_file = c_temp_path("missing");
  refused(&o, MQTT_INBOX_IO_ERROR, "missing");
  o.password_file = empty;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "empty");
  o.password_file = pw; /* MQTT 3.1.1: a password needs a user name */
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "user name");
  o = options();
  o.broker_uri = "ssl://127.0.0.1:1";
  o.tls_key_password_file = c_temp_path("nokey");
  refused(&o, MQTT_INBOX_IO_ERROR, "nokey");
}

static void test_a_password_file_with_a_user_name_is_accepted(void) {
  mqtt_inbox_subscriber_options_t o = options();
  mqtt_inbox_subscriber_t* s = NULL;
  const char* pw = c_temp_path("password");
  char* json = NULL;
  write_file(pw, "hunter2\n");
  o.username = "device-7";
  o.password_file = pw;
  REQUIRE(mqtt_inbox_subscriber_create(&o, &s, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_subscriber_health_json(s, &json) == MQTT_INBOX_OK);
  CHECK_CONTAINS(json, "\"connected\":false");
  CHECK(strstr(json, "hunter2") == NULL);
  mqtt_inbox_free(json);
  mqtt_inbox_subscriber_destroy(s);
}

/* The TLS fields (cipher list, ALPN, the INSECURE certificate switch) reach the checks
 * create makes. */
static void test_tls_ciphers_alpn_and_the_insecure_switch_are_checked(void) {
  mqtt_inbox_subscriber_options_t o = options();
  mqtt_inbox_subscriber_t* s = NULL;
  const char* alpn[] = {"x-amzn-mqtt-ca", "mqtt"};
  const char* empty_name[] = {""};
  o.broker_uri = "ssl://127.0.0.1:1";
  o.tls_ciphers = "NO-SUCH-CIPHER";
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "NO-SUCH-CIPHER");
  o.tls_ciphers = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256";
  o.tls_alpn = empty_name;
  o.tls_alpn_count = 1;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "alpn");
  o.tls_alpn = NULL;
  o.tls_alpn_count = 2;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "tls_alpn is NULL");
  o.tls_alpn = alpn;
  o.tls_insecure_skip_certificate_check = 1;
  CHECK_EQ_INT(mqtt_inbox_subscriber_create(&o, &s, NULL), MQTT_INBOX_OK);
  mqtt_inbox_subscriber_destroy(s);
  s = NULL;

  /* On a plaintext URI each of them is a TLS setting there is no TLS for: refused. */
  o = options();
  o.tls_insecure_skip_certificate_check = 1;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "plaintext");
  o = options();
  o.tls_ciphers = "ECDHE-RSA-AES128-GCM-SHA256";
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "plaintext");
  o = options();
  o.tls_alpn = alpn;
  o.tls_alpn_count = 1;
  refused(&o, MQTT_INBOX_INVALID_ARGUMENT, "plaintext");
}

static int never(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  (void)ctx;
  (void)db;
  (void)d;
  return MQTT_INBOX_HANDLER_RETRY;
}

static void test_misuse_and_a_stop_request_without_a_start(void) {
  mqtt_inbox_subscriber_options_t o = options();
  mqtt_inbox_subscriber_t* s = NULL;
  mqtt_inbox_t* inbox = NULL;
  mqtt_inbox_consumer_t* c = NULL;
  char* json = NULL;
  REQUIRE(mqtt_inbox_open(c_temp_path("i.db"), NULL, &inbox, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_consumer_create(inbox, "c", never, NULL, NULL, &c) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_subscriber_create(&o, &s, NULL) == MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_subscriber_subscribe(s, NULL, c), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_subscriber_subscribe(s, "x/#", NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_subscriber_subscribe(s, "", c), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_EQ_INT(mqtt_inbox_subscriber_subscribe(s, "x/#", c), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_subscriber_subscribe(s, "x/#", c), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(strlen(mqtt_inbox_subscriber_errmsg(s)) > 0);
  CHECK_EQ_INT(mqtt_inbox_subscriber_wait_connected(s, 0), 0);
  /* A request made before run() is not lost: run returns at once. */
  mqtt_inbox_subscriber_request_stop(s);
  CHECK_EQ_INT(mqtt_inbox_subscriber_run(s), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_subscriber_stop(s), MQTT_INBOX_OK);

  CHECK_EQ_INT(mqtt_inbox_subscriber_subscribe(NULL, "x", c), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_subscriber_start(NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_subscriber_stop(NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_subscriber_run(NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_subscriber_wait_connected(NULL, 0), 0);
  CHECK_EQ_INT(mqtt_inbox_subscriber_health_json(NULL, &json), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_subscriber_health_json(s, NULL), MQTT_INBOX_MISUSE);
  mqtt_inbox_subscriber_request_stop(NULL);
  mqtt_inbox_subscriber_destroy(NULL);
  CHECK(mqtt_inbox_subscriber_errmsg(NULL) != NULL);
  mqtt_inbox_subscriber_destroy(s);
  mqtt_inbox_consumer_destroy(c);
  mqtt_inbox_close(inbox);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(create_refuses_what_would_lose_messages_or_secrets),
    CASE(a_password_file_with_a_user_name_is_accepted),
    CASE(tls_ciphers_alpn_and_the_insecure_switch_are_checked),
    CASE(misuse_and_a_stop_request_without_a_start),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

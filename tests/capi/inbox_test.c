/* The C API's inbox calls, from C (c.h, "The inbox"): version, result codes, open with
 * option structs of every size, the application's set-up SQL, stats and health as JSON,
 * and every call's NULL and misuse paths. Each case asserts on the file's rows or
 * settings, read through a second SQLite connection. */
#include <mqtt_inbox/c.h>

#include "c_check.h"

static mqtt_inbox_t* open_inbox(const char* path) {
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  int rc = mqtt_inbox_open(path, NULL, &inbox, &err);
  if (rc != MQTT_INBOX_OK) fprintf(stderr, "open: %s: %s\n", mqtt_inbox_errstr(rc), err);
  mqtt_inbox_free(err);
  REQUIRE(rc == MQTT_INBOX_OK && inbox != NULL);
  return inbox;
}

static void test_version_matches_the_header(void) {
  const char* text = NULL;
  char expected[32];
  CHECK_EQ_INT(mqtt_inbox_version(&text), MQTT_INBOX_C_VERSION_NUMBER);
  CHECK_EQ_INT(mqtt_inbox_version(NULL), MQTT_INBOX_C_VERSION_NUMBER);
  snprintf(expected, sizeof expected, "%d.%d.%d", MQTT_INBOX_C_VERSION_MAJOR,
           MQTT_INBOX_C_VERSION_MINOR, MQTT_INBOX_C_VERSION_PATCH);
  REQUIRE(text != NULL);
  CHECK(strcmp(text, expected) == 0);
}

static void test_every_code_has_a_name(void) {
  int rc;
  CHECK(strcmp(mqtt_inbox_errstr(MQTT_INBOX_OK), "ok") == 0);
  CHECK(strcmp(mqtt_inbox_errstr(MQTT_INBOX_BUSY), "busy") == 0);
  for (rc = MQTT_INBOX_OK; rc <= MQTT_INBOX_SCHEMA; ++rc)
    CHECK(strcmp(mqtt_inbox_errstr(rc), "unknown") != 0);
  CHECK(strcmp(mqtt_inbox_errstr(-1), "unknown") == 0);
  CHECK(strcmp(mqtt_inbox_errstr(MQTT_INBOX_SCHEMA + 1), "unknown") == 0);
}

static void test_null_arguments_are_misuse_and_destroy_is_null_safe(void) {
  mqtt_inbox_t* inbox = (mqtt_inbox_t*)&inbox; /* not NULL: open must clear it */
  char* err = (char*)&err;
  char* json = NULL;
  CHECK_EQ_INT(mqtt_inbox_open(NULL, NULL, &inbox, &err), MQTT_INBOX_MISUSE);
  CHECK(inbox == NULL);
  CHECK_CONTAINS(err, "NULL");
  mqtt_inbox_free(err);
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("a.db"), NULL, NULL, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_setup(NULL, "SELECT 1"), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_setup_fn(NULL, NULL, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_stats_json(NULL, &json), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_health_json(NULL, &json), MQTT_INBOX_MISUSE);
  CHECK(mqtt_inbox_errmsg(NULL) != NULL);
  mqtt_inbox_close(NULL);
  mqtt_inbox_free(NULL);

  inbox = open_inbox(c_temp_path("b.db"));
  CHECK_EQ_INT(mqtt_inbox_setup(inbox, NULL), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(mqtt_inbox_errmsg(inbox), "NULL sql");
  CHECK_EQ_INT(mqtt_inbox_setup_fn(inbox, NULL, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_stats_json(inbox, NULL), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_health_json(inbox, NULL), MQTT_INBOX_MISUSE);
  mqtt_inbox_close(inbox);
}

static void test_setup_creates_the_application_tables(void) {
  const char* path = c_temp_path("ledger.db");
  mqtt_inbox_t* inbox = open_inbox(path);
  CHECK_EQ_INT(mqtt_inbox_setup(inbox,
                                "CREATE TABLE IF NOT EXISTS accounts (account TEXT PRIMARY KEY,"
                                " balance INTEGER NOT NULL);"
                                "INSERT INTO accounts VALUES ('alice', 10)"),
               MQTT_INBOX_OK);
  CHECK(strcmp(mqtt_inbox_errmsg(inbox), "") == 0);
  CHECK_EQ_INT(c_query_int(path, "SELECT balance FROM accounts WHERE account = 'alice'"), 10);
  /* The inbox's own schema is there too. */
  CHECK_EQ_INT(c_query_int(path, "SELECT count(*) FROM inbox_processed"), 0);
  mqtt_inbox_close(inbox);
}

static void test_failed_setup_rolls_back_and_says_why(void) {
  const char* path = c_temp_path("ledger.db");
  mqtt_inbox_t* inbox = open_inbox(path);
  int rc = mqtt_inbox_setup(inbox,
                            "CREATE TABLE accounts (account TEXT PRIMARY KEY);"
                            "INSERT INTO nowhere VALUES (1)");
  CHECK(rc != MQTT_INBOX_OK);
  CHECK_CONTAINS(mqtt_inbox_errmsg(inbox), "nowhere");
  CHECK_EQ_INT(c_query_int(path, "SELECT count(*) FROM sqlite_master WHERE name = 'accounts'"), 0);
  rc = mqtt_inbox_setup(inbox, "CREATE TABLE t (x CHECK (x > 0)); INSERT INTO t VALUES (0)");
  CHECK_EQ_INT(rc, MQTT_INBOX_REJECTED);
  CHECK_EQ_INT(c_query_int(path, "SELECT count(*) FROM sqlite_master WHERE name = 't'"), 0);
  /* Transaction control belongs to the library. */
  CHECK(mqtt_inbox_setup(inbox, "COMMIT") != MQTT_INBOX_OK);
  mqtt_inbox_close(inbox);
}

static int seed(void* ctx, sqlite3* db) {
  int* calls = (int*)ctx;
  ++*calls;
  return sqlite3_exec(db, "CREATE TABLE seeded (x); INSERT INTO seeded VALUES (7)", NULL, NULL,
                      NULL);
}

static int seed_then_fail(void* ctx, sqlite3* db) {
  (void)ctx;
  if (sqlite3_exec(db, "CREATE TABLE half (x)", NULL, NULL, NULL) != SQLITE_OK) return SQLITE_ERROR;
  return SQLITE_CONSTRAINT;
}

static void test_setup_fn_runs_in_one_transaction(void) {
  const char* path = c_temp_path("fn.db");
  mqtt_inbox_t* inbox = open_inbox(path);
  int calls = 0;
  CHECK_EQ_INT(mqtt_inbox_setup_fn(inbox, seed, &calls), MQTT_INBOX_OK);
  CHECK_EQ_INT(calls, 1);
  CHECK_EQ_INT(c_query_int(path, "SELECT x FROM seeded"), 7);
  CHECK_EQ_INT(mqtt_inbox_setup_fn(inbox, seed_then_fail, NULL), MQTT_INBOX_REJECTED);
  CHECK_EQ_INT(c_query_int(path, "SELECT count(*) FROM sqlite_master WHERE name = 'half'"), 0);
  mqtt_inbox_close(inbox);
}

static long long pragma_of(mqtt_inbox_t* inbox, const char* path, const char* pragma) {
  char sql[128];
  (void)inbox;
  snprintf(sql, sizeof sql, "PRAGMA %s", pragma);
  return c_query_int(path, sql);
}

static int read_cache_size(void* ctx, sqlite3* db) {
  sqlite3_stmt* st = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA cache_size", -1, &st, NULL);
  if (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    *(long long*)ctx = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return rc;
}

static void test_options_are_applied(void) {
  const char* path = c_temp_path("small.db");
  mqtt_inbox_options_t o = MQTT_INBOX_OPTIONS_INIT;
  mqtt_inbox_t* inbox = NULL;
  long long cache = 0;
  o.page_size_bytes = 1024;
  o.cache_size_kib = 300;
  REQUIRE(mqtt_inbox_open(path, &o, &inbox, NULL) == MQTT_INBOX_OK);
  CHECK_EQ_INT(pragma_of(inbox, path, "page_size"), 1024);
  CHECK_EQ_INT(mqtt_inbox_setup_fn(inbox, read_cache_size, &cache), MQTT_INBOX_OK);
  CHECK_EQ_INT(cache, -300);
  mqtt_inbox_close(inbox);

  o = (mqtt_inbox_options_t)MQTT_INBOX_OPTIONS_INIT;
  o.synchronous = 7;
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("x.db"), &o, &inbox, NULL), MQTT_INBOX_INVALID_ARGUMENT);
  o = (mqtt_inbox_options_t)MQTT_INBOX_OPTIONS_INIT;
  o.page_size_bytes = 1000;
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("y.db"), &o, &inbox, NULL), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(inbox == NULL);
}

static void test_a_struct_size_below_its_own_field_is_misuse(void) {
  mqtt_inbox_options_t o = MQTT_INBOX_OPTIONS_INIT;
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  o.struct_size = 0;
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("z.db"), &o, &inbox, &err), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(err, "_INIT");
  mqtt_inbox_free(err);
}

static void test_a_second_exclusive_open_is_busy_with_a_message(void) {
  const char* path = c_temp_path("one.db");
  mqtt_inbox_t* first = open_inbox(path);
  mqtt_inbox_t* second = NULL;
  mqtt_inbox_options_t tool = MQTT_INBOX_OPTIONS_INIT;
  char* err = NULL;
  CHECK_EQ_INT(mqtt_inbox_open(path, NULL, &second, &err), MQTT_INBOX_BUSY);
  CHECK(second == NULL);
  CHECK(err != NULL && strlen(err) > 0);
  mqtt_inbox_free(err);
  /* A tool beside it opens without the lock. */
  tool.exclusive = 0;
  CHECK_EQ_INT(mqtt_inbox_open(path, &tool, &second, NULL), MQTT_INBOX_OK);
  mqtt_inbox_close(second);
  mqtt_inbox_close(first);
}

static void test_open_refuses_a_file_that_is_not_a_database(void) {
  const char* path = c_temp_path("junk.db");
  FILE* f = fopen(path, "wb");
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  int i;
  REQUIRE(f != NULL);
  for (i = 0; i < 4096; ++i) fputc('x', f);
  fclose(f);
  CHECK_EQ_INT(mqtt_inbox_open(path, NULL, &inbox, &err), MQTT_INBOX_CORRUPTION);
  CHECK(err != NULL);
  mqtt_inbox_free(err);
}

static void test_stats_and_health_are_json(void) {
  mqtt_inbox_t* inbox = open_inbox(c_temp_path("s.db"));
  char* json = NULL;
  REQUIRE(mqtt_inbox_stats_json(inbox, &json) == MQTT_INBOX_OK);
  CHECK_CONTAINS(json, "\"processed\":0");
  CHECK_CONTAINS(json, "\"schema_version\":");
  CHECK_CONTAINS(json, "\"consumers\":{}");
  mqtt_inbox_free(json);
  REQUIRE(mqtt_inbox_health_json(inbox, &json) == MQTT_INBOX_OK);
  CHECK_CONTAINS(json, "\"level\":\"green\"");
  CHECK_CONTAINS(json, "\"fatal\":false");
  CHECK_CONTAINS(json, "s.db");
  mqtt_inbox_free(json);
  mqtt_inbox_close(inbox);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(version_matches_the_header),
    CASE(every_code_has_a_name),
    CASE(null_arguments_are_misuse_and_destroy_is_null_safe),
    CASE(setup_creates_the_application_tables),
    CASE(failed_setup_rolls_back_and_says_why),
    CASE(setup_fn_runs_in_one_transaction),
    CASE(options_are_applied),
    CASE(a_struct_size_below_its_own_field_is_misuse),
    CASE(a_second_exclusive_open_is_busy_with_a_message),
    CASE(open_refuses_a_file_that_is_not_a_database),
    CASE(stats_and_health_are_json),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

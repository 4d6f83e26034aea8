/* A caller's mistakes, from C: each ends with a documented result code within a bound,
 * never a crash, a hang or a weaker setting (c.h, the conventions; issue 41). Every
 * mistake runs in a child process (c_in_child): a crash or a hang fails the case, with
 * the signal or the time, instead of killing the runner. Under the sanitizer stage the
 * child is ASan/UBSan-checked like any test, leaks included (it exits through exit()). */
#define _GNU_SOURCE /* mkdtemp, mmap's MAP_ANONYMOUS, unshare, mount */
#include <errno.h>
#include <fcntl.h>
#include <mqtt_inbox/c.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_check.h"

#define BOUND_MS 10000 /* every mistake returns well within this; a hang is killed */

static int file_exists(const char* path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static mqtt_inbox_t* open_inbox(const char* path) {
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  int rc = mqtt_inbox_open(path, NULL, &inbox, &err);
  if (rc != MQTT_INBOX_OK) fprintf(stderr, "open %s: %s: %s\n", path, mqtt_inbox_errstr(rc), err);
  mqtt_inbox_free(err);
  REQUIRE(rc == MQTT_INBOX_OK && inbox != NULL);
  return inbox;
}

/* A handler that returns what its context says, and counts its calls. */
struct script {
  int rc;
  int calls;
  mqtt_inbox_subscriber_t* subscriber;
  mqtt_inbox_consumer_t* consumer;
  mqtt_inbox_relay_t* relay;
  mqtt_inbox_pruner_t* pruner;
  int stop_rc, run_rc, destroy_rc, relay_stop_rc, relay_destroy_rc, consumer_destroy_rc,
      pruner_destroy_rc;
  long long stop_ms;
  char stop_msg[512];
};

static int scripted(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  struct script* s = (struct script*)ctx;
  (void)db;
  (void)d;
  ++s->calls;
  return s->rc;
}

static int feed(mqtt_inbox_consumer_t* c, const char* id, int* outcome) {
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  char payload[128];
  snprintf(payload, sizeof payload, "{\"message_id\":\"%s\"}", id);
  m.topic = "t/1";
  m.payload = payload;
  m.payload_len = strlen(payload);
  return mqtt_inbox_consumer_feed(c, &m, outcome);
}

/* ---- Option structs: not made by their _INIT macro ---------------------------------- */

static void uninitialised_options(void* arg) {
  mqtt_inbox_options_t o;
  mqtt_inbox_consumer_options_t co = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_subscriber_options_t so;
  mqtt_inbox_subscriber_t* sub = (mqtt_inbox_subscriber_t*)&sub;
  mqtt_inbox_t* inbox = (mqtt_inbox_t*)&inbox;
  char* err = NULL;
  (void)arg;
  /* Garbage, as an uninitialised struct on the stack may hold. */
  memset(&o, 0xA5, sizeof o);
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("g.db"), &o, &inbox, &err), MQTT_INBOX_MISUSE);
  CHECK(inbox == NULL);
  CHECK_CONTAINS(err, "MQTT_INBOX_OPTIONS_INIT");
  mqtt_inbox_free(err);
  /* Zeros: a struct that was cleared instead of initialised. */
  memset(&o, 0, sizeof o);
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("z.db"), &o, &inbox, NULL), MQTT_INBOX_MISUSE);
  /* Another struct in its place. */
  CHECK_EQ_INT(
      mqtt_inbox_open(c_temp_path("c.db"), (const mqtt_inbox_options_t*)(void*)&co, &inbox, &err),
      MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(err, "is a mqtt_inbox_consumer_options_t");
  mqtt_inbox_free(err);
  /* Nothing was created by a refused open. */
  CHECK(!file_exists(c_temp_path("g.db")) && !file_exists(c_temp_path("g.db.lock")));
  CHECK(!file_exists(c_temp_path("z.db")) && !file_exists(c_temp_path("c.db")));
  memset(&so, 0x5A, sizeof so);
  CHECK_EQ_INT(mqtt_inbox_subscriber_create(&so, &sub, NULL), MQTT_INBOX_MISUSE);
  CHECK(sub == NULL);
}

static void test_an_uninitialised_options_struct_is_misuse(void) {
  c_in_child("uninitialised options", uninitialised_options, NULL, BOUND_MS);
}

static void versions_and_sizes(void* arg) {
  mqtt_inbox_options_t o = MQTT_INBOX_OPTIONS_INIT;
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  (void)arg;
  o.struct_version = 0;
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("v.db"), &o, &inbox, &err), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(err, "struct_version is 0");
  mqtt_inbox_free(err);
  o.struct_version = 2; /* a newer header than this library */
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("v.db"), &o, &inbox, NULL), MQTT_INBOX_MISUSE);
  o.struct_version = 1;
  o.struct_size = 10; /* the issue's case: a short struct with a bad synchronous */
  o.synchronous = 7;
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("v.db"), &o, &inbox, &err), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(err, "struct_size is 10");
  mqtt_inbox_free(err);
  o.struct_size = sizeof o + 8;
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("v.db"), &o, &inbox, NULL), MQTT_INBOX_MISUSE);
  CHECK(inbox == NULL && !file_exists(c_temp_path("v.db")));
}

static void test_an_unknown_version_or_a_wrong_size_is_misuse(void) {
  c_in_child("versions and sizes", versions_and_sizes, NULL, BOUND_MS);
}

/* The struct ends where a page the process may not read begins: the library reads no
 * byte past the size it knows for the struct's version (a read would be SIGSEGV). A
 * header whose version it does not know is not read past the header. */
static void nothing_read_past_the_struct(void* arg) {
  const long page = sysconf(_SC_PAGESIZE);
  unsigned char* mem =
      mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const mqtt_inbox_options_t init = MQTT_INBOX_OPTIONS_INIT;
  mqtt_inbox_options_t* o;
  mqtt_inbox_t* inbox = NULL;
  const size_t header = offsetof(mqtt_inbox_options_t, synchronous);
  (void)arg;
  REQUIRE(mem != MAP_FAILED);
  REQUIRE(mprotect(mem + page, (size_t)page, PROT_NONE) == 0);
  o = (mqtt_inbox_options_t*)(void*)(mem + page - sizeof init);
  memcpy(o, &init, sizeof init);
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("edge.db"), o, &inbox, NULL), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
  /* Only a header fits before the guard page: a version this library does not know. */
  o = (mqtt_inbox_options_t*)(void*)(mem + page - header);
  memcpy(o, &init, header);
  o->struct_version = 9;
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("edge2.db"), o, &inbox, NULL), MQTT_INBOX_MISUSE);
  o->struct_version = 1;
  o->struct_size = header; /* not the size of version 1 */
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("edge2.db"), o, &inbox, NULL), MQTT_INBOX_MISUSE);
  munmap(mem, (size_t)page * 2);
}

static void test_nothing_past_the_known_size_is_read(void) {
  c_in_child("nothing read past the struct", nothing_read_past_the_struct, NULL, BOUND_MS);
}

/* ---- Values out of range: refused, never mapped to another value -------------------- */

static void enums_out_of_range(void* arg) {
  const int bad[] = {2, -1, 7, 0x7fffffff};
  size_t i;
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  (void)arg;
  for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    mqtt_inbox_options_t o = MQTT_INBOX_OPTIONS_INIT;
    o.synchronous = bad[i];
    CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("e.db"), &o, &inbox, &err),
                 MQTT_INBOX_INVALID_ARGUMENT);
    CHECK_CONTAINS(err, "synchronous");
    mqtt_inbox_free(err);
    /* Nothing was opened, so nothing ran with synchronous = NORMAL either. */
    CHECK(inbox == NULL && !file_exists(c_temp_path("e.db")));
    o = (mqtt_inbox_options_t)MQTT_INBOX_OPTIONS_INIT;
    o.exclusive = bad[i];
    CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("e.db"), &o, &inbox, NULL),
                 MQTT_INBOX_INVALID_ARGUMENT);
    o = (mqtt_inbox_options_t)MQTT_INBOX_OPTIONS_INIT;
    o.record_metadata = bad[i];
    CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("e.db"), &o, &inbox, NULL),
                 MQTT_INBOX_INVALID_ARGUMENT);
    o = (mqtt_inbox_options_t)MQTT_INBOX_OPTIONS_INIT;
    o.low_memory = bad[i];
    CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("e.db"), &o, &inbox, NULL),
                 MQTT_INBOX_INVALID_ARGUMENT);
  }
  inbox = open_inbox(c_temp_path("ok.db"));
  {
    mqtt_inbox_consumer_options_t co = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
    mqtt_inbox_consumer_t* c = NULL;
    struct script s = {0};
    co.retained = 3;
    CHECK_EQ_INT(mqtt_inbox_consumer_create(inbox, "c", scripted, &s, &co, &c),
                 MQTT_INBOX_INVALID_ARGUMENT);
    co = (mqtt_inbox_consumer_options_t)MQTT_INBOX_CONSUMER_OPTIONS_INIT;
    co.id_disagreement = 2;
    CHECK_EQ_INT(mqtt_inbox_consumer_create(inbox, "c", scripted, &s, &co, &c),
                 MQTT_INBOX_INVALID_ARGUMENT);
    CHECK(c == NULL);
  }
  {
    mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
    mqtt_inbox_subscriber_t* sub = NULL;
    so.broker_uri = "ssl://127.0.0.1:1";
    so.client_id = "c";
    so.tls_insecure_skip_certificate_check = 2; /* garbage must not switch checks off */
    CHECK_EQ_INT(mqtt_inbox_subscriber_create(&so, &sub, &err), MQTT_INBOX_INVALID_ARGUMENT);
    CHECK_CONTAINS(err, "tls_insecure_skip_certificate_check is 2");
    mqtt_inbox_free(err);
    so.tls_insecure_skip_certificate_check = 0;
    so.tls_insecure_skip_hostname_check = -1;
    CHECK_EQ_INT(mqtt_inbox_subscriber_create(&so, &sub, NULL), MQTT_INBOX_INVALID_ARGUMENT);
    so.tls_insecure_skip_hostname_check = 0;
    so.mqtt_version = 4;
    CHECK_EQ_INT(mqtt_inbox_subscriber_create(&so, &sub, NULL), MQTT_INBOX_INVALID_ARGUMENT);
    so.mqtt_version = MQTT_INBOX_MQTT_5;
    so.tls_version = 11;
    CHECK_EQ_INT(mqtt_inbox_subscriber_create(&so, &sub, NULL), MQTT_INBOX_INVALID_ARGUMENT);
    CHECK(sub == NULL);
  }
  {
    mqtt_inbox_outbox_class_t cl = MQTT_INBOX_OUTBOX_CLASS_INIT;
    mqtt_inbox_outbox_options_t oo = MQTT_INBOX_OUTBOX_OPTIONS_INIT;
    mqtt_inbox_outbox_t* ob = NULL;
    mqtt_inbox_relay_options_t ro = MQTT_INBOX_RELAY_OPTIONS_INIT;
    mqtt_inbox_relay_t* relay = NULL;
    cl.topic_prefix = "a/";
    cl.policy = 2;
    oo.classes = &cl;
    oo.class_count = 1;
    CHECK_EQ_INT(mqtt_inbox_outbox_create_with_options(inbox, &oo, &ob),
                 MQTT_INBOX_INVALID_ARGUMENT);
    REQUIRE(mqtt_inbox_outbox_create(inbox, &ob) == MQTT_INBOX_OK);
    ro.broker_uri = "tcp://127.0.0.1:1";
    ro.client_id = "r";
    ro.wake_on_commit = 5;
    CHECK_EQ_INT(mqtt_inbox_relay_create(ob, &ro, &relay, NULL), MQTT_INBOX_INVALID_ARGUMENT);
    CHECK(relay == NULL);
    CHECK_EQ_INT(mqtt_inbox_outbox_destroy(ob), MQTT_INBOX_OK);
  }
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
}

static void test_a_value_out_of_range_is_refused_never_mapped(void) {
  c_in_child("values out of range", enums_out_of_range, NULL, BOUND_MS);
}

/* ---- Handles: close while used, use after close, double close ----------------------- */

static void close_while_children_live(void* arg) {
  mqtt_inbox_t* inbox = open_inbox(c_temp_path("busy.db"));
  mqtt_inbox_consumer_t* consumer = NULL;
  mqtt_inbox_outbox_t* outbox = NULL;
  mqtt_inbox_pruner_t* pruner = NULL;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  mqtt_inbox_subscriber_t* sub = NULL;
  mqtt_inbox_relay_options_t ro = MQTT_INBOX_RELAY_OPTIONS_INIT;
  mqtt_inbox_relay_t* relay = NULL;
  struct script s = {0};
  int outcome = -1;
  (void)arg;
  REQUIRE(mqtt_inbox_consumer_create(inbox, "c", scripted, &s, NULL, &consumer) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_outbox_create(inbox, &outbox) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_pruner_create(inbox, NULL, &pruner) == MQTT_INBOX_OK);
  so.broker_uri = "tcp://127.0.0.1:1";
  so.client_id = "busy-sub";
  so.client_id_lock_dir = "";
  REQUIRE(mqtt_inbox_subscriber_create(&so, &sub, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_subscriber_subscribe(sub, "t/#", consumer) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_relay_create_on(outbox, sub, &ro, &relay, NULL) == MQTT_INBOX_OK);

  /* Each refuses while something made from it is alive, and closes nothing. */
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_BUSY);
  CHECK_CONTAINS(mqtt_inbox_errmsg(inbox), "3 consumer(s), outbox(es) or pruner(s)");
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(consumer), MQTT_INBOX_BUSY);
  CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(consumer), "subscriber(s) routing");
  CHECK_EQ_INT(mqtt_inbox_outbox_destroy(outbox), MQTT_INBOX_BUSY);
  CHECK_EQ_INT(mqtt_inbox_subscriber_destroy(sub), MQTT_INBOX_BUSY);
  CHECK_CONTAINS(mqtt_inbox_subscriber_errmsg(sub), "relay(s) publishing on its connection");
  /* ... and all of it still works. */
  CHECK_EQ_INT(feed(consumer, "m-1", &outcome), MQTT_INBOX_OK);
  CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(mqtt_inbox_setup(inbox, "CREATE TABLE IF NOT EXISTS t (x)"), MQTT_INBOX_OK);

  /* In the reverse order of creation each one goes. */
  CHECK_EQ_INT(mqtt_inbox_relay_destroy(relay), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_subscriber_destroy(sub), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(consumer), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_BUSY); /* the outbox and the pruner */
  CHECK_EQ_INT(mqtt_inbox_outbox_destroy(outbox), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_pruner_destroy(pruner), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
  /* The lock file was released by the close: the file opens again. */
  inbox = open_inbox(c_temp_path("busy.db"));
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
}

static void test_close_refuses_while_a_handle_made_from_it_lives(void) {
  c_in_child("close while children live", close_while_children_live, NULL, BOUND_MS);
}

static void use_after_close(void* arg) {
  mqtt_inbox_t* inbox = open_inbox(c_temp_path("after.db"));
  mqtt_inbox_consumer_t* consumer = NULL;
  mqtt_inbox_outbox_t* outbox = NULL;
  mqtt_inbox_pruner_t* pruner = NULL;
  struct script s = {0};
  int outcome = -1;
  char* json = NULL;
  mqtt_inbox_consumer_counters_t counters = MQTT_INBOX_CONSUMER_COUNTERS_INIT;
  (void)arg;
  REQUIRE(mqtt_inbox_consumer_create(inbox, "c", scripted, &s, NULL, &consumer) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_outbox_create(inbox, &outbox) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_pruner_create(inbox, NULL, &pruner) == MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_pruner_destroy(pruner), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_outbox_destroy(outbox), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(consumer), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);

  /* Every call on a dead handle: a code, no crash (the registry is asked, the memory is
   * never read). */
  CHECK_EQ_INT(mqtt_inbox_setup(inbox, "SELECT 1"), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_stats_json(inbox, &json), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(mqtt_inbox_errmsg(inbox), "not a live mqtt_inbox_t");
  CHECK_EQ_INT(feed(consumer, "m-1", &outcome), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_counters(consumer, &counters), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(consumer), "not a live mqtt_inbox_consumer_t");
  CHECK_EQ_INT(mqtt_inbox_outbox_create(inbox, &outbox), MQTT_INBOX_MISUSE);
  CHECK(outbox == NULL);
  CHECK_EQ_INT(mqtt_inbox_pruner_run_once(pruner, NULL), MQTT_INBOX_MISUSE);
  /* Closed or destroyed twice. */
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(consumer), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_pruner_destroy(pruner), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_close(NULL), MQTT_INBOX_OK);
  CHECK(s.calls == 0);
}

static void test_use_after_close_and_double_close_are_misuse(void) {
  c_in_child("use after close", use_after_close, NULL, BOUND_MS);
}

/* The issue's case: the inbox closed under its live consumer, then a feed. */
static void close_under_a_live_consumer(void* arg) {
  mqtt_inbox_t* inbox = open_inbox(c_temp_path("under.db"));
  mqtt_inbox_consumer_t* consumer = NULL;
  struct script s = {0};
  int outcome = -1;
  (void)arg;
  REQUIRE(mqtt_inbox_consumer_create(inbox, "c", scripted, &s, NULL, &consumer) == MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_BUSY);
  CHECK_EQ_INT(feed(consumer, "m-1", &outcome), MQTT_INBOX_OK);
  CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(consumer), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
  CHECK_EQ_INT(c_query_int(c_temp_path("under.db"), "SELECT count(*) FROM inbox_processed"), 1);
}

static void test_a_live_consumer_keeps_its_inbox_open(void) {
  c_in_child("close under a live consumer", close_under_a_live_consumer, NULL, BOUND_MS);
}

/* A handle passed where another kind is expected. */
static void wrong_kind(void* arg) {
  mqtt_inbox_t* inbox = open_inbox(c_temp_path("kind.db"));
  mqtt_inbox_consumer_t* consumer = NULL;
  struct script s = {0};
  int outcome = -1;
  (void)arg;
  REQUIRE(mqtt_inbox_consumer_create(inbox, "c", scripted, &s, NULL, &consumer) == MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_setup((mqtt_inbox_t*)(void*)consumer, "SELECT 1"), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(feed((mqtt_inbox_consumer_t*)(void*)inbox, "x", &outcome), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_close((mqtt_inbox_t*)(void*)consumer), MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(consumer), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
}

static void test_a_handle_of_another_kind_is_misuse(void) {
  c_in_child("a handle of another kind", wrong_kind, NULL, BOUND_MS);
}

/* ---- Open: what waiting cannot mend fails at once, leaving nothing ------------------ */

static void open_a_folder(void* arg) {
  const char* dir = c_temp_path("a-folder");
  char lock[4200];
  mqtt_inbox_t* inbox = (mqtt_inbox_t*)&inbox;
  char* err = NULL;
  const long long t0 = c_now_ms();
  (void)arg;
  REQUIRE(mkdir(dir, 0755) == 0);
  /* The default startup_deadline_ms 0 waits as long as a transient error lasts. */
  CHECK_EQ_INT(mqtt_inbox_open(dir, NULL, &inbox, &err), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(c_now_ms() - t0 < 2000);
  CHECK(inbox == NULL);
  CHECK_CONTAINS(err, "is a folder");
  mqtt_inbox_free(err);
  snprintf(lock, sizeof lock, "%s.lock", dir);
  CHECK(!file_exists(lock));
  CHECK_EQ_INT(mqtt_inbox_open("/dev/null", NULL, &inbox, &err), MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "not a regular file");
  mqtt_inbox_free(err);
  CHECK(!file_exists("/dev/null.lock"));
}

static void test_open_on_a_folder_fails_at_once_and_leaves_no_lock_file(void) {
  c_in_child("open a folder", open_a_folder, NULL, BOUND_MS);
}

static void open_in_a_missing_folder(void* arg) {
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  (void)arg;
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("no/such/folder/x.db"), NULL, &inbox, &err),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "does not exist");
  mqtt_inbox_free(err);
  /* A file where a folder should be. */
  REQUIRE(fclose(fopen(c_temp_path("plain"), "w")) == 0);
  CHECK_EQ_INT(mqtt_inbox_open(c_temp_path("plain/x.db"), NULL, &inbox, NULL),
               MQTT_INBOX_INVALID_ARGUMENT);
  CHECK(inbox == NULL);
}

static void test_open_in_a_missing_folder_fails_at_once(void) {
  c_in_child("open in a missing folder", open_in_a_missing_folder, NULL, BOUND_MS);
}

/* A small tmpfs, in a mount namespace of the child's own (root only). */
static int mount_tmpfs(const char* dir, const char* options, unsigned long flags) {
  char data[64];
  snprintf(data, sizeof data, "%s,mode=0755", options);
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
  if (unshare(CLONE_NEWNS) == 0) mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
  return mount("tmpfs", dir, "tmpfs", flags, data);
}

static void fill(const char* path) {
  static char block[4096];
  FILE* f = fopen(path, "wb");
  REQUIRE(f != NULL);
  setvbuf(f, NULL, _IONBF, 0);
  memset(block, 'x', sizeof block);
  while (fwrite(block, 1, sizeof block, f) == sizeof block) {
  }
  while (fwrite(block, 1, 1, f) == 1) {
  }
  fclose(f);
}

static void open_unwritable_and_full(void* arg) {
  const char* ro = c_temp_path("ro");
  const char* full = c_temp_path("full");
  char path[4200], lock[4300];
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  long long t0;
  (void)arg;
  if (mount_tmpfs(ro, "size=1m", MS_RDONLY) != 0) {
    printf("no tmpfs (%s): these two cases need root\n", strerror(errno));
    exit(C_CHECK_SKIP);
  }
  /* A new database where nothing can be written: at once, MQTT_INBOX_READ_ONLY. */
  snprintf(path, sizeof path, "%s/x.db", ro);
  t0 = c_now_ms();
  CHECK_EQ_INT(mqtt_inbox_open(path, NULL, &inbox, &err), MQTT_INBOX_READ_ONLY);
  CHECK(c_now_ms() - t0 < 2000);
  CHECK_CONTAINS(err, "cannot be written");
  mqtt_inbox_free(err);

  /* A new database on a full file system: at once, MQTT_INBOX_FULL, no file left. */
  REQUIRE(mount_tmpfs(full, "size=256k", 0) == 0);
  snprintf(path, sizeof path, "%s/filler", full);
  fill(path);
  snprintf(path, sizeof path, "%s/x.db", full);
  t0 = c_now_ms();
  CHECK_EQ_INT(mqtt_inbox_open(path, NULL, &inbox, &err), MQTT_INBOX_FULL);
  CHECK(c_now_ms() - t0 < 5000);
  CHECK(inbox == NULL);
  CHECK_CONTAINS(err, "no room to create");
  mqtt_inbox_free(err);
  snprintf(lock, sizeof lock, "%s.lock", path);
  CHECK(!file_exists(path) && !file_exists(lock));
  snprintf(lock, sizeof lock, "%s-wal", path);
  CHECK(!file_exists(lock));
  snprintf(lock, sizeof lock, "%s-shm", path);
  CHECK(!file_exists(lock));
}

static void test_open_where_nothing_fits_or_can_be_written_fails_at_once(void) {
  c_in_child("unwritable and full", open_unwritable_and_full, NULL, BOUND_MS);
}

/* A write lock another process holds is transient: waited out with a log line, up to
 * startup_deadline_ms. */
static int lines_seen;
static void count_lines(void* ctx, int level, const char* msg) {
  (void)ctx;
  if (level >= MQTT_INBOX_LOG_WARN && strstr(msg, "held.db") && strstr(msg, "start-up"))
    ++lines_seen;
}

static void held_lock(void* arg) {
  const char* path = c_temp_path("held.db");
  sqlite3* holder = NULL;
  mqtt_inbox_options_t o = MQTT_INBOX_OPTIONS_INIT;
  mqtt_inbox_t* inbox = NULL;
  char* err = NULL;
  long long t0;
  int pipefd[2];
  pid_t pid;
  char byte = 0;
  (void)arg;
  REQUIRE(pipe(pipefd) == 0);
  pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) { /* another process: an empty database, locked */
    REQUIRE(sqlite3_open(path, &holder) == SQLITE_OK);
    REQUIRE(sqlite3_exec(holder, "BEGIN EXCLUSIVE", NULL, NULL, NULL) == SQLITE_OK);
    REQUIRE(write(pipefd[1], &byte, 1) == 1);
    sleep(3);
    _exit(0);
  }
  REQUIRE(read(pipefd[0], &byte, 1) == 1);
  mqtt_inbox_set_log_callback(count_lines, NULL, MQTT_INBOX_LOG_INFO);
  o.startup_deadline_ms = 500;
  t0 = c_now_ms();
  CHECK_EQ_INT(mqtt_inbox_open(path, &o, &inbox, &err), MQTT_INBOX_BUSY);
  CHECK(c_now_ms() - t0 >= 450);
  CHECK_CONTAINS(err, "not ready after");
  mqtt_inbox_free(err);
  CHECK(lines_seen >= 1);
  mqtt_inbox_set_log_callback(NULL, NULL, MQTT_INBOX_LOG_INFO);
  waitpid(pid, NULL, 0);
  /* Once it lets go, the same open succeeds. */
  inbox = open_inbox(path);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
}

static void test_a_lock_another_process_holds_is_waited_out_with_a_log_line(void) {
  c_in_child("a held lock", held_lock, NULL, BOUND_MS);
}

/* ---- Handler results that do not fit ------------------------------------------------- */

static void misfit_results(void* arg) {
  const char* path = c_temp_path("misfit.db");
  mqtt_inbox_t* inbox = open_inbox(path);
  mqtt_inbox_consumer_options_t co = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_consumer_t* consumer = NULL;
  struct script s = {0};
  int outcome = -1;
  char text[512];
  (void)arg;
  co.max_attempts = 2;
  co.retry_backoff_initial_ms = 1;
  co.retry_backoff_max_ms = 1;
  co.requeue_poll_ms = 20;
  REQUIRE(mqtt_inbox_consumer_create(inbox, "c", scripted, &s, &co, &consumer) == MQTT_INBOX_OK);
  /* OUTBOX_FULL with no outbox at all: no backpressure to wait for. */
  s.rc = MQTT_INBOX_HANDLER_OUTBOX_FULL;
  CHECK_EQ_INT(feed(consumer, "full-1", &outcome), MQTT_INBOX_OK);
  CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(s.calls, 2);
  c_query_text(path,
               "SELECT reason || ': ' || reason_text FROM inbox_dead_letters"
               " WHERE message_id = 'full-1' AND status = 'dead'",
               text, sizeof text);
  CHECK_CONTAINS(text, "handler_failed: ");
  CHECK_CONTAINS(text, "no mqtt_inbox_outbox_enqueue of this attempt returned");
  /* Not parked, so never replayed: the calls stay at 2. */
  usleep(300 * 1000);
  CHECK_EQ_INT(s.calls, 2);
  CHECK_EQ_INT(
      c_query_int(path, "SELECT count(*) FROM inbox_dead_letters WHERE status = 'requeued'"), 0);
  /* A code that is none of MQTT_INBOX_HANDLER_*. */
  s.calls = 0;
  s.rc = 42;
  CHECK_EQ_INT(feed(consumer, "odd-1", &outcome), MQTT_INBOX_OK);
  CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_DEAD_LETTERED);
  CHECK_EQ_INT(s.calls, 2);
  c_query_text(path, "SELECT reason_text FROM inbox_dead_letters WHERE message_id = 'odd-1'", text,
               sizeof text);
  CHECK_CONTAINS(text, "returned 42, which is not an MQTT_INBOX_HANDLER_* code");
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(consumer), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
}

static void test_a_handler_result_that_does_not_fit_is_a_named_dead_letter(void) {
  c_in_child("handler results that do not fit", misfit_results, NULL, BOUND_MS);
}

/* ---- feed: what a broker would never deliver ----------------------------------------- */

static void feed_checks(void* arg) {
  const char* path = c_temp_path("feed.db");
  mqtt_inbox_t* inbox = open_inbox(path);
  mqtt_inbox_consumer_t* consumer = NULL;
  struct script s = {0};
  const char* payload = "{\"message_id\":\"f-1\"}";
  const char* bad_topics[] = {"a/+/b", "a/#", "#", "", "caf\xc3", "\xff\xfe"};
  size_t i;
  int outcome = -1;
  (void)arg;
  REQUIRE(mqtt_inbox_consumer_create(inbox, "c", scripted, &s, NULL, &consumer) == MQTT_INBOX_OK);
  for (i = 0; i < sizeof bad_topics / sizeof bad_topics[0]; ++i) {
    mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
    m.topic = bad_topics[i];
    m.payload = payload;
    m.payload_len = strlen(payload);
    CHECK_EQ_INT(mqtt_inbox_consumer_feed(consumer, &m, &outcome), MQTT_INBOX_INVALID_ARGUMENT);
    CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(consumer), "mqtt_inbox_message_t.topic");
  }
  {
    mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
    m.topic = "t/1";
    m.payload = payload;
    m.payload_len = strlen(payload);
    m.qos = 3;
    CHECK_EQ_INT(mqtt_inbox_consumer_feed(consumer, &m, &outcome), MQTT_INBOX_INVALID_ARGUMENT);
    CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(consumer), "qos is 3");
    m.qos = -1;
    CHECK_EQ_INT(mqtt_inbox_consumer_feed(consumer, &m, &outcome), MQTT_INBOX_INVALID_ARGUMENT);
    m.qos = 1;
    m.dup = 5;
    CHECK_EQ_INT(mqtt_inbox_consumer_feed(consumer, &m, &outcome), MQTT_INBOX_INVALID_ARGUMENT);
    CHECK_CONTAINS(mqtt_inbox_consumer_errmsg(consumer), "dup is 5");
    m.dup = 0;
    m.retained = 2;
    CHECK_EQ_INT(mqtt_inbox_consumer_feed(consumer, &m, &outcome), MQTT_INBOX_INVALID_ARGUMENT);
    /* Nothing was recorded and no handler ran. */
    CHECK_EQ_INT(s.calls, 0);
    CHECK_EQ_INT(c_query_int(path, "SELECT count(*) FROM inbox_processed"), 0);
    CHECK_EQ_INT(c_query_int(path, "SELECT count(*) FROM inbox_dead_letters"), 0);
    /* The same message, right: processed, and the consumer's errmsg cleared. */
    m.retained = 0;
    CHECK_EQ_INT(mqtt_inbox_consumer_feed(consumer, &m, &outcome), MQTT_INBOX_OK);
    CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_PROCESSED);
    CHECK(strcmp(mqtt_inbox_consumer_errmsg(consumer), "") == 0);
  }
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(consumer), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
}

static void test_feed_refuses_a_message_no_broker_would_deliver(void) {
  c_in_child("feed's checks", feed_checks, NULL, BOUND_MS);
}

/* ---- Calls that wait for another thread, from inside a handler ----------------------- */

static int stopping_handler(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  struct script* s = (struct script*)ctx;
  const long long t0 = c_now_ms();
  (void)db;
  (void)d;
  ++s->calls;
  s->stop_rc = mqtt_inbox_subscriber_stop(s->subscriber);
  s->stop_ms = c_now_ms() - t0;
  snprintf(s->stop_msg, sizeof s->stop_msg, "%s", mqtt_inbox_subscriber_errmsg(s->subscriber));
  s->run_rc = mqtt_inbox_subscriber_run(s->subscriber);
  s->destroy_rc = mqtt_inbox_subscriber_destroy(s->subscriber);
  s->relay_stop_rc = mqtt_inbox_relay_stop(s->relay);
  s->relay_destroy_rc = mqtt_inbox_relay_destroy(s->relay);
  s->consumer_destroy_rc = mqtt_inbox_consumer_destroy(s->consumer);
  s->pruner_destroy_rc = mqtt_inbox_pruner_destroy(s->pruner);
  mqtt_inbox_subscriber_request_stop(s->subscriber); /* allowed: it only asks */
  return MQTT_INBOX_HANDLER_OK;
}

static void stop_in_handler(void* arg) {
  mqtt_inbox_t* inbox = open_inbox(c_temp_path("stop.db"));
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  mqtt_inbox_relay_options_t ro = MQTT_INBOX_RELAY_OPTIONS_INIT;
  mqtt_inbox_outbox_t* outbox = NULL;
  struct script s;
  int outcome = -1;
  (void)arg;
  memset(&s, 0, sizeof s);
  so.broker_uri = "tcp://127.0.0.1:1";
  so.client_id = "stop-in-handler";
  so.client_id_lock_dir = "";
  so.stop_timeout_ms = 5000;
  REQUIRE(mqtt_inbox_subscriber_create(&so, &s.subscriber, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_consumer_create(inbox, "c", stopping_handler, &s, NULL, &s.consumer) ==
          MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_outbox_create(inbox, &outbox) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_relay_create_on(outbox, s.subscriber, &ro, &s.relay, NULL) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_pruner_create(inbox, NULL, &s.pruner) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_subscriber_subscribe(s.subscriber, "t/#", s.consumer) == MQTT_INBOX_OK);
  REQUIRE(mqtt_inbox_subscriber_start(s.subscriber) == MQTT_INBOX_OK);
  CHECK_EQ_INT(feed(s.consumer, "stop-1", &outcome), MQTT_INBOX_OK);
  CHECK_EQ_INT(outcome, MQTT_INBOX_OUTCOME_PROCESSED);
  CHECK_EQ_INT(s.calls, 1);
  /* Refused at once (not after stop_timeout_ms), saying why. */
  CHECK_EQ_INT(s.stop_rc, MQTT_INBOX_MISUSE);
  CHECK(s.stop_ms < 1000);
  CHECK_CONTAINS(s.stop_msg, "from inside a handler");
  CHECK_CONTAINS(s.stop_msg, "mqtt_inbox_subscriber_request_stop");
  CHECK_EQ_INT(s.run_rc, MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(s.destroy_rc, MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(s.relay_stop_rc, MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(s.relay_destroy_rc, MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(s.consumer_destroy_rc, MQTT_INBOX_MISUSE);
  CHECK_EQ_INT(s.pruner_destroy_rc, MQTT_INBOX_MISUSE);
  /* The stop the handler asked for is what run does next. */
  CHECK_EQ_INT(mqtt_inbox_subscriber_run(s.subscriber), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_relay_destroy(s.relay), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_subscriber_destroy(s.subscriber), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_pruner_destroy(s.pruner), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_outbox_destroy(outbox), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_consumer_destroy(s.consumer), MQTT_INBOX_OK);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
}

static void test_a_stop_from_inside_the_handler_is_refused_at_once(void) {
  c_in_child("stop from inside the handler", stop_in_handler, NULL, BOUND_MS);
}

/* ---- errmsg: cleared by a later success ---------------------------------------------- */

static void errmsg_cleared(void* arg) {
  mqtt_inbox_t* inbox = open_inbox(c_temp_path("msg.db"));
  char* json = NULL;
  (void)arg;
  CHECK(strcmp(mqtt_inbox_errmsg(inbox), "") == 0);
  CHECK(mqtt_inbox_setup(inbox, "INSERT INTO nowhere VALUES (1)") != MQTT_INBOX_OK);
  CHECK_CONTAINS(mqtt_inbox_errmsg(inbox), "nowhere");
  /* sqlite3_errmsg's rule: the message is the last call's. */
  CHECK_EQ_INT(mqtt_inbox_stats_json(inbox, &json), MQTT_INBOX_OK);
  mqtt_inbox_free(json);
  CHECK(strcmp(mqtt_inbox_errmsg(inbox), "") == 0);
  CHECK_EQ_INT(mqtt_inbox_setup(inbox, NULL), MQTT_INBOX_MISUSE);
  CHECK_CONTAINS(mqtt_inbox_errmsg(inbox), "NULL sql");
  CHECK_EQ_INT(mqtt_inbox_setup(inbox, "CREATE TABLE IF NOT EXISTS t (x)"), MQTT_INBOX_OK);
  CHECK(strcmp(mqtt_inbox_errmsg(inbox), "") == 0);
  CHECK_EQ_INT(mqtt_inbox_close(inbox), MQTT_INBOX_OK);
}

static void test_errmsg_is_cleared_by_a_later_success(void) {
  c_in_child("errmsg cleared", errmsg_cleared, NULL, BOUND_MS);
}

#define CASE(name) \
  { #name, test_##name }
static const struct c_test tests[] = {
    CASE(an_uninitialised_options_struct_is_misuse),
    CASE(an_unknown_version_or_a_wrong_size_is_misuse),
    CASE(nothing_past_the_known_size_is_read),
    CASE(a_value_out_of_range_is_refused_never_mapped),
    CASE(close_refuses_while_a_handle_made_from_it_lives),
    CASE(use_after_close_and_double_close_are_misuse),
    CASE(a_live_consumer_keeps_its_inbox_open),
    CASE(a_handle_of_another_kind_is_misuse),
    CASE(open_on_a_folder_fails_at_once_and_leaves_no_lock_file),
    CASE(open_in_a_missing_folder_fails_at_once),
    CASE(open_where_nothing_fits_or_can_be_written_fails_at_once),
    CASE(a_lock_another_process_holds_is_waited_out_with_a_log_line),
    CASE(a_handler_result_that_does_not_fit_is_a_named_dead_letter),
    CASE(feed_refuses_a_message_no_broker_would_deliver),
    CASE(a_stop_from_inside_the_handler_is_refused_at_once),
    CASE(errmsg_is_cleared_by_a_later_success),
};

int main(int argc, char** argv) {
  return c_check_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}

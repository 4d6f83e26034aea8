/* The C tests' frame (c_check.h). */
#define _GNU_SOURCE
#include "c_check.h"

#include <stdlib.h>
#include <unistd.h>

int c_check_failures = 0;

static char c_dir[4096];

const char* c_temp_dir(void) {
  if (!c_dir[0]) {
    const char* base = getenv("TMPDIR");
    snprintf(c_dir, sizeof c_dir, "%s/capi_test_XXXXXX", base && *base ? base : "/tmp");
    REQUIRE(mkdtemp(c_dir) != NULL);
  }
  return c_dir;
}

const char* c_temp_path(const char* name) {
  static char slots[4][4096];
  static int next = 0;
  char* p = slots[next];
  next = (next + 1) % 4;
  snprintf(p, 4096, "%s/%s", c_temp_dir(), name);
  return p;
}

static sqlite3* c_open(const char* path) {
  sqlite3* db = NULL;
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    fprintf(stderr, "cannot open %s: %s\n", path, db ? sqlite3_errmsg(db) : "no memory");
    sqlite3_close(db);
    return NULL;
  }
  sqlite3_busy_timeout(db, 5000);
  return db;
}

long long c_query_int(const char* path, const char* sql) {
  long long v = -1;
  sqlite3* db = c_open(path);
  sqlite3_stmt* st = NULL;
  if (!db) return -1;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int64(st, 0);
  else
    fprintf(stderr, "query \"%s\": %s\n", sql, sqlite3_errmsg(db));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

void c_query_text(const char* path, const char* sql, char* buf, size_t size) {
  sqlite3* db = c_open(path);
  sqlite3_stmt* st = NULL;
  buf[0] = 0;
  if (!db) return;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW &&
      sqlite3_column_text(st, 0))
    snprintf(buf, size, "%s", (const char*)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static void c_remove_dir(void) {
  char cmd[4200];
  if (!c_dir[0]) return;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", c_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", c_dir);
}

int c_check_main(int argc, char** argv, const struct c_test* tests, size_t count) {
  size_t i;
  if (argc != 2) {
    fprintf(stderr, "usage: %s <case>\n", argv[0]);
    return 2;
  }
  for (i = 0; i < count; ++i) {
    if (strcmp(tests[i].name, argv[1]) == 0) {
      tests[i].fn();
      c_remove_dir();
      if (c_check_failures) fprintf(stderr, "%s: %d check(s) failed\n", argv[1], c_check_failures);
      return c_check_failures ? 1 : 0;
    }
  }
  fprintf(stderr, "no case named %s\n", argv[1]);
  return 2;
}

/* The C tests' frame (c_check.h). */
#define _GNU_SOURCE
#include "c_check.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
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

long long c_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int c_in_child(const char* what, void (*fn)(void* arg), void* arg, int timeout_ms) {
  const long long deadline = c_now_ms() + timeout_ms;
  int status = 0;
  pid_t pid;
  (void)c_temp_dir(); /* made (and removed) by this process, not the child */
  fflush(NULL);
  pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    c_check_failures = 0;
    fn(arg);
    fflush(NULL);
    /* exit, not _exit: a sanitizer's leak check runs at exit and fails the child. */
    exit(c_check_failures ? 1 : 0);
  }
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    REQUIRE(r >= 0);
    if (r == pid) break;
    if (c_now_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fprintf(stderr, "%s: still running after %d ms: killed (a hang)\n", what, timeout_ms);
      ++c_check_failures;
      return 0;
    }
    usleep(5000);
  }
  if (WIFSIGNALED(status)) {
    fprintf(stderr, "%s: the child died of signal %d (a crash)\n", what, WTERMSIG(status));
    ++c_check_failures;
    return 0;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == C_CHECK_SKIP) c_skip(what);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "%s: the child failed (exit %d)\n", what,
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ++c_check_failures;
    return 0;
  }
  return 1;
}

static void c_remove_dir(void) {
  char cmd[4200];
  if (!c_dir[0]) return;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", c_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", c_dir);
}

void c_skip(const char* why) {
  fprintf(stderr, "skipped: %s\n", why);
  c_remove_dir();
  exit(C_CHECK_SKIP);
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

/* A small test frame for the C API's tests, in C99: each TEST(name) is a function that a
 * ctest case runs by name (`capi_inbox_test name`); CHECK and friends report the line
 * and fail the case. Helpers make a temporary folder and read rows with a second SQLite
 * connection, so cases assert on what the file holds. */
#ifndef MQTT_INBOX_TESTS_C_CHECK_H
#define MQTT_INBOX_TESTS_C_CHECK_H

#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int c_check_failures;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++c_check_failures;                                                      \
    }                                                                          \
  } while (0)
#define CHECK_EQ_INT(a, b)                                                                        \
  do {                                                                                            \
    long long c_a_ = (long long)(a), c_b_ = (long long)(b);                                       \
    if (c_a_ != c_b_) {                                                                           \
      fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s == %lld, %s == %lld\n", __FILE__, __LINE__, \
              #a, c_a_, #b, c_b_);                                                                \
      ++c_check_failures;                                                                         \
    }                                                                                             \
  } while (0)
#define CHECK_CONTAINS(text, part)                                                   \
  do {                                                                               \
    const char* c_t_ = (text);                                                       \
    if (!c_t_ || !strstr(c_t_, (part))) {                                            \
      fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, \
              c_t_ ? c_t_ : "(null)", (part));                                       \
      ++c_check_failures;                                                            \
    }                                                                                \
  } while (0)
/* Stops the case: what follows would only crash. */
#define REQUIRE(cond)                                                            \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

typedef void (*c_test_fn)(void);
struct c_test {
  const char* name;
  c_test_fn fn;
};

/* A fresh folder under $TMPDIR (or /tmp) for this case, and a path in it. */
const char* c_temp_dir(void);
/* "<c_temp_dir()>/<name>" in a static buffer per call slot (4 slots, round robin). */
const char* c_temp_path(const char* name);

/* The first column of the first row of `sql` on a separate connection to `path`, as an
 * integer (-1 if no row or an error). */
long long c_query_int(const char* path, const char* sql);
/* The same as text into buf (empty if no row). */
void c_query_text(const char* path, const char* sql, char* buf, size_t size);

/* Runs fn(arg) in a child process (fork) and fails the case, saying why, if the child
 * crashed (a signal), failed a check, exited otherwise than 0, or was still running after
 * timeout_ms (then it is killed): a caller's mistake must end with a code within a bound,
 * and a crash or a hang fails this case instead of killing or stalling the runner. The
 * child's checks count in it only; 1 if the child passed, else 0. Call it from the case's
 * own process before any thread starts. */
int c_in_child(const char* what, void (*fn)(void* arg), void* arg, int timeout_ms);

/* The exit code of a case that cannot run here (ctest SKIP_RETURN_CODE). */
#define C_CHECK_SKIP 77
/* Ends the case as skipped, saying why. */
void c_skip(const char* why);

/* Milliseconds on the monotonic clock. */
long long c_now_ms(void);

/* Runs the case named argv[1] of `tests`; 0 if it passed. */
int c_check_main(int argc, char** argv, const struct c_test* tests, size_t count);

#endif

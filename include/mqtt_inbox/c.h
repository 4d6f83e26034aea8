/* mqtt-inbox for C callers: the idempotent QoS 1 consumer from C99, no C++ needed.
 *
 * What the C++ headers say holds here too (inbox.h, consumer.h, handler.h, message.h);
 * this header says what is C's own. A guide with a whole program is docs/c-api.md.
 *
 * Conventions (those of sqlite3.h, mosquitto.h and leveldb's c.h):
 *  - Objects are opaque handles made by a *_create or *_open function and freed by its
 *    *_destroy or *_close function, which accepts NULL.
 *  - Every fallible call returns an int result code, MQTT_INBOX_OK (0) or one of the
 *    codes below; mqtt_inbox_errstr(rc) names it, and the handle's *_errmsg function
 *    gives the last failure's message on that handle. Values come back through
 *    out-parameters, left untouched on failure unless a call says otherwise.
 *  - No C++ exception ever crosses this boundary: out of memory is MQTT_INBOX_NOMEM,
 *    anything unexpected MQTT_INBOX_INTERNAL.
 *  - Option structs start with their own size: initialise them with their _INIT macro,
 *    which sets it, then change fields. A library newer than the program reads only the
 *    bytes the program's struct has and takes defaults for the rest; a struct larger
 *    than the library knows is accepted if the bytes it does not know are zero, and
 *    refused with MQTT_INBOX_INVALID_ARGUMENT otherwise.
 *  - Strings are NUL-terminated UTF-8 unless a length is given. Strings the library
 *    returns for the caller to keep are freed with mqtt_inbox_free().
 *  - Callbacks take the void *ctx given with them; each says on which thread it runs
 *    and what it may call.
 *
 * Thread safety: as the C++ objects behind the handles (an inbox is thread-safe; a
 * consumer's feed call may run on several threads at once).
 */
#ifndef MQTT_INBOX_C_H
#define MQTT_INBOX_C_H

#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#if defined(_WIN32)
#define MQTT_INBOX_C_EXPORT
#else
#define MQTT_INBOX_C_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Version ------------------------------------------------------------------------
 * The version of this header; mqtt_inbox_version() says the library's, which may be
 * newer (a shared library upgraded under the program). */
#define MQTT_INBOX_C_VERSION_MAJOR 0
#define MQTT_INBOX_C_VERSION_MINOR 4
#define MQTT_INBOX_C_VERSION_PATCH 0
#define MQTT_INBOX_C_VERSION_NUMBER \
  (MQTT_INBOX_C_VERSION_MAJOR * 1000000 + MQTT_INBOX_C_VERSION_MINOR * 1000 + \
   MQTT_INBOX_C_VERSION_PATCH)

/* The library's version as MAJOR * 1000000 + MINOR * 1000 + PATCH; if `text` is not
 * NULL, *text gets "MAJOR.MINOR.PATCH" (static storage, never freed). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_version(const char **text);

/* ---- Result codes ----------------------------------------------------------------- */
#define MQTT_INBOX_OK 0
#define MQTT_INBOX_INVALID_ARGUMENT 1 /* an option or argument is refused (see errmsg) */
#define MQTT_INBOX_NOT_FOUND 2        /* the named row does not exist */
#define MQTT_INBOX_BUSY 3             /* another connection or process holds the lock */
#define MQTT_INBOX_FULL 4             /* disk full, or SQLite out of memory */
#define MQTT_INBOX_IO_ERROR 5         /* the file system failed */
#define MQTT_INBOX_READ_ONLY 6        /* the database cannot be written */
#define MQTT_INBOX_CORRUPTION 7       /* the file is corrupt or newer than this library */
#define MQTT_INBOX_ABORTED 8          /* stopped on request */
#define MQTT_INBOX_INTERNAL 9         /* anything else: a bug, an unexpected error */
#define MQTT_INBOX_REJECTED 10        /* SQLite refused the change (a constraint) */
#define MQTT_INBOX_PERMISSION_DENIED 11 /* a file belongs to another user (see errmsg) */
#define MQTT_INBOX_NOMEM 12           /* the library could not allocate memory */
#define MQTT_INBOX_MISUSE 13          /* a NULL handle or argument, a bad struct_size */

/* The name of a result code, e.g. "busy"; "unknown" for a code not listed. Static
 * storage; any thread. */
MQTT_INBOX_C_EXPORT const char *mqtt_inbox_errstr(int rc);

/* Frees a string or buffer the library returned for the caller (stats, health, dead
 * letters as JSON, open's error message). NULL is a no-op. */
MQTT_INBOX_C_EXPORT void mqtt_inbox_free(void *p);

/* ---- The inbox: the SQLite file (inbox.h) -------------------------------------------- */
typedef struct mqtt_inbox_t mqtt_inbox_t;

#define MQTT_INBOX_SYNC_FULL 0   /* one fsync per commit: survives power loss (default) */
#define MQTT_INBOX_SYNC_NORMAL 1 /* survives a process crash only (docs/guarantees.md) */

typedef struct mqtt_inbox_options_t {
  size_t struct_size;           /* sizeof(mqtt_inbox_options_t); set by the _INIT macro */
  int synchronous;              /* MQTT_INBOX_SYNC_FULL (default) or _NORMAL */
  int busy_timeout_ms;          /* one wait for another connection's lock, ms; 5000 */
  int cache_size_kib;           /* SQLite page cache of the connection, KiB; 2048 */
  int page_size_bytes;          /* page size of a NEW file, 512..65536; 4096 */
  int exclusive;                /* 1: flock "<path>.lock", a second process gets
                                   MQTT_INBOX_BUSY (default); 0: for tools beside it */
  int record_metadata;          /* 1: keep topic and payload hash per claim; 0 (default) */
  int64_t startup_deadline_ms;  /* how long open and setup wait for a store that is
                                   transiently unavailable, ms; 0 = as long as it takes
                                   (default) */
} mqtt_inbox_options_t;

#define MQTT_INBOX_OPTIONS_INIT \
  { sizeof(mqtt_inbox_options_t), MQTT_INBOX_SYNC_FULL, 5000, 2048, 4096, 1, 0, 0 }

/* Opens (creating if needed) the inbox database at `path` with `options` (NULL: all
 * defaults); see Inbox::open in inbox.h for what it checks and how it waits at start-up.
 * On success *out owns the inbox and MQTT_INBOX_OK is returned. On failure *out is set
 * to NULL and, if `errmsg` is not NULL, *errmsg gets a message for mqtt_inbox_free()
 * (NULL if none could be made). Errors: MQTT_INBOX_INVALID_ARGUMENT (bad options),
 * _BUSY (another process holds the file), _PERMISSION_DENIED, _CORRUPTION, the last
 * transient error after startup_deadline_ms, _MISUSE (NULL path or out). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_open(const char *path, const mqtt_inbox_options_t *options,
                                        mqtt_inbox_t **out, char **errmsg);

/* Closes the database and releases the lock file. Everything made on the inbox
 * (consumers, subscribers using them, outboxes, relays, pruners) must be destroyed
 * first. NULL is a no-op. */
MQTT_INBOX_C_EXPORT void mqtt_inbox_close(mqtt_inbox_t *inbox);

/* The message of the last call on `inbox` that failed (from any thread), or "" if none
 * failed. The pointer stays valid until the next *_errmsg call on this thread. */
MQTT_INBOX_C_EXPORT const char *mqtt_inbox_errmsg(const mqtt_inbox_t *inbox);

/* The application's start-up SQL (CREATE TABLE IF NOT EXISTS ..., seed rows), one or
 * more statements separated by ';', run on the inbox's connection in one transaction
 * that is retried while the store is transiently unavailable, like open. `sql` may not
 * open or end transactions. Errors: the store's codes for the SQL's own failure
 * (MQTT_INBOX_INTERNAL for a syntax error, _REJECTED for a constraint, ...), as open's
 * start-up; _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_setup(mqtt_inbox_t *inbox, const char *sql);

/* setup with a function: `fn` runs on the calling thread with the inbox's connection
 * inside the transaction, and returns an SQLite result code (SQLITE_OK commits; any
 * other rolls back, and a transient one such as SQLITE_BUSY is retried like open's
 * start-up). `fn` must not open or end transactions nor keep `db`. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_setup_fn(mqtt_inbox_t *inbox,
                                            int (*fn)(void *ctx, sqlite3 *db), void *ctx);

/* A snapshot of the inbox's statistics (stats.h: counters, commit latency, file sizes,
 * rows per consumer as last measured) as a JSON object, in *json for mqtt_inbox_free().
 * Never waits for the store; any thread. Errors: _NOMEM, _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_stats_json(mqtt_inbox_t *inbox, char **json);

/* The inbox's health (health.h) as a JSON object with "level" ("green", "amber", "red")
 * and the fields of Health, in *json for mqtt_inbox_free(). Never waits; any thread. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_health_json(mqtt_inbox_t *inbox, char **json);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MQTT_INBOX_C_H */

/* mqtt-inbox for C callers: the idempotent QoS 1 consumer from C99, no C++ needed.
 *
 * What the C++ headers say holds here too (inbox.h, consumer.h, handler.h, message.h);
 * this header says what is C's own. A guide with a whole program is docs/c-api.md.
 *
 * Conventions (those of sqlite3.h, mosquitto.h, MQTTAsync.h and leveldb's c.h):
 *  - Objects are opaque handles made by a *_create or *_open function and freed by its
 *    *_destroy or *_close function. Those return a code, as sqlite3_close does: NULL is
 *    MQTT_INBOX_OK (nothing to do); a handle something else still uses (a consumer made
 *    on an inbox, a subscriber routing to a consumer, a relay of an outbox, another
 *    thread inside a call on it) is refused with MQTT_INBOX_BUSY and nothing is freed.
 *  - The library knows which handles are live: a handle used after its close or
 *    destroy, closed twice, or of the wrong kind (an outbox passed as an inbox) gets
 *    MQTT_INBOX_MISUSE, never a crash. Not detectable: a pointer that was never a handle
 *    (garbage is looked up, never read), a closed handle whose address a newer handle of
 *    the same kind reuses (it then names the newer one), a delivery used after its
 *    handler returned, and mqtt_inbox_subscriber_request_stop after destroy (it must be
 *    async-signal-safe, so it cannot look).
 *  - Every fallible call returns an int result code, MQTT_INBOX_OK (0) or one of the
 *    codes below; mqtt_inbox_errstr(rc) names it, and the handle's *_errmsg function
 *    gives the message of the last call on that handle: "" after a call that succeeded,
 *    as sqlite3_errmsg. Values come back through out-parameters, left untouched on
 *    failure unless a call says otherwise.
 *  - No C++ exception ever crosses this boundary: out of memory is MQTT_INBOX_NOMEM,
 *    anything unexpected MQTT_INBOX_INTERNAL.
 *  - Option structs start with a header their _INIT macro fills, as MQTTAsync.h's
 *    struct_id and struct_version: an eyecatcher naming the struct (struct_id), the
 *    version of its layout (struct_version) and its size (struct_size). Initialise every
 *    struct with its _INIT macro, then change fields. One that was not (struct_id wrong:
 *    garbage, zeros, another struct) is refused with MQTT_INBOX_MISUSE, and so is a
 *    struct_version this library does not know or a struct_size that is not that
 *    version's: the library reads no byte past the size it knows for the declared
 *    version. A library newer than the program reads an older version's fields and
 *    takes the defaults for the rest.
 *  - A field that takes one of a list of values (an MQTT_INBOX_* constant, or 0 and 1
 *    for a switch) is refused with MQTT_INBOX_INVALID_ARGUMENT when it holds any other:
 *    nothing is ever read as the nearest value, so a garbage `synchronous` never becomes
 *    MQTT_INBOX_SYNC_NORMAL.
 *  - Strings are NUL-terminated UTF-8 unless a length is given. Strings the library
 *    returns for the caller to keep are freed with mqtt_inbox_free().
 *  - Callbacks take the void *ctx given with them; each says on which thread it runs
 *    and what it may call. Calls that wait for another thread (a subscriber's stop, run
 *    and destroy; a relay's stop and destroy; the destroy of a consumer or pruner) are
 *    refused with MQTT_INBOX_MISUSE from inside a handler, an id extractor or a set-up
 *    function: that thread may be waiting for the one the callback holds.
 *
 * Thread safety: as the C++ objects behind the handles (an inbox is thread-safe; a
 * consumer's feed call may run on several threads at once).
 */
#ifndef MQTT_INBOX_C_H
#define MQTT_INBOX_C_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "mqtt_inbox/version.h"

#if defined(_WIN32)
#define MQTT_INBOX_C_EXPORT
#else
#define MQTT_INBOX_C_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Version ------------------------------------------------------------------------
 * The version of this header (version.h, plain macros that C reads too);
 * mqtt_inbox_version() says the library's, which may be newer (a shared library upgraded
 * under the program). */
#define MQTT_INBOX_C_VERSION_MAJOR MQTT_INBOX_VERSION_MAJOR
#define MQTT_INBOX_C_VERSION_MINOR MQTT_INBOX_VERSION_MINOR
#define MQTT_INBOX_C_VERSION_PATCH MQTT_INBOX_VERSION_PATCH
#define MQTT_INBOX_C_VERSION_NUMBER                                           \
  (MQTT_INBOX_C_VERSION_MAJOR * 1000000 + MQTT_INBOX_C_VERSION_MINOR * 1000 + \
   MQTT_INBOX_C_VERSION_PATCH)

/* The library's version as MAJOR * 1000000 + MINOR * 1000 + PATCH; if `text` is not
 * NULL, *text gets "MAJOR.MINOR.PATCH" (static storage, never freed). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_version(const char** text);

/* ---- Result codes ----------------------------------------------------------------- */
#define MQTT_INBOX_OK 0
#define MQTT_INBOX_INVALID_ARGUMENT 1   /* an option or argument is refused (see errmsg) */
#define MQTT_INBOX_NOT_FOUND 2          /* the named row does not exist */
#define MQTT_INBOX_BUSY 3               /* another connection or process holds the lock */
#define MQTT_INBOX_FULL 4               /* disk full, or SQLite out of memory */
#define MQTT_INBOX_IO_ERROR 5           /* the file system failed */
#define MQTT_INBOX_READ_ONLY 6          /* the database cannot be written */
#define MQTT_INBOX_CORRUPTION 7         /* the file is corrupt or newer than this library */
#define MQTT_INBOX_ABORTED 8            /* stopped on request */
#define MQTT_INBOX_INTERNAL 9           /* anything else: a bug, an unexpected error */
#define MQTT_INBOX_REJECTED 10          /* SQLite refused the change (a constraint) */
#define MQTT_INBOX_PERMISSION_DENIED 11 /* a file or privilege is refused (see errmsg) */
#define MQTT_INBOX_NOMEM 12             /* the library could not allocate memory */
#define MQTT_INBOX_MISUSE                                \
  13 /* a NULL, closed or wrong handle, a NULL argument, \
        a struct not made by its _INIT macro, a call     \
        from a callback that may not make it */
#define MQTT_INBOX_OUTBOX_FULL                                                         \
  14                                 /* a bounded outbox class refused the row as full \
                                        (backpressure, not a fault: see                \
                                        mqtt_inbox_outbox_enqueue) */
#define MQTT_INBOX_AUTHENTICATION 15 /* the server refused who we are (a password) */
#define MQTT_INBOX_SCHEMA                               \
  16 /* the schema is missing, too old for this role to \
        migrate, or newer than this library */

/* The name of a result code, e.g. "busy"; "unknown" for a code not listed. Static
 * storage; any thread. */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_errstr(int rc);

/* Frees a string or buffer the library returned for the caller (stats, health, dead
 * letters as JSON, open's error message). NULL is a no-op. */
MQTT_INBOX_C_EXPORT void mqtt_inbox_free(void* p);

/* ---- Logging ------------------------------------------------------------------------
 * What the library logs (a store that waits, a handler that failed, a connection lost,
 * dead letters; untrusted bytes escaped, secrets never) goes by default to stderr, from
 * the shared spdlog logger "mqtt_inbox" that every object made through this header logs
 * to. mqtt_inbox_set_log_callback sends it to the program instead. */
#define MQTT_INBOX_LOG_TRACE 0
#define MQTT_INBOX_LOG_DEBUG 1
#define MQTT_INBOX_LOG_INFO 2
#define MQTT_INBOX_LOG_WARN 3
#define MQTT_INBOX_LOG_ERROR 4
#define MQTT_INBOX_LOG_CRITICAL 5
#define MQTT_INBOX_LOG_OFF 6 /* as min_level: nothing */

/* One log line: `level` (MQTT_INBOX_LOG_TRACE..CRITICAL) and the text, NUL-terminated,
 * without time, level or a trailing newline; valid only during the call. */
typedef void (*mqtt_inbox_log_fn)(void* ctx, int level, const char* msg);

/* Process-wide, like SQLITE_CONFIG_LOG: every line of level >= min_level that any inbox,
 * consumer, subscriber, relay or pruner of this process logs goes to fn(ctx, ...) instead
 * of stderr; fn NULL sends them to stderr again (still filtered by min_level; the
 * default is MQTT_INBOX_LOG_INFO). Call it before or after making objects: it applies to
 * lines logged after it returns, and once it returns the previous callback is not
 * running and is never called again (its ctx may be freed).
 * The callback runs on the thread that logs (Paho's receive thread, a handler's caller,
 * the relay's, the pruner's or the requeue thread, the caller of an mqtt_inbox_* call),
 * one call at a time across the process, possibly while the library holds an inbox's
 * lock: it must return quickly and must not call any mqtt_inbox_* function (errstr
 * excepted), this one included (it would wait for itself).
 * Errors: MQTT_INBOX_INVALID_ARGUMENT for a min_level outside 0..6, or when a C++ part of
 * the program registered its own spdlog logger named "mqtt_inbox" before the library
 * made one (its sinks are the program's: nothing changes); _NOMEM. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_set_log_callback(mqtt_inbox_log_fn fn, void* ctx, int min_level);

/* ---- Option structs ------------------------------------------------------------------
 * Each starts with these three fields, which its _INIT macro sets (see the conventions
 * above): struct_id, four characters naming the struct (not a string: no NUL);
 * struct_version, the version of the layout the program was built with; struct_size,
 * sizeof the struct of that version. */
#define MQTT_INBOX_STRUCT_ID(a, b, c, d) \
  { a, b, c, d }

/* ---- The inbox: the SQLite file (inbox.h) -------------------------------------------- */
typedef struct mqtt_inbox_t mqtt_inbox_t;

#define MQTT_INBOX_SYNC_FULL 0   /* one fsync per commit: survives power loss (default) */
#define MQTT_INBOX_SYNC_NORMAL 1 /* survives a process crash only (docs/guarantees.md) */

typedef struct mqtt_inbox_options_t {
  char struct_id[4];           /* "MQIO" */
  int struct_version;          /* 1 */
  size_t struct_size;          /* sizeof(mqtt_inbox_options_t) */
  int synchronous;             /* MQTT_INBOX_SYNC_FULL (default) or _NORMAL */
  int busy_timeout_ms;         /* one wait for another connection's lock, ms; 5000 */
  int cache_size_kib;          /* SQLite page cache of the connection, KiB; 2048 */
  int page_size_bytes;         /* page size of a NEW file, 512..65536; 4096 */
  int exclusive;               /* 1: flock "<path>.lock", a second process gets
                                  MQTT_INBOX_BUSY (default); 0: for tools beside it */
  int record_metadata;         /* 1: keep topic and payload hash per claim; 0 (default) */
  int64_t startup_deadline_ms; /* how long open and setup wait for a store that is
                                  transiently unavailable (locked, full, failing), ms;
                                  0 = as long as it takes (default). Errors that do not
                                  go away by waiting never wait */
  int low_memory;              /* 1 (default): keep idle memory small for a device
                                  (docs/c-api.md#memory): SQLite's page cache takes
                                  memory a page at a time, not 20 pages per connection
                                  up front (process-wide, set at the first open if
                                  SQLite is not initialised yet), and the memory start-up
                                  freed goes back to the system after each open and
                                  pruner create (malloc_trim, glibc). 0: SQLite's and the
                                  allocator's own behaviour */
} mqtt_inbox_options_t;

#define MQTT_INBOX_OPTIONS_INIT                                                \
  {                                                                            \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'I', 'O'), 1, sizeof(mqtt_inbox_options_t), \
        MQTT_INBOX_SYNC_FULL, 5000, 2048, 4096, 1, 0, 0, 1                     \
  }

/* Opens (creating if needed) the inbox database at `path` with `options` (NULL: all
 * defaults); see Inbox::open in inbox.h for what it checks and how it waits at start-up.
 * On success *out owns the inbox and MQTT_INBOX_OK is returned. On failure *out is set
 * to NULL and, if `errmsg` is not NULL, *errmsg gets a message for mqtt_inbox_free()
 * (NULL if none could be made), and no file is left that the call created.
 * Only what may pass is waited for (a lock another process holds, a full disk or an I/O
 * error on an existing database), with a log line, up to startup_deadline_ms. What
 * waiting cannot mend fails at once: MQTT_INBOX_INVALID_ARGUMENT (bad options; `path` is
 * a folder or not a regular file; its folder does not exist), _READ_ONLY (a new
 * database in a folder this process cannot write), _FULL (no room to create a new
 * database), _PERMISSION_DENIED (a file of the database belongs to another user),
 * _CORRUPTION; after startup_deadline_ms the last transient error (_BUSY: another process
 * holds the file; _FULL, _IO_ERROR, _READ_ONLY); _MISUSE (NULL path or out, a bad
 * options struct). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_open(const char* path, const mqtt_inbox_options_t* options,
                                        mqtt_inbox_t** out, char** errmsg);

/* Closes the database and releases the lock file, as sqlite3_close: while anything made
 * on the inbox is alive (a consumer, and through it a subscriber; an outbox, and through
 * it a relay; a pruner) or another thread is inside a call on it, it closes nothing and
 * returns MQTT_INBOX_BUSY, its errmsg naming what is left. NULL: MQTT_INBOX_OK. A handle
 * closed before: MQTT_INBOX_MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_close(mqtt_inbox_t* inbox);

/* The message of the last call on `inbox` (from any thread): "" if it succeeded. The
 * pointer stays valid until the next *_errmsg call on this thread. A NULL or dead
 * handle gets a text that says so. */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_errmsg(const mqtt_inbox_t* inbox);

/* The application's start-up SQL (CREATE TABLE IF NOT EXISTS ..., seed rows), one or
 * more statements separated by ';', run on the inbox's connection in one transaction
 * that is retried while the store is transiently unavailable, like open. `sql` may not
 * open or end transactions. Errors: the store's codes for the SQL's own failure
 * (MQTT_INBOX_INTERNAL for a syntax error, _REJECTED for a constraint, ...), as open's
 * start-up; _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_setup(mqtt_inbox_t* inbox, const char* sql);

/* setup with a function: `fn` runs on the calling thread with the inbox's connection
 * inside the transaction, and returns an SQLite result code (SQLITE_OK commits; any
 * other rolls back, and a transient one such as SQLITE_BUSY is retried like open's
 * start-up). `fn` must not open or end transactions nor keep `db`. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_setup_fn(mqtt_inbox_t* inbox, int (*fn)(void* ctx, sqlite3* db),
                                            void* ctx);

/* A snapshot of the inbox's statistics (stats.h: counters, commit latency, file sizes,
 * rows per consumer as last measured) as a JSON object, in *json for mqtt_inbox_free().
 * Never waits for the store; any thread. Errors: _NOMEM, _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_stats_json(mqtt_inbox_t* inbox, char** json);

/* The inbox's health (health.h) as a JSON object with "level" ("green", "amber", "red")
 * and the fields of Health, in *json for mqtt_inbox_free(). Never waits; any thread. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_health_json(mqtt_inbox_t* inbox, char** json);

/* ---- The consumer and its handler (consumer.h, handler.h) ---------------------------- */
typedef struct mqtt_inbox_consumer_t mqtt_inbox_consumer_t;
/* One delivery as the handler sees it: read it with the mqtt_inbox_delivery_* calls.
 * Valid only during the handler call; copy what you keep. */
typedef struct mqtt_inbox_delivery_t mqtt_inbox_delivery_t;

/* What a handler returns. */
#define MQTT_INBOX_HANDLER_OK 0 /* the effect is written: it commits with the claim */
#define MQTT_INBOX_HANDLER_RETRY                          \
  1 /* this attempt failed: rolled back, counted, retried \
       with backoff up to max_attempts, then the message  \
       is dead-lettered as handler_failed */
#define MQTT_INBOX_HANDLER_UNDECODABLE                \
  2 /* the payload can never be decoded: rolled back, \
       dead-lettered at once as undecodable_payload */
#define MQTT_INBOX_HANDLER_REJECT                      \
  3 /* well-formed but refused by the application (a   \
       value out of range): rolled back, dead-lettered \
       at once as invalid_payload */
#define MQTT_INBOX_HANDLER_OUTBOX_FULL                        \
  4 /* mqtt_inbox_outbox_enqueue returned                     \
       MQTT_INBOX_OUTBOX_FULL: rolled back, NOT counted as an \
       attempt (the message is not at fault); parked as the   \
       dead letter outbox_full with status 'requeued', which  \
       the consumer's requeue thread replays once the relay   \
       has made room */
#define MQTT_INBOX_HANDLER_NOT_YET                             \
  5 /* a dependency the handler needs is down (a service, a    \
       device): rolled back, NOT counted as an attempt; run    \
       again on the dependency schedule (the options'          \
       dependency_*), the message held unacked meanwhile, then \
       dead-lettered as dependency_unavailable (RetryLater,    \
       handler.h) */
/* A return that does not fit is a failed attempt (as MQTT_INBOX_HANDLER_RETRY: counted,
 * retried up to max_attempts, then dead-lettered as handler_failed) whose reason text,
 * logged as an error, names the mistake: any other value, and
 * MQTT_INBOX_HANDLER_OUTBOX_FULL when no enqueue of this attempt was refused as full (no
 * outbox, or none full: nothing would ever make room, and the parked message would be
 * replayed every requeue_poll_ms for ever). */

/* The application's handler: applies one message's effect with `db`, the inbox's own
 * connection, inside the claim transaction, which the library opened and commits after
 * the handler returns MQTT_INBOX_HANDLER_OK (then, and only then, the PUBACK goes).
 * Runs on the thread that delivered the message: the subscriber's receive thread (one
 * per process, shared by every MQTT client of it), or the caller of
 * mqtt_inbox_consumer_feed, or the consumer's requeue thread for a replayed dead letter.
 * Rules (handler.h; sqlite3.h's rule for callbacks):
 *  - Use `db` for SQL of your own (sqlite3_prepare_v2, sqlite3_step, sqlite3_exec), and
 *    finalize or reset every statement before returning. Do not keep `db`, close it,
 *    or change its settings (busy handler, hooks, authorizer, PRAGMAs).
 *  - The library owns the transaction: BEGIN, COMMIT, ROLLBACK and END are refused at
 *    prepare time with SQLITE_AUTH ("not authorized"), and the attempt then fails,
 *    whatever the handler returns (OK included), with the reason text "handler ended the
 *    transaction: it ran COMMIT" (END is named COMMIT; ROLLBACK, BEGIN likewise): nothing
 *    the handler wrote commits, the message is not marked processed, and it is retried,
 *    then dead-lettered as handler_failed with that text. A handler that returns
 *    MQTT_INBOX_HANDLER_OK after an SQLite error rolled the transaction back fails the
 *    same way ("... it was rolled back inside the handler"). SAVEPOINT, RELEASE and
 *    ROLLBACK TO a savepoint of your own are allowed.
 *  - Return a failure code for any SQL error; set its reason text with
 *    mqtt_inbox_delivery_set_reason (it becomes the dead letter's text).
 *  - Do not call the library for this inbox (its consumer, outbox enqueue excepted):
 *    such a call is refused with MQTT_INBOX_INVALID_ARGUMENT and the message is
 *    dead-lettered as handler_reentered. mqtt_inbox_stats_json and _health_json are
 *    allowed.
 *  - Keep it short: it holds the database's write lock and Paho's receive thread. */
typedef int (*mqtt_inbox_handler)(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d);

/* The producer-assigned message id the consumer extracted (NUL-terminated, valid UTF-8
 * without control characters, at most 256 bytes by default). */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_delivery_message_id(const mqtt_inbox_delivery_t* d);
/* The topic (NUL-terminated). */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_delivery_topic(const mqtt_inbox_delivery_t* d);
/* The payload's raw bytes (not NUL-terminated text in general, though a NUL byte follows
 * them), their count in *len. */
MQTT_INBOX_C_EXPORT const void* mqtt_inbox_delivery_payload(const mqtt_inbox_delivery_t* d,
                                                            size_t* len);
/* QoS (0..2); the DUP and RETAIN flags as received (0 or 1; informational: never a
 * deduplication key); the attempt, 1 for the first, counted across restarts. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_delivery_qos(const mqtt_inbox_delivery_t* d);
MQTT_INBOX_C_EXPORT int mqtt_inbox_delivery_dup(const mqtt_inbox_delivery_t* d);
MQTT_INBOX_C_EXPORT int mqtt_inbox_delivery_retained(const mqtt_inbox_delivery_t* d);
MQTT_INBOX_C_EXPORT int mqtt_inbox_delivery_attempt(const mqtt_inbox_delivery_t* d);
/* MQTT 5 user properties, in arrival order (none with MQTT 3.1.1). _user_property
 * returns 1 and sets the name and value (raw bytes, each NUL-terminated too, and their
 * lengths; any out-parameter may be NULL) for index < count, else 0. _user_property_get
 * returns the value of the first property named `name`, or NULL. */
MQTT_INBOX_C_EXPORT size_t mqtt_inbox_delivery_user_property_count(const mqtt_inbox_delivery_t* d);
MQTT_INBOX_C_EXPORT int mqtt_inbox_delivery_user_property(const mqtt_inbox_delivery_t* d,
                                                          size_t index, const char** name,
                                                          size_t* name_len, const char** value,
                                                          size_t* value_len);
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_delivery_user_property_get(
    const mqtt_inbox_delivery_t* d, const char* name);
/* The MQTT 5 PUBLISH properties other than user properties (MQTT 5.0 section 3.3.2.3;
 * message.h MessageProperties), as received or fed in; none with MQTT 3.1.1. Each returns
 * NULL (or -1, or 0) when the message does not carry the property:
 *  - _content_type, _response_topic: the text (NUL-terminated too), its byte count in *len
 *    (len may be NULL);
 *  - _correlation_data: raw bytes (a NUL follows them), their count in *len;
 *  - _payload_format_indicator: 0 (bytes) or 1 (UTF-8 text), -1 if absent;
 *  - _message_expiry_interval: 1 and *seconds (may be NULL) if present, else 0.
 * Pointers are valid for the handler call only; any thread the handler runs on. */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_delivery_content_type(const mqtt_inbox_delivery_t* d,
                                                                 size_t* len);
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_delivery_response_topic(const mqtt_inbox_delivery_t* d,
                                                                   size_t* len);
MQTT_INBOX_C_EXPORT const void* mqtt_inbox_delivery_correlation_data(const mqtt_inbox_delivery_t* d,
                                                                     size_t* len);
MQTT_INBOX_C_EXPORT int mqtt_inbox_delivery_payload_format_indicator(
    const mqtt_inbox_delivery_t* d);
MQTT_INBOX_C_EXPORT int mqtt_inbox_delivery_message_expiry_interval(const mqtt_inbox_delivery_t* d,
                                                                    uint32_t* seconds);
/* The reason text of a failure the handler is about to return (copied; the last call
 * wins). Without one, the text names the return code. */
MQTT_INBOX_C_EXPORT void mqtt_inbox_delivery_set_reason(const mqtt_inbox_delivery_t* d,
                                                        const char* text);

/* The application's message id function (MessageIdOptions::extractor, options.h): the
 * third source of the id, after the user property and the JSON field. It reads the
 * message through `d` (topic, payload, flags, properties; the message id is "" and the
 * attempt 0, as none is known yet), writes the id's bytes to `buf` (`cap` bytes:
 * max_id_bytes + 1; no NUL needed) and returns their count. It returns
 *  - n in 0..cap: the id is buf[0..n), then checked as any id (empty, longer than
 *    max_id_bytes, not UTF-8, control characters: dead-lettered as invalid_id);
 *  - n > cap: an id longer than the buffer: invalid_id;
 *  - MQTT_INBOX_ID_NONE: no id here: missing_id (or the next source);
 *  - MQTT_INBOX_ID_UNDECODABLE (or any other negative value): the payload can never be
 *    decoded: dead-lettered at once as undecodable_payload, with the text set by
 *    mqtt_inbox_delivery_set_reason if any.
 * Runs on the thread that delivered the message (as the handler), before the claim
 * transaction, with no connection: it must not call the library for this inbox. */
#define MQTT_INBOX_ID_NONE (-1)
#define MQTT_INBOX_ID_UNDECODABLE (-2)
typedef int (*mqtt_inbox_id_extractor)(void* ctx, const mqtt_inbox_delivery_t* d, char* buf,
                                       size_t cap);

/* The user property and the JSON field both hold an id, and they differ (IdDisagreement,
 * options.h). */
#define MQTT_INBOX_ID_DISAGREEMENT_DEAD_LETTER 0        /* invalid_id, both values in the text */
#define MQTT_INBOX_ID_DISAGREEMENT_USER_PROPERTY_WINS 1 /* the JSON field is not read */

#define MQTT_INBOX_RETAINED_SKIP 0        /* ack a retained message unprocessed (default) */
#define MQTT_INBOX_RETAINED_DEAD_LETTER 1 /* dead-letter it as retained */
#define MQTT_INBOX_RETAINED_PROCESS 2     /* process it like any other */

/* A message whose MQTT 5 message expiry ran out before it could be applied (ExpiredPolicy,
 * options.h): measured from mqtt_inbox_consumer_feed (or the subscriber's callback) on a
 * monotonic clock, checked before the handler runs and before its commit. */
#define MQTT_INBOX_EXPIRED_DEAD_LETTER 0 /* never applied: the dead letter expired (default) */
#define MQTT_INBOX_EXPIRED_APPLY 1       /* applied anyway, as with MQTT 3.1.1 (no expiry) */

typedef struct mqtt_inbox_consumer_options_t {
  char struct_id[4];                    /* "MQCO" */
  int struct_version;                   /* 1 */
  size_t struct_size;                   /* sizeof(mqtt_inbox_consumer_options_t) */
  int max_attempts;                     /* handler attempts before handler_failed, >= 1; 5 */
  int retry_backoff_initial_ms;         /* between attempts, doubled each time: 100 ms ... */
  int retry_backoff_max_ms;             /* ... capped at 2000 ms */
  int retained;                         /* MQTT_INBOX_RETAINED_*; _SKIP */
  size_t max_payload_bytes;             /* larger payloads: payload_too_large; 1 MiB */
  size_t dead_letter_payload_bytes;     /* payload kept in a dead letter; 1 MiB */
  int64_t requeue_poll_ms;              /* the requeue thread's poll, ms; 0 = no thread; 2000 */
  const char* id_user_property;         /* MQTT 5 user property holding the message id; NULL:
                                           "message-id"; "": not read */
  const char* id_json_field;            /* top-level string field of a JSON payload holding it;
                                           NULL: "message_id"; "": not read */
  mqtt_inbox_id_extractor id_extractor; /* the third id source; NULL: none */
  void* id_extractor_ctx;               /* its ctx */
  size_t max_id_bytes;                  /* longest id accepted, bytes, >= 1; 256 */
  int id_disagreement;                  /* MQTT_INBOX_ID_DISAGREEMENT_*; _DEAD_LETTER */
  /* Version 2: */
  int expired;                           /* MQTT_INBOX_EXPIRED_*; _DEAD_LETTER */
  int dependency_immediate_attempts;     /* after a HANDLER_NOT_YET: runs at the retry
                                            backoff's pace, >= 0; 3 */
  int64_t dependency_backoff_initial_ms; /* then delays from this, doubled each time ... */
  int64_t dependency_backoff_max_ms;     /* ... capped at this: 1000 and 60000 ms */
  int64_t dependency_wait_max_ms;        /* the schedule ends this long after the first
                                            NOT_YET: then dependency_unavailable; >= 0;
                                            600000 (10 min) */
} mqtt_inbox_consumer_options_t;

#define MQTT_INBOX_CONSUMER_OPTIONS_INIT                                                        \
  {                                                                                             \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'C', 'O'), 2, sizeof(mqtt_inbox_consumer_options_t), 5, 100, \
        2000, MQTT_INBOX_RETAINED_SKIP, 1024 * 1024, 1024 * 1024, 2000, NULL, NULL, NULL, NULL, \
        256, MQTT_INBOX_ID_DISAGREEMENT_DEAD_LETTER, MQTT_INBOX_EXPIRED_DEAD_LETTER, 3, 1000,   \
        60000, 600000                                                                           \
  }

/* Makes the consumer named `name` (non-empty, at most 200 bytes: recorded in every row)
 * on `inbox`, with `handler` and its `ctx`, and `options` (NULL: defaults). `inbox` must
 * outlive it. On failure *out is NULL and the message is the inbox's errmsg. Errors:
 * MQTT_INBOX_INVALID_ARGUMENT (name, options: max_attempts < 1, an unknown retained or
 * id_disagreement value, max_id_bytes 0, no id source left), _MISUSE (NULL inbox, handler
 * or out), _NOMEM. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_consumer_create(mqtt_inbox_t* inbox, const char* name,
                                                   mqtt_inbox_handler handler, void* ctx,
                                                   const mqtt_inbox_consumer_options_t* options,
                                                   mqtt_inbox_consumer_t** out);
/* Stops the requeue thread and frees the consumer. MQTT_INBOX_BUSY, freeing nothing,
 * while a subscriber routes messages to it (destroy the subscriber first) or another
 * thread is inside a call on it; _MISUSE from a handler (see the conventions) or for a
 * dead handle. NULL: MQTT_INBOX_OK. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_consumer_destroy(mqtt_inbox_consumer_t* consumer);
/* The last failure on `consumer`, as mqtt_inbox_errmsg. */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_consumer_errmsg(const mqtt_inbox_consumer_t* consumer);

/* One user property of a message fed in: raw bytes with their lengths. */
typedef struct mqtt_inbox_user_property_t {
  const char* name;
  size_t name_len;
  const char* value;
  size_t value_len;
} mqtt_inbox_user_property_t;

/* A message that arrived by another route (serial, a radio, another MQTT client). */
typedef struct mqtt_inbox_message_t {
  char struct_id[4];   /* "MQMS" */
  int struct_version;  /* 1 */
  size_t struct_size;  /* sizeof(mqtt_inbox_message_t) */
  const char* topic;   /* NUL-terminated topic name (UTF-8, no + or #); required */
  const void* payload; /* payload_len bytes; NULL only with payload_len 0 */
  size_t payload_len;
  int qos;                                           /* 0..2; 1 */
  int dup;                                           /* 0 or 1; 0 */
  int retained;                                      /* 0 or 1; 0 */
  const mqtt_inbox_user_property_t* user_properties; /* user_property_count entries */
  size_t user_property_count;
  const char* content_type;     /* NUL-terminated; NULL: none */
  const char* response_topic;   /* NUL-terminated; NULL: none */
  const void* correlation_data; /* correlation_data_len bytes; NULL: none */
  size_t correlation_data_len;
  int payload_format_indicator;      /* 0 or 1; -1: none */
  int64_t message_expiry_interval_s; /* 0..4294967295 s; -1: none */
} mqtt_inbox_message_t;

#define MQTT_INBOX_MESSAGE_INIT                                                                  \
  {                                                                                              \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'M', 'S'), 1, sizeof(mqtt_inbox_message_t), NULL, NULL, 0, 1, \
        0, 0, NULL, 0, NULL, NULL, NULL, 0, -1, -1                                               \
  }

/* Outcomes of one delivery (Outcome, message.h). */
#define MQTT_INBOX_OUTCOME_PROCESSED 0             /* the effect committed with the claim */
#define MQTT_INBOX_OUTCOME_DUPLICATE 1             /* already processed: skipped */
#define MQTT_INBOX_OUTCOME_DEAD_LETTERED 2         /* written to the dead letters now */
#define MQTT_INBOX_OUTCOME_ALREADY_DEAD_LETTERED 3 /* a redelivery of a dead letter */
#define MQTT_INBOX_OUTCOME_SKIPPED 4               /* a retained message skipped by policy */

/* Processes one message as the subscriber does (Consumer::handle, consumer.h): returns
 * when it has a durable outcome, in *outcome (MQTT_INBOX_OUTCOME_*); acknowledge it to
 * its sender only then. Runs the handler on the calling thread. Blocks while the store
 * fails, for as long as it fails. Safe from several threads at once. Errors:
 * MQTT_INBOX_MISUSE (NULL arguments, no topic, a NULL pointer with a length, a bad
 * struct), _INVALID_ARGUMENT (a topic MQTT does not allow in a PUBLISH: empty, a + or #
 * wildcard, not UTF-8, U+0000, longer than 65535 bytes; qos not 0..2; dup or retained
 * not 0 or 1; payload_format_indicator not 0, 1 or -1; message_expiry_interval_s not -1
 * or 0..4294967295: nothing is recorded), _NOMEM (nothing was recorded, or the
 * outcome is durable but could not be reported: feed the message again, it is then a
 * duplicate; never acknowledge it before OK). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_consumer_feed(mqtt_inbox_consumer_t* consumer,
                                                 const mqtt_inbox_message_t* message, int* outcome);

/* The consumer's counters since it was made (ConsumerCounters, consumer.h). */
typedef struct mqtt_inbox_consumer_counters_t {
  char struct_id[4];             /* "MQCC" */
  int struct_version;            /* 1 */
  size_t struct_size;            /* sizeof(mqtt_inbox_consumer_counters_t) */
  int64_t processed;             /* effects committed */
  int64_t duplicates;            /* deliveries skipped as already processed */
  int64_t dead_lettered;         /* messages written to the dead letters */
  int64_t already_dead_lettered; /* redeliveries of dead-lettered messages */
  int64_t handler_failures;      /* handler attempts that failed (RETRY, ...) */
  int64_t store_retries;         /* store operations retried after a failure */
  int64_t retained_skipped;      /* retained messages acked unprocessed */
  int64_t outbox_full_parked;    /* deliveries parked because the outbox was full */
  /* Version 2: */
  int64_t expired; /* messages dead-lettered as expired (in dead_lettered too) */
  int64_t not_yet; /* handler runs that returned MQTT_INBOX_HANDLER_NOT_YET */
} mqtt_inbox_consumer_counters_t;

#define MQTT_INBOX_CONSUMER_COUNTERS_INIT                                                         \
  {                                                                                               \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'C', 'C'), 2, sizeof(mqtt_inbox_consumer_counters_t), 0, 0, 0, \
        0, 0, 0, 0, 0, 0, 0                                                                       \
  }

/* Fills *counters with a snapshot: the fields of its struct_version (a program built
 * against an older c.h gets those it knows; the header is left as it was). Never waits
 * for the store; any thread, a handler's included. Errors: MQTT_INBOX_MISUSE (NULL
 * arguments, a struct not made by MQTT_INBOX_CONSUMER_COUNTERS_INIT). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_consumer_counters(mqtt_inbox_consumer_t* consumer,
                                                     mqtt_inbox_consumer_counters_t* counters);
/* The consumer's health (Consumer::health, health.h: its message path waiting for the
 * store) as a JSON object, the shape of mqtt_inbox_health_json: "level" ("green",
 * "amber" while a delivery waits for a locked, full or failing store, "red" once the
 * file is unusable), "stuck", "stuck_since_ms", "stuck_for_ms", "retries",
 * "total_store_errors", "last_error", "starting", "operation", "fatal", "database", and
 * "dependency": {"waiting", "waited_ms", "message_id", "attempt", "reason",
 * "next_run_in_ms", "text"} while a handler's MQTT_INBOX_HANDLER_NOT_YET holds a message
 * (not stuck; the level stays green; "text" is "waiting for a dependency: 42 s, message
 * 'c-7', attempt 6: ..."). In *json for mqtt_inbox_free. Never waits for the store; any
 * thread, a handler's included. Errors: MQTT_INBOX_NOMEM, _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_consumer_health_json(mqtt_inbox_consumer_t* consumer,
                                                        char** json);

/* ---- The MQTT subscriber (subscriber.h, connection.h, tls.h) -------------------------- */
typedef struct mqtt_inbox_subscriber_t mqtt_inbox_subscriber_t;

#define MQTT_INBOX_MQTT_3_1_1 0
#define MQTT_INBOX_MQTT_5 1

#define MQTT_INBOX_TLS_DEFAULT 0 /* OpenSSL's highest common version */
#define MQTT_INBOX_TLS_1_2 12    /* TLS 1.2 or 1.3 */
#define MQTT_INBOX_TLS_1_3 13    /* TLS 1.3 only */

/* The subscriber's settings. Strings are copied by create; NULL means "not set". Secrets
 * come from files only: the password and the TLS key's password are never a field. */
typedef struct mqtt_inbox_subscriber_options_t {
  char struct_id[4];                       /* "MQSO" */
  int struct_version;                      /* 1 */
  size_t struct_size;                      /* sizeof(mqtt_inbox_subscriber_options_t) */
  const char* broker_uri;                  /* tcp://, mqtt://, ws:// or ssl://, mqtts://, wss://
                                              host[:port]; required */
  const char* client_id;                   /* required; stable across restarts: the broker keeps
                                              the session, and its unacked messages, under it */
  int mqtt_version;                        /* MQTT_INBOX_MQTT_3_1_1 (default) or _5 */
  uint32_t session_expiry_s;               /* MQTT 5: sent, > 0; MQTT 3.1.1: declared (what the
                                              broker keeps); 7 days. Retention must cover it */
  int keep_alive_s;                        /* 1..65535; 30 */
  int connect_timeout_ms;                  /* one attempt, > 0; 10000 */
  int reconnect_backoff_initial_ms;        /* first wait after a failure, doubled; 500 */
  int reconnect_backoff_max_ms;            /* its cap; 30000 */
  int receive_maximum;                     /* MQTT 5 Receive Maximum sent in CONNECT,
                                              1..65535; 20. mosquitto 2.0.11 keeps it only
                                              at 1: docs/brokers-and-tls.md#the-in-flight-window */
  int stop_timeout_ms;                     /* how long stop waits for a message in the handler;
                                              10000 */
  int tls_version;                         /* lowest TLS version, MQTT_INBOX_TLS_*; _DEFAULT */
  int tls_insecure_skip_hostname_check;    /* INSECURE: 1 accepts a certificate for another
                                         host name (the chain is still verified, so any
                                         certificate from a trusted CA is accepted). Logged as
                                         a warning at every connect; 0 or 1; 0 */
  const char* username;                    /* CONNECT user name (not a secret: logged); none */
  const char* password_file;               /* file whose content (one trailing newline removed) is
                                              the CONNECT password, read at every connect; none */
  const char* tls_ca_file;                 /* PEM CA certificate(s); none: the system trust store */
  const char* tls_ca_dir;                  /* hashed CA folder (openssl rehash); none */
  const char* tls_cert_file;               /* client certificate (mutual TLS); none */
  const char* tls_key_file;                /* its key; none: read from tls_cert_file */
  const char* tls_key_password_file;       /* file holding the key's password; none */
  const char* client_id_lock_dir;          /* folder of the per-host client-id lock; NULL: "auto"
                                              (connection.h); "": no lock */
  const char* tls_ciphers;                 /* OpenSSL cipher list for TLS 1.2
                                              (SSL_CTX_set_cipher_list syntax, e.g.
                                              "ECDHE-ECDSA-AES128-GCM-SHA256"); TLS 1.3 suites
                                              stay OpenSSL's. A list that selects no cipher is
                                              refused. NULL: OpenSSL's default list */
  const char* const* tls_alpn;             /* ALPN protocol names offered, in order of
                                              preference (RFC 7301), tls_alpn_count of them,
                                              each 1..255 bytes; copied by create. AWS IoT Core
                                              on port 443 needs "x-amzn-mqtt-ca". NULL: none */
  size_t tls_alpn_count;                   /* entries of tls_alpn; 0 */
  int tls_insecure_skip_certificate_check; /* INSECURE: 1 does not verify the broker's
                                           certificate at all (nor its host name): the
                                           connection is encrypted, but anyone on the path
                                           can read and change it. Logged as a warning at
                                           every connect; 0 or 1; 0 */
} mqtt_inbox_subscriber_options_t;

#define MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT                                                        \
  {                                                                                               \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'S', 'O'), 1, sizeof(mqtt_inbox_subscriber_options_t), NULL,   \
        NULL, MQTT_INBOX_MQTT_3_1_1, 7u * 24u * 3600u, 30, 10000, 500, 30000, 20, 10000,          \
        MQTT_INBOX_TLS_DEFAULT, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, \
        0                                                                                         \
  }

/* Checks the options (subscriber.h: a persistent session, TLS files readable and
 * matching, the password file readable and not empty) and makes the subscriber; it does
 * not connect yet. On failure *out is NULL and *errmsg (if not NULL) gets a message for
 * mqtt_inbox_free, which names a file but never holds a secret. Errors:
 * MQTT_INBOX_INVALID_ARGUMENT, _IO_ERROR (the password file), _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_create(const mqtt_inbox_subscriber_options_t* options,
                                                     mqtt_inbox_subscriber_t** out, char** errmsg);
/* Stops (as mqtt_inbox_subscriber_stop) if still running and frees it; then the
 * consumers it delivered to may be destroyed. MQTT_INBOX_BUSY, freeing nothing, while a
 * relay publishes on its connection (destroy the relay first) or another thread is
 * inside a call on it (mqtt_inbox_subscriber_run: request the stop and let run return
 * first); _MISUSE from a handler or for a dead handle. Also returns what the stop
 * returned (MQTT_INBOX_BUSY after stop_timeout_ms: a message was stuck in the store and
 * is not acknowledged; the subscriber is freed all the same). NULL: MQTT_INBOX_OK. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_destroy(mqtt_inbox_subscriber_t* subscriber);
/* The last call on `subscriber`, as mqtt_inbox_errmsg. */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_subscriber_errmsg(
    const mqtt_inbox_subscriber_t* subscriber);

/* Routes messages matching `topic_filter` (+ and # wildcards, "$share/group/" allowed),
 * subscribed at QoS 1, to `consumer`, which must outlive the subscriber. Call before
 * start. Errors: MQTT_INBOX_INVALID_ARGUMENT (an empty or repeated filter, after start),
 * _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_subscribe(mqtt_inbox_subscriber_t* subscriber,
                                                        const char* topic_filter,
                                                        mqtt_inbox_consumer_t* consumer);
/* Takes the client-id lock and starts connecting in the background; returns at once.
 * From then on the consumers' handlers run on Paho's receive thread. Errors:
 * MQTT_INBOX_BUSY (another process holds the client-id lock), _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_start(mqtt_inbox_subscriber_t* subscriber);
/* 1 once connected and subscribed (waiting up to timeout_ms, ms), else 0; 0 is not an
 * error: it keeps reconnecting (mqtt_inbox_subscriber_health_json says why). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_wait_connected(mqtt_inbox_subscriber_t* subscriber,
                                                             int timeout_ms);
/* Disconnects and stops reconnecting; a message in the handler commits (and is acked)
 * first. Also wakes mqtt_inbox_subscriber_run. Errors: MQTT_INBOX_BUSY if a message was
 * still not committed after stop_timeout_ms (the store is stuck): the message is not
 * acked, and the process should exit, so that the broker redelivers it to the next run;
 * MQTT_INBOX_MISUSE at once from inside a handler, an id extractor or a set-up function
 * (any subscriber's: every handler of the process may run on Paho's one receive thread,
 * which the stop would wait for): call mqtt_inbox_subscriber_request_stop there. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_stop(mqtt_inbox_subscriber_t* subscriber);
/* Asks for a stop, and only asks: async-signal-safe (an atomic store and a write(2) to a
 * pipe), for a SIGTERM handler or a message handler. mqtt_inbox_subscriber_run then stops
 * the subscriber. It cannot check its handle (see the conventions): never call it with a
 * destroyed one (clear the pointer a signal handler reads before destroying). */
MQTT_INBOX_C_EXPORT void mqtt_inbox_subscriber_request_stop(mqtt_inbox_subscriber_t* subscriber);
/* Blocks the calling thread until mqtt_inbox_subscriber_request_stop or _stop is called,
 * then stops the subscriber and returns what stop returned. The main loop of a program
 * whose SIGTERM handler calls request_stop. MQTT_INBOX_MISUSE from a handler. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_run(mqtt_inbox_subscriber_t* subscriber);
/* The connection's state (connection.h, ConnectionHealth: connected, attempts, the last
 * failure and its reason, sessions lost) as a JSON object, in *json for mqtt_inbox_free.
 * Never waits for Paho or the store; any thread. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_health_json(mqtt_inbox_subscriber_t* subscriber,
                                                          char** json);

/* Why the last connection attempt failed (ConnectionHealth::Failure, connection.h). */
#define MQTT_INBOX_FAILURE_NONE 0 /* no attempt has failed yet */
#define MQTT_INBOX_FAILURE_NETWORK                                                        \
  1                                      /* no TCP connection: refused, unreachable, name \
                                            not resolved, timed out */
#define MQTT_INBOX_FAILURE_TLS 2         /* TLS handshake or certificate check failed */
#define MQTT_INBOX_FAILURE_REFUSED 3     /* the broker refused the CONNECT (connack_code) */
#define MQTT_INBOX_FAILURE_CREDENTIALS 4 /* the password file could not be read */
#define MQTT_INBOX_FAILURE_SUBSCRIBE 5   /* connected, but a SUBSCRIBE was refused */
#define MQTT_INBOX_FAILURE_OTHER 6       /* anything else Paho reported */

/* The connection's state as numbers (connection.h, ConnectionHealth), for a program that
 * acts on it (a status LED, a watchdog) without parsing JSON; the texts are in the JSON.
 * Filled by the library. */
typedef struct mqtt_inbox_connection_health_t {
  char struct_id[4];            /* "MQCH" */
  int struct_version;           /* 1 */
  size_t struct_size;           /* sizeof(mqtt_inbox_connection_health_t) */
  int connected;                /* 1: connected and subscribed now; 0: not */
  int last_failure;             /* MQTT_INBOX_FAILURE_*: the last failed attempt's kind,
                                   kept after a later success */
  int64_t since_ms;             /* Unix time, ms, when `connected` last changed (start
                                   counts as a change); 0 before start */
  int64_t last_failure_ms;      /* Unix time, ms, of the last failed attempt; 0: none */
  int64_t connect_attempts;     /* attempts started */
  int64_t connects;             /* attempts that connected and subscribed */
  int64_t consecutive_failures; /* failed attempts since the last success */
  int connack_code;             /* the broker's last refusal: MQTT 3.1.1 return code 1..5
                                   or MQTT 5 reason code >= 0x80; 0: none */
  int64_t sessions_lost;        /* times the broker had lost the session (its queued
                                   messages with it) */
} mqtt_inbox_connection_health_t;

#define MQTT_INBOX_CONNECTION_HEALTH_INIT                                                         \
  {                                                                                               \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'C', 'H'), 1, sizeof(mqtt_inbox_connection_health_t), 0, 0, 0, \
        0, 0, 0, 0, 0, 0                                                                          \
  }

/* Fills *health (initialised with MQTT_INBOX_CONNECTION_HEALTH_INIT) with the
 * subscriber's connection state: the fields of its struct_version. Never waits for Paho
 * or the store; any thread, a handler's included. Errors: MQTT_INBOX_MISUSE (NULL or
 * dead handle, NULL health, a struct not made by its _INIT macro). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_subscriber_health(mqtt_inbox_subscriber_t* subscriber,
                                                     mqtt_inbox_connection_health_t* health);

/* ---- The transactional outbox and its relay (outbox.h, relay.h) ----------------------- */
typedef struct mqtt_inbox_outbox_t mqtt_inbox_outbox_t;
typedef struct mqtt_inbox_relay_t mqtt_inbox_relay_t;

/* Makes the outbox of `inbox` with no bounded class (mqtt_inbox_outbox_create_with_options
 * with NULL options). `inbox` must outlive it. On failure *out is NULL and the message is
 * the inbox's errmsg. Errors: MQTT_INBOX_MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_outbox_create(mqtt_inbox_t* inbox, mqtt_inbox_outbox_t** out);

/* What an enqueue does when its class is full (OutboxFullPolicy, outbox.h). */
#define MQTT_INBOX_OUTBOX_REJECT                     \
  0 /* the enqueue fails with MQTT_INBOX_OUTBOX_FULL \
       (backpressure; default) */
#define MQTT_INBOX_OUTBOX_DROP_OLDEST                    \
  1 /* the class's oldest pending rows are deleted until \
       the new one fits, counted and logged (telemetry) */

/* A bounded class of outgoing messages: every topic that starts with topic_prefix; a
 * topic belongs to the class with the longest matching prefix, and a topic matching none
 * is not bounded (OutboxClass, outbox.h). Bounds count pending rows (not yet PUBACKed). */
typedef struct mqtt_inbox_outbox_class_t {
  char struct_id[4];        /* "MQOC" */
  int struct_version;       /* 1 */
  size_t struct_size;       /* sizeof(mqtt_inbox_outbox_class_t); every element of one
                               array has the same header (its size is the stride) */
  const char* topic_prefix; /* e.g. "telemetry/"; "" matches every topic; unique among the
                               classes; required */
  int64_t max_rows;         /* most pending rows, >= 0; 0 = no row limit */
  int64_t max_bytes;        /* most bytes of pending rows (id, key, topic, payload and
                               properties), >= 0; 0 = no byte limit */
  int64_t max_age_ms;       /* oldest a pending row may be, ms on the inbox's retention
                               clock, >= 0; 0 = no age limit. Past it, _REJECT refuses new
                               rows until the relay sent the old one; _DROP_OLDEST drops the
                               rows older than it */
  int policy;               /* MQTT_INBOX_OUTBOX_REJECT (default) or _DROP_OLDEST */
} mqtt_inbox_outbox_class_t;

#define MQTT_INBOX_OUTBOX_CLASS_INIT                                                               \
  {                                                                                                \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'O', 'C'), 1, sizeof(mqtt_inbox_outbox_class_t), NULL, 0, 0, 0, \
        MQTT_INBOX_OUTBOX_REJECT                                                                   \
  }

typedef struct mqtt_inbox_outbox_options_t {
  char struct_id[4];                        /* "MQOO" */
  int struct_version;                       /* 1 */
  size_t struct_size;                       /* sizeof(mqtt_inbox_outbox_options_t) */
  const mqtt_inbox_outbox_class_t* classes; /* class_count bounded classes, copied by
                                               create; NULL: none (nothing bounded) */
  size_t class_count;                       /* 0 */
  size_t max_id_bytes;                      /* largest message id accepted, bytes (the next
                                               hop's limit); 256 */
} mqtt_inbox_outbox_options_t;

#define MQTT_INBOX_OUTBOX_OPTIONS_INIT \
  { MQTT_INBOX_STRUCT_ID('M', 'Q', 'O', 'O'), 1, sizeof(mqtt_inbox_outbox_options_t), NULL, 0, 256 }

/* Makes the outbox of `inbox` with `options` (NULL: defaults, nothing bounded). `inbox`
 * must outlive it. On failure *out is NULL and the message is the inbox's errmsg. Errors:
 * MQTT_INBOX_INVALID_ARGUMENT (a NULL or repeated topic_prefix, a negative bound, a
 * policy not listed), _MISUSE (NULL inbox or out, NULL classes with a count, a struct or
 * class not made by its _INIT macro). Any thread. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_outbox_create_with_options(
    mqtt_inbox_t* inbox, const mqtt_inbox_outbox_options_t* options, mqtt_inbox_outbox_t** out);
/* Frees it. MQTT_INBOX_BUSY, freeing nothing, while a relay of it is alive or another
 * thread is inside a call on it; _MISUSE for a dead handle. NULL: MQTT_INBOX_OK. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_outbox_destroy(mqtt_inbox_outbox_t* outbox);
/* The last call on `outbox`, as mqtt_inbox_errmsg. */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_outbox_errmsg(const mqtt_inbox_outbox_t* outbox);

/* One message to publish at QoS 1 (OutgoingMessage, outbox.h). */
typedef struct mqtt_inbox_outgoing_t {
  char struct_id[4];   /* "MQOG" */
  int struct_version;  /* 1 */
  size_t struct_size;  /* sizeof(mqtt_inbox_outgoing_t) */
  const char* topic;   /* no wildcards; required */
  const void* payload; /* payload_len bytes; NULL only with payload_len 0 */
  size_t payload_len;
  const char* message_id;   /* the stable id the next hop deduplicates on; NULL: a random
                               UUID. From a handler, derive it from the incoming id
                               (mqtt_inbox_derived_message_id) so a re-run enqueues the
                               same id */
  const char* ordering_key; /* FIFO among rows of one key; NULL: the topic */
  const char* content_type; /* MQTT 5 content type; NULL: none */
  const mqtt_inbox_user_property_t* user_properties; /* MQTT 5; the relay adds
                              "message-id" */
  size_t user_property_count;
} mqtt_inbox_outgoing_t;

#define MQTT_INBOX_OUTGOING_INIT                                                               \
  {                                                                                            \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'O', 'G'), 1, sizeof(mqtt_inbox_outgoing_t), NULL, NULL, 0, \
        NULL, NULL, NULL, NULL, 0                                                              \
  }

/* Adds `message` to the outbox inside the transaction of `db`, which must be the
 * connection the library lent: a handler's `db` (the row commits with the claim, or not
 * at all) or a set-up function's. If `message_id` is not NULL, *message_id gets the id
 * (for mqtt_inbox_free). An id already in the outbox adds nothing and succeeds.
 * Refusals, and what a handler returns after one:
 *  - MQTT_INBOX_INVALID_ARGUMENT: a topic, id or property MQTT or the next hop refuses
 *    (never succeeds). The message is dead-lettered at once as outbox_refused if the
 *    handler returns MQTT_INBOX_HANDLER_OK anyway.
 *  - MQTT_INBOX_OUTBOX_FULL: a MQTT_INBOX_OUTBOX_REJECT class is full (rows, bytes or the
 *    age of its oldest row). Backpressure, not a fault of the message: return
 *    MQTT_INBOX_HANDLER_OUTBOX_FULL (MQTT_INBOX_HANDLER_OK does the same), and the message
 *    is parked as outbox_full, with no attempt counted, for the consumer's requeue thread
 *    to replay once the relay has made room. (It cannot wait in the handler: the relay's
 *    PUBACKs arrive on the thread the handler holds.)
 * Another return code (RETRY, UNDECODABLE, REJECT) after a refusal is the handler's own
 * outcome. Errors: those two; _MISUSE (`db` is not a connection the library lent on this
 * thread, NULL arguments); store codes. Thread: the one the connection was lent on. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_outbox_enqueue(mqtt_inbox_outbox_t* outbox, sqlite3* db,
                                                  const mqtt_inbox_outgoing_t* message,
                                                  char** message_id);
/* incoming_id + "/" + suffix, checked as an outbox id (outbox.h derived_message_id), in
 * *out for mqtt_inbox_free. Errors: MQTT_INBOX_INVALID_ARGUMENT (too long, control
 * characters), _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_derived_message_id(const char* incoming_id, const char* suffix,
                                                      char** out);

/* The relay's settings: a connection of its own (as the subscriber's fields; it
 * connects with a clean start: the outbox table is its only state) and publishing
 * (RelayOptions, relay.h). With mqtt_inbox_relay_create_on the connection is the
 * subscriber's: see there which fields are read. */
typedef struct mqtt_inbox_relay_options_t {
  char struct_id[4];                    /* "MQRO" */
  int struct_version;                   /* 1 */
  size_t struct_size;                   /* sizeof(mqtt_inbox_relay_options_t) */
  const char* broker_uri;               /* required */
  const char* client_id;                /* required; differs from every subscriber's */
  int mqtt_version;                     /* MQTT_INBOX_MQTT_5 (default) or _3_1_1 */
  int keep_alive_s;                     /* 30 */
  int connect_timeout_ms;               /* 10000 */
  int reconnect_backoff_initial_ms;     /* 500 */
  int reconnect_backoff_max_ms;         /* 30000 */
  int max_inflight;                     /* publishes without PUBACK, 1..65535; 64 */
  int poll_interval_ms;                 /* look for rows committed elsewhere, ms; 1000 */
  int stop_timeout_ms;                  /* 10000 */
  int tls_version;                      /* MQTT_INBOX_TLS_*; _DEFAULT */
  int tls_insecure_skip_hostname_check; /* INSECURE; 0 or 1; 0 */
  const char* username;                 /* none */
  const char* password_file;            /* read at every connect; none */
  const char* tls_ca_file;
  const char* tls_ca_dir;
  const char* tls_cert_file;
  const char* tls_key_file;
  const char* tls_key_password_file;
  const char* client_id_lock_dir;          /* NULL: "auto"; "": no lock */
  const char* tls_ciphers;                 /* as the subscriber's; NULL */
  const char* const* tls_alpn;             /* as the subscriber's; NULL */
  size_t tls_alpn_count;                   /* 0 */
  int tls_insecure_skip_certificate_check; /* INSECURE, as the subscriber's; 0 or 1; 0 */
  int mark_batch;                          /* most rows marked sent per transaction, >= 1;
                                              256 */
  int mark_linger_ms;                      /* longest a PUBACK waits to be marked sent, so
                                              a burst shares one transaction, ms, >= 0; 0 =
                                              at once; 200. A crash loses the marks not yet
                                              written: those rows go again, same ids */
  int wake_on_commit;                      /* 1: a commit that enqueued wakes the relay at
                                              once (default); 0: rows are found at the poll
                                              only; no other value */
  int metrics_period_ms;                   /* between writes of prometheus_textfile, > 0;
                                              10000 */
  int64_t max_packet_size;                 /* largest PUBLISH sent, bytes, the whole packet;
                                              a larger row becomes an outbox dead letter
                                              payload_too_large, unsent. The smaller of this
                                              and an MQTT 5 broker's CONNACK limit applies;
                                              set it to the broker's limit on MQTT 3.1.1,
                                              which cannot announce one. >= 0; 0 = no limit
                                              of its own (default) */
  const char* prometheus_textfile;         /* the relay's counters in Prometheus text,
                                              rewritten every metrics_period_ms and at stop
                                              (a ".tmp" renamed over it); NULL: none */
} mqtt_inbox_relay_options_t;

#define MQTT_INBOX_RELAY_OPTIONS_INIT                                                            \
  {                                                                                              \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'R', 'O'), 1, sizeof(mqtt_inbox_relay_options_t), NULL, NULL, \
        MQTT_INBOX_MQTT_5, 30, 10000, 500, 30000, 64, 1000, 10000, MQTT_INBOX_TLS_DEFAULT, 0,    \
        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 256, 200, 1, 10000, 0, \
        NULL                                                                                     \
  }

/* Makes a relay that publishes `outbox`'s rows in order and marks them sent on PUBACK,
 * with a connection of its own. On failure *out is NULL and *errmsg (if not NULL) gets
 * a message for mqtt_inbox_free. Errors: MQTT_INBOX_INVALID_ARGUMENT, _IO_ERROR (a
 * password file), _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_relay_create(mqtt_inbox_outbox_t* outbox,
                                                const mqtt_inbox_relay_options_t* options,
                                                mqtt_inbox_relay_t** out, char** errmsg);
/* A relay that publishes on `subscriber`'s MQTT connection instead of opening its own
 * (Relay::create(outbox, subscriber, ...), relay.h): one connection per device, which
 * some brokers require and every broker's connection limit likes. The subscriber keeps
 * connecting and holding its session; the relay publishes while it is connected (before
 * or after mqtt_inbox_subscriber_start) and publishes every pending row again, in order,
 * after each reconnect. The MQTT version is the subscriber's: with MQTT 3.1.1 there is
 * no "message-id" user property (the payload must carry the id) and no PUBACK reason
 * code, and a warning is logged; use MQTT 5. If the subscriber's filters match the
 * topics the relay publishes to, it receives them too.
 * Of `options` (NULL: defaults) only the publishing fields are read (max_inflight,
 * poll_interval_ms, stop_timeout_ms, mark_batch, mark_linger_ms, wake_on_commit,
 * metrics_period_ms, max_packet_size, prometheus_textfile) and the reconnect backoff
 * (paces a start over after a publish failed on a live connection); mqtt_version,
 * keep_alive_s and connect_timeout_ms are the subscriber's and not read. The other
 * connection fields (broker_uri, client_id, user name, password file, every tls_* field,
 * client_id_lock_dir) must be left at their defaults: they belong to the subscriber, and
 * one set would be refused rather than silently dropped.
 * Neither `outbox` nor `subscriber` is owned: either refuses its destroy (BUSY) while the
 * relay lives. One relay per subscriber (a second one's start fails). On failure *out is
 * NULL and *errmsg (if not NULL) gets a message for mqtt_inbox_free. Errors:
 * MQTT_INBOX_INVALID_ARGUMENT (a connection field set, a count or interval out of
 * range), _MISUSE (NULL or dead outbox, subscriber or out, a struct not made by its
 * _INIT macro). Any thread but a handler's. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_relay_create_on(mqtt_inbox_outbox_t* outbox,
                                                   mqtt_inbox_subscriber_t* subscriber,
                                                   const mqtt_inbox_relay_options_t* options,
                                                   mqtt_inbox_relay_t** out, char** errmsg);
/* Stops it if running and frees it; returns what the stop returned (the relay is freed
 * all the same). MQTT_INBOX_BUSY, freeing nothing, while another thread is inside a call
 * on it; _MISUSE from a handler or for a dead handle. NULL: MQTT_INBOX_OK. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_relay_destroy(mqtt_inbox_relay_t* relay);
/* The last call on `relay`, as mqtt_inbox_errmsg. */
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_relay_errmsg(const mqtt_inbox_relay_t* relay);
/* Starts its thread; returns at once. Its own connection: takes the client-id lock, then
 * connects in the background. A subscriber's: publishes whenever the subscriber is
 * connected. Errors: MQTT_INBOX_BUSY (the client-id lock), _INVALID_ARGUMENT (already
 * started; another relay already uses the subscriber's connection). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_relay_start(mqtt_inbox_relay_t* relay);
/* Stops its thread and disconnects (its own connection; a subscriber's stays up);
 * unacknowledged rows stay pending for the next run.
 * Errors: MQTT_INBOX_BUSY when its thread is stuck in the store (exit the process);
 * _MISUSE from a handler (its thread may be waiting for the connection the handler
 * holds). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_relay_stop(mqtt_inbox_relay_t* relay);
/* Its counters (RelayCounters, relay.h: published, acked, rejected, connects,
 * max_inflight_seen, receive_maximum and maximum_packet_size from the last CONNACK,
 * expired, too_large, connection_dropped, connected, offline_ms) as a JSON object, in
 * *json for mqtt_inbox_free. Never waits; any thread. Errors: _NOMEM, _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_relay_counters_json(mqtt_inbox_relay_t* relay, char** json);
/* The relay's connection state, as mqtt_inbox_subscriber_health (for a relay on a
 * subscriber's connection: `connected` is whether it can publish; the attempts are the
 * subscriber's). */
MQTT_INBOX_C_EXPORT int mqtt_inbox_relay_health(mqtt_inbox_relay_t* relay,
                                                mqtt_inbox_connection_health_t* health);

/* ---- Retention (retention.h) ------------------------------------------------------- */
typedef struct mqtt_inbox_pruner_t mqtt_inbox_pruner_t;

typedef struct mqtt_inbox_pruner_options_t {
  char struct_id[4];                /* "MQPO" */
  int struct_version;               /* 1 */
  size_t struct_size;               /* sizeof(mqtt_inbox_pruner_options_t) */
  int64_t window_ms;                /* how long a processed id is remembered; 8 days */
  int64_t broker_session_expiry_ms; /* floor of the broker's session expiry; 7 days */
  int64_t max_offline_ms;           /* longest time the device may be away; 0 */
  int64_t margin_ms;                /* headroom above the horizon; 1 hour */
  int64_t period_ms;                /* between passes of its thread; 60000 */
  int64_t dead_letter_window_ms;    /* dead letters kept; 0 = until purged; 30 days */
} mqtt_inbox_pruner_options_t;

/* (int64_t)-cast products rather than LL literals, which C89 lacks. */
#define MQTT_INBOX_PRUNER_OPTIONS_INIT                                                         \
  {                                                                                            \
    MQTT_INBOX_STRUCT_ID('M', 'Q', 'P', 'O'), 1, sizeof(mqtt_inbox_pruner_options_t),          \
        (int64_t)8 * 24 * 3600 * 1000, (int64_t)7 * 24 * 3600 * 1000, 0, (int64_t)3600 * 1000, \
        60000, (int64_t)30 * 24 * 3600 * 1000                                                  \
  }

/* Makes the pruner of `inbox` after checking the window against the horizon and the
 * session expiries the subscriber recorded (retention.h): a window that does not cover
 * them is refused, because an id forgotten while the broker can still redeliver its
 * message lets a duplicate through. On failure *out is NULL and the message is the
 * inbox's errmsg. Errors: MQTT_INBOX_INVALID_ARGUMENT (names the session it does not
 * cover), start-up store codes, _MISUSE. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_pruner_create(mqtt_inbox_t* inbox,
                                                 const mqtt_inbox_pruner_options_t* options,
                                                 mqtt_inbox_pruner_t** out);
/* Stops its thread and frees it. MQTT_INBOX_BUSY, freeing nothing, while another thread
 * is inside a call on it; _MISUSE from a handler or for a dead handle. NULL:
 * MQTT_INBOX_OK. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_pruner_destroy(mqtt_inbox_pruner_t* pruner);
MQTT_INBOX_C_EXPORT const char* mqtt_inbox_pruner_errmsg(const mqtt_inbox_pruner_t* pruner);
/* Starts the thread that runs a pass every period_ms. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_pruner_start(mqtt_inbox_pruner_t* pruner);
/* One pass now, on the calling thread; *deleted (if not NULL) gets the processed ids
 * deleted. Errors: MQTT_INBOX_INVALID_ARGUMENT (the window no longer covers a recorded
 * session: nothing deleted), store codes. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_pruner_run_once(mqtt_inbox_pruner_t* pruner, int64_t* deleted);

/* ---- Dead letters (dead_letter.h) --------------------------------------------------- */

/* The dead letters of consumer `consumer_name` (NULL: all), newest first, at most `limit`
 * (<= 0: no limit), as a JSON array of objects (id, consumer, message_id, topic, payload
 * as text with invalid UTF-8 replaced, payload_size, reason, reason_text, attempts, times
 * in Unix ms, redeliveries, status), in *json for mqtt_inbox_free. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_dead_letters_json(mqtt_inbox_t* inbox, const char* consumer_name,
                                                     int64_t limit, char** json);
/* Marks dead letter `id` 'requeued': the running consumer of its name replays it on its
 * requeue thread (Inbox::requeue_dead_letter). Errors: MQTT_INBOX_NOT_FOUND;
 * _INVALID_ARGUMENT (not 'dead', its payload was cut); store codes. */
MQTT_INBOX_C_EXPORT int mqtt_inbox_dead_letter_requeue(mqtt_inbox_t* inbox, int64_t id);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MQTT_INBOX_C_H */

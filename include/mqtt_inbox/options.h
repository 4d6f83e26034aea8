// Options for the SQLite inbox (InboxOptions) and for the per-message policy of one
// consumer (ConsumerOptions). Plain structs: each field states its unit and default.
// MQTT connection options live in subscriber.h, because the core knows nothing of MQTT.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "mqtt_inbox/health.h"
#include "mqtt_inbox/message.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox {

class Clock;

// SQLite's PRAGMA synchronous in WAL mode (https://sqlite.org/pragma.html#pragma_synchronous).
enum class Synchronous {
  // One fsync (fdatasync) of the WAL per commit: a commit survives power loss. Required
  // for the guarantee, because the PUBACK leaves right after the commit.
  kFull,
  // No fsync at commit: survives a process crash, but the last commits can roll back on
  // power loss or OS crash, after their PUBACK went out, i.e. lost messages. An explicit,
  // documented trade-off (docs/guarantees.md#the-limits-of-the-promise).
  kNormal,
};

struct InboxOptions {
  // Durability of each commit. Default kFull; see Synchronous.
  Synchronous synchronous = Synchronous::kFull;

  // How long one SQLite call waits for another connection's lock before SQLITE_BUSY
  // (PRAGMA busy_timeout), in ms. Default 5000. The per-message path retries BUSY
  // after that, so this only bounds one wait, not the total.
  int busy_timeout_ms = 5000;

  // SQLite page size in bytes for a NEW database file (PRAGMA page_size; ignored for an
  // existing file, whose page size is fixed). Default 4096. On SD/eMMC flash 1024 writes
  // less per message (measured: ~15 KB instead of ~33 KB, docs/benchmarks.md) for the
  // same number of fsyncs and the same guarantee; larger tables get deeper b-trees.
  // A power of two, 512..65536.
  int page_size_bytes = 4096;

  // PRAGMA cache_size in KiB of page cache per connection. Default 2048 (2 MiB).
  // Lower it on small devices; see docs/packaging.md#footprint.
  int cache_size_kib = 2048;

  // PRAGMA journal_size_limit in bytes: the WAL file is truncated to this size after a
  // checkpoint resets it; at open it is lowered to one checkpoint cycle's WAL (the
  // adaptive checkpoint's threshold below plus 32 frames, each a page and its 24-byte
  // header), if that is smaller, so a steady stream neither cuts nor regrows the file.
  // -1 = no limit. Default 4 MiB.
  int64_t journal_size_limit_bytes = 4 * 1024 * 1024;

  // The WAL size, in pages, after which a commit checkpoints it (SQLite's
  // wal_autocheckpoint). An upper bound: the inbox checkpoints as soon as the WAL holds a
  // quarter of the file system's free space (at least 32 pages), so on a small or nearly
  // full file system the WAL never takes the last free space, and on SQLITE_FULL it
  // checkpoints and truncates the WAL at once (docs/operations.md#disk-space). 0 turns automatic
  // checkpoints off. Default 1000 (SQLite's default).
  int wal_autocheckpoint_pages = 1000;

  // Also record the topic, the MQTT 5 content type and correlation data and a payload
  // hash (64-bit FNV-1a) in each inbox_processed row, for debugging (mqtt-inbox export
  // shows them). Default false: the claim row is then the key and received_at only,
  // which is all deduplication and retention read. On, a row takes about 155 bytes of
  // the file instead of 130 (with 36-byte UUID ids) and a commit writes 4 % more WAL
  // bytes and CPU (docs/design.md#design-decisions: what the claim row keeps).
  bool record_metadata = false;

  // Hold an exclusive advisory lock (flock(2) on "<path>.lock") while the Inbox is open,
  // so a second consumer process on the same database fails at open with kBusy instead
  // of competing for every message. Default true. Tools that only inspect or repair a
  // live database (the admin tool) set it false. flock is per host: it does not protect a
  // database on a network file system shared by two hosts (don't do that with SQLite).
  bool exclusive = true;

  // --- The PostgreSQL store (postgres.h, docs/postgres.md); ignored by the SQLite store.
  // On PostgreSQL, busy_timeout_ms is the connection's lock_timeout (the handler's
  // statements included): a claim waiting behind another consumer's uncommitted claim of
  // the same id gives up after it, as "not yet" (SQLSTATE 55P03: retried with the store
  // backoff, never counted against the message). 0 means "do not wait" on both stores
  // (lock_timeout 1 ms here: PostgreSQL's 0 would wait for ever); synchronous,
  // page_size_bytes, cache_size_kib, journal_size_limit_bytes, wal_autocheckpoint_pages,
  // exclusive and vfs do not apply (the server's synchronous_commit decides durability).

  // The schema that holds the inbox's tables, created if missing (with its versioned
  // migrations, under an advisory lock so consumers starting together do not race).
  // Default "mqtt_inbox". 1..63 characters of [a-z0-9_], not starting with a digit.
  std::string postgres_schema = "mqtt_inbox";

  // A libpq password file (https://www.postgresql.org/docs/15/libpq-pgpass.html) to take
  // the password from, passed to libpq as `passfile`. Default "" = libpq's own choice
  // (PGPASSFILE, else ~/.pgpass). The location itself may not hold a password.
  std::string postgres_password_file;

  // How long the server lets a session of this inbox sit inside a transaction waiting for
  // the client before it ends the session (PostgreSQL idle_in_transaction_session_timeout,
  // set on each of the inbox's connections), ms; 0 = the server's own setting. A process
  // that froze or lost its network in the middle of a claim holds the claim's and its
  // handler's row locks until its session ends, and every consumer of the fleet that
  // touches those rows waits that long (docs/fleet.md#a-member-cut-off). Its COMMIT then
  // fails and the claim row decides, as after any lost connection. Keep it above the
  // longest pause a handler makes between its statements. Default 10000.
  int postgres_idle_in_transaction_timeout_ms = 10000;

  // SQLite VFS to open the file with (https://sqlite.org/vfs.html). Default "" = the
  // platform default. The fault-injection tests pass a wrapping VFS here.
  std::string vfs;

  // Time source. Default nullptr = Clock::system(). Not owned; must outlive the Inbox.
  Clock* clock = nullptr;

  // Where the library logs. Default nullptr = a logger named "mqtt_inbox" (created on
  // first use with spdlog's default sink setup); the library never writes to spdlog's
  // default logger. Everything made on this Inbox logs here too: its Consumers, its
  // Pruner and its StoreThenProcess (they have no logger option of their own). The
  // Subscriber logs to SubscriberOptions::logger; pass the same logger to both to get one
  // stream.
  std::shared_ptr<spdlog::logger> logger;

  // --- Start-up: Inbox::open, Inbox::setup, Pruner::create, StoreThenProcess::create and
  // StoreThenProcess::start. A store that is transiently unavailable at start-up (locked
  // by another process such as a backup, the admin tool or a migration; disk full; I/O
  // failing; read-only) is waited out with the same capped backoff, log rate limit and
  // Health as the message path (ConsumerOptions::store_*), instead of failing: a device
  // in the field has nobody to restart it. Whatever is not transient (a corrupt file,
  // files of another user, bad options) fails at once. Because each of these calls
  // returns only once the store is ready, an application that starts its Subscriber
  // after them never connects (and gets redeliveries) before the store can take them.

  // Backoff between start-up attempts: initial, doubled each time, capped. Defaults
  // 50 ms and 5000 ms. Each attempt itself may wait busy_timeout_ms for a lock.
  std::chrono::milliseconds startup_backoff_initial{50};
  std::chrono::milliseconds startup_backoff_max{5000};
  // Minimum interval between two log lines about the same start-up wait, ms.
  // Default 10000.
  int64_t startup_log_interval_ms = 10000;
  // How long one start-up call may wait in total, ms; 0 = as long as it takes. When it
  // runs out, the call returns the last transient error (Status::is_transient_store_error
  // is true, the message says "not ready after N ms at start-up"), for systems that
  // prefer a supervisor restart; each attempt's busy timeout is cut to what is left, so
  // the call returns within about this long. Default 0 (wait).
  int64_t startup_deadline_ms = 0;
  // Called on the waiting thread after every failed start-up attempt (Health: stuck,
  // starting, operation, retries, last_error) and once when the store answers again
  // (stuck false). Inbox::open blocks and there is no object to ask yet, so this is how
  // a caller, or a systemd watchdog helper, sees "waiting for the store at start-up":
  // the first comes about 1 s into a wait (the first attempt waits at most 1 s for a
  // lock), later ones at least every busy_timeout_ms + startup_backoff_max (10 s), so
  // a watchdog ping from here needs WatchdogSec above that. Must not throw or call into
  // the Inbox. Default empty. After open, Inbox::health() gives the same snapshot.
  std::function<void(const Health&)> startup_progress;

  // Test hook: called just before the claim transaction begins (after the duplicate
  // pre-check), with the consumer name and message id. Lets a test hold two connections
  // at a barrier right before the claim. Default empty.
  std::function<void(const std::string& consumer, const std::string& message_id)> before_claim_hook;

  // Test hook: called right after the claim transaction committed, before the consumer
  // returns (and so before the PUBACK). Lets a test kill the process in exactly the window
  // "committed but not acked". Default empty.
  std::function<void(const std::string& consumer, const std::string& message_id)> after_commit_hook;
};

// What to do when the user property and the JSON field both hold an id and the ids
// differ (or the JSON field is not a string, or appears twice).
enum class IdDisagreement {
  // Dead-letter the message as invalid_id with both values in the reason text. A message
  // with two ids is applied twice as soon as one hop drops MQTT 5 properties (an MQTT
  // 3.1.1 bridge sees only the JSON id): neither id can be trusted.
  kDeadLetter,
  // The user property wins and the JSON field is not read (the precedence before this
  // check existed). Only for producers known to put different things in the two places.
  kUserPropertyWins,
};

// Where the producer-assigned message id comes from. Sources are tried in this order; the
// first source that is present decides (a present but invalid id is dead-lettered as
// invalid_id, it does not fall through to the next source). When the user property is
// present, the JSON field is read too (the payload is parsed) and must agree
// (on_disagreement).
struct MessageIdOptions {
  // 1. An MQTT 5 user property with this name. Default "message-id". Empty disables.
  std::string user_property = "message-id";
  // 2. A top-level string field of a JSON object payload. Default "message_id".
  //    Empty disables. Numbers are refused (invalid_id): ids are text.
  std::string json_field = "message_id";
  // 3. An application function. Returns the id, or std::nullopt for "no id here".
  //    If it throws, the message is dead-lettered as undecodable_payload.
  std::function<std::optional<std::string>(const Message&)> extractor;
  // Longest accepted id, in bytes. Default 256. Longer ids are invalid_id.
  size_t max_id_bytes = 256;
  // User property and JSON field both present with different ids. Default kDeadLetter.
  IdDisagreement on_disagreement = IdDisagreement::kDeadLetter;
  // Payloads up to this many bytes that the JSON field is read from are parsed into a
  // document in the same pass, which the handler gets as Delivery::payload_json, so a
  // JSON payload is parsed once per message instead of twice (payload_json.h). Longer
  // payloads, and every payload with 0, are read without building one (memory bounded by
  // the nesting depth instead of a few times the payload, up to ~32x for pathological
  // nesting: 2 MiB at the default). Default 64 KiB. Set 0 for handlers that do not read
  // JSON (a document nobody reads costs about a quarter more than the reading alone).
  size_t json_document_max_bytes = 64 * 1024;
};

// What a consumer does with a retained message (Message::retain set: the broker sent a
// stored message because of a SUBSCRIBE). docs/api-guide.md#retained-messages.
enum class RetainedPolicy {
  // Ack it without running the handler and without writing anything; count it
  // (ConsumerCounters::retained_skipped) and log it at info level. The default: a
  // message published while the subscription exists, online or queued in the persistent
  // session, never has RETAIN set, so skipping loses nothing that was published to this
  // session. What it skips is a copy of an old message that the broker resends at every
  // new SUBSCRIBE (a new filter, a lost session), months later if need be: once its id has
  // left the retention window, processing it applies it a second time. The inbox cannot
  // make that exactly-once, so it does not try.
  kSkip,
  // Dead-letter it as 'retained' (with its id, when it has a usable one, so a repeat
  // bumps the same row's redeliveries; a retained copy of an id already processed is a
  // duplicate). An operator can then look at it and replay it, which processes it.
  kDeadLetter,
  // Process it like any other message. Exactly-once only while its id is within the
  // retention window: choose this only for retained messages that carry state the
  // handler applies idempotently (a setpoint, a configuration), not for events.
  kProcess,
};
const char* to_string(RetainedPolicy policy);

// What a consumer does with a message whose MQTT 5 message expiry
// (Message::message_expiry_interval_s, the producer's "worthless after this many
// seconds", as the broker forwarded it) ran out before the message could be applied.
// docs/api-guide.md#messages-with-a-lifetime.
enum class ExpiredPolicy {
  // Honour the producer: never apply it. It becomes the dead letter `expired` (its
  // properties keep the interval it arrived with; the text says how long it waited) and
  // is acked. The default.
  kDeadLetter,
  // Apply it anyway, as MQTT 3.1.1 would (3.1.1 has no message expiry): for producers
  // that set an expiry for the broker's queue only, not for its effect.
  kApply,
};
const char* to_string(ExpiredPolicy policy);

struct ConsumerOptions {
  MessageIdOptions message_id;

  // A retained message (Message::retain). Default kSkip; see RetainedPolicy.
  RetainedPolicy retained = RetainedPolicy::kSkip;

  // Largest payload processed, in bytes. Default 1 MiB. Larger payloads are dead-lettered
  // as payload_too_large without running the handler.
  size_t max_payload_bytes = 1024 * 1024;

  // Bytes of payload kept in a dead letter. Default 1 MiB. A longer payload is cut and the
  // row records the original size, so the cut is never silent.
  size_t dead_letter_payload_bytes = 1024 * 1024;

  // Attempts of the handler for one message before it is dead-lettered, counting
  // attempts in earlier processes (a crash inside the handler counts). Default 5, >= 1.
  int max_attempts = 5;

  // Backoff between in-process handler attempts: initial, doubled each time, capped.
  // Defaults 100 ms and 2000 ms. The callback holds Paho's receive thread meanwhile, so
  // keep the total well below the MQTT keep-alive.
  std::chrono::milliseconds retry_backoff_initial{100};
  std::chrono::milliseconds retry_backoff_max{2000};

  // A message whose MQTT 5 message expiry ran out before it could be applied. Default
  // kDeadLetter; see ExpiredPolicy. The wait is measured on the Inbox's retention clock
  // (monotonic, docs/operations.md#clock-safety) from when the library received the
  // message (Consumer::handle, StoreThenProcess::handle), and checked in the claim
  // transaction before the handler runs and again before it commits (Consumer), or before
  // a stored row is processed and again before its transaction commits
  // (StoreThenProcess: the time in the backlog counts). A replayed dead letter is never
  // expired: the operator decides. MQTT 3.1.1 carries no expiry: nothing expires.
  ExpiredPolicy expired = ExpiredPolicy::kDeadLetter;

  // The dependency schedule: the runs of a message whose handler said "not yet"
  // (RetryLater, handler.h; C: MQTT_INBOX_HANDLER_NOT_YET). No attempt is counted. After
  // a "not yet", the next run comes after the retry_backoff_* delay for the first
  // dependency_immediate_attempts runs, then after dependency_backoff_initial, doubled
  // each time, capped at dependency_backoff_max, the last one cut so that it runs when
  // dependency_wait_max has passed since the first "not yet"; a "not yet" then makes the
  // dead letter dependency_unavailable. Any other outcome ends the wait. The Consumer
  // holds the message (unacked; the stream waits behind it) and health() shows the wait;
  // store-then-process reschedules the row. Defaults: 3 immediate runs, then 1 s doubling
  // to 60 s, for up to 10 minutes (19 runs in all). dependency_immediate_attempts
  // >= 0; 1 ms <= dependency_backoff_initial <= dependency_backoff_max;
  // dependency_wait_max >= 0 (0: the first "not yet" is a dead letter).
  int dependency_immediate_attempts = 3;
  std::chrono::milliseconds dependency_backoff_initial{1000};
  std::chrono::milliseconds dependency_backoff_max{60000};
  std::chrono::milliseconds dependency_wait_max{600000};

  // Backoff while the store cannot commit (locked, full, failing). The message is never
  // acked meanwhile; retries go on until a commit succeeds. Defaults 50 ms .. 5000 ms.
  std::chrono::milliseconds store_backoff_initial{50};
  std::chrono::milliseconds store_backoff_max{5000};

  // Minimum interval between two log lines about the same stuck store, in ms.
  // Default 10000.
  int64_t store_error_log_interval_ms = 10000;

  // Consumer mode only: how often the Consumer's own thread looks for dead letters the
  // admin tool marked 'requeued' (Inbox::requeue_dead_letter), and messages a full outbox
  // parked (outbox.h OutboxFull), and replays them through the handler, in ms. One index probe per
  // poll; the replay runs on that thread, never on the transport's callback thread, taking the
  // connection for one message at a time. 0 = no thread (call Consumer::replay_requeued()
  // yourself). Default 2000, >= 0.
  int64_t requeue_poll_ms = 2000;
};

}  // namespace mqtt_inbox

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
  // documented trade-off (README "The guarantee, and its limits").
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
  // Lower it on small devices; see README "Footprint".
  int cache_size_kib = 2048;

  // PRAGMA journal_size_limit in bytes: the WAL file is truncated to this size after a
  // checkpoint resets it. Default 4 MiB.
  int64_t journal_size_limit_bytes = 4 * 1024 * 1024;

  // PRAGMA wal_autocheckpoint in pages: the WAL length at which its pages are copied back
  // into the database file (a checkpoint). Default 1000 (SQLite's default). 0 disables
  // automatic checkpoints (the Pruner still checkpoints).
  int wal_autocheckpoint_pages = 1000;

  // Run those checkpoints on a connection and a thread of the Inbox's own instead of
  // inside the commit that crosses wal_autocheckpoint_pages (SQLite's way, where that
  // commit copies ~1000 pages and fsyncs the database file while its PUBACK waits). Only
  // with exclusive = true. Costs one thread and one more SQLite connection (64 KiB page
  // cache); the WAL stays bounded (2x wal_autocheckpoint_pages at most: the commit that
  // sees it checkpoints itself) and a failed checkpoint loses no commit. Off by default:
  // measured on the 2-core VM (bench_core, FULL, 3,000 messages) it made 1.46 fsyncs and
  // 5,000 database bytes per message against 1.01 and 600 inline, and lower throughput
  // (docs/benchmarks.md); it checkpoints far more often than once per threshold, and
  // that is not yet understood. Default false.
  bool background_checkpoint = false;

  // Record topic and payload hash in inbox_processed for debugging. Default true.
  // Turning it off makes rows smaller (fewer bytes written per message on flash).
  bool record_metadata = true;

  // Hold an exclusive advisory lock (flock(2) on "<path>.lock") while the Inbox is open,
  // so a second consumer process on the same database fails at open with kBusy instead
  // of competing for every message. Default true. Tools that only inspect or repair a
  // live database (the admin tool) set it false. flock is per host: it does not protect a
  // database on a network file system shared by two hosts (don't do that with SQLite).
  bool exclusive = true;

  // SQLite VFS to open the file with (https://sqlite.org/vfs.html). Default "" = the
  // platform default. The fault-injection tests pass a wrapping VFS here.
  std::string vfs;

  // Time source. Default nullptr = Clock::system(). Not owned; must outlive the Inbox.
  Clock* clock = nullptr;

  // Where the library logs. Default nullptr = a logger named "mqtt_inbox" (created on
  // first use with spdlog's default sink setup); the library never writes to spdlog's
  // default logger.
  std::shared_ptr<spdlog::logger> logger;

  // Test hook: called just before the claim transaction begins (after the duplicate
  // pre-check), with the consumer name and message id. Lets a test hold two connections
  // at a barrier right before the claim. Default empty.
  std::function<void(const std::string& consumer, const std::string& message_id)>
      before_claim_hook;

  // Test hook: called right after the claim transaction committed, before the consumer
  // returns (and so before the PUBACK). Lets a test kill the process in exactly the window
  // "committed but not acked". Default empty.
  std::function<void(const std::string& consumer, const std::string& message_id)>
      after_commit_hook;
};

// Where the producer-assigned message id comes from. Sources are tried in this order; the
// first source that is present decides (a present but invalid id is dead-lettered as
// invalid_id, it does not fall through to the next source).
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
};

struct ConsumerOptions {
  MessageIdOptions message_id;

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

  // Backoff while the store cannot commit (locked, full, failing). The message is never
  // acked meanwhile; retries go on until a commit succeeds. Defaults 50 ms .. 5000 ms.
  std::chrono::milliseconds store_backoff_initial{50};
  std::chrono::milliseconds store_backoff_max{5000};

  // Minimum interval between two log lines about the same stuck store, in ms.
  // Default 10000.
  int64_t store_error_log_interval_ms = 10000;
};

}  // namespace mqtt_inbox

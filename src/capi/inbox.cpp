// The inbox from C: version, open and close, the application's start-up SQL, stats and
// health as JSON (c.h, "The inbox").
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>

#include "capi/connection_scope.h"
#include "capi/handles.h"
#include "capi/json_text.h"
#include "capi/memory.h"
#include "capi/sized_struct.h"
#include "mqtt_inbox/version.h"

using mqtt_inbox::capi::guarded;
using mqtt_inbox::capi::Kind;
using mqtt_inbox::capi::LastError;
using mqtt_inbox::capi::with_handle;

namespace {

constexpr mqtt_inbox_options_t kDefaults = MQTT_INBOX_OPTIONS_INIT;

// Misuse by the caller, recorded where there is a place for it.
int misuse(LastError* err, const char* what) {
  return err ? err->set(MQTT_INBOX_MISUSE, what) : MQTT_INBOX_MISUSE;
}

}  // namespace

extern "C" {

int mqtt_inbox_version(const char** text) {
  if (text) *text = MQTT_INBOX_VERSION_STRING;
  return MQTT_INBOX_VERSION_MAJOR * 1000000 + MQTT_INBOX_VERSION_MINOR * 1000 +
         MQTT_INBOX_VERSION_PATCH;
}

int mqtt_inbox_open(const char* path, const mqtt_inbox_options_t* options, mqtt_inbox_t** out,
                    char** errmsg) {
  if (out) *out = nullptr;
  if (errmsg) *errmsg = nullptr;
  LastError err;
  const int rc = guarded(&err, [&] {
    if (!path || !out) return misuse(&err, "mqtt_inbox_open: path and out must not be NULL");
    mqtt_inbox_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kDefaults, &o, &err)) return r;
    mqtt_inbox::InboxOptions io;
    switch (o.synchronous) {
      case MQTT_INBOX_SYNC_FULL:
        io.synchronous = mqtt_inbox::Synchronous::kFull;
        break;
      case MQTT_INBOX_SYNC_NORMAL:
        io.synchronous = mqtt_inbox::Synchronous::kNormal;
        break;
      default:
        // Never read as the nearest value: durability is not lowered by a garbage value.
        return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                       "mqtt_inbox_options_t.synchronous is " + std::to_string(o.synchronous) +
                           ": it must be MQTT_INBOX_SYNC_FULL or MQTT_INBOX_SYNC_NORMAL");
    }
    bool low_memory = true;
    if (int r = mqtt_inbox::capi::read_flag(o.exclusive, "mqtt_inbox_options_t.exclusive", &err,
                                            &io.exclusive))
      return r;
    if (int r = mqtt_inbox::capi::read_flag(
            o.record_metadata, "mqtt_inbox_options_t.record_metadata", &err, &io.record_metadata))
      return r;
    if (int r = mqtt_inbox::capi::read_flag(o.low_memory, "mqtt_inbox_options_t.low_memory", &err,
                                            &low_memory))
      return r;
    io.busy_timeout_ms = o.busy_timeout_ms;
    io.cache_size_kib = o.cache_size_kib;
    io.page_size_bytes = o.page_size_bytes;
    io.startup_deadline_ms = o.startup_deadline_ms;
    if (low_memory) mqtt_inbox::capi::configure_sqlite_for_low_memory();
    auto h = std::make_unique<mqtt_inbox_t>();
    h->low_memory = low_memory;
    if (int r = err.set(mqtt_inbox::Inbox::open(path, io, &h->inbox))) return r;
    mqtt_inbox::capi::adopt(h.get(), {});
    *out = h.release();
    if (low_memory) mqtt_inbox::capi::give_back_freed_memory();
    return MQTT_INBOX_OK;
  });
  if (rc != MQTT_INBOX_OK && errmsg) *errmsg = mqtt_inbox::capi::malloc_copy(err.read());
  return rc;
}

int mqtt_inbox_close(mqtt_inbox_t* inbox) {
  return mqtt_inbox::capi::release_handle(inbox, Kind::kInbox, "mqtt_inbox_close",
                                          [](mqtt_inbox_t*) { return MQTT_INBOX_OK; });
}

const char* mqtt_inbox_errmsg(const mqtt_inbox_t* inbox) {
  mqtt_inbox::capi::Use use(inbox, Kind::kInbox);
  return use ? inbox->error.read() : mqtt_inbox::capi::dead_handle_text(Kind::kInbox);
}

int mqtt_inbox_setup(mqtt_inbox_t* inbox, const char* sql) {
  return with_handle(inbox, Kind::kInbox, [&] {
    if (!sql) return misuse(&inbox->error, "mqtt_inbox_setup: NULL sql");
    return inbox->error.set(inbox->inbox->setup_sql(sql));
  });
}

int mqtt_inbox_setup_fn(mqtt_inbox_t* inbox, int (*fn)(void* ctx, sqlite3* db), void* ctx) {
  return with_handle(inbox, Kind::kInbox, [&] {
    if (!fn) return misuse(&inbox->error, "mqtt_inbox_setup_fn: NULL fn");
    return inbox->error.set(inbox->inbox->setup([&](SQLite::Database& db) {
      mqtt_inbox::capi::ConnectionScope scope(&db);
      mqtt_inbox::capi::InCallback in_callback;
      const int rc = fn(ctx, db.getHandle());
      // Thrown as SQLite's own error, so that setup classifies it like one of its own
      // statements: a transient code is waited out, the rest fails the call.
      if (rc != SQLITE_OK) throw SQLite::Exception("the set-up function returned", rc);
    }));
  });
}

int mqtt_inbox_stats_json(mqtt_inbox_t* inbox, char** json) {
  return with_handle(inbox, Kind::kInbox, [&] {
    if (!json) return misuse(&inbox->error, "mqtt_inbox_stats_json: NULL json");
    using mqtt_inbox::capi::JsonObject;
    const mqtt_inbox::InboxStats s = inbox->inbox->stats();
    // Topics and consumer names are raw bytes: JsonObject replaces what is not UTF-8.
    JsonObject consumers;
    for (const auto& [name, rows] : s.consumers)
      consumers.raw_at(name, JsonObject()
                                 .number("rows", rows.rows)
                                 .number("oldest_received_at", rows.oldest_received_at)
                                 .number("newest_received_at", rows.newest_received_at)
                                 .done());
    JsonObject classes;
    for (const auto& [prefix, c] : s.outbox.classes)
      classes.raw_at(prefix, JsonObject()
                                 .number("pending_rows", c.pending_rows)
                                 .number("pending_bytes", c.pending_bytes)
                                 .number("dropped", c.dropped)
                                 .done());
    const std::string outbox = JsonObject()
                                   .raw("classes", classes.done())
                                   .number("sent_rows", s.outbox.sent_rows)
                                   .number("dead_rows", s.outbox.dead_rows)
                                   .number("oldest_pending_age_ms", s.outbox.oldest_pending_age_ms)
                                   .done();
    return mqtt_inbox::capi::hand_out_json(JsonObject()
                                               .number("processed", s.processed)
                                               .number("duplicates", s.duplicates)
                                               .number("dead_lettered", s.dead_lettered)
                                               .number("retries", s.retries)
                                               .number("store_errors", s.store_errors)
                                               .number("pruned", s.pruned)
                                               .number("dead_letters_pruned", s.dead_letters_pruned)
                                               .number("sessions_lost", s.sessions_lost)
                                               .real("duplicate_ratio", s.duplicate_ratio)
                                               .number("commit_p50_us", s.commit_p50_us)
                                               .number("commit_p99_us", s.commit_p99_us)
                                               .number("commit_max_us", s.commit_max_us)
                                               .number("db_bytes", s.db_bytes)
                                               .number("wal_bytes", s.wal_bytes)
                                               .number("schema_version", s.schema_version)
                                               .number("retention_clock_ms", s.retention_clock_ms)
                                               .number("rows_measured_at", s.rows_measured_at)
                                               .raw("consumers", consumers.done())
                                               .raw("outbox", outbox)
                                               .done(),
                                           &inbox->error, json);
  });
}

int mqtt_inbox_health_json(mqtt_inbox_t* inbox, char** json) {
  return with_handle(inbox, Kind::kInbox, [&] {
    if (!json) return misuse(&inbox->error, "mqtt_inbox_health_json: NULL json");
    return mqtt_inbox::capi::hand_out_json(mqtt_inbox::capi::health_json(inbox->inbox->health()),
                                           &inbox->error, json);
  });
}

}  // extern "C"

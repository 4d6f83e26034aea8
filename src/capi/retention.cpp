// The pruner from C: its window checked as in C++, its thread, one pass on demand (c.h,
// "Retention").
#include "mqtt_inbox/retention.h"

#include "capi/handles.h"
#include "capi/memory.h"
#include "capi/sized_struct.h"

using mqtt_inbox::capi::Kind;
using mqtt_inbox::capi::with_handle;

struct mqtt_inbox_pruner_t : mqtt_inbox::capi::Handle {
  mqtt_inbox_pruner_t() noexcept : Handle(Kind::kPruner) {}
  std::unique_ptr<mqtt_inbox::Pruner> pruner;
};

namespace {
constexpr mqtt_inbox_pruner_options_t kDefaults = MQTT_INBOX_PRUNER_OPTIONS_INIT;
}

extern "C" {

int mqtt_inbox_pruner_create(mqtt_inbox_t* inbox, const mqtt_inbox_pruner_options_t* options,
                             mqtt_inbox_pruner_t** out) {
  if (out) *out = nullptr;
  return with_handle(inbox, Kind::kInbox, [&] {
    auto& err = inbox->error;
    if (!out) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_pruner_create: NULL out");
    mqtt_inbox_pruner_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kDefaults, &o, &err)) return r;
    mqtt_inbox::RetentionOptions ro;
    ro.window = std::chrono::milliseconds(o.window_ms);
    ro.broker_session_expiry = std::chrono::milliseconds(o.broker_session_expiry_ms);
    ro.max_offline = std::chrono::milliseconds(o.max_offline_ms);
    ro.margin = std::chrono::milliseconds(o.margin_ms);
    ro.period = std::chrono::milliseconds(o.period_ms);
    ro.dead_letter_window = std::chrono::milliseconds(o.dead_letter_window_ms);
    auto h = std::make_unique<mqtt_inbox_pruner_t>();
    if (int r = err.set(mqtt_inbox::Pruner::create(inbox->inbox.get(), ro, &h->pruner))) return r;
    mqtt_inbox::capi::adopt(h.get(), {inbox});
    *out = h.release();
    // The sweep's connection was opened and checked: what that freed goes back.
    if (inbox->low_memory) mqtt_inbox::capi::give_back_freed_memory();
    return MQTT_INBOX_OK;
  });
}

int mqtt_inbox_pruner_destroy(mqtt_inbox_pruner_t* pruner) {
  if (pruner && mqtt_inbox::capi::InCallback::active()) {
    mqtt_inbox::capi::Use use(pruner, Kind::kPruner);
    return mqtt_inbox::capi::refused_in_callback(use ? &pruner->error : nullptr,
                                                 "mqtt_inbox_pruner_destroy");
  }
  return mqtt_inbox::capi::release_handle(pruner, Kind::kPruner, "mqtt_inbox_pruner_destroy",
                                          [](mqtt_inbox_pruner_t*) { return MQTT_INBOX_OK; });
}

const char* mqtt_inbox_pruner_errmsg(const mqtt_inbox_pruner_t* pruner) {
  mqtt_inbox::capi::Use use(pruner, Kind::kPruner);
  return use ? pruner->error.read() : mqtt_inbox::capi::dead_handle_text(Kind::kPruner);
}

int mqtt_inbox_pruner_start(mqtt_inbox_pruner_t* pruner) {
  return with_handle(pruner, Kind::kPruner,
                     [&] { return pruner->error.set(pruner->pruner->start()); });
}

int mqtt_inbox_pruner_run_once(mqtt_inbox_pruner_t* pruner, int64_t* deleted) {
  return with_handle(pruner, Kind::kPruner, [&] {
    mqtt_inbox::PruneResult r;
    if (int rc = pruner->error.set(pruner->pruner->prune_once(&r))) return rc;
    if (deleted) *deleted = r.processed_deleted;
    return MQTT_INBOX_OK;
  });
}

}  // extern "C"

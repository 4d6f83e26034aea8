// The pruner from C: its window checked as in C++, its thread, one pass on demand (c.h,
// "Retention").
#include "mqtt_inbox/retention.h"

#include "capi/handles.h"
#include "capi/sized_struct.h"

using mqtt_inbox::capi::guarded;
using mqtt_inbox::capi::LastError;

struct mqtt_inbox_pruner_t {
  std::unique_ptr<mqtt_inbox::Pruner> pruner;
  LastError error;
};

namespace {
constexpr mqtt_inbox_pruner_options_t kDefaults = MQTT_INBOX_PRUNER_OPTIONS_INIT;
}

extern "C" {

int mqtt_inbox_pruner_create(mqtt_inbox_t* inbox, const mqtt_inbox_pruner_options_t* options,
                             mqtt_inbox_pruner_t** out) {
  if (out) *out = nullptr;
  if (!inbox) return MQTT_INBOX_MISUSE;
  auto& err = inbox->error;
  return guarded(&err, [&] {
    if (!out) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_pruner_create: NULL out");
    mqtt_inbox_pruner_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kDefaults, &o, &err,
                                             "mqtt_inbox_pruner_options_t"))
      return r;
    mqtt_inbox::RetentionOptions ro;
    ro.window = std::chrono::milliseconds(o.window_ms);
    ro.broker_session_expiry = std::chrono::milliseconds(o.broker_session_expiry_ms);
    ro.max_offline = std::chrono::milliseconds(o.max_offline_ms);
    ro.margin = std::chrono::milliseconds(o.margin_ms);
    ro.period = std::chrono::milliseconds(o.period_ms);
    ro.dead_letter_window = std::chrono::milliseconds(o.dead_letter_window_ms);
    auto h = std::make_unique<mqtt_inbox_pruner_t>();
    if (int r = err.set(mqtt_inbox::Pruner::create(inbox->inbox.get(), ro, &h->pruner))) return r;
    *out = h.release();
    return MQTT_INBOX_OK;
  });
}

void mqtt_inbox_pruner_destroy(mqtt_inbox_pruner_t* pruner) { delete pruner; }

const char* mqtt_inbox_pruner_errmsg(const mqtt_inbox_pruner_t* pruner) {
  return pruner ? pruner->error.read() : "mqtt_inbox_pruner_errmsg: NULL pruner";
}

int mqtt_inbox_pruner_start(mqtt_inbox_pruner_t* pruner) {
  if (!pruner) return MQTT_INBOX_MISUSE;
  return guarded(&pruner->error, [&] { return pruner->error.set(pruner->pruner->start()); });
}

int mqtt_inbox_pruner_run_once(mqtt_inbox_pruner_t* pruner, int64_t* deleted) {
  if (!pruner) return MQTT_INBOX_MISUSE;
  return guarded(&pruner->error, [&] {
    mqtt_inbox::PruneResult r;
    if (int rc = pruner->error.set(pruner->pruner->prune_once(&r))) return rc;
    if (deleted) *deleted = r.processed_deleted;
    return MQTT_INBOX_OK;
  });
}

}  // extern "C"

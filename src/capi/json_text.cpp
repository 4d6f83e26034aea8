// The C API's JSON texts (capi/json_text.h).
#include "capi/json_text.h"

#include <nlohmann/json.hpp>

namespace mqtt_inbox::capi {

namespace {

// A lone string or number value: its destructor frees at most its own string.
template <typename T>
std::string scalar(const T& v) {
  return nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void JsonObject::key(const char* k) {
  if (out_.size() > 1) out_ += ',';
  out_ += '"';
  out_ += k;
  out_ += "\":";
}

JsonObject& JsonObject::text(const char* k, const std::string& value) {
  key(k);
  out_ += scalar(value);
  return *this;
}

JsonObject& JsonObject::null(const char* k) {
  key(k);
  out_ += "null";
  return *this;
}

JsonObject& JsonObject::number(const char* k, int64_t value) {
  key(k);
  out_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::real(const char* k, double value) {
  key(k);
  out_ += scalar(value);
  return *this;
}

JsonObject& JsonObject::flag(const char* k, bool value) {
  key(k);
  out_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::raw(const char* k, const std::string& json) {
  key(k);
  out_ += json;
  return *this;
}

JsonObject& JsonObject::raw_at(const std::string& k, const std::string& json) {
  if (out_.size() > 1) out_ += ',';
  out_ += scalar(k);
  out_ += ':';
  out_ += json;
  return *this;
}

std::string JsonObject::done() {
  out_ += '}';
  return std::move(out_);
}

std::string health_json(const Health& h) {
  return JsonObject()
      .text("level", to_string(level(h)))
      .flag("stuck", h.stuck)
      .number("stuck_since_ms", h.stuck_since_ms)
      .number("stuck_for_ms", h.stuck_for_ms)
      .number("retries", h.retries)
      .number("total_store_errors", h.total_store_errors)
      .text("last_error", h.last_error)
      .flag("starting", h.starting)
      .text("operation", h.operation)
      .flag("fatal", h.fatal)
      .text("database", h.database)
      .raw("dependency", JsonObject()
                             .flag("waiting", h.dependency.waiting)
                             .number("waited_ms", h.dependency.waited_ms)
                             .text("message_id", h.dependency.message_id)
                             .number("attempt", h.dependency.attempt)
                             .text("reason", h.dependency.reason)
                             .number("next_run_in_ms", h.dependency.next_run_in_ms)
                             .text("text", to_string(h.dependency))
                             .done())
      .done();
}

int hand_out_json(const std::string& text, LastError* err, char** out) {
  char* p = malloc_copy(text);
  if (!p) return err ? err->set(MQTT_INBOX_NOMEM, "out of memory") : MQTT_INBOX_NOMEM;
  *out = p;
  return MQTT_INBOX_OK;
}

}  // namespace mqtt_inbox::capi

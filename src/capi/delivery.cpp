// What a C handler reads of its delivery, and the reason text it sets (c.h,
// mqtt_inbox_delivery_*). Every accessor is NULL-safe and never throws.
#include "capi/delivery.h"

#include "mqtt_inbox/c.h"

extern "C" {

const char* mqtt_inbox_delivery_message_id(const mqtt_inbox_delivery_t* d) {
  return d ? d->delivery->message_id.c_str() : nullptr;
}

const char* mqtt_inbox_delivery_topic(const mqtt_inbox_delivery_t* d) {
  return d ? d->delivery->message.topic.c_str() : nullptr;
}

const void* mqtt_inbox_delivery_payload(const mqtt_inbox_delivery_t* d, size_t* len) {
  if (!d) {
    if (len) *len = 0;
    return nullptr;
  }
  const std::string& p = d->delivery->message.payload;
  if (len) *len = p.size();
  return p.c_str();
}

int mqtt_inbox_delivery_qos(const mqtt_inbox_delivery_t* d) {
  return d ? d->delivery->message.qos : 0;
}

int mqtt_inbox_delivery_dup(const mqtt_inbox_delivery_t* d) {
  return d && d->delivery->message.dup ? 1 : 0;
}

int mqtt_inbox_delivery_retained(const mqtt_inbox_delivery_t* d) {
  return d && d->delivery->message.retain ? 1 : 0;
}

int mqtt_inbox_delivery_attempt(const mqtt_inbox_delivery_t* d) {
  return d ? d->delivery->attempt : 0;
}

size_t mqtt_inbox_delivery_user_property_count(const mqtt_inbox_delivery_t* d) {
  return d ? d->delivery->message.user_properties.size() : 0;
}

int mqtt_inbox_delivery_user_property(const mqtt_inbox_delivery_t* d, size_t index,
                                      const char** name, size_t* name_len, const char** value,
                                      size_t* value_len) {
  if (!d || index >= d->delivery->message.user_properties.size()) return 0;
  const auto& p = d->delivery->message.user_properties[index];
  if (name) *name = p.first.c_str();
  if (name_len) *name_len = p.first.size();
  if (value) *value = p.second.c_str();
  if (value_len) *value_len = p.second.size();
  return 1;
}

const char* mqtt_inbox_delivery_user_property_get(const mqtt_inbox_delivery_t* d,
                                                  const char* name) {
  if (!d || !name) return nullptr;
  for (const auto& p : d->delivery->message.user_properties)
    if (p.first == name) return p.second.c_str();
  return nullptr;
}

namespace {

const char* optional_text(const std::optional<std::string>& v, size_t* len) {
  if (len) *len = v ? v->size() : 0;
  return v ? v->c_str() : nullptr;
}

}  // namespace

const char* mqtt_inbox_delivery_content_type(const mqtt_inbox_delivery_t* d, size_t* len) {
  static const std::optional<std::string> kNone;
  return optional_text(d ? d->delivery->message.content_type : kNone, len);
}

const char* mqtt_inbox_delivery_response_topic(const mqtt_inbox_delivery_t* d, size_t* len) {
  static const std::optional<std::string> kNone;
  return optional_text(d ? d->delivery->message.response_topic : kNone, len);
}

const void* mqtt_inbox_delivery_correlation_data(const mqtt_inbox_delivery_t* d, size_t* len) {
  static const std::optional<std::string> kNone;
  return optional_text(d ? d->delivery->message.correlation_data : kNone, len);
}

int mqtt_inbox_delivery_payload_format_indicator(const mqtt_inbox_delivery_t* d) {
  if (!d || !d->delivery->message.payload_format_indicator) return -1;
  return *d->delivery->message.payload_format_indicator;
}

int mqtt_inbox_delivery_message_expiry_interval(const mqtt_inbox_delivery_t* d, uint32_t* seconds) {
  if (!d || !d->delivery->message.message_expiry_interval_s) return 0;
  if (seconds) *seconds = *d->delivery->message.message_expiry_interval_s;
  return 1;
}

void mqtt_inbox_delivery_set_reason(const mqtt_inbox_delivery_t* d, const char* text) {
  if (!d) return;
  try {
    d->reason = text ? text : "";
    d->has_reason = true;
  } catch (...) {
    // No memory for the text: the failure keeps the return code's default text.
    d->has_reason = false;
  }
}

}  // extern "C"

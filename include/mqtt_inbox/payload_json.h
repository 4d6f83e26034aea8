// The payload of a Delivery as a JSON document, parsed at most once per message: the
// consumer's parse when it took the message id from a JSON field (Delivery::payload_json),
// else a parse made here. For handlers of JSON payloads; includes nlohmann/json.hpp.
//
// Thread safety: none of its own; a handler runs on one thread per delivery.
#pragma once

#include <nlohmann/json.hpp>

#include "mqtt_inbox/message.h"

namespace mqtt_inbox {

// *d.payload_json if the consumer parsed the payload already; else the payload parsed
// now into *storage, and *storage returned. A payload that is not valid JSON gives a
// discarded value (is_discarded() true), never an exception: a handler reports it as
// UndecodablePayload (handler.h), so the message is dead-lettered at once instead of
// retried. The reference lives as long as the shorter of the delivery and *storage.
//
//   nlohmann::json storage;
//   const nlohmann::json& j = mqtt_inbox::payload_json(d, &storage);
//   if (!j.is_object()) throw mqtt_inbox::UndecodablePayload("payload is not a JSON object");
inline const nlohmann::json& payload_json(const Delivery& d, nlohmann::json* storage) {
  if (d.payload_json != nullptr) return *d.payload_json;
  *storage = nlohmann::json::parse(d.message.payload, nullptr, /*allow_exceptions=*/false);
  return *storage;
}

}  // namespace mqtt_inbox

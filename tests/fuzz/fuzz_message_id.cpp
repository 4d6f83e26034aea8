// libFuzzer target: message-id extraction from untrusted MQTT input.
// Input layout: byte 0 selects options; then "property value" 0x00 "payload".
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "inbox/message_id.h"
#include "util/log.h"
#include "util/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace mqtt_inbox;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t sep = in.find('\0');
  Message m;
  m.topic = "fuzz";
  MessageIdOptions o;
  o.max_id_bytes = 1 + data[0] % 64;
  if (data[0] & 0x80) o.json_field = "id";
  if (sep != std::string::npos) {
    m.user_properties.emplace_back(o.user_property, in.substr(0, sep));
    m.payload = in.substr(sep + 1);
  } else {
    m.payload = in;
  }
  std::string id, why;
  DeadLetterReason reason{};
  const bool ok = detail::extract_message_id(m, o, &id, &reason, &why);
  // The reading that keeps the payload's document for the handler (Delivery::payload_json)
  // says exactly what the SAX reading says, and its document is the payload's parse.
  std::string doc_id, doc_why;
  DeadLetterReason doc_reason{};
  nlohmann::json document;
  if (detail::extract_message_id(m, o, &doc_id, &doc_reason, &doc_why, &document) != ok ||
      doc_id != id || (!ok && (doc_reason != reason || doc_why != why)))
    std::abort();
  // (operator!= recurses: only documents too short to nest deeply are compared.)
  if (!document.is_discarded() && m.payload.size() < 4096 &&
      document != nlohmann::json::parse(m.payload, nullptr, /*allow_exceptions=*/false))
    std::abort();
  if (ok) {
    // An accepted id is always usable as a key and safe to log.
    if (id.empty() || id.size() > o.max_id_bytes || !detail::is_valid_utf8(id) ||
        !detail::validate_message_id(id, o.max_id_bytes).empty())
      std::abort();
    // A message never carries two ids: when the JSON payload holds the field too, it is
    // the same string (otherwise a hop that drops MQTT 5 properties applies it twice).
    const auto j = nlohmann::json::parse(m.payload, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains(o.json_field) &&
        (!j[o.json_field].is_string() || j[o.json_field].get<std::string>() != id))
      std::abort();
  } else if (why.empty()) {
    std::abort();  // every refusal names its reason
  }
  for (char c : detail::printable(in)) {
    if (c < 0x20 || c > 0x7e) std::abort();  // log lines never carry raw bytes
  }
  return 0;
}

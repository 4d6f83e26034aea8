// libFuzzer target: message-id extraction from untrusted MQTT input.
// Input layout: byte 0 selects options; then "property value" 0x00 "payload".
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "log.h"
#include "message_id.h"
#include "text.h"

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
  if (detail::extract_message_id(m, o, &id, &reason, &why)) {
    // An accepted id is always usable as a key and safe to log.
    if (id.empty() || id.size() > o.max_id_bytes || !detail::is_valid_utf8(id) ||
        !detail::validate_message_id(id, o.max_id_bytes).empty())
      std::abort();
  } else if (why.empty()) {
    std::abort();  // every refusal names its reason
  }
  for (char c : detail::printable(in)) {
    if (c < 0x20 || c > 0x7e) std::abort();  // log lines never carry raw bytes
  }
  return 0;
}

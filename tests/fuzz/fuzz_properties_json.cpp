// libFuzzer target: MQTT 5 properties to the dead-letter JSON and back (replay reads it),
// and the reader on arbitrary JSON (a row edited by hand or by a newer version).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "inbox/properties_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mqtt_inbox;
  const std::string in(reinterpret_cast<const char*>(data), size);

  // 1. Arbitrary bytes as the stored JSON: must not throw or crash.
  DeadLetter raw;
  raw.properties_json = in;
  (void)detail::message_from_dead_letter(raw);

  // 2. Round trip: properties made from the input survive byte for byte.
  Message m;
  size_t at = 0;
  auto next = [&]() {
    const size_t end = in.find('\0', at);
    std::string part = in.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? in.size() : end + 1;
    return part;
  };
  while (at < in.size() && m.user_properties.size() < 8) {
    std::string name = next();
    std::string value = next();
    m.user_properties.emplace_back(std::move(name), std::move(value));
  }
  if (!in.empty()) {
    m.content_type = in.substr(0, in.size() / 2);
    m.correlation_data = in.substr(in.size() / 2);
    m.payload_format_indicator = static_cast<uint8_t>(in[0]);
  }
  DeadLetter dl;
  dl.properties_json = detail::properties_json(m);
  const Message back = detail::message_from_dead_letter(dl);
  if (back.user_properties != m.user_properties || back.content_type != m.content_type ||
      back.correlation_data != m.correlation_data ||
      back.payload_format_indicator != m.payload_format_indicator)
    std::abort();
  return 0;
}

// The wire size of a relay PUBLISH and its expiry (mqtt/publish_size.h).
#include "mqtt/publish_size.h"

#include <algorithm>
#include <string>

namespace mqtt_inbox::detail {

namespace {

// Bytes of a Variable Byte Integer (MQTT 5.0 section 1.5.5; 3.1.1 section 2.2.3).
int64_t varint_size(int64_t v) {
  int64_t n = 1;
  while (v >= 128) {
    v /= 128;
    ++n;
  }
  return n;
}

int64_t utf8_string_size(const std::string& s) { return 2 + static_cast<int64_t>(s.size()); }

}  // namespace

int64_t publish_packet_size(const OutboxRow& row, bool mqtt5) {
  int64_t remaining = utf8_string_size(row.topic) + 2;  // topic name, packet identifier
  if (mqtt5) {
    const OutgoingMessage& p = row.properties;
    // Identifier byte + value, per property (MQTT 5.0 section 2.2.2.2).
    int64_t props = 1 + utf8_string_size("message-id") + utf8_string_size(row.message_id);
    for (const auto& up : p.user_properties)
      props += 1 + utf8_string_size(up.first) + utf8_string_size(up.second);
    if (p.content_type) props += 1 + utf8_string_size(*p.content_type);
    if (p.response_topic) props += 1 + utf8_string_size(*p.response_topic);
    if (p.correlation_data) props += 1 + utf8_string_size(*p.correlation_data);
    if (p.payload_format_indicator) props += 1 + 1;
    if (p.message_expiry_interval_s) props += 1 + 4;
    remaining += varint_size(props) + props;
  }
  remaining += static_cast<int64_t>(row.payload.size());
  return 1 + varint_size(remaining) + remaining;
}

bool expired(const OutboxRow& row) {
  const auto& expiry = row.properties.message_expiry_interval_s;
  return expiry && row.waited_ms >= static_cast<int64_t>(*expiry) * 1000;
}

uint32_t remaining_expiry_s(const OutboxRow& row) {
  const auto& expiry = row.properties.message_expiry_interval_s;
  if (!expiry) return 0;
  const int64_t waited_s = row.waited_ms / 1000;
  return static_cast<uint32_t>(std::max<int64_t>(1, static_cast<int64_t>(*expiry) - waited_s));
}

}  // namespace mqtt_inbox::detail

// What the relay needs to know about an outbox row as an MQTT PUBLISH before it sends it:
// the packet's size on the wire (to honour the broker's Maximum Packet Size) and what is
// left of its message expiry. MQTT layer; no SQL, no Paho.
#pragma once

#include <cstdint>

#include "mqtt_inbox/outbox.h"

namespace mqtt_inbox::detail {

// Bytes of the QoS 1 PUBLISH the relay sends for `row` (MQTT 5.0 section 3.3; 3.1.1
// section 3.3 when !mqtt5): fixed header, topic, packet id, with MQTT 5 the property length
// and every property the relay adds (user property "message-id" first, then the row's
// properties), and the payload. The Maximum Packet Size a broker announces counts all of
// it (MQTT 5.0 section 3.2.2.3.6).
int64_t publish_packet_size(const OutboxRow& row, bool mqtt5);

// Whether row.properties.message_expiry_interval_s has run out in row.waited_ms.
bool expired(const OutboxRow& row);

// Seconds left of row.properties.message_expiry_interval_s after row.waited_ms (rounded
// down; at least 1, since a row with nothing left is not sent). 0 if it has no expiry.
uint32_t remaining_expiry_s(const OutboxRow& row);

}  // namespace mqtt_inbox::detail

// Internal (MQTT layer): an outbox row as the relay publishes it: the Paho message (QoS 1,
// the message id as the MQTT 5 user property "message-id", the row's properties, what is
// left of its expiry), and the test that finds a row which can never be published.
#pragma once

#include <mqtt/message.h>

#include <cstdint>
#include <optional>
#include <string>

#include "mqtt_inbox/outbox.h"

namespace mqtt_inbox::detail {

// The PUBLISH for `row`; with mqtt5 it carries the properties (none on MQTT 3.1.1).
mqtt::message_ptr to_paho_message(const OutboxRow& row, bool mqtt5);

// A row that can never be published, and the reason (with a sentence for the dead letter
// in *text), or nullopt:
//  - kExpired: its message expiry ran out while it waited (row.waited_ms).
//  - kPayloadTooLarge: its PUBLISH is larger than `broker_limit` (bytes, the broker's
//    CONNACK Maximum Packet Size; 0 = none announced) or `own_limit` (bytes,
//    RelayOptions::max_packet_size; 0 = none): the smaller applies. MQTT 5.0 section
//    3.2.2.3.6: the client must not send it; mosquitto answers one with DISCONNECT 0x95
//    (MQTT 5) or closes the connection (3.1.1), after which every reconnect would resend it
//    and block the stream.
std::optional<OutboxDeadReason> unpublishable(const OutboxRow& row, bool mqtt5,
                                              int64_t broker_limit, int64_t own_limit,
                                              std::string* text);

}  // namespace mqtt_inbox::detail

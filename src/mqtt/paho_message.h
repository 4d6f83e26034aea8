// Internal (MQTT layer): a Paho message as the library's Message (topic, payload, QoS,
// DUP, RETAIN and the MQTT 5 properties the library reads). topic_matches() is declared
// in subscriber.h and defined in mqtt/paho_message.cpp.
#pragma once

#include <mqtt/message.h>

#include "mqtt_inbox/message.h"

namespace mqtt_inbox {
namespace detail {

// Copies what the library reads from `pm`; user properties keep their order. Paho's
// message must be alive during the call only.
Message to_message(const mqtt::message& pm);

}  // namespace detail
}  // namespace mqtt_inbox

// MQTT 5 properties of a Message to and from the JSON kept in a dead letter. Raw bytes
// that are not UTF-8 are kept as {"hex": "..."} so that nothing is lost or replaced.
#pragma once

#include <string>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/message.h"

namespace mqtt_inbox::detail {

// {"user_properties": [[name, value], ...], "content_type": ..., ...}; "{}" if none.
std::string properties_json(const Message& m);

// The Message a dead letter was made from (topic, payload, QoS, properties). Tolerates
// malformed JSON (keeps what it can read); never throws.
Message message_from_dead_letter(const DeadLetter& dl);

// Sets the MQTT 5 property fields (and dup) of *out from JSON made by properties_json();
// keeps what it can read of malformed JSON, leaves other fields alone; never throws.
void read_properties_json(const std::string& json, Message* out);

}  // namespace mqtt_inbox::detail

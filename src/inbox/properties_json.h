// MQTT 5 properties (MessageProperties) of a Message or an outbox row to and from the JSON kept in
// a dead letter or an outbox row. Raw bytes that are not UTF-8 are kept as {"hex": "..."} so that
// nothing is lost or replaced.
#pragma once

#include <string>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/message.h"

namespace mqtt_inbox::detail {

// {"user_properties": [[name, value], ...], "content_type": ..., ..., "dup": true if
// `dup`}; "{}" if none. The Message overload records its DUP flag.
std::string properties_json(const MessageProperties& p, bool dup = false);
inline std::string properties_json(const Message& m) { return properties_json(m, m.dup); }

// The Message a dead letter was made from (topic, payload, QoS, properties). Tolerates
// malformed JSON (keeps what it can read); never throws.
Message message_from_dead_letter(const DeadLetter& dl);

// Sets the MQTT 5 property fields of *out (and *dup, if given and recorded) from JSON made
// by properties_json(); keeps what it can read of malformed JSON, leaves other fields
// alone; never throws. The Message overload sets its DUP flag.
void read_properties_json(const std::string& json, MessageProperties* out, bool* dup = nullptr);
inline void read_properties_json(const std::string& json, Message* out) {
  read_properties_json(json, out, &out->dup);
}

}  // namespace mqtt_inbox::detail

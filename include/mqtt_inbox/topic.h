// Topic names and topic filters: the checks MQTT makes of them (MQTT 3.1.1 sections
// 1.5.3 and 4.7; MQTT 5.0 sections 1.5.4 and 4.7), for a program to make at start-up, so
// that a bad --topic or --emit-topic stops the program with the option's name instead of
// failing every message later (a publish refused or a connection dropped by the broker,
// each row an outbox dead letter). Pure functions: thread-safe, no I/O.
#pragma once

#include <string>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox {

// OK if `topic` can be published to: 1..65,535 bytes of valid UTF-8, no U+0000, no
// wildcard ('+' or '#'). Else kInvalidArgument saying why, naming it as `what` (e.g.
// "--emit-topic"; default "topic name").
Status check_topic_name(const std::string& topic, const std::string& what = "topic name");

// OK if `filter` can be subscribed to: 1..65,535 bytes of valid UTF-8, no U+0000, '+'
// only as a whole level, '#' only as the whole last level. A shared subscription
// "$share/<name>/<filter>" needs a name of at least one character without '/', '+' or
// '#', and a valid filter after it. Else kInvalidArgument saying why, naming it as `what`.
Status check_topic_filter(const std::string& filter, const std::string& what = "topic filter");

}  // namespace mqtt_inbox

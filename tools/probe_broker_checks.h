// probe-broker's two measurements of what a broker does beyond keeping a session
// (docs/admin-tool.md, docs/brokers-and-tls.md): how many QoS 1 messages it keeps in flight
// to a consumer that stops acknowledging, against the Receive Maximum the consumer sent;
// and whether a reload of its configuration keeps what is published to an offline
// persistent session. Each uses a client id and a topic of its own under the probe's, and
// ends its session when done. Uses Paho; no SQL.
#pragma once

#include <mqtt/async_client.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "format.h"

namespace mqtt_inbox::cli {

// What every check needs from the probe.
struct ProbeContext {
  std::string broker;
  int mqtt_version = MQTTVERSION_5;         // MQTTVERSION_5 or MQTTVERSION_3_1_1
  std::string client_id;                    // the probe's; a check appends its own suffix
  std::string topic;                        // the probe's; a check appends its own level
  std::chrono::milliseconds timeout{5000};  // the bound of each step that waits for the broker
  uint32_t session_expiry_s = 300;          // MQTT 5 session expiry of a check's session
  // Sets TLS, the user name and the password (read from --password-file again) on `o`;
  // throws ToolError when a file cannot be used.
  std::function<void(mqtt::connect_options* o)> secure;
};

// The in-flight window. A persistent session (client id <id>-inflight) subscribes to
// <topic>/inflight; while it is offline (R+1)^2 QoS 1 messages are published to it (R:
// `receive_maximum`, 1..30). It connects again with keep-alive 1 s (and on MQTT 5 with
// Receive Maximum R), acknowledges the first R messages, then holds the next in Paho's
// callback (so no PUBACK leaves) until the broker ends the connection for the missed
// keep-alive: at most 1.5 keep-alives plus 7 s. It connects once more and counts the
// messages resent with DUP=1: what the broker had in flight when it gave up on the
// consumer. Verdicts: "honoured" (at most R; MQTT 5), "exceeded" (more), "not_applicable"
// (MQTT 3.1.1 has no Receive Maximum: the count is the broker's own window), "not_measured"
// (the reason says why), "error" (the reason in "error"). Appends warnings. Throws nothing.
json probe_in_flight(const ProbeContext& c, int receive_maximum, json* warnings);

// What the reload check does (--reload-command and the flags beside it).
struct ReloadCheck {
  std::string command;   // run with /bin/sh -c; must exit 0 within the context's timeout
  int count = 10;        // messages published before the reload, and again after it
  int pause_ms = 0;      // offline this long before the command (a broker restart then)
  int settle_ms = 1000;  // waited after the command: a broker applies a reload in its loop
};

// The reload check. A persistent session (client id <id>-reload) subscribes to
// <topic>/reload and disconnects; `count` QoS 1 messages are published to it; after
// `pause_ms` (announced on stderr: "probe: offline before the reload ...") the command
// runs, `settle_ms` pass, `count` more are published, and the session connects again
// (the password file read again: the command may have rotated it) and counts both kinds.
// Verdicts: "kept", "dropped" (fewer arrived than the broker acknowledged, the session
// present), "session_lost", "not_measured" (no command), "error" (the reason in "error").
// Appends warnings. Throws nothing.
json probe_reload(const ProbeContext& c, const ReloadCheck& r, json* warnings);

}  // namespace mqtt_inbox::cli

// Message: one delivered message as the inbox core sees it, independent of MQTT client
// libraries. The MQTT layer (subscriber.h) fills it from a Paho message; a firmware
// application that receives messages some other way can fill it itself.
//
// Thread safety: a value type; no shared state.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "mqtt_inbox/json_abi.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// Delivery::payload_json is a document the library built: this program must see the
// same nlohmann::json type, whose namespace nlohmann tags with its version and
// JSON_DIAGNOSTICS (json_abi.h holds the library's).
static_assert(NLOHMANN_JSON_VERSION_MAJOR == MQTT_INBOX_NLOHMANN_JSON_VERSION_MAJOR &&
                  NLOHMANN_JSON_VERSION_MINOR == MQTT_INBOX_NLOHMANN_JSON_VERSION_MINOR &&
                  NLOHMANN_JSON_VERSION_PATCH == MQTT_INBOX_NLOHMANN_JSON_VERSION_PATCH &&
                  JSON_DIAGNOSTICS == MQTT_INBOX_NLOHMANN_JSON_DIAGNOSTICS,
              "mqtt-inbox was built with another nlohmann-json (version or JSON_DIAGNOSTICS) "
              "than this program compiles against: a Delivery's payload_json would be read "
              "with the wrong layout. Build both with the same nlohmann-json and settings.");

namespace mqtt_inbox {

class SessionRecords;

// The MQTT 5 PUBLISH properties a message carries (MQTT 5.0 section 3.3.2.3), shared by
// what arrives (Message) and what the outbox sends (OutgoingMessage, outbox.h). With MQTT
// 3.1.1 there are none: every field stays empty.
struct MessageProperties {
  // User properties in order (section 3.3.2.3.7). Names and values are raw bytes; the
  // same name may repeat.
  std::vector<std::pair<std::string, std::string>> user_properties;
  std::optional<std::string> content_type;            // section 3.3.2.3.9
  std::optional<std::string> response_topic;          // section 3.3.2.3.5
  std::optional<std::string> correlation_data;        // section 3.3.2.3.6, binary
  std::optional<uint8_t> payload_format_indicator;    // section 3.3.2.3.2: 0 bytes, 1 UTF-8
  std::optional<uint32_t> message_expiry_interval_s;  // section 3.3.2.3.3, seconds

  // Returns the first user property named `name`, if any.
  const std::string* user_property(const std::string& name) const {
    for (const auto& p : user_properties)
      if (p.first == name) return &p.second;
    return nullptr;
  }
};

// One delivered message: its topic, payload and flags, and its MQTT 5 properties
// (MessageProperties, in arrival order as received).
struct Message : MessageProperties {
  std::string topic;
  // Raw payload bytes; need not be UTF-8 or text at all.
  std::string payload;
  int qos = 1;
  // The MQTT DUP flag as received. Informational only: the DUP flag and the MQTT packet
  // identifier describe a delivery, not a message, and are never used for deduplication
  // (MQTT 3.1.1 sections 2.3.1 and 3.3.1.1; docs/guarantees.md section 2).
  bool dup = false;
  // The RETAIN flag as received. A broker sets it only on a message it sends because of a
  // SUBSCRIBE, i.e. a stored retained message that may have been published long before
  // the subscription existed; a message forwarded through an established subscription
  // (live, or queued in the persistent session while the client was offline) arrives with
  // RETAIN=0 (MQTT 3.1.1 section 3.3.1.3; MQTT 5.0 section 3.3.1.3 with Retain As
  // Published = 0, which the Subscriber always uses). ConsumerOptions::retained decides
  // what happens to a message with it set. Default false.
  bool retain = false;
};

// What the per-message path reports once a delivery has a durable outcome.
enum class Outcome {
  kProcessed,            // the effect committed with the claim (or, store-then-process,
                         // the message was stored for the workers)
  kDuplicate,            // already processed (or stored) under this consumer: skipped
  kDeadLettered,         // written to the dead letters now
  kAlreadyDeadLettered,  // a redelivery of a message already dead-lettered
  kSkipped,              // not processed and not recorded, by policy: a retained message
                         // under RetainedPolicy::kSkip (options.h); acked and counted
  kRefused,              // not handled and nothing recorded: the call came from inside a
                         // handler of the same inbox (handler.h), which would deadlock; the
                         // running handler's message is dead-lettered as handler_reentered
};
const char* to_string(Outcome outcome);

// Where a transport hands each delivery. handle() returns only once the delivery has a
// durable outcome, so the transport may acknowledge it (send the PUBACK) right after.
// Implemented by Consumer (process in the callback) and by the store-then-process
// receiver. Implementations must not throw.
class MessageSink {
 public:
  virtual ~MessageSink();
  virtual Outcome handle(const Message& message) = 0;
  // Records a delivery that must not be processed at all (for example a message on a
  // topic no subscription of this client matches any more, kept by the persistent
  // session) as a dead letter with reason handler_failed and `why` as its text, without
  // running any handler. Returns once that record is durable, like handle().
  virtual Outcome reject(const Message& message, const std::string& why) = 0;
  // The consumer name recorded with every row (used in logs).
  virtual const std::string& name() const = 0;
  // The session records of the inbox this sink records into (Inbox::sessions(),
  // session_record.h). A transport with a persistent session records that session there
  // (the MQTT Subscriber: its topic filters and session expiry), and that inbox's Pruner
  // checks its retention window against it. Part of the interface, not an option, so
  // that no sink can be attached without it. Never null: Subscriber::subscribe refuses a
  // sink without them.
  virtual SessionRecords* sessions() const = 0;
};

// A Message together with the producer-assigned id the consumer extracted from it.
// Handlers receive this. Lifetime: `message` and `message_id` refer to objects that live
// only for this delivery (the transport's Message, the id the consumer extracted) and are
// valid only during the handler call. A handler
// that keeps anything beyond its return (a queue, another thread, a lambda run later)
// copies it: Message and std::string are value types.
struct Delivery {
  const Message& message;
  const std::string& message_id;
  // 1 for the first attempt of this message by this consumer; counts survive restarts.
  int attempt;
  // The payload as a JSON document, when the consumer has parsed it already: it took the
  // message id from a JSON field (MessageIdOptions::json_field, also when it only checked
  // that field against a user property), and the payload is valid JSON (RFC 8259) of at
  // most MessageIdOptions::json_document_max_bytes (64 KiB by default; a larger one is
  // read for its id without building a document, whose memory grows with the payload, up
  // to some 32 times it for deep nesting). Then a
  // handler reads this instead of parsing the payload a second time, one JSON parse per
  // message instead of two (docs/benchmarks.md, "One JSON parse"). nullptr otherwise: an id
  // from a user property or the extractor alone, a StoreThenProcess delivery, a Delivery
  // built by hand. Same lifetime as `message`. payload_json() (payload_json.h) returns this
  // or parses the payload itself when it is null.
  const nlohmann::json* payload_json = nullptr;
};

}  // namespace mqtt_inbox

// Dead letters: messages the inbox could not process, kept with everything needed to
// understand and replay them. A dead letter is a separate state from "processed": it
// never counts as a claim, so a replay after a fix applies the message exactly once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mqtt_inbox/message.h"

namespace mqtt_inbox {

// The fixed set of reasons. The text forms ("missing_id", ...) are what the database
// stores and what the admin tool prints; they never change meaning.
enum class DeadLetterReason {
  kMissingId,                // no message id in any configured source
  kInvalidId,                // an id was found but is empty, whitespace, too long, not UTF-8,
                             // holds control characters, or is not a JSON string
  kPayloadTooLarge,          // payload longer than ConsumerOptions::max_payload_bytes
  kUndecodablePayload,       // the id extractor or the handler (by throwing
                             // UndecodablePayload) said the bytes cannot be decoded
  kInvalidPayload,           // the handler threw RejectMessage: the message decodes but its
                             // content is refused (a value out of range, an unknown account)
  kHandlerFailed,            // the handler threw on every attempt up to the limit
  kHandlerCrashed,           // the process died inside the handler on every attempt up to the
                             // limit (counted durably across restarts)
  kRetained,                 // a retained message (Message::retain) under
                             // RetainedPolicy::kDeadLetter; replaying it processes it
  kHandlerReentered,         // the handler called back into its own Inbox (or a Consumer,
                             // Pruner or StoreThenProcess on it), which would have deadlocked;
                             // the text names the call (handler.h)
  kOutboxFull,               // not a failure: the handler's Outbox::enqueue_or_throw met a full
                             // OutboxFullPolicy::kReject class (OutboxFull). The Consumer parks
                             // the message here with status 'requeued' and no attempt counted,
                             // and its requeue thread replays it once the relay has made room
                             // (docs/outbox.md#backpressure)
  kOutboxRefused,            // the handler's Outbox::enqueue_or_throw refused its outgoing
                             // message for good (OutboxRefused, outbox.h: an id too long or
                             // malformed, a topic or property MQTT does not allow, a message
                             // larger than its class): dead-lettered at once, one attempt; the
                             // text names the refusal
  kHandlerEndedTransaction,  // the handler ended the library's transaction or tried to
                             // (COMMIT, ROLLBACK, BEGIN, commit()/abort() on it, or closed
                             // the inbox's connection): nothing of it committed, refused by
                             // every store alike (handler.h); dead-lettered at once, the text
                             // names what the handler ran
  kExpired,                  // the message's MQTT 5 message expiry ran out before it could be
                             // applied (ConsumerOptions::expired, kDeadLetter by default): never
                             // applied; the text gives the interval it arrived with and how
                             // long it waited since the library received it
  kDependencyUnavailable,    // the handler said "not yet" (RetryLater, c.h
                             // MQTT_INBOX_HANDLER_NOT_YET) on every run of the dependency
                             // schedule (ConsumerOptions::dependency_*): never applied; the
                             // text gives the runs, the wait and the handler's last words
};

// Every reason, in declaration order (for parsing, listing and help texts).
inline constexpr DeadLetterReason kDeadLetterReasons[] = {
    DeadLetterReason::kMissingId,        DeadLetterReason::kInvalidId,
    DeadLetterReason::kPayloadTooLarge,  DeadLetterReason::kUndecodablePayload,
    DeadLetterReason::kInvalidPayload,   DeadLetterReason::kHandlerFailed,
    DeadLetterReason::kHandlerCrashed,   DeadLetterReason::kRetained,
    DeadLetterReason::kHandlerReentered, DeadLetterReason::kOutboxFull,
    DeadLetterReason::kOutboxRefused,    DeadLetterReason::kHandlerEndedTransaction,
    DeadLetterReason::kExpired,          DeadLetterReason::kDependencyUnavailable};

const char* to_string(DeadLetterReason reason);
// Parses the text form; returns false for an unknown name.
bool parse_dead_letter_reason(const std::string& text, DeadLetterReason* out);

struct DeadLetter {
  int64_t id = 0;  // row id in inbox_dead_letters
  std::string consumer_name;
  std::optional<std::string> message_id;  // empty when the message had no usable id
  std::string topic;
  std::string payload;          // raw bytes, possibly cut (see payload_size)
  int64_t payload_size = 0;     // bytes received; larger than payload.size() if cut
  std::string properties_json;  // MQTT 5 properties as a JSON object, "{}" if none
  int qos = 1;
  DeadLetterReason reason = DeadLetterReason::kHandlerFailed;
  std::string reason_text;
  int attempts = 0;
  int64_t first_attempt_at_ms = 0;  // Unix time, ms
  int64_t last_attempt_at_ms = 0;
  int64_t dead_lettered_at_ms = 0;
  int redeliveries = 0;   // deliveries of the same (consumer, id) seen after dead-lettering
  bool replayed = false;  // status 'replayed': a replay committed its effect
  bool requeued = false;  // status 'requeued': waiting for the running Consumer to replay
                          // it (Inbox::requeue_dead_letter, or parked as kOutboxFull)
  std::optional<int64_t> replayed_at_ms;
};

// Filter for listing and purging. Unset fields match everything.
struct DeadLetterFilter {
  std::optional<std::string> consumer_name;
  std::optional<DeadLetterReason> reason;
  std::optional<std::string> message_id;
  std::optional<int64_t> since_ms;   // dead_lettered_at >= since_ms
  std::optional<int64_t> before_ms;  // dead_lettered_at < before_ms
  bool include_replayed = false;     // also rows already replayed successfully ('dead' and
                                     // 'requeued' rows always match)
  int64_t limit = 1000;              // rows; <= 0 means no limit
};

}  // namespace mqtt_inbox

// Extraction and validation of the producer-assigned message id from untrusted input.
#pragma once

#include <string>

#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"

namespace mqtt_inbox::detail {

// Checks an id: non-empty, not only whitespace, at most max_bytes, valid UTF-8, and free
// of control characters (C0, DEL, C1). Returns "" if valid, else why not.
std::string validate_message_id(const std::string& id, size_t max_bytes);

// Finds the id in the sources of `options` (user property, JSON field, extractor, in that
// order). Returns true and sets *id, or returns false and sets *reason (kMissingId,
// kInvalidId or kUndecodablePayload) and *why. Never throws. Memory is bounded by the
// payload size: the JSON source is read with a SAX parser that builds no document.
bool extract_message_id(const Message& message, const MessageIdOptions& options,
                        std::string* id, DeadLetterReason* reason, std::string* why);

}  // namespace mqtt_inbox::detail

// Extraction and validation of the producer-assigned message id from untrusted input.
#pragma once

#include <nlohmann/json_fwd.hpp>

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
// kInvalidId or kUndecodablePayload) and *why. Never throws.
//
// `document`: null, or where the payload's parse goes for the handler to read
// (Delivery::payload_json), so a JSON payload is parsed once per message, not twice. When
// the JSON source was read, the payload is valid JSON and at most
// options.json_document_max_bytes long, *document holds it (any JSON value); otherwise it is left
// discarded (value_t::discarded). The JSON source is read in one SAX pass either way;
// without a document it builds none (memory bounded by the nesting depth); a document
// takes a few times the payload's size, up to about 32 times for pathological nesting,
// hence the limit. The outcome is the same with or without (tests/unit/message_id_test.cpp
// runs every case both ways; the fuzzer compares them and the document with parse()).
bool extract_message_id(const Message& message, const MessageIdOptions& options, std::string* id,
                        DeadLetterReason* reason, std::string* why,
                        nlohmann::json* document = nullptr);

}  // namespace mqtt_inbox::detail

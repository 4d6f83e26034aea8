#include "inbox/message_id.h"

#include <nlohmann/json.hpp>

#include <utility>
#include <vector>

#include "util/log.h"
#include "util/text.h"

namespace mqtt_inbox::detail {
namespace {

// SAX handler that looks at one top-level field of a JSON object. Without a document it
// keeps only the nesting depth, so memory does not grow with the payload. With one
// (`document` not null) it also builds the payload's document there, value by value, as
// nlohmann::json::parse does (a repeated key keeps its last value; the fuzzer checks the
// result against parse()): one pass both reads the id and parses the payload for the
// handler. That costs what a plain parse costs (16,300 instructions for a 130-byte
// credit), where parse() with a callback to count the key took 20,000.
class TopLevelField final : public nlohmann::json_sax<nlohmann::json> {
 public:
  enum class Found { kNo, kString, kOtherType, kTwice };

  TopLevelField(const std::string& name, nlohmann::json* document)
      : name_(name), document_(document) {}

  Found found = Found::kNo;
  std::string value;
  std::string error;

  bool null() override { return scalar("null", nullptr); }
  bool boolean(bool v) override { return scalar("a boolean", v); }
  bool number_integer(number_integer_t v) override { return scalar("a number", v); }
  bool number_unsigned(number_unsigned_t v) override { return scalar("a number", v); }
  bool number_float(number_float_t v, const string_t&) override { return scalar("a number", v); }
  bool string(string_t& s) override {
    if (at_field()) record(Found::kString, s);
    if (document_) add(std::move(s));
    return true;
  }
  bool binary(binary_t& b) override {  // not produced by JSON text; kept for completeness
    if (at_field()) record(Found::kOtherType, "binary");
    if (document_) add(nlohmann::json::binary(std::move(b)));
    return true;
  }
  bool start_object(std::size_t) override {
    if (at_field()) record(Found::kOtherType, "an object");
    open(nlohmann::json::value_t::object);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    if (at_field()) record(Found::kOtherType, "an array");
    open(nlohmann::json::value_t::array);
    return true;
  }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    expecting_value_ = depth_ == 1 && k == name_;
    if (document_) slot_ = &(*containers_.back())[k];  // std::map: the address stays put
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error = "at byte " + std::to_string(position) + ": " + e.what();
    if (document_) *document_ = nlohmann::json(nlohmann::json::value_t::discarded);
    return false;
  }

 private:
  bool at_field() const { return depth_ == 1 && expecting_value_; }
  template <typename V>
  bool scalar(const char* type, V&& v) {
    if (at_field()) record(Found::kOtherType, type);
    if (document_) add(std::forward<V>(v));
    return true;
  }
  void record(Found kind, const std::string& v) {
    expecting_value_ = false;
    if (found != Found::kNo) {
      found = Found::kTwice;
      return;
    }
    found = kind;
    value = v;
  }
  void open(nlohmann::json::value_t type) {
    ++depth_;
    expecting_value_ = false;
    if (document_) containers_.push_back(add(nlohmann::json(type)));
  }
  bool close() {
    --depth_;
    if (document_) containers_.pop_back();
    return true;
  }
  // Puts a value where the document expects the next one: the root, the end of the
  // innermost array, or the slot of the innermost object's last key. The containers
  // above stay where they are while an inner one is open (JSON nests strictly).
  template <typename V>
  nlohmann::json* add(V&& v) {
    if (containers_.empty()) {
      *document_ = nlohmann::json(std::forward<V>(v));
      return document_;
    }
    nlohmann::json& top = *containers_.back();
    if (top.is_array()) {
      top.emplace_back(std::forward<V>(v));
      return &top.back();
    }
    *slot_ = nlohmann::json(std::forward<V>(v));
    return slot_;
  }

  const std::string& name_;
  nlohmann::json* const document_;
  int depth_ = 0;
  bool expecting_value_ = false;
  std::vector<nlohmann::json*> containers_;  // the open objects and arrays, innermost last
  nlohmann::json* slot_ = nullptr;           // the innermost object's value for the last key
};

// What the JSON source says: the payload parsed or not, and the top-level field.
struct JsonFieldId {
  bool parsed = false;
  TopLevelField::Found found = TopLevelField::Found::kNo;
  std::string value;  // the string (kString) or its type ("a number", kOtherType)
  std::string error;  // why it did not parse
};

// The JSON source, read with the SAX handler; the payload's document goes to *document
// too when it is not null and the payload is no longer than json_document_max_bytes.
JsonFieldId read_json_field(const std::string& payload, const MessageIdOptions& options,
                            nlohmann::json* document) {
  const std::string& field = options.json_field;
  TopLevelField sax(field, payload.size() <= options.json_document_max_bytes ? document : nullptr);
  JsonFieldId out;
  out.parsed = nlohmann::json::sax_parse(payload, &sax, nlohmann::json::input_format_t::json,
                                         /*strict=*/true, /*ignore_comments=*/false);
  if (!out.parsed && document) *document = nlohmann::json(nlohmann::json::value_t::discarded);
  out.found = sax.found;
  out.value = std::move(sax.value);
  out.error = std::move(sax.error);
  return out;
}

bool fail(DeadLetterReason r, std::string text, DeadLetterReason* reason, std::string* why) {
  *reason = r;
  *why = std::move(text);
  return false;
}

bool accept(const std::string& candidate, const char* source, const MessageIdOptions& options,
            std::string* id, DeadLetterReason* reason, std::string* why) {
  std::string bad = validate_message_id(candidate, options.max_id_bytes);
  if (!bad.empty())
    return fail(DeadLetterReason::kInvalidId, std::string(source) + ": " + bad, reason, why);
  *id = candidate;
  return true;
}

// With both sources present, the message carries two ids unless they are equal: a hop
// that strips MQTT 5 properties (a 3.1.1 bridge) makes the consumer behind it see the
// JSON id, and the same message is then applied once under each id. Returns true when
// the JSON source is absent (no JSON, no such field) or holds the same string.
bool agrees_with_json_field(const Message& message, const MessageIdOptions& options,
                            const std::string& property_id, DeadLetterReason* reason,
                            std::string* why, nlohmann::json* document) {
  const JsonFieldId json = read_json_field(message.payload, options, document);
  if (!json.parsed || json.found == TopLevelField::Found::kNo) return true;
  if (json.found == TopLevelField::Found::kString && json.value == property_id) return true;
  std::string other;
  switch (json.found) {
    case TopLevelField::Found::kString:
      other = "'" + printable(json.value) + "'";
      break;
    case TopLevelField::Found::kTwice:
      other = "present more than once";
      break;
    default:
      other = json.value + ", not a string";
      break;
  }
  return fail(DeadLetterReason::kInvalidId,
              "message ids disagree: user property '" + options.user_property + "' is '" +
                  printable(property_id) + "' but JSON field '" + options.json_field + "' is " +
                  other +
                  "; a hop that drops MQTT 5 properties would see the other id and apply the "
                  "message twice (MessageIdOptions::on_disagreement)",
              reason, why);
}

}  // namespace

std::string validate_message_id(const std::string& id, size_t max_bytes) {
  if (id.empty()) return "message id is empty";
  if (id.size() > max_bytes)
    return "message id is " + std::to_string(id.size()) + " bytes, longer than " +
           std::to_string(max_bytes);
  if (!is_valid_utf8(id)) return "message id is not valid UTF-8: '" + printable(id) + "'";
  bool all_space = true;
  for (size_t i = 0; i < id.size(); ++i) {
    const auto c = static_cast<unsigned char>(id[i]);
    if (c < 0x20 || c == 0x7f)
      return "message id contains control character 0x" +
             std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 0xf];
    // C1 controls U+0080..U+009F are encoded as 0xC2 0x80..0x9F.
    if (c == 0xc2 && i + 1 < id.size() && static_cast<unsigned char>(id[i + 1]) <= 0x9f)
      return "message id contains a C1 control character";
    if (c != ' ' && c != '\t') all_space = false;
  }
  if (all_space) return "message id is only whitespace";
  return "";
}

bool extract_message_id(const Message& message, const MessageIdOptions& options, std::string* id,
                        DeadLetterReason* reason, std::string* why, nlohmann::json* document) {
  if (document) *document = nlohmann::json(nlohmann::json::value_t::discarded);
  // 1. MQTT 5 user property: present means it decides.
  if (!options.user_property.empty()) {
    int present = 0;
    for (const auto& p : message.user_properties) present += p.first == options.user_property;
    if (present > 1)
      return fail(DeadLetterReason::kInvalidId,
                  "user property '" + options.user_property + "' appears " +
                      std::to_string(present) + " times",
                  reason, why);
    if (const std::string* v = message.user_property(options.user_property)) {
      if (!accept(*v, ("user property '" + options.user_property + "'").c_str(), options, id,
                  reason, why))
        return false;
      if (options.json_field.empty() ||
          options.on_disagreement == IdDisagreement::kUserPropertyWins)
        return true;
      return agrees_with_json_field(message, options, *v, reason, why, document);
    }
  }

  // 2. Top-level field of a JSON object payload.
  std::string json_problem;
  if (!options.json_field.empty()) {
    const JsonFieldId json = read_json_field(message.payload, options, document);
    const std::string field = "JSON field '" + options.json_field + "'";
    if (!json.parsed) {
      json_problem = "payload is not valid JSON " + json.error;
    } else if (json.found == TopLevelField::Found::kString) {
      return accept(json.value, field.c_str(), options, id, reason, why);
    } else if (json.found == TopLevelField::Found::kTwice) {
      return fail(DeadLetterReason::kInvalidId, field + " appears more than once", reason, why);
    } else if (json.found == TopLevelField::Found::kOtherType) {
      return fail(DeadLetterReason::kInvalidId, field + " is not a string", reason, why);
    }
  }

  // 3. The application's extractor.
  if (options.extractor) {
    try {
      if (std::optional<std::string> v = options.extractor(message))
        return accept(*v, "extractor", options, id, reason, why);
    } catch (const std::exception& e) {
      return fail(DeadLetterReason::kUndecodablePayload,
                  std::string("message id extractor threw: ") + e.what(), reason, why);
    } catch (...) {
      return fail(DeadLetterReason::kUndecodablePayload, "message id extractor threw", reason, why);
    }
  }

  if (!json_problem.empty())
    return fail(DeadLetterReason::kUndecodablePayload, "no message id: " + json_problem, reason,
                why);
  std::string sources;
  auto add = [&](const std::string& source) { sources += (sources.empty() ? "" : ", ") + source; };
  if (!options.user_property.empty()) add("user property '" + options.user_property + "'");
  if (!options.json_field.empty()) add("JSON field '" + options.json_field + "'");
  if (options.extractor) add("the extractor");
  return fail(DeadLetterReason::kMissingId, "no message id (looked in " + sources + ")", reason,
              why);
}

}  // namespace mqtt_inbox::detail

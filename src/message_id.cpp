#include "message_id.h"

#include <nlohmann/json.hpp>

#include "log.h"
#include "text.h"

namespace mqtt_inbox::detail {
namespace {

// SAX handler that looks at one top-level field of a JSON object and ignores the rest.
// It keeps only the nesting depth, so memory does not grow with the document.
class TopLevelField final : public nlohmann::json_sax<nlohmann::json> {
 public:
  enum class Found { kNo, kString, kOtherType, kTwice };

  explicit TopLevelField(const std::string& name) : name_(name) {}

  Found found = Found::kNo;
  std::string value;
  bool top_is_object = false;
  std::string error;

  bool null() override { return scalar("null"); }
  bool boolean(bool) override { return scalar("a boolean"); }
  bool number_integer(number_integer_t) override { return scalar("a number"); }
  bool number_unsigned(number_unsigned_t) override { return scalar("a number"); }
  bool number_float(number_float_t, const string_t&) override { return scalar("a number"); }
  bool string(string_t& s) override {
    if (at_field()) record(Found::kString, s);
    return true;
  }
  bool binary(binary_t&) override { return scalar("binary"); }
  bool start_object(std::size_t) override {
    if (depth_ == 0) top_is_object = true;
    if (at_field()) record(Found::kOtherType, "an object");
    ++depth_;
    expecting_value_ = false;
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    if (at_field()) record(Found::kOtherType, "an array");
    ++depth_;
    expecting_value_ = false;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    expecting_value_ = depth_ == 1 && k == name_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error = "at byte " + std::to_string(position) + ": " + e.what();
    return false;
  }

 private:
  bool at_field() const { return depth_ == 1 && expecting_value_; }
  bool scalar(const char* type) {
    if (at_field()) record(Found::kOtherType, type);
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

  const std::string& name_;
  int depth_ = 0;
  bool expecting_value_ = false;
};

// What the JSON source says: the payload parsed or not, and the top-level field.
struct JsonFieldId {
  bool parsed = false;
  TopLevelField::Found found = TopLevelField::Found::kNo;
  std::string value;  // the string (kString) or its type ("a number", kOtherType)
  std::string error;  // why it did not parse
};

// The type of a JSON value in the words of the SAX reading above.
const char* type_words(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::binary: return "binary";
    default: return "a string";
  }
}

JsonFieldId read_json_field_sax(const std::string& payload, const std::string& field) {
  TopLevelField sax(field);
  JsonFieldId out;
  out.parsed = nlohmann::json::sax_parse(payload, &sax, nlohmann::json::input_format_t::json,
                                         /*strict=*/true, /*ignore_comments=*/false);
  out.found = sax.found;
  out.value = std::move(sax.value);
  out.error = std::move(sax.error);
  return out;
}

// The same reading as the SAX one, on a document that is kept: the payload is parsed
// into *document, and the field's occurrences at the top level are counted while it is
// (the finished document keeps only the last of two equal keys). A payload the parser
// refuses is read again by the SAX parser, whose report names the byte: refusals cost
// two parses, and both readings say the same.
JsonFieldId read_json_field_into(const std::string& payload, const std::string& field,
                                 nlohmann::json* document) {
  int occurrences = 0;
  try {
    *document = nlohmann::json::parse(
        payload,
        [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
              parsed.get_ref<const std::string&>() == field)
            ++occurrences;
          return true;
        },
        /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception&) {
    *document = nlohmann::json(nlohmann::json::value_t::discarded);
    return read_json_field_sax(payload, field);
  }
  JsonFieldId out;
  out.parsed = true;
  if (!document->is_object() || occurrences == 0) return out;
  if (occurrences > 1) {
    out.found = TopLevelField::Found::kTwice;
    return out;
  }
  const nlohmann::json& v = *document->find(field);
  if (v.is_string()) {
    out.found = TopLevelField::Found::kString;
    out.value = v.get<std::string>();
  } else {
    out.found = TopLevelField::Found::kOtherType;
    out.value = type_words(v);
  }
  return out;
}

// The JSON source: parsed into *document when the caller keeps the parse (and the
// payload is short enough), else read with the SAX handler.
JsonFieldId read_json_field(const std::string& payload, const std::string& field,
                            nlohmann::json* document) {
  if (document && payload.size() <= kMaxDocumentPayloadBytes)
    return read_json_field_into(payload, field, document);
  return read_json_field_sax(payload, field);
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
  const JsonFieldId json = read_json_field(message.payload, options.json_field, document);
  if (!json.parsed || json.found == TopLevelField::Found::kNo) return true;
  if (json.found == TopLevelField::Found::kString && json.value == property_id) return true;
  std::string other;
  switch (json.found) {
    case TopLevelField::Found::kString: other = "'" + printable(json.value) + "'"; break;
    case TopLevelField::Found::kTwice: other = "present more than once"; break;
    default: other = json.value + ", not a string"; break;
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

bool extract_message_id(const Message& message, const MessageIdOptions& options,
                        std::string* id, DeadLetterReason* reason, std::string* why,
                        nlohmann::json* document) {
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
    const JsonFieldId json = read_json_field(message.payload, options.json_field, document);
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
      return fail(DeadLetterReason::kUndecodablePayload, "message id extractor threw", reason,
                  why);
    }
  }

  if (!json_problem.empty())
    return fail(DeadLetterReason::kUndecodablePayload,
                "no message id: " + json_problem, reason, why);
  std::string sources;
  auto add = [&](const std::string& source) { sources += (sources.empty() ? "" : ", ") + source; };
  if (!options.user_property.empty()) add("user property '" + options.user_property + "'");
  if (!options.json_field.empty()) add("JSON field '" + options.json_field + "'");
  if (options.extractor) add("the extractor");
  return fail(DeadLetterReason::kMissingId, "no message id (looked in " + sources + ")", reason,
              why);
}

}  // namespace mqtt_inbox::detail

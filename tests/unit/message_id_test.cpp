// Message-id extraction from untrusted input: sources, precedence, and every way an id
// can be unusable. Pure functions; no database.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "inbox/message_id.h"

namespace mqtt_inbox::detail {
namespace {

struct Result {
  bool ok;
  std::string id;
  DeadLetterReason reason;
  std::string why;
};

// Extracts the id twice: reading the JSON source with the SAX parser (no document), and
// parsing it into the document a Consumer hands its handler (Delivery::payload_json).
// Both readings must give the same outcome, so every case below checks both. The
// document, when kept, is the payload as nlohmann::json::parse reads it.
Result extract(const std::string& payload,
               std::vector<std::pair<std::string, std::string>> props = {},
               MessageIdOptions o = {}) {
  Message m;
  m.topic = "t";
  m.payload = payload;
  m.user_properties = std::move(props);
  Result r{};
  r.ok = extract_message_id(m, o, &r.id, &r.reason, &r.why);
  Result d{};
  nlohmann::json document;
  d.ok = extract_message_id(m, o, &d.id, &d.reason, &d.why, &document);
  EXPECT_EQ(d.ok, r.ok) << payload;
  EXPECT_EQ(d.id, r.id) << payload;
  if (!r.ok) {
    EXPECT_EQ(d.reason, r.reason) << payload;
    EXPECT_EQ(d.why, r.why) << payload;
  }
  // (nlohmann's operator== recurses: not for the deeply nested cases.)
  if (!document.is_discarded() && payload.size() < 4096) {
    EXPECT_EQ(document, nlohmann::json::parse(payload)) << payload;
  }
  return r;
}

TEST(MessageId, UserPropertyComesFirst) {
  const Result r = extract(R"({"account":"a"})", {{"message-id", "from-prop"}});
  ASSERT_TRUE(r.ok) << r.why;
  EXPECT_EQ(r.id, "from-prop");
  // An invalid property id is refused even when the JSON id is fine (no fall-through).
  EXPECT_FALSE(extract(R"({"message_id":"from-json"})", {{"message-id", ""}}).ok);
}

// Issue 12: a user property and a JSON field that both hold an id must agree. Otherwise
// a hop that drops MQTT 5 properties (a 3.1.1 bridge) sees the other id, and the message
// is applied once under each.
TEST(MessageId, DisagreeingSourcesAreInvalidWithBothValuesInTheReason) {
  const Result r = extract(R"({"message_id":"from-json"})", {{"message-id", "from-prop"}});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, DeadLetterReason::kInvalidId);
  EXPECT_NE(r.why.find("'from-prop'"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("'from-json'"), std::string::npos) << r.why;

  // Every way the JSON field can fail to agree: another string, another type, twice, or
  // a string that is not a valid id.
  for (const char* p :
       {R"({"message_id":42})", R"({"message_id":null})", R"({"message_id":"a","message_id":"a"})",
        R"({"message_id":" "})", R"({"message_id":"A"})"}) {
    const Result bad = extract(p, {{"message-id", "a"}});
    EXPECT_FALSE(bad.ok) << p;
    EXPECT_EQ(bad.reason, DeadLetterReason::kInvalidId) << p;
    EXPECT_NE(bad.why.find("disagree"), std::string::npos) << bad.why;
  }
  // Control bytes of the other id are escaped in the reason, like every logged id.
  const Result escaped = extract("{\"message_id\":\"x\\u0001y\"}", {{"message-id", "a"}});
  EXPECT_EQ(escaped.why.find('\x01'), std::string::npos) << escaped.why;
}

TEST(MessageId, AgreeingOrAbsentJsonIdKeepsThePropertyId) {
  EXPECT_EQ(extract(R"({"message_id":"same"})", {{"message-id", "same"}}).id, "same");
  EXPECT_EQ(extract(R"({"account":"a"})", {{"message-id", "p"}}).id, "p");       // no field
  EXPECT_EQ(extract("\xff binary", {{"message-id", "p"}}).id, "p");              // not JSON
  EXPECT_EQ(extract(R"([{"message_id":"x"}])", {{"message-id", "p"}}).id, "p");  // not top level
  MessageIdOptions no_json;
  no_json.json_field = "";
  EXPECT_EQ(extract(R"({"message_id":"x"})", {{"message-id", "p"}}, no_json).id, "p");
}

TEST(MessageId, PropertyWinsOnlyWhenExplicitlyAsked) {
  MessageIdOptions o;
  o.on_disagreement = IdDisagreement::kUserPropertyWins;
  const Result r = extract(R"({"message_id":"from-json"})", {{"message-id", "from-prop"}}, o);
  ASSERT_TRUE(r.ok) << r.why;
  EXPECT_EQ(r.id, "from-prop");
}

TEST(MessageId, PresentButInvalidPropertyDoesNotFallThrough) {
  const Result r = extract(R"({"message_id":"from-json"})", {{"message-id", " "}});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, DeadLetterReason::kInvalidId);
}

TEST(MessageId, TopLevelJsonFieldOnly) {
  EXPECT_EQ(extract(R"({"a":{"message_id":"nested"},"message_id":"top"})").id, "top");
  const Result nested = extract(R"({"a":{"message_id":"nested"}})");
  EXPECT_FALSE(nested.ok);
  EXPECT_EQ(nested.reason, DeadLetterReason::kMissingId);
  EXPECT_EQ(extract(R"([{"message_id":"in-array"}])").reason, DeadLetterReason::kMissingId);
}

TEST(MessageId, WrongJsonTypesAreInvalid) {
  for (const char* p :
       {R"({"message_id":42})", R"({"message_id":null})", R"({"message_id":true})",
        R"({"message_id":{}})", R"({"message_id":["x"]})", R"({"message_id":1.5})"}) {
    const Result r = extract(p);
    EXPECT_FALSE(r.ok) << p;
    EXPECT_EQ(r.reason, DeadLetterReason::kInvalidId) << p;
  }
}

TEST(MessageId, AmbiguousDuplicateKeyIsInvalid) {
  const Result r = extract(R"({"message_id":"a","message_id":"b"})");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, DeadLetterReason::kInvalidId);
  const Result twice = extract("{}", {{"message-id", "a"}, {"message-id", "b"}});
  EXPECT_FALSE(twice.ok);
  EXPECT_EQ(twice.reason, DeadLetterReason::kInvalidId);
}

TEST(MessageId, UndecodablePayloads) {
  for (const std::string& p :
       {std::string(""), std::string("{"), std::string("{\"message_id\":\"abc"),
        std::string("\xff\xfe"), std::string("nope")}) {
    const Result r = extract(p);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.reason, DeadLetterReason::kUndecodablePayload) << p;
  }
}

TEST(MessageId, ValidationRules) {
  EXPECT_EQ(validate_message_id("abc-123", 256), "");
  EXPECT_EQ(validate_message_id("ünïcode-✓", 256), "");
  EXPECT_NE(validate_message_id("", 256), "");
  EXPECT_NE(validate_message_id(" \t ", 256), "");
  EXPECT_NE(validate_message_id(std::string(257, 'a'), 256), "");
  EXPECT_EQ(validate_message_id(std::string(256, 'a'), 256), "");
  EXPECT_NE(validate_message_id("a\nb", 256), "");
  EXPECT_NE(validate_message_id(std::string("a\0b", 3), 256), "");
  EXPECT_NE(validate_message_id("a\x7f", 256), "");
  EXPECT_NE(validate_message_id("a\xc2\x85", 256), "");     // U+0085, a C1 control
  EXPECT_NE(validate_message_id("\xc0\xaf", 256), "");      // overlong
  EXPECT_NE(validate_message_id("\xed\xa0\x80", 256), "");  // surrogate
  EXPECT_NE(validate_message_id("\xff", 256), "");
}

TEST(MessageId, SeveralKibLongIdIsInvalidNotTruncated) {
  const std::string id(4096, 'k');
  const Result r = extract("{}", {{"message-id", id}});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, DeadLetterReason::kInvalidId);
}

TEST(MessageId, ExtractorIsTheLastSource) {
  MessageIdOptions o;
  o.json_field.clear();
  o.extractor = [](const Message& m) -> std::optional<std::string> {
    if (m.topic == "t") return std::string("from-extractor");
    return std::nullopt;
  };
  EXPECT_EQ(extract("binary\x01payload", {}, o).id, "from-extractor");
  o.extractor = [](const Message&) -> std::optional<std::string> {
    throw std::runtime_error("cannot decode");
  };
  const Result r = extract("x", {}, o);
  EXPECT_EQ(r.reason, DeadLetterReason::kUndecodablePayload);
  EXPECT_NE(r.why.find("cannot decode"), std::string::npos);
}

TEST(MessageId, DeeplyNestedJsonDoesNotExhaustMemoryOrStack) {
  // Past the document limit: read with the SAX parser only, memory bounded by the depth.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const Result r = extract(deep);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, DeadLetterReason::kMissingId);
  // At the limit, the document is built: 32,768 nested arrays, parsed and destroyed
  // without recursion (a stack overflow would end the test with SIGSEGV).
  const size_t half = MessageIdOptions{}.json_document_max_bytes / 2;
  const std::string at_limit = std::string(half, '[') + std::string(half, ']');
  const Result l = extract(at_limit);
  EXPECT_EQ(l.reason, DeadLetterReason::kMissingId);
  Message m;
  m.payload = at_limit;
  nlohmann::json document;
  std::string id, why;
  DeadLetterReason reason{};
  EXPECT_FALSE(extract_message_id(m, {}, &id, &reason, &why, &document));
  ASSERT_TRUE(document.is_array());  // built, 32,768 levels deep
  size_t depth = 0;
  for (const nlohmann::json* v = &document; v->is_array() && !v->empty(); v = &(*v)[0]) ++depth;
  EXPECT_EQ(depth, half - 1);
}

// The document a Consumer hands its handler: the payload's parse when the id came from
// its JSON field, nothing when the id came from elsewhere or the payload is too long.
TEST(MessageId, TheDocumentIsKeptOnlyWhenTheJsonSourceParsedThePayload) {
  Message m;
  m.topic = "t";
  m.payload = R"({"message_id":"a-1","account":"acct","amount":5})";
  MessageIdOptions o;
  std::string id, why;
  DeadLetterReason reason{};
  nlohmann::json document;
  ASSERT_TRUE(extract_message_id(m, o, &id, &reason, &why, &document)) << why;
  EXPECT_EQ(document.at("amount"), 5);
  EXPECT_EQ(document.at("account"), "acct");

  // The id from the user property alone (no JSON field configured): not parsed.
  m.user_properties = {{"message-id", "a-1"}};
  o.json_field.clear();
  ASSERT_TRUE(extract_message_id(m, o, &id, &reason, &why, &document)) << why;
  EXPECT_TRUE(document.is_discarded());
  // Checked against the JSON field (on_disagreement kDeadLetter, the default): parsed.
  o = MessageIdOptions{};
  ASSERT_TRUE(extract_message_id(m, o, &id, &reason, &why, &document)) << why;
  EXPECT_EQ(document.at("amount"), 5);

  // A valid payload just over the limit keeps no document; the id is read all the same.
  m.user_properties.clear();
  m.payload = R"({"message_id":"a-1","pad":")" +
              std::string(MessageIdOptions{}.json_document_max_bytes, 'x') + R"("})";
  ASSERT_TRUE(extract_message_id(m, o, &id, &reason, &why, &document)) << why;
  EXPECT_EQ(id, "a-1");
  EXPECT_TRUE(document.is_discarded());
  // Not JSON: no document, and the reason as without one.
  m.payload = "{\"message_id\":";
  EXPECT_FALSE(extract_message_id(m, o, &id, &reason, &why, &document));
  EXPECT_TRUE(document.is_discarded());
}

// The document built while the id is read is the payload as parse() reads it, for every
// kind of value and nesting: containers inside arrays and objects, empty ones, repeated
// keys (the last wins, as in parse()), escapes, and every number type.
TEST(MessageId, TheDocumentIsWhatParseReads) {
  for (const std::string& p :
       {std::string(R"({"message_id":"d-1","a":[1,-2,3.5,true,false,null,"s",{"k":[[]]},[{}]],)"
                    R"("o":{"x":{"y":{"z":[0,{"w":"v"}]}},"x":2},"u":18446744073709551615,)"
                    R"("e":"\u00e9\n\"\\","n":-0.0,"big":1e300,"empty":{},"list":[]})"),
        std::string(R"({"message_id":"d-2","dup":1,"dup":[2],"dup":{"last":true}})"),
        std::string(R"({"message_id":"d-3"})")}) {
    const Result r = extract(p);  // compares the document with parse(p) when one is built
    EXPECT_TRUE(r.ok) << r.why;
    Message m;
    m.payload = p;
    nlohmann::json document;
    std::string id, why;
    DeadLetterReason reason{};
    ASSERT_TRUE(extract_message_id(m, {}, &id, &reason, &why, &document)) << why;
    ASSERT_FALSE(document.is_discarded()) << p;  // one was built
    EXPECT_EQ(document, nlohmann::json::parse(p));
  }
  // json_document_max_bytes 0: the id is read, no document is built.
  MessageIdOptions none;
  none.json_document_max_bytes = 0;
  Message m;
  m.payload = R"({"message_id":"d-4","a":1})";
  nlohmann::json document;
  std::string id, why;
  DeadLetterReason reason{};
  ASSERT_TRUE(extract_message_id(m, none, &id, &reason, &why, &document)) << why;
  EXPECT_EQ(id, "d-4");
  EXPECT_TRUE(document.is_discarded());
}

// A number the parser cannot hold is refused the same way by both readings.
TEST(MessageId, NumberOverflowIsUndecodableEitherWay) {
  const Result r = extract(R"({"message_id":"a","x":1e400})");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, DeadLetterReason::kUndecodablePayload);
}

}  // namespace
}  // namespace mqtt_inbox::detail

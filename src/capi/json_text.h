// The JSON texts the C API hands out (c.h: stats, health, dead letters), written as text
// rather than through an nlohmann::json document: destroying a document that holds an
// array or object allocates (nlohmann flattens it onto a heap stack in its noexcept
// destructor), so a std::bad_alloc while one was being built ended in std::terminate
// instead of MQTT_INBOX_NOMEM (tests/capi/nomem_test.c found it). Strings go through
// nlohmann's escaping, a lone string value, whose destructor does not allocate.
#pragma once

#include <cstdint>
#include <string>

#include "capi/errors.h"
#include "mqtt_inbox/health.h"

namespace mqtt_inbox::capi {

// One JSON object, field by field, in the order given. Keys are the caller's literals
// (not escaped); string values are escaped, bytes that are not UTF-8 replaced by U+FFFD.
class JsonObject {
 public:
  JsonObject& text(const char* key, const std::string& value);
  JsonObject& null(const char* key);
  JsonObject& number(const char* key, int64_t value);
  JsonObject& real(const char* key, double value);
  JsonObject& flag(const char* key, bool value);
  // `json` is already a JSON value (an object or array built the same way).
  JsonObject& raw(const char* key, const std::string& json);
  // The same under a key that is data (a consumer name, a topic prefix): escaped.
  JsonObject& raw_at(const std::string& key, const std::string& json);
  // The object's text; the object is done.
  std::string done();

 private:
  void key(const char* k);
  std::string out_ = "{";
};

// "level" ("green", "amber", "red") and every field of `h`.
std::string health_json(const Health& h);

// *out = `text` in memory from malloc; MQTT_INBOX_NOMEM (recorded in `err`) if it cannot
// be allocated.
int hand_out_json(const std::string& text, LastError* err, char** out);

}  // namespace mqtt_inbox::capi

#include "inbox/properties_json.h"

#include <nlohmann/json.hpp>

#include "util/text.h"

namespace mqtt_inbox::detail {
namespace {

// Bytes that may not be UTF-8 go into JSON as {"hex": "..."} so nothing is lost or
// replaced (nlohmann::json refuses invalid UTF-8 when dumping).
nlohmann::json json_bytes(const std::string& s) {
  if (detail::is_valid_utf8(s)) return s;
  return nlohmann::json{{"hex", detail::to_hex(s)}};
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Inverse of json_bytes; anything else (a hand-edited row) reads as "".
std::string from_json_bytes(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (!j.is_object()) return "";
  const auto it = j.find("hex");
  if (it == j.end() || !it->is_string()) return "";
  const std::string& hex = it->get_ref<const std::string&>();
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    const int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return "";
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

}  // namespace

std::string properties_json(const MessageProperties& m, bool dup) {
  nlohmann::json j = nlohmann::json::object();
  if (!m.user_properties.empty()) {
    nlohmann::json ups = nlohmann::json::array();
    for (const auto& p : m.user_properties)
      ups.push_back(nlohmann::json::array({json_bytes(p.first), json_bytes(p.second)}));
    j["user_properties"] = std::move(ups);
  }
  if (m.content_type) j["content_type"] = json_bytes(*m.content_type);
  if (m.response_topic) j["response_topic"] = json_bytes(*m.response_topic);
  if (m.correlation_data) j["correlation_data"] = json_bytes(*m.correlation_data);
  if (m.payload_format_indicator) j["payload_format_indicator"] = *m.payload_format_indicator;
  if (m.message_expiry_interval_s) j["message_expiry_interval_s"] = *m.message_expiry_interval_s;
  if (dup) j["dup"] = true;
  return j.dump();
}

// Rebuilds the Message a dead letter was made from (for replay).
Message message_from_dead_letter(const DeadLetter& dl) {
  Message m;
  read_properties_json(dl.properties_json, &m);
  m.topic = dl.topic;
  m.payload = dl.payload;
  m.qos = dl.qos;
  return m;
}

void read_properties_json(const std::string& json, MessageProperties* out, bool* dup) {
  MessageProperties& m = *out;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_object()) return;
  if (auto it = j.find("user_properties"); it != j.end() && it->is_array())
    for (const auto& p : *it)
      if (p.is_array() && p.size() == 2)
        m.user_properties.emplace_back(from_json_bytes(p[0]), from_json_bytes(p[1]));
  if (auto it = j.find("content_type"); it != j.end()) m.content_type = from_json_bytes(*it);
  if (auto it = j.find("response_topic"); it != j.end()) m.response_topic = from_json_bytes(*it);
  if (auto it = j.find("correlation_data"); it != j.end())
    m.correlation_data = from_json_bytes(*it);
  if (auto it = j.find("payload_format_indicator");
      it != j.end() && it->is_number_unsigned() && it->get<uint64_t>() <= 0xff)
    m.payload_format_indicator = static_cast<uint8_t>(it->get<uint64_t>());
  if (auto it = j.find("message_expiry_interval_s");
      it != j.end() && it->is_number_unsigned() && it->get<uint64_t>() <= 0xffffffffULL)
    m.message_expiry_interval_s = static_cast<uint32_t>(it->get<uint64_t>());
  if (auto it = j.find("dup"); dup && it != j.end() && it->is_boolean()) *dup = it->get<bool>();
}

}  // namespace mqtt_inbox::detail

#include "util/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace mqtt_inbox::detail {

std::shared_ptr<spdlog::logger> logger_or_default(std::shared_ptr<spdlog::logger> supplied) {
  if (supplied) return supplied;
  static const std::shared_ptr<spdlog::logger> fallback = [] {
    if (auto existing = spdlog::get("mqtt_inbox")) return existing;
    try {
      return spdlog::stderr_color_mt("mqtt_inbox");
    } catch (const spdlog::spdlog_ex&) {  // registered concurrently by someone else
      return spdlog::get("mqtt_inbox");
    }
  }();
  return fallback;
}

std::string printable(std::string_view bytes, size_t max_bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = bytes.size() < max_bytes ? bytes.size() : max_bytes;
  out.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  if (n < bytes.size()) out += "...";
  return out;
}

}  // namespace mqtt_inbox::detail

// The admin tool's output formatting (see format.h).
#include "format.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iostream>

namespace mqtt_inbox::cli {

std::string iso(int64_t ms) {
  if (ms <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string human_ms(int64_t ms) {
  char buf[48];
  const double a = static_cast<double>(ms < 0 ? -ms : ms);
  if (a >= 86400000.0 && ms % 3600000 == 0)
    std::snprintf(
        buf, sizeof buf, "%lldd%s", static_cast<long long>(ms / 86400000),
        ms % 86400000 ? (" " + std::to_string(ms % 86400000 / 3600000) + "h").c_str() : "");
  else if (a >= 86400000.0)
    std::snprintf(buf, sizeof buf, "%.1fd", ms / 86400000.0);
  else if (a >= 3600000.0)
    std::snprintf(buf, sizeof buf, "%.1fh", ms / 3600000.0);
  else if (a >= 60000.0)
    std::snprintf(buf, sizeof buf, "%.1fm", ms / 60000.0);
  else
    std::snprintf(buf, sizeof buf, "%.1fs", ms / 1000.0);
  return buf;
}

std::string human_bytes(int64_t b) {
  char buf[48];
  if (b >= 1 << 20)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else if (b >= 1 << 10)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  return buf;
}

bool is_utf8_text(const std::string& s) {
  return detail::is_valid_utf8(s) && std::none_of(s.begin(), s.end(), [](char c) {
           return static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t' && c != '\r';
         });
}

std::string json_text(const std::string& s) {
  return detail::is_valid_utf8(s) ? s : printable(s, s.size());
}

void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size());
  for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string cell = i < r.size() ? r[i] : "";
      out += cell;
      if (i + 1 < w.size()) out += std::string(w[i] - cell.size() + 2, ' ');
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    std::cout << out << "\n";
  };
  line(header);
  std::vector<std::string> dashes;
  for (size_t x : w) dashes.push_back(std::string(x, '-'));
  line(dashes);
  for (const auto& r : rows) line(r);
}

void print_kv(const std::vector<std::pair<std::string, std::string>>& kv) {
  size_t w = 0;
  for (const auto& p : kv) w = std::max(w, p.first.size());
  for (const auto& p : kv)
    std::cout << p.first << std::string(w - p.first.size() + 2, ' ') << p.second << "\n";
}

void emit(const json& j) { std::cout << j.dump(2) << std::endl; }

}  // namespace mqtt_inbox::cli

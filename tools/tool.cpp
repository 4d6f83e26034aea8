// The admin tool's globals, its confirmation prompt and the parsing of durations and times
// (see tool.h).
#include "tool.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>

#include <unistd.h>

namespace mqtt_inbox::cli {

Globals g;

int64_t wall_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool confirm(const std::string& question, bool yes) {
  if (yes) return true;
  if (!isatty(STDIN_FILENO))
    fail(kRefused,
         "refused: " + question + " needs confirmation; stdin is not a terminal, pass --yes");
  std::cerr << question << " [y/N] " << std::flush;
  std::string answer;
  std::getline(std::cin, answer);
  return answer == "y" || answer == "Y" || answer == "yes";
}

bool parse_duration(const std::string& text, int64_t* out) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 15) return false;
  const int64_t n = std::stoll(text.substr(0, i));
  const std::string unit = text.substr(i);
  int64_t mul = 0;
  if (unit == "ms")
    mul = 1;
  else if (unit == "s")
    mul = 1000;
  else if (unit == "m")
    mul = 60 * 1000;
  else if (unit == "h")
    mul = 3600 * 1000;
  else if (unit == "d")
    mul = 24LL * 3600 * 1000;
  else
    return false;
  *out = n * mul;
  return true;
}

int64_t duration_or_usage(const std::string& text, const char* what) {
  int64_t ms = 0;
  if (!parse_duration(text, &ms))
    fail(kUsage, std::string(what) + ": '" + text + "' is not a duration (e.g. 90s, 15m, 8h, 7d)");
  return ms;
}

int64_t parse_time(const std::string& text, int64_t now_ms, const char* what) {
  if (!text.empty() && std::all_of(text.begin(), text.end(), ::isdigit)) return std::stoll(text);
  int64_t d = 0;
  if (parse_duration(text, &d)) return now_ms - d;
  std::tm tm{};
  int y = 0, mo = 0, da = 0, h = 0, mi_ = 0, s = 0;
  const int n = std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d", &y, &mo, &da, &h, &mi_, &s);
  if (n >= 3 && y >= 1970 && mo >= 1 && mo <= 12 && da >= 1 && da <= 31) {
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = da;
    tm.tm_hour = n >= 4 ? h : 0;
    tm.tm_min = n >= 5 ? mi_ : 0;
    tm.tm_sec = n >= 6 ? s : 0;
    const int64_t wall = static_cast<int64_t>(timegm(&tm)) * 1000;
    return wall + (now_ms - wall_now_ms());
  }
  fail(kUsage, std::string(what) + ": '" + text +
                   "' is not a time (ms, a duration ago like 2h, or 2024-05-01T12:00:00Z)");
}

}  // namespace mqtt_inbox::cli

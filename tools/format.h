// The admin tool's output: tables and key/value lists for a terminal, JSON documents,
// times, durations and sizes for people, and untrusted bytes made safe for both.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/log.h"   // detail::printable: untrusted bytes for a terminal line
#include "util/text.h"  // detail::is_valid_utf8, detail::to_hex, detail::base64

namespace mqtt_inbox::cli {

using mqtt_inbox::detail::base64;
using mqtt_inbox::detail::printable;
using mqtt_inbox::detail::to_hex;
using nlohmann::json;

// UTC, "2024-05-01T12:00:00Z"; "-" for 0 or less (never happened).
std::string iso(int64_t ms);

// A duration for people: "7d", "7d 3h", "2.5d", "3.0h", "15.0m", "4.2s".
std::string human_ms(int64_t ms);

// A size for people: "512 B", "3.5 KiB", "1.2 MiB".
std::string human_bytes(int64_t bytes);

// A payload to print as text: valid UTF-8 without control characters other than
// newline, tab and carriage return.
bool is_utf8_text(const std::string& s);

// A text for JSON output: the string itself if valid UTF-8, else with \xNN escapes.
std::string json_text(const std::string& s);

// Columns padded to their widest cell, a line of dashes under the header.
void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows);

// "key  value" lines, the values aligned.
void print_kv(const std::vector<std::pair<std::string, std::string>>& kv);

// The --json output of a command: `j` indented by 2.
void emit(const json& j);

}  // namespace mqtt_inbox::cli

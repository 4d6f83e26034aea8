// Internal logging helpers. The library logs only through the logger the application
// supplied, or a logger named "mqtt_inbox"; never through spdlog's default logger.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>

namespace mqtt_inbox::detail {

// `supplied` if set, else the shared "mqtt_inbox" logger (stderr, created on first use).
std::shared_ptr<spdlog::logger> logger_or_default(std::shared_ptr<spdlog::logger> supplied);

// Sends what the shared "mqtt_inbox" logger writes to `sink` instead of stderr (nullptr:
// stderr again), for lines logged after it returns; the C API's log callback
// (c.h, mqtt_inbox_set_log_callback). Returns false, changing nothing, if the program
// registered a logger of that name itself before the library made one: that logger's
// sinks are the program's. Thread-safe.
bool set_default_sink(std::shared_ptr<spdlog::sinks::sink> sink);

// Makes untrusted bytes safe for a log line: printable ASCII kept, everything else as
// \xNN, cut to `max_bytes` of input with "..." appended. Raw payloads and ids may be
// anything, and a log line must never break (or inject lines) because of them.
std::string printable(std::string_view bytes, size_t max_bytes = 120);

}  // namespace mqtt_inbox::detail

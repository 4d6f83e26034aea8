#include "util/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace mqtt_inbox::detail {

namespace {

// The shared logger's one sink: stderr, or what set_default_sink put in its place. A
// logger's sink list cannot change while other threads log through it; this sink's
// target can.
class SwitchSink final : public spdlog::sinks::sink {
 public:
  SwitchSink() : stderr_(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()), to_(stderr_) {}
  void log(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    to_->log(msg);
  }
  void flush() override {
    std::lock_guard<std::mutex> lock(mu_);
    to_->flush();
  }
  void set_pattern(const std::string& pattern) override {
    std::lock_guard<std::mutex> lock(mu_);
    stderr_->set_pattern(pattern);
    if (to_ != stderr_) to_->set_pattern(pattern);
  }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override {
    std::lock_guard<std::mutex> lock(mu_);
    stderr_->set_formatter(std::move(f));
  }
  void point_to(std::shared_ptr<spdlog::sinks::sink> target) {
    std::lock_guard<std::mutex> lock(mu_);
    to_ = target ? std::move(target) : stderr_;
  }

 private:
  std::mutex mu_;
  const std::shared_ptr<spdlog::sinks::sink> stderr_;
  std::shared_ptr<spdlog::sinks::sink> to_;
};

}  // namespace

std::shared_ptr<spdlog::logger> logger_or_default(std::shared_ptr<spdlog::logger> supplied) {
  if (supplied) return supplied;
  static const std::shared_ptr<spdlog::logger> fallback = [] {
    if (auto existing = spdlog::get("mqtt_inbox")) return existing;
    auto made = std::make_shared<spdlog::logger>("mqtt_inbox", std::make_shared<SwitchSink>());
    try {
      // Registers it with the registry's level and pattern, as stderr_color_mt() did.
      spdlog::initialize_logger(made);
      return made;
    } catch (const spdlog::spdlog_ex&) {  // registered concurrently by someone else
      return spdlog::get("mqtt_inbox");
    }
  }();
  return fallback;
}

bool set_default_sink(std::shared_ptr<spdlog::sinks::sink> sink) {
  const std::shared_ptr<spdlog::logger> l = logger_or_default(nullptr);
  if (!l || l->sinks().size() != 1) return false;
  auto* s = dynamic_cast<SwitchSink*>(l->sinks().front().get());
  if (!s) return false;
  s->point_to(std::move(sink));
  return true;
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

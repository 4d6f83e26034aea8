// The C program's log callback (c.h, mqtt_inbox_set_log_callback): a sink that hands each
// line of the shared "mqtt_inbox" logger to a C function, switched in place of stderr
// (util/log.h, set_default_sink).
#include <spdlog/sinks/base_sink.h>

#include <memory>
#include <mutex>
#include <string>

#include "capi/errors.h"
#include "mqtt_inbox/c.h"
#include "util/log.h"

namespace {

static_assert(MQTT_INBOX_LOG_TRACE == spdlog::level::trace &&
                  MQTT_INBOX_LOG_DEBUG == spdlog::level::debug &&
                  MQTT_INBOX_LOG_INFO == spdlog::level::info &&
                  MQTT_INBOX_LOG_WARN == spdlog::level::warn &&
                  MQTT_INBOX_LOG_ERROR == spdlog::level::err &&
                  MQTT_INBOX_LOG_CRITICAL == spdlog::level::critical &&
                  MQTT_INBOX_LOG_OFF == spdlog::level::off,
              "c.h's log levels are spdlog's");

// base_sink's mutex makes the calls one at a time.
class CallbackSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  CallbackSink(mqtt_inbox_log_fn fn, void* ctx) : fn_(fn), ctx_(ctx) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string text(msg.payload.data(), msg.payload.size());
    fn_(ctx_, static_cast<int>(msg.level), text.c_str());
  }
  void flush_() override {}

 private:
  mqtt_inbox_log_fn fn_;
  void* ctx_;
};

}  // namespace

extern "C" {

int mqtt_inbox_set_log_callback(mqtt_inbox_log_fn fn, void* ctx, int min_level) {
  if (min_level < MQTT_INBOX_LOG_TRACE || min_level > MQTT_INBOX_LOG_OFF)
    return MQTT_INBOX_INVALID_ARGUMENT;
  return mqtt_inbox::capi::guarded(nullptr, [&] {
    std::shared_ptr<spdlog::sinks::sink> sink;
    if (fn) sink = std::make_shared<CallbackSink>(fn, ctx);
    if (!mqtt_inbox::detail::set_default_sink(std::move(sink))) return MQTT_INBOX_INVALID_ARGUMENT;
    mqtt_inbox::detail::logger_or_default(nullptr)->set_level(
        static_cast<spdlog::level::level_enum>(min_level));
    return MQTT_INBOX_OK;
  });
}

}  // extern "C"

// Thread-local structured log fields (util/log_context.h).
#include "util/log_context.h"

namespace mqtt_inbox::detail {

namespace {
thread_local LogContext current;
}  // namespace

const LogContext& log_context() { return current; }

LogContextScope::LogContextScope(const std::string& consumer) : saved_(current) {
  current.consumer = &consumer;
  current.message_id = nullptr;
}

LogContextScope::~LogContextScope() { current = saved_; }

void LogContextScope::set_message_id(const std::string& id) { current.message_id = &id; }

}  // namespace mqtt_inbox::detail

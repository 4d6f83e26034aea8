// The structured fields of the message a thread is working on, for log sinks that can
// record fields beside the text (the journal sink of service/journal_log.cpp: CONSUMER= and
// INBOX_MESSAGE_ID=). The per-message paths (Consumer::run, store-then-process receipt
// and workers) open a LogContextScope; a sink reads log_context() on the thread that
// logs, so it holds only for synchronous loggers (an async spdlog logger formats on
// another thread and sees no fields). Setting and reading are a thread-local pointer
// copy: no allocation, no lock.
#pragma once

#include <string>

namespace mqtt_inbox::detail {

struct LogContext {
  const std::string* consumer = nullptr;    // consumer name, or nullptr
  const std::string* message_id = nullptr;  // a validated message id, or nullptr
};

// The innermost scope's fields on this thread (both nullptr outside any scope).
const LogContext& log_context();

// Sets the consumer for this thread until destroyed, then restores the outer scope's
// fields. The strings must outlive the scope. Not copyable; stack use only.
class LogContextScope {
 public:
  explicit LogContextScope(const std::string& consumer);
  ~LogContextScope();
  LogContextScope(const LogContextScope&) = delete;
  LogContextScope& operator=(const LogContextScope&) = delete;
  // Adds the message id once it is known and valid.
  void set_message_id(const std::string& id);

 private:
  LogContext saved_;
};

}  // namespace mqtt_inbox::detail

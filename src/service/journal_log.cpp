// The service logger (journal_log.h): journal detection and the journal sink with the
// per-message fields of util/log_context.h.
//
// Built with libsystemd when MQTT_INBOX_HAVE_LIBSYSTEMD is 1; otherwise the journal is fed
// through stderr with "<N>" priority prefixes.
#include "mqtt_inbox/journal_log.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#if MQTT_INBOX_HAVE_LIBSYSTEMD
#include <spdlog/sinks/systemd_sink.h>
#endif

#include "util/log_context.h"

namespace mqtt_inbox {

namespace {

// syslog(3) priorities for spdlog levels: spdlog's systemd_sink table (trace and debug
// are LOG_DEBUG), used where that sink is not.
int syslog_priority(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
    case spdlog::level::debug:
      return 7;
    case spdlog::level::info:
      return 6;
    case spdlog::level::warn:
      return 4;
    case spdlog::level::err:
      return 3;
    case spdlog::level::critical:
      return 2;
    default:
      return 6;
  }
}

// The "%*" pattern flag: "<N>" for journald's stream parser (SyslogLevelPrefix=).
class PriorityPrefix final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const char text[4] = {'<', static_cast<char>('0' + syslog_priority(msg.level)), '>', '\0'};
    dest.append(text, text + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PriorityPrefix>();
  }
};

// A stderr sink whose lines journald parses: "<N>text".
spdlog::sink_ptr prefixed_stderr_sink() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<PriorityPrefix>('*').set_pattern("%*%v");
  sink->set_formatter(std::move(formatter));
  return sink;
}

#if MQTT_INBOX_HAVE_LIBSYSTEMD
// Where journald receives native-protocol entries (systemd-journald.service(8)).
constexpr const char* kJournalSocket = "/run/systemd/journal/socket";

// spdlog's systemd_sink (its level table and identifier), plus the fields of the message
// being handled on this thread. spdlog 1.10's sink sends a fixed set of fields, so this
// one builds the entry itself with sd_journal_sendv(3), which takes any bytes in a value.
class JournalSink final : public spdlog::sinks::systemd_sink<std::mutex> {
 public:
  explicit JournalSink(std::string ident) : systemd_sink(std::move(ident), false) {
    fallback_ = prefixed_stderr_sink();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const int priority = syslog_level(msg.level);
    const spdlog::string_view_t ident = ident_.empty() ? msg.logger_name : ident_;
    std::string message = "MESSAGE=";
    message.append(msg.payload.data(), msg.payload.size());
    std::string prio = "PRIORITY=" + std::to_string(priority);
    std::string id = "SYSLOG_IDENTIFIER=";
    id.append(ident.data(), ident.size());
    std::string consumer, message_id, code_file, code_line, code_func;
    std::vector<iovec> iov;
    auto add = [&iov](std::string& s) { iov.push_back({s.data(), s.size()}); };
    add(message);
    add(prio);
    add(id);
    const detail::LogContext& ctx = detail::log_context();
    if (ctx.consumer) {
      consumer = "CONSUMER=" + *ctx.consumer;
      add(consumer);
    }
    if (ctx.message_id) {
      message_id = "INBOX_MESSAGE_ID=" + *ctx.message_id;
      add(message_id);
    }
    if (!msg.source.empty()) {
      code_file = std::string("CODE_FILE=") + msg.source.filename;
      code_line = "CODE_LINE=" + std::to_string(msg.source.line);
      code_func = std::string("CODE_FUNC=") + msg.source.funcname;
      add(code_file);
      add(code_line);
      add(code_func);
    }
    if (sd_journal_sendv(iov.data(), static_cast<int>(iov.size())) < 0) fallback_->log(msg);
  }

 private:
  spdlog::sink_ptr fallback_;
};
#endif

}  // namespace

bool stderr_is_journal() {
  const char* v = std::getenv("JOURNAL_STREAM");
  if (!v || !*v) return false;
  uintmax_t dev = 0, ino = 0;
  int used = 0;
  if (std::sscanf(v, "%" SCNuMAX ":%" SCNuMAX "%n", &dev, &ino, &used) != 2 || v[used] != '\0')
    return false;
  struct stat st;
  if (::fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<uintmax_t>(st.st_dev) == dev && static_cast<uintmax_t>(st.st_ino) == ino;
}

Status make_service_logger(const std::string& name, const ServiceLoggerOptions& options,
                           std::shared_ptr<spdlog::logger>* out) {
  if (!out) return Status::InvalidArgument("out is null");
  if (name.empty()) return Status::InvalidArgument("logger name is empty");
  const spdlog::level::level_enum level = spdlog::level::from_str(options.level);
  if (level == spdlog::level::off && options.level != "off")
    return Status::InvalidArgument("unknown log level '" + options.level +
                                   "' (trace, debug, info, warn, error, critical, off)");
  try {
    spdlog::sink_ptr sink;
    if (stderr_is_journal()) {
#if MQTT_INBOX_HAVE_LIBSYSTEMD
      // sd_journal_sendv(3) drops entries silently when the socket is missing (ENOENT), so
      // a journal without its native socket gets the stream with priority prefixes.
      if (::access(kJournalSocket, W_OK) == 0)
        sink = std::make_shared<JournalSink>(options.identifier.empty()
                                                 ? std::string(program_invocation_short_name)
                                                 : options.identifier);
      else
        sink = prefixed_stderr_sink();
#else
      sink = prefixed_stderr_sink();
#endif
    } else {
      sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    }
    auto logger = std::make_shared<spdlog::logger>(name, std::move(sink));
    logger->set_level(level);
    *out = std::move(logger);
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cannot make the logger: ") + e.what());
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox

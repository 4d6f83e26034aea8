// Logging for a program that may run as a systemd service: to the journal with
// priorities and fields when standard error is the journal, to standard error otherwise.
// The library logs only to the logger an application passes it (options.h), so a program
// passes the logger made here to InboxOptions, SubscriberOptions and the other options.
//
// How "standard error is the journal" is detected (systemd.exec(5), JOURNAL_STREAM): when
// systemd connects a service's stdout or stderr to the journal it sets JOURNAL_STREAM to
// "<device>:<inode>" (decimal) of that stream. The stream is ours only if fstat(2) of
// fd 2 has that device and inode: a program started from a service's shell with
// `2>file`, or a unit with StandardError=file:..., inherits JOURNAL_STREAM but writes
// elsewhere, and a child of the service that redirected stderr must not upgrade either.
//
// Journal fields (journalctl -o verbose shows them; journalctl CONSUMER=ledger filters):
//   MESSAGE            the text (no time stamp or level: the journal records both)
//   PRIORITY           from the level: trace and debug 7, info 6, warn 4, error 3,
//                      critical 2 (spdlog's systemd_sink table; journalctl -p warning)
//   SYSLOG_IDENTIFIER  ServiceLoggerOptions::identifier (journalctl -t)
//   CONSUMER           the consumer (or store-then-process) name, on lines the library
//                      logs while it handles a message
//   INBOX_MESSAGE_ID   the producer's message id on those lines, once it was extracted
//                      and validated. Not MESSAGE_ID: journald reserves that field for a
//                      128-bit id of the kind of entry (systemd.journal-fields(7), the
//                      message catalog of journalctl -x).
// The fields come from the thread that logs, so they need a synchronous logger (the one
// made here is; an spdlog async logger would lose them).
//
// Thread safety: stderr_is_journal() and make_service_logger() are safe from any thread;
// the logger is an spdlog multi-threaded (_mt) logger.
#pragma once

#include <memory>
#include <string>

#include "mqtt_inbox/status.h"

namespace spdlog {
class logger;
}

namespace mqtt_inbox {

// True if fd 2 is the stream JOURNAL_STREAM names (see above). False when the variable is
// unset or malformed, or fd 2 is something else.
bool stderr_is_journal();

struct ServiceLoggerOptions {
  // Lowest level logged: "trace", "debug", "info", "warn" (or "warning"), "error" (or
  // "err"), "critical" or "off". Default "info".
  std::string level = "info";
  // SYSLOG_IDENTIFIER of journal entries. Default "" = the program's name
  // (program_invocation_short_name), which journald also gives the program's plain
  // stdout/stderr lines, so `journalctl -t <program>` finds both.
  std::string identifier;
};

// Makes a logger named `name`, not registered with spdlog (spdlog::get does not find it):
//  - stderr is the journal (stderr_is_journal()), the library was built with libsystemd
//    and journald's socket (/run/systemd/journal/socket) is there: entries through the
//    journal's native protocol (sd_journal_sendv(3)) with the fields above. An entry
//    sd_journal_sendv reports as not sent is written to stderr as below instead. (It
//    reports success when the socket has gone, and drops the entry; journald's socket is
//    held by systemd across journald restarts, so that means journald was removed.)
//  - stderr is the journal, without libsystemd or without that socket: plain lines with a
//    "<N>" priority prefix, which journald turns into PRIORITY (SyslogLevelPrefix=, on by
//    default); no fields.
//  - otherwise: stderr with spdlog's default pattern (time, logger, level), coloured on
//    a terminal.
// Errors: kInvalidArgument for an empty name or an unknown level. Never throws.
Status make_service_logger(const std::string& name, const ServiceLoggerOptions& options,
                           std::shared_ptr<spdlog::logger>* out);

}  // namespace mqtt_inbox

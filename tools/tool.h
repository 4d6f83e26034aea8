// The admin tool's shared vocabulary: its exit codes (docs/admin-tool.md), the error a
// command throws to main, the global flags, and the durations and times the commands
// accept on the command line.
#pragma once

#include <cstdint>
#include <string>

namespace mqtt_inbox::cli {

// Exit codes, as documented in docs/admin-tool.md and `mqtt-inbox --help`.
enum Exit {
  kOk = 0,
  kUsage = 1,
  kProblems = 2,
  kStoreError = 3,
  kRefused = 4,
  kSchema = 5,
  kUnsupported = 6,
  kBroker = 7,
  kNotFound = 8,
};

// Thrown by a command; main prints "mqtt-inbox: <message>" and exits with `code`.
struct ToolError {
  int code;
  std::string message;
};

[[noreturn]] inline void fail(int code, const std::string& message) {
  throw ToolError{code, message};
}

// The options given before the command (--json, --busy-timeout-ms, and for a PostgreSQL
// location --password-file and --pg-schema).
struct Globals {
  bool json = false;
  int busy_timeout_ms = 5000;
  std::string password_file;             // InboxOptions::postgres_password_file
  std::string pg_schema = "mqtt_inbox";  // InboxOptions::postgres_schema
};
extern Globals g;

int64_t wall_now_ms();

// Asks `question` with [y/N] on stderr and reads the answer from stdin; true at once if
// `yes` (--yes). Without a terminal on stdin (a script, ssh without -t) it refuses:
// fail(kRefused) saying to pass --yes.
bool confirm(const std::string& question, bool yes);

// "90s", "15m", "8h", "7d", "250ms" -> ms. Returns false if malformed.
bool parse_duration(const std::string& text, int64_t* out);

// parse_duration, or fail(kUsage) naming the option `what`.
int64_t duration_or_usage(const std::string& text, const char* what);

// A point in time on a clock whose "now" is `now_ms`:
//   all digits            -> that value, ms
//   a duration (2h, 7d)   -> now - duration ("2 hours ago" on that clock)
//   2024-05-01[THH:MM[:SS]][Z] -> UTC wall time; + (now - wall now) for the retention clock,
//                            which started at the wall clock but does not run while down.
// Anything else: fail(kUsage) naming the option `what`.
int64_t parse_time(const std::string& text, int64_t now_ms, const char* what);

}  // namespace mqtt_inbox::cli

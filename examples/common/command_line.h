// command_line: how every shipped program (the examples and the mqtt-inbox tool) ends a
// command line it cannot use, and the start-up checks of its topic options.
//
// CLI11 ends a parse error with codes of its own (105 for a failed check, 106 for a
// missing option, 109 for an unknown one, ...), which collide with nothing documented and
// mean nothing to a supervisor. A usage error is a configuration error: exit 1, which the
// shipped units list in RestartPreventExitStatus=
// (docs/operations.md#installing-and-starting-a-unit). --help exits 0.
#pragma once

#include <mqtt_inbox/topic.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

namespace command_line {

// Parses `argv` into `app`. Returns -1 to go on, or the code for main() to return: 0
// after --help (printed on stdout), 1 after a usage error, printed on stderr as
// "<program>: <why>" with a hint to --help.
inline int parse(CLI::App& app, int argc, char** argv, const char* program) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help: CLI11 prints it
      (void)app.exit(e);
      return 0;
    }
    std::fprintf(stderr, "%s: %s\nRun with --help for the options.\n", program, e.what());
    return 1;
  }
}

// A check for an option holding a topic name to publish to (mqtt_inbox::check_topic_name):
// a wildcard, an empty topic, U+0000 or invalid UTF-8 would otherwise fail every message
// (an outbox refusal, a publish the broker drops) instead of the start.
inline CLI::Validator topic_name() {
  return CLI::Validator(
      [](std::string& topic) {
        const auto s = mqtt_inbox::check_topic_name(topic, "topic");
        return s.ok() ? std::string() : s.message();
      },
      "TOPIC", "topic name");
}

// Likewise for a topic filter to subscribe to (mqtt_inbox::check_topic_filter).
inline CLI::Validator topic_filter() {
  return CLI::Validator(
      [](std::string& filter) {
        const auto s = mqtt_inbox::check_topic_filter(filter, "topic filter");
        return s.ok() ? std::string() : s.message();
      },
      "FILTER", "topic filter");
}

}  // namespace command_line

// Paho C's trace, process-wide (connection.h): the library turns Paho's always-on
// in-memory trace down to errors when it makes its first client (about a sixth of the
// receive thread's instructions per message, docs/benchmarks.md), and leaves it alone
// when the user asks Paho for its trace with MQTT_C_CLIENT_TRACE or
// MQTT_C_CLIENT_TRACE_LEVEL. Each case runs a consumer as a child
// process (support/paho_trace_child.cpp), so that the process-wide setting starts fresh,
// against a real mosquitto, with real messages.
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include "support/ledger_fixture.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

class PahoTraceTest : public ::testing::Test {
 protected:
  // Runs the child until it has processed `count` credits published meanwhile; returns
  // its stdout. `env` is put in front of the command (env VAR=value ...).
  std::string run_child(int count, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv{"/usr/bin/env"};
    argv.insert(argv.end(), env.begin(), env.end());
    const std::string db = dir_.file("trace-" + std::to_string(++runs_) + ".db");
    const std::string topic = "credits/trace/" + std::to_string(runs_);
    argv.insert(argv.end(), {built_program("paho_trace_child"), db, broker_.uri(), topic,
                             std::to_string(count)});
    const std::string log = dir_.file("child-" + std::to_string(runs_) + ".log");
    Child child(with_emulator(argv), log);
    // The child subscribes on a new session: publish once it holds the filter.
    EXPECT_TRUE(wait_until([&] { return read(log).find("consuming: ") != std::string::npos; },
                           std::chrono::seconds(20)))
        << read(log);
    TestPublisher pub(broker_.uri());
    for (int i = 0; i < count; ++i)
      pub.credit(topic, "t-" + std::to_string(runs_) + "-" + std::to_string(i), "a", 1);
    const int st = child.wait(std::chrono::seconds(40));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st << "\n" << read(log);
    EXPECT_EQ(query_int(db, "SELECT count(*) FROM ledger_entries"), count);
    return read(log);
  }

  static std::string read(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  TempDir dir_;
  Broker broker_;
  int runs_ = 0;
};

// By default Paho hands its trace callback nothing below an error once the library has
// made its client: no entry for any function, packet or message of the 20 credits.
// (Paho's own default is TRACE_MINIMUM, thousands of entries for the same run.)
TEST_F(PahoTraceTest, LibraryClientsLeavePahoTracingOnlyErrors) {
  const std::string out = run_child(20);
  EXPECT_NE(out.find("below_error=0 processed=20"), std::string::npos) << out;
}

// MQTT_C_CLIENT_TRACE asks Paho for its trace: the library keeps Paho's level, and the
// trace file gets Paho's function-level entries for the same run.
TEST_F(PahoTraceTest, MqttCClientTraceKeepsPahosOwnLevel) {
  const std::string trace = dir_.file("paho.trace");
  const std::string out = run_child(20, {"MQTT_C_CLIENT_TRACE=" + trace});
  EXPECT_EQ(out.find("below_error=0 "), std::string::npos) << out;
  // Paho starts a new file every 1,000 lines and keeps the last one as <file>.0.
  const std::string text = read(trace + ".0") + read(trace);
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_GT(lines, 100u) << text.substr(0, 2000);
  EXPECT_NE(text.find("MQTTAsync_"), std::string::npos) << text.substr(0, 2000);
}

// MQTT_C_CLIENT_TRACE_LEVEL alone (no file) selects what a trace callback receives: the
// library leaves that to Paho too, and the callback gets Paho's protocol lines.
TEST_F(PahoTraceTest, MqttCClientTraceLevelKeepsPahosOwnLevel) {
  const std::string out = run_child(5, {"MQTT_C_CLIENT_TRACE_LEVEL=PROTOCOL"});
  EXPECT_NE(out.find("below_error="), std::string::npos) << out;
  EXPECT_EQ(out.find("below_error=0 "), std::string::npos) << out;
}

}  // namespace
}  // namespace mqtt_inbox::test

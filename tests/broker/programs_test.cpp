// The shipped programs (examples/ledger_consumer, event_consumer, sensor_gateway,
// publisher and the mqtt-inbox tool) at their edges, run as child processes as a newcomer
// runs them (issue 27's follow-up):
//  - a command line they cannot use ends with exit 1 and the reason on stderr, whatever
//    CLI11's own code for the error would be (105, 106, 109, ...), and --help with 0: the
//    shipped units list 1 in RestartPreventExitStatus= (docs/operations.md);
//  - a topic option whose bad value would only show per message (a wildcard in
//    --emit-topic dead-letters every credit's event) stops the program at start, naming
//    the option, before it touches the database or the broker;
//  - the publisher survives a broker restart (or gives up within --ack-timeout-ms, exit 1).
#include <signal.h>
#include <sys/stat.h>

#include <utility>

#include <mqtt_inbox/topic.h>
#include <nlohmann/json.hpp>

#include "support/example_fixture.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

struct Outcome {
  int exit_code = -1;  // -1: did not exit normally within the timeout
  std::string output;  // stdout and stderr
};

Outcome run_program(const TempDir& dir, const std::vector<std::string>& argv,
                    const std::string& log, seconds timeout = seconds(20)) {
  Child c(argv, dir.file(log));
  const int st = c.wait(timeout);
  Outcome r;
  if (st != -1 && WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
  r.output = read_text(dir.file(log));
  return r;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class ProgramsTest : public ExampleProgramTest {
 protected:
  int runs_ = 0;  // one log file per run: a Child appends to its log
  // The smallest command line each program accepts, against the test's broker and file.
  std::vector<std::string> base(const std::string& program) const {
    if (program == "ledger_consumer" || program == "event_consumer")
      return {built_program(program),
              "--broker",
              broker_.uri(),
              "--client-id",
              client_id_,
              "--topic",
              "credits/#",
              "--db",
              db_};
    if (program == "sensor_gateway")
      return {built_program(program),
              "--broker",
              broker_.uri(),
              "--client-id",
              client_id_,
              "--db",
              db_};
    if (program == "publisher")
      return {built_program(program), "--broker",         broker_.uri(), "--topic", "credits/x",
              "--client-id",          "pub-" + client_id_};
    // The admin tool: a command that needs the database (absent: exit 3 if parsed).
    return {built_program("mqtt-inbox"), "stats", db_};
  }
  static std::vector<std::string> with(std::vector<std::string> argv,
                                       const std::vector<std::string>& extra) {
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  // Expects exit 1, the program's name and `needle` in the output, and no database made.
  void expect_usage_error(const std::vector<std::string>& argv, const std::string& needle,
                          const std::string& what) {
    SCOPED_TRACE(what);
    const Outcome r = run_program(dir_, argv, "usage-" + std::to_string(++runs_) + ".log");
    const std::string program = argv[0].substr(argv[0].rfind('/') + 1);
    EXPECT_EQ(r.exit_code, 1) << program << " " << what << ":\n" << r.output;
    EXPECT_NE(r.output.find(program + ": "), std::string::npos) << what << ":\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos)
        << program << " " << what << ": no '" << needle << "' in:\n"
        << r.output;
    EXPECT_FALSE(exists(db_)) << program << " " << what << ": the database was created";
    EXPECT_EQ(broker_connections(), 0u) << program << " " << what << ": it connected";
  }
};

const char* const kPrograms[] = {"ledger_consumer", "event_consumer", "sensor_gateway", "publisher",
                                 "mqtt-inbox"};

// Each kind of parse error CLI11 has a code of its own for, on every program: an unknown
// option (109), a value that fails a check (105), a value of the wrong type (105/104), a
// missing required option (106), an option without its value (114): all exit 1.
TEST_F(ProgramsTest, EveryUsageErrorOfEveryProgramExits1) {
  for (const std::string program : kPrograms) {
    SCOPED_TRACE(program);
    const auto b = base(program);
    expect_usage_error(with(b, {"--no-such-option"}), "--no-such-option", "unknown option");
    if (program == "mqtt-inbox") {
      expect_usage_error({built_program("mqtt-inbox"), "prune", db_, "--budget-ms", "-5"},
                         "--budget-ms", "failed check");
      expect_usage_error({built_program("mqtt-inbox"), "outbox", "list", db_, "--limit", "x"},
                         "--limit", "wrong type");
      expect_usage_error({built_program("mqtt-inbox"), "stats"}, "", "missing database");
      expect_usage_error({built_program("mqtt-inbox")}, "", "missing command");
      continue;
    }
    if (program == "publisher") {
      expect_usage_error(with(b, {"--count", "0"}), "--count", "failed check");
      expect_usage_error(with(b, {"--window", "many"}), "--window", "wrong type");
      expect_usage_error({built_program(program), "--broker", broker_.uri()}, "--topic",
                         "missing required option");
    } else {
      expect_usage_error(with(b, {"--mqtt-version", "4"}), "--mqtt-version", "failed check");
      expect_usage_error(with(b, {"--startup-deadline-ms", "soon"}), "--startup-deadline-ms",
                         "wrong type");
      std::vector<std::string> no_db = {built_program(program), "--broker", broker_.uri(),
                                        "--client-id", client_id_};
      if (program != "sensor_gateway") no_db.insert(no_db.end(), {"--topic", "credits/#"});
      expect_usage_error(no_db, "--db", "missing required option");
    }
    expect_usage_error(with(b, {"--broker"}), "--broker", "option without its value");
  }
}

TEST_F(ProgramsTest, HelpExits0OnEveryProgram) {
  for (const std::string program : kPrograms) {
    const Outcome r =
        run_program(dir_, {built_program(program), "--help"}, "help-" + program + ".log");
    EXPECT_EQ(r.exit_code, 0) << program << ":\n" << r.output;
    EXPECT_NE(r.output.find("--"), std::string::npos) << program << ": no options listed";
  }
  // The examples' --help shows every option's default (the options of their own, not only
  // the shared connection flags): a newcomer reads it there, not in the source.
  const std::pair<const char*, const char*> defaults[] = {
      {"ledger_consumer", "--consumer TEXT=ledger"},
      {"event_consumer", "--consumer TEXT=events"},
      {"sensor_gateway", "=2"},  // --workers
      {"publisher", "--id-prefix TEXT=credit"},
  };
  for (const auto& [program, shown] : defaults) {
    const Outcome r =
        run_program(dir_, {built_program(program), "--help"}, std::string("help-d-") + program);
    EXPECT_NE(r.output.find(shown), std::string::npos) << program << " --help:\n" << r.output;
    EXPECT_EQ(r.output.find("=[]"), std::string::npos) << program << ": an empty list as []";
  }
  const Outcome r =
      run_program(dir_, {built_program("mqtt-inbox"), "outbox", "list", "--help"}, "help.log");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(exists(db_));
}

// The class of issue 27's --emit-topic: every option holding a topic is checked at start.
// A topic name to publish to (--emit-topic, publisher --topic, probe-broker
// --topic-prefix): no wildcard, not empty, valid UTF-8. A filter to subscribe to (the
// consumers' --topic, sensor_gateway's): '+' and '#' only as whole levels.
TEST_F(ProgramsTest, EveryTopicOptionIsCheckedAtStart) {
  const std::vector<std::string> bad_names = {"events/+", "events/#", "", "events/\xff\xfe"};
  for (const auto& bad : bad_names) {
    SCOPED_TRACE("name '" + bad + "'");
    expect_usage_error(with(base("ledger_consumer"), {"--emit-topic", bad}), "--emit-topic",
                       "--emit-topic");
    expect_usage_error({built_program("publisher"), "--broker", broker_.uri(), "--topic", bad},
                       "--topic", "publisher --topic");
    expect_usage_error({built_program("mqtt-inbox"), "probe-broker", "--broker", broker_.uri(),
                        "--topic-prefix", bad},
                       "--topic-prefix", "probe-broker --topic-prefix");
  }
  const std::vector<std::string> bad_filters = {"credits/#/x",     "credits/a+",      "", "#x",
                                                "$share//credits", "credits/\xc0\xaf"};
  for (const auto& bad : bad_filters) {
    SCOPED_TRACE("filter '" + bad + "'");
    for (const std::string program : {"ledger_consumer", "event_consumer"})
      expect_usage_error({built_program(program), "--broker", broker_.uri(), "--client-id",
                          client_id_, "--db", db_, "--topic", bad},
                         "--topic", program + " --topic");
    expect_usage_error(with(base("sensor_gateway"), {"--topic", bad}), "--topic",
                       "sensor_gateway --topic");
  }
}

// examples/publisher across a broker restart, on both MQTT versions: it used to wait for
// ever on a PUBACK the lost connection would never bring. It reconnects by itself (a new
// Paho client; Paho's automatic reconnect, which it used before, showed a use-after-free
// inside Paho C under TSan), publishes again what had no PUBACK, and exits 0; every credit
// is applied exactly once at the ledger.
// Waits until the publisher has connected (its log says so) and then a moment more, so
// that the broker goes away mid-stream rather than before the first CONNECT (on a loaded
// machine the program may take more than a second to get there).
void publishing(Child& pub, const std::string& log) {
  ASSERT_TRUE(
      wait_until([&] { return read_text(log).find("publisher: connected") != std::string::npos; },
                 seconds(30)))
      << read_text(log);
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE(pub.running()) << read_text(log);
}

class PublisherRestartTest : public ProgramsTest,
                             public ::testing::WithParamInterface<std::string> {};

TEST_P(PublisherRestartTest, PublisherRidesOutABrokerRestart) {
  {
    const std::string version = GetParam();
    create_session([&](const std::string& log) { return start_ledger(log); });
    constexpr int kCredits = 3000;
    const std::string log = "publisher-" + version + ".log";
    Child pub({built_program("publisher"), "--broker", broker_.uri(), "--topic", "credits/r",
               "--count", std::to_string(kCredits), "--accounts", "7", "--id-prefix", "r" + version,
               "--client-id", "pub-" + client_id_, "--mqtt-version", version, "--rate", "1000"},
              dir_.file(log));
    ASSERT_NO_FATAL_FAILURE(publishing(pub, dir_.file(log)));
    broker_.stop();
    std::this_thread::sleep_for(milliseconds(1500));
    broker_.start();
    const auto t0 = std::chrono::steady_clock::now();
    const int st = pub.wait(seconds(60));
    ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << "status " << st << " after "
        << std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count()
        << " ms\n"
        << read_text(dir_.file(log));
    const std::string out = read_text(dir_.file(log));
    const size_t at = out.rfind("total_amount=");
    ASSERT_NE(at, std::string::npos) << out;
    const int64_t total = std::stoll(out.substr(at + 13));

    auto ledger = start_ledger("ledger-" + version + ".log");
    EXPECT_TRUE(wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == kCredits; },
                           seconds(60)))
        << q("SELECT count(*) FROM ledger_entries") << " of " << kCredits << " credits applied";
    EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), kCredits);
    EXPECT_EQ(q("SELECT sum(balance) FROM accounts"), total);
    ledger->signal(SIGTERM);
    EXPECT_EQ(ledger->wait(seconds(20)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Mqtt, PublisherRestartTest, ::testing::Values("3.1.1", "5"),
                         [](const auto& p) { return p.param == "5" ? "v5" : "v311"; });

// A broker that does not come back: the publisher gives up within --ack-timeout-ms of the
// last PUBACK, exit 1, saying how many were acked, instead of hanging.
TEST_F(ProgramsTest, PublisherGivesUpWhenTheBrokerStaysAway) {
  for (const std::string version : {"3.1.1", "5"}) {
    SCOPED_TRACE("MQTT " + version);
    const std::string log = "publisher-away-" + version + ".log";
    Child pub({built_program("publisher"), "--broker", broker_.uri(), "--topic", "credits/a",
               "--count", "5000", "--client-id", "pub-" + client_id_, "--mqtt-version", version,
               "--rate", "500", "--ack-timeout-ms", "3000"},
              dir_.file(log));
    ASSERT_NO_FATAL_FAILURE(publishing(pub, dir_.file(log)));
    broker_.stop();
    const auto t0 = std::chrono::steady_clock::now();
    const int st = pub.wait(seconds(20));
    const auto took =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
    broker_.start();
    const std::string out = read_text(dir_.file(log));
    ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1) << "status " << st << "\n"
                                                                   << out;
    EXPECT_LT(took, seconds(10)) << out;
    EXPECT_NE(out.find("publisher: no PUBACK for 3000 ms"), std::string::npos) << out;
    EXPECT_EQ(out.find("total_amount="), std::string::npos) << out;
  }
}

// A session the broker lost while the consumer was stopped (another client connected with
// its client id and a clean session: mosquitto #3551) is visible after the fact: the
// restarted consumer counts it in the session record, `mqtt-inbox stats` shows it once
// that process is gone, and --prometheus-textfile is written.
TEST_F(ProgramsTest, ALostSessionIsSeenAfterTheFact) {
  const std::string prom = dir_.file("inbox.prom");
  create_session([&](const std::string& log) {
    return start_ledger(log, {"--prometheus-textfile", prom});
  });
  ASSERT_TRUE(wait_until([&] { return exists(prom); }, seconds(5)))
      << "no Prometheus textfile written at start";
  EXPECT_NE(read_text(prom).find("mqtt_inbox_sessions_lost_total"), std::string::npos)
      << read_text(prom);
  // The takeover with a clean session: the broker deletes the consumer's session.
  ASSERT_EQ(::system(("mosquitto_pub -h 127.0.0.1 -p " + std::to_string(broker_.port()) + " -i '" +
                      client_id_ + "' -t takeover/x -m x -q 0")
                         .c_str()),
            0);
  auto again = start_ledger("again.log", {"--prometheus-textfile", prom});
  ASSERT_TRUE(wait_until(
      [&] { return read_text(dir_.file("again.log")).find("consuming: ") != std::string::npos; },
      seconds(15)))
      << read_text(dir_.file("again.log"));
  EXPECT_NE(read_text(dir_.file("again.log")).find("SESSION LOST"), std::string::npos)
      << read_text(dir_.file("again.log"));
  again->signal(SIGTERM);
  ASSERT_EQ(again->wait(seconds(20)), 0);

  // After the fact: the process that saw it is gone.
  EXPECT_EQ(q("SELECT sessions_lost FROM inbox_sessions WHERE client_id = '" + client_id_ + "'"),
            1);
  const Outcome json_run =
      run_program(dir_, {built_program("mqtt-inbox"), "--json", "stats", db_}, "stats.json");
  ASSERT_EQ(json_run.exit_code, 0) << json_run.output;
  const auto j = nlohmann::json::parse(json_run.output.substr(json_run.output.find('{')), nullptr,
                                       /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << json_run.output;
  EXPECT_EQ(j["sessions_lost"], 1) << json_run.output;
  ASSERT_EQ(j["sessions"].size(), 1u) << json_run.output;
  EXPECT_EQ(j["sessions"][0]["client_id"], client_id_);
  EXPECT_EQ(j["sessions"][0]["sessions_lost"], 1);
  EXPECT_TRUE(j["sessions"][0]["last_lost_at"].is_number()) << json_run.output;
  const Outcome table = run_program(dir_, {built_program("mqtt-inbox"), "stats", db_}, "stats.txt");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("The broker lost 1 session"), std::string::npos) << table.output;
}

// The checks themselves, members of both classes, good and bad.
TEST(TopicChecks, NamesAndFilters) {
  for (const char* ok : {"a", "a/b", "/", "a//b", "$SYS/x", "é/ü"})
    EXPECT_TRUE(check_topic_name(ok).ok()) << ok;
  for (const std::string& bad :
       {std::string(), std::string("a/+"), std::string("#"), std::string("a\0b", 3),
        std::string("\xed\xa0\x80"), std::string(65536, 'a')})
    EXPECT_EQ(check_topic_name(bad, "--x").code(), Status::Code::kInvalidArgument)
        << bad.size() << " bytes";
  EXPECT_NE(check_topic_name("a/+", "--emit-topic").message().find("--emit-topic"),
            std::string::npos);
  for (const char* ok : {"#", "+", "a/#", "a/+/b", "+/+", "/#", "$share/g/a/#", "$share/g/+"})
    EXPECT_TRUE(check_topic_filter(ok).ok()) << ok;
  for (const std::string& bad :
       {std::string(), std::string("a/#/b"), std::string("a#"), std::string("a/b+"),
        std::string("+a"), std::string("$share/g"), std::string("$share//a"),
        std::string("$share/g+/a"), std::string("$share/g/"), std::string("a\0", 2)})
    EXPECT_EQ(check_topic_filter(bad).code(), Status::Code::kInvalidArgument) << bad;
}

}  // namespace
}  // namespace mqtt_inbox::test

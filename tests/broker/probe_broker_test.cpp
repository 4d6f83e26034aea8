// probe-broker's in-flight and reload checks (issue 42) against a real mosquitto. What the
// probe reports is compared with what the test counts on its own: the in-flight window in
// the broker's log (PUBLISHes sent to the probe's client minus the PUBACKs it received, on
// the connection the broker ended), and a reload's effect with the test's own Paho clients
// in the same scenario. Never with a fixed figure: the checks are there to find out what a
// broker does.
#include <mqtt/async_client.h>
#include <sys/wait.h>

#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/process.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

struct ProbeRun {
  int code = -1;  // exit code, -1: did not end in time or was killed
  json j;         // the --json report
  std::string text;
};

// Runs `mqtt-inbox --json probe-broker ARGS` as a child process. `during` (if set) runs
// once the probe announces its pause before the reload, as a person restarting the broker
// would.
ProbeRun run_probe(const TempDir& dir, const std::vector<std::string>& args,
                   const std::function<void()>& during = nullptr) {
  static int n = 0;
  const std::string log = dir.file("probe-" + std::to_string(++n) + ".log");
  std::vector<std::string> argv = {built_program("mqtt-inbox"), "--json", "probe-broker",
                                   "--timeout-ms", "5000"};
  argv.insert(argv.end(), args.begin(), args.end());
  Child child(argv, log);
  if (during) {
    EXPECT_TRUE(wait_until(
        [&] {
          return file_text(log).find("probe: offline before the reload") != std::string::npos;
        },
        30s))
        << file_text(log);
    during();
  }
  const int st = child.wait(90s);
  ProbeRun r;
  r.code = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.text = file_text(log);
  // stderr lines come first (the pause, a command's output); the report is the last thing.
  const size_t at =
      r.text.find("\n{") == std::string::npos ? r.text.find('{') : r.text.find("\n{") + 1;
  r.j = json::parse(r.text.substr(std::min(at, r.text.size())), nullptr, false);
  EXPECT_FALSE(r.j.is_discarded()) << r.text;
  return r;
}

// The broker's own count: on the connection of `client_id` that it ended for a missed
// keep-alive, the PUBLISHes it sent minus the PUBACKs it received. -1 if there is none.
int in_flight_in_broker_log(const std::string& log, const std::string& client_id) {
  std::istringstream in(log);
  int sent = 0, acked = 0;
  bool on = false;
  for (std::string line; std::getline(in, line);) {
    if (line.find("New client connected") != std::string::npos &&
        line.find(" as " + client_id + " (") != std::string::npos) {
      on = true;
      sent = acked = 0;
    } else if (on && line.find("Sending PUBLISH to " + client_id + " (") != std::string::npos) {
      ++sent;
    } else if (on && line.find("Received PUBACK from " + client_id + " (") != std::string::npos) {
      ++acked;
    } else if (on &&
               line.find("Client " + client_id + " has exceeded timeout") != std::string::npos) {
      return sent - acked;
    }
  }
  return -1;
}

class ProbeInFlightTest : public ::testing::TestWithParam<const char*> {
 protected:
  bool mqtt5() const { return std::string(GetParam()) == "5"; }
  std::string version_name() const { return mqtt5() ? "v5" : "v311"; }

  // Runs the in-flight check alone and compares it with the broker's log.
  json check(Broker& broker, const std::string& client_id, int receive_maximum) {
    ProbeRun r = run_probe(
        dir_, {"--broker", broker.uri(), "--mqtt-version", GetParam(), "--client-id", client_id,
               "--count", "2", "--receive-maximum", std::to_string(receive_maximum)});
    EXPECT_EQ(r.code, 0) << r.text;
    const json& f = r.j["in_flight"];
    const int counted =
        in_flight_in_broker_log(file_text(broker.log_path()), client_id + "-inflight");
    EXPECT_GT(counted, 0) << file_text(broker.log_path());
    EXPECT_EQ(f.value("in_flight", -1), counted) << f.dump(2);
    EXPECT_EQ(f.value("resent_with_dup", -1), counted) << f.dump(2);
    EXPECT_TRUE(f.value("cleaned_up", false)) << f.dump(2);
    // What the check says follows from the count, not the other way round.
    const char* verdict = !mqtt5()                    ? "not_applicable"
                          : counted > receive_maximum ? "exceeded"
                                                      : "honoured";
    EXPECT_EQ(f.value("verdict", ""), verdict) << f.dump(2);
    EXPECT_EQ(r.j["warnings"].dump().find("in flight to a consumer") != std::string::npos,
              counted > receive_maximum)
        << r.j["warnings"].dump(2);
    return f;
  }

  TempDir dir_;
};

// mosquitto's default window (max_inflight_messages 20; MQTT 5: the client's Receive
// Maximum 5): what the probe found in flight is what the broker's log shows.
TEST_P(ProbeInFlightTest, ReportsWhatTheBrokerHadInFlight) {
  Broker broker;
  check(broker, "probe-if-" + version_name(), 5);
}

// A window of one (MQTT 5: Receive Maximum 1; 3.1.1: max_inflight_messages 1), which
// mosquitto 2.0.11 keeps: the same comparison, the other verdict.
TEST_P(ProbeInFlightTest, ReportsAWindowOfOne) {
  Broker::Config c;
  c.max_inflight_messages = 1;
  Broker broker(c);
  const json f = check(broker, "probe-if1-" + version_name(), 1);
  EXPECT_EQ(f.value("in_flight", -1), 1) << f.dump(2);
}

INSTANTIATE_TEST_SUITE_P(Versions, ProbeInFlightTest, ::testing::Values("5", "3.1.1"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param) == "5" ? "mqtt5" : "mqtt311";
                         });

// What the test's own client saw in a reload scenario.
struct Seen {
  int before = 0, after = 0;  // distinct messages of each kind that arrived, of 2 each
  bool session_present = false;
};

// The reload tests' broker: a listener with a password file and an ACL file (the setup
// docs/brokers-and-tls.md recommends), users "probe" (for the probe) and "side" (for the
// test's own measurement), each allowed its own topics.
class ProbeReloadTest : public ::testing::TestWithParam<const char*> {
 protected:
  bool mqtt5() const { return std::string(GetParam()) == "5"; }
  std::string version_name() const { return mqtt5() ? "v5" : "v311"; }

  void SetUp() override {
    set_password("-c", "probe", "probe-Pa55-1");
    set_password("", "side", "side-Pa55-1");
    write_file(acl_,
               "user probe\ntopic readwrite mqtt-inbox/probe/#\n"
               "user side\ntopic readwrite side/#\n");
    broker_ = std::make_unique<Broker>(
        Broker::Config{}, std::vector<std::string>{"allow_anonymous false\npassword_file " +
                                                   passwd_ + "\nacl_file " + acl_ + "\n"});
    uri_ = "tcp://127.0.0.1:" + std::to_string(broker_->listener_port(0));
    write_file(probe_password_, "probe-Pa55-1");
    write_file(side_password_, "side-Pa55-1");
  }

  void set_password(const char* flags, const std::string& user, const std::string& pw) {
    std::vector<std::string> argv = {"/usr/bin/mosquitto_passwd"};
    if (*flags) argv.push_back(flags);
    argv.insert(argv.end(), {"-b", passwd_, user, pw});
    Child c(argv, dir_.file("mosquitto_passwd.log"));
    ASSERT_EQ(c.wait(20s), 0) << file_text(dir_.file("mosquitto_passwd.log"));
  }

  // The scenario the probe's reload check runs, done by the test with its own Paho
  // clients (user "side"): a persistent session subscribes and goes offline; 2 messages;
  // `event` (a reload, with what comes before it); 1 s; 2 more; the session connects again
  // (the password file read again) and counts.
  Seen side_measure(const std::string& client_id, const std::function<void()>& event) {
    const int v = mqtt5() ? MQTTVERSION_5 : MQTTVERSION_3_1_1;
    const std::string topic = "side/" + client_id;
    auto options = [&](bool clean) {
      auto b = mqtt::connect_options_builder().mqtt_version(v).user_name("side").password(
          file_text(side_password_));
      if (mqtt5())
        b.clean_start(clean);
      else
        b.clean_session(clean);
      return b.finalize();
    };
    auto publish = [&](const std::string& prefix) {
      mqtt::async_client pub(uri_, client_id + "-pub", mqtt::create_options(v), nullptr);
      ASSERT_TRUE(pub.connect(options(true))->wait_for(10s));
      for (int i = 0; i < 2; ++i)
        ASSERT_TRUE(pub.publish(mqtt::make_message(topic, prefix + std::to_string(i), 1, false))
                        ->wait_for(10s));
      pub.disconnect()->wait_for(10s);
    };
    std::mutex mu;
    std::set<std::string> got;
    mqtt::async_client sub(uri_, client_id, mqtt::create_options(v), nullptr);
    sub.set_message_callback([&](mqtt::const_message_ptr m) {
      std::lock_guard<std::mutex> l(mu);
      got.insert(m->to_string());
    });
    Seen seen;
    {
      mqtt::connect_options o = options(false);
      if (mqtt5()) o.set_properties({{mqtt::property::SESSION_EXPIRY_INTERVAL, 300}});
      EXPECT_TRUE(sub.connect(o)->wait_for(10s));
      EXPECT_TRUE(sub.subscribe(topic, 1)->wait_for(10s));
      EXPECT_TRUE(sub.disconnect()->wait_for(10s));
    }
    publish("before-");
    event();
    std::this_thread::sleep_for(1s);
    publish("after-");
    mqtt::connect_options o = options(false);
    if (mqtt5()) o.set_properties({{mqtt::property::SESSION_EXPIRY_INTERVAL, 300}});
    auto tok = sub.connect(o);
    EXPECT_TRUE(tok->wait_for(10s));
    seen.session_present = tok->get_connect_response().is_session_present();
    wait_until(
        [&] {
          std::lock_guard<std::mutex> l(mu);
          return got.size() >= 4;
        },
        3s);
    {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& p : got) (p.rfind("before-", 0) == 0 ? seen.before : seen.after) += 1;
    }
    sub.disconnect()->wait_for(10s);
    sub.connect(options(true))->wait_for(10s);  // ends the session
    sub.disconnect()->wait_for(10s);
    return seen;
  }

  std::vector<std::string> probe_args(const std::string& client_id,
                                      const std::string& reload_command) {
    return {"--broker", uri_,         "--mqtt-version", GetParam(),         "--client-id",
            client_id,  "--username", "probe",          "--password-file",  probe_password_,
            "--count",  "2",          "--no-in-flight", "--reload-command", reload_command};
  }

  // The probe's report agrees with what the test's own client saw.
  void expect_same(const ProbeRun& r, const Seen& seen) {
    const json& rl = r.j["reload"];
    EXPECT_EQ(rl["queued_before_reload"].value("arrived", -1), seen.before) << rl.dump(2);
    EXPECT_EQ(rl["published_after_reload"].value("arrived", -1), seen.after) << rl.dump(2);
    EXPECT_EQ(rl.value("session_present", !seen.session_present), seen.session_present)
        << rl.dump(2);
    const bool all = seen.before + seen.after == 4;
    EXPECT_EQ(rl.value("verdict", ""), !seen.session_present ? "session_lost"
                                       : all                 ? "kept"
                                                             : "dropped")
        << rl.dump(2);
    EXPECT_EQ(r.code, all && seen.session_present ? 0 : 2) << r.text;
    EXPECT_TRUE(rl.value("cleaned_up", false)) << rl.dump(2);
  }

  TempDir dir_;
  std::string passwd_ = dir_.file("mosquitto.passwd");
  std::string acl_ = dir_.file("mosquitto.acl");
  std::string probe_password_ = dir_.file("probe.password");
  std::string side_password_ = dir_.file("side.password");
  std::unique_ptr<Broker> broker_;
  std::string uri_;
};

// A reload with nothing changed.
TEST_P(ProbeReloadTest, AReloadWithNothingChanged) {
  const Seen seen = side_measure("side-plain-" + version_name(), [&] { broker_->reload(); });
  EXPECT_EQ(seen.before, 2);  // the scenario happened: the session and its queue existed
  const ProbeRun r = run_probe(dir_, probe_args("probe-plain-" + version_name(),
                                                "kill -HUP " + std::to_string(broker_->pid())));
  expect_same(r, seen);
}

// A reload after the offline session's password was changed in the password file, the
// client's password file rotated with it (the reload command does both for the probe).
TEST_P(ProbeReloadTest, AReloadAfterThePasswordChanged) {
  const Seen seen = side_measure("side-rotate-" + version_name(), [&] {
    set_password("", "side", "side-Pa55-2");
    write_file(side_password_, "side-Pa55-2");
    broker_->reload();
  });
  EXPECT_TRUE(seen.session_present);
  const std::string rotate = "/usr/bin/mosquitto_passwd -b '" + passwd_ +
                             "' probe probe-Pa55-2 && printf probe-Pa55-2 > '" + probe_password_ +
                             "' && kill -HUP " + std::to_string(broker_->pid());
  const ProbeRun r = run_probe(dir_, probe_args("probe-rotate-" + version_name(), rotate));
  expect_same(r, seen);
}

// A broker restart while the session is offline, then a reload (Debian: a boot, then the
// daily logrotate). The probe pauses before its reload command; the test restarts the
// broker then, and the command finds the new broker's pid in its pid file.
TEST_P(ProbeReloadTest, ARestartThenAReload) {
  const Seen seen = side_measure("side-restart-" + version_name(), [&] {
    broker_->stop();
    broker_->start();
    // Its port is open; give it time to install its SIGHUP handler too (a SIGHUP before
    // that would end it).
    std::this_thread::sleep_for(500ms);
    broker_->reload();
  });
  EXPECT_TRUE(seen.session_present);
  std::vector<std::string> args = probe_args("probe-restart-" + version_name(),
                                             "kill -HUP \"$(cat '" + broker_->pid_file() + "')\"");
  args.insert(args.end(), {"--pause-before-reload-ms", "3000"});
  const ProbeRun r = run_probe(dir_, args, [&] {
    broker_->stop();
    broker_->start();
  });
  expect_same(r, seen);
}

INSTANTIATE_TEST_SUITE_P(Versions, ProbeReloadTest, ::testing::Values("5", "3.1.1"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param) == "5" ? "mqtt5" : "mqtt311";
                         });

// Without --reload-command the reload check says it did not run and why; the exit code is
// the session check's.
TEST(ProbeBroker, WithoutAReloadCommandTheReloadIsNotMeasured) {
  TempDir dir;
  Broker broker;
  const ProbeRun r = run_probe(dir, {"--broker", broker.uri(), "--count", "2", "--no-in-flight"});
  EXPECT_EQ(r.code, 0) << r.text;
  EXPECT_EQ(r.j["verdict"], "ok") << r.text;
  EXPECT_EQ(r.j["reload"].value("verdict", ""), "not_measured") << r.text;
  EXPECT_NE(r.j["reload"].value("reason", "").find("--reload-command"), std::string::npos)
      << r.text;
  EXPECT_FALSE(r.j.contains("in_flight")) << r.text;  // --no-in-flight
}

}  // namespace
}  // namespace mqtt_inbox::test

// probe-broker's in-flight and reload checks: see probe_broker_checks.h.
#include "probe_broker_checks.h"

#include "tool.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace mqtt_inbox::cli {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string ms_text(milliseconds d) { return std::to_string(d.count()) + " ms"; }

// Waits for `t`; throws mqtt::exception naming what it waited for when `bound` passes.
void must(const mqtt::token_ptr& t, const std::string& what, milliseconds bound) {
  if (!t->wait_for(bound))
    throw mqtt::exception(-1, what + ": no answer from the broker within " + ms_text(bound));
}

// A persistent session's options: 3.1.1 clean_session=false; 5 clean_start=false with the
// context's session expiry and, when > 0, `receive_maximum`. Set on the caller's object
// (Paho C++ 1.2.0 copies connect_options without its properties: see probe_broker.cpp).
void persistent_options(const ProbeContext& c, int keep_alive_s, int receive_maximum,
                        mqtt::connect_options* o) {
  const bool v5 = c.mqtt_version == MQTTVERSION_5;
  auto b = mqtt::connect_options_builder()
               .mqtt_version(c.mqtt_version)
               .connect_timeout(c.timeout)
               .keep_alive_interval(std::chrono::seconds(keep_alive_s));
  if (v5)
    b.clean_start(false);
  else
    b.clean_session(false);
  *o = b.finalize();
  c.secure(o);
  if (v5) {
    mqtt::properties p{
        {mqtt::property::SESSION_EXPIRY_INTERVAL, static_cast<int>(c.session_expiry_s)}};
    if (receive_maximum > 0) p.add({mqtt::property::RECEIVE_MAXIMUM, receive_maximum});
    o->set_properties(p);
  }
}

// A clean session that ends at its disconnect (3.1.1 clean_session; 5 clean start, expiry 0).
void clean_options(const ProbeContext& c, mqtt::connect_options* o) {
  const bool v5 = c.mqtt_version == MQTTVERSION_5;
  auto b = mqtt::connect_options_builder().mqtt_version(c.mqtt_version).connect_timeout(c.timeout);
  if (v5)
    b.clean_start(true);
  else
    b.clean_session(true);
  *o = b.finalize();
  c.secure(o);
  if (v5) o->set_properties({{mqtt::property::SESSION_EXPIRY_INTERVAL, 0}});
}

// Connects, trying again every 200 ms while `budget` lasts (a broker that is restarting).
mqtt::connect_response connect_within(mqtt::async_client& client, const mqtt::connect_options& o,
                                      const std::string& what, milliseconds budget) {
  const auto deadline = Clock::now() + budget;
  for (;;) {
    try {
      auto tok = client.connect(o);
      must(tok, what, budget);
      return tok->get_connect_response();
    } catch (const mqtt::exception&) {
      if (Clock::now() + milliseconds(200) >= deadline) throw;
      std::this_thread::sleep_for(milliseconds(200));
    }
  }
}

// Publishes `n` QoS 1 messages "<prefix><i>" to `topic` from a client of its own (client
// id <probe id>-pub, a clean session), waiting for each PUBACK.
void publish(const ProbeContext& c, const std::string& topic, const std::string& prefix, int n) {
  mqtt::async_client pub(c.broker, c.client_id + "-pub", mqtt::create_options(c.mqtt_version),
                         nullptr);
  mqtt::connect_options o;
  clean_options(c, &o);
  connect_within(pub, o, "publisher connect", c.timeout);
  for (int i = 0; i < n; ++i)
    must(pub.publish(mqtt::make_message(topic, prefix + std::to_string(i), 1, false)),
         "publish (waiting for its PUBACK)", c.timeout);
  pub.disconnect()->wait_for(c.timeout);
}

// Ends the session of `client` at the broker: disconnect, connect with a clean session,
// disconnect. "" when done, else why the session may be left on the broker.
std::string end_session(const ProbeContext& c, mqtt::async_client& client) {
  try {
    if (client.is_connected()) client.disconnect()->wait_for(c.timeout);
    mqtt::connect_options o;
    clean_options(c, &o);
    must(client.connect(o), "connect with a clean session", c.timeout);
    client.disconnect()->wait_for(c.timeout);
    return "";
  } catch (const mqtt::exception& e) {
    return e.what();
  }
}

// Messages a check's client received: payload and DUP flag, in order.
struct Received {
  std::mutex mu;
  std::vector<std::pair<std::string, bool>> got;
  size_t distinct(const std::string& prefix) {
    std::lock_guard<std::mutex> l(mu);
    std::set<std::string> d;
    for (const auto& m : got)
      if (m.first.compare(0, prefix.size(), prefix) == 0) d.insert(m.first);
    return d.size();
  }
};

// Waits until `r` holds `target` distinct messages with `prefix`, or nothing new came for
// `quiet` (once something came), or `bound` passed.
void wait_for_messages(Received& r, const std::string& prefix, size_t target, milliseconds quiet,
                       milliseconds bound) {
  const auto start = Clock::now();
  auto last_change = start;
  size_t seen = r.distinct(prefix);
  while (Clock::now() - start < bound) {
    const size_t now = r.distinct(prefix);
    if (now >= target) return;
    if (now != seen) seen = now, last_change = Clock::now();
    if (now > 0 && Clock::now() - last_change >= quiet) return;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

}  // namespace

json probe_in_flight(const ProbeContext& c, int receive_maximum, json* warnings) {
  const bool v5 = c.mqtt_version == MQTTVERSION_5;
  const int r = receive_maximum;
  const int acks = r;                       // PUBACKs sent before the consumer stops acking
  const int published = (r + 1) * (r + 1);  // more than R + acks*R: the backlog outlasts a
                                            // broker that releases R per PUBACK
  const std::string topic = c.topic + "/inflight";
  const std::string id = c.client_id + "-inflight";
  constexpr int kKeepAliveS = 1;  // the held connection's: the broker ends it soon
  json j = {{"client_id", id},
            {"receive_maximum_sent", v5 ? json(r) : json()},
            {"published", published},
            {"acked_before_stopping", acks},
            {"keep_alive_s", kKeepAliveS}};

  // State shared with Paho's receive thread. Phase 1: acknowledge `acks` messages (return
  // at once), then hold the next until `hold_until`. Phase 2: record what arrives.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    int phase = 0;
    int arrived = 0;  // in phase 1
    bool holding = false;
    Clock::time_point hold_until;
    milliseconds hold{0};
    bool lost = false;
  } st;
  Received rec;
  mqtt::async_client s(c.broker, id, mqtt::create_options(c.mqtt_version), nullptr);
  s.set_message_callback([&](mqtt::const_message_ptr m) {
    std::unique_lock<std::mutex> l(st.mu);
    if (st.phase == 1) {
      if (++st.arrived == acks + 1 && !st.holding) {
        st.holding = true;
        st.hold_until = Clock::now() + st.hold;
        st.cv.notify_all();
        // No PUBACK leaves while this callback runs (docs/guarantees.md section 1); the
        // wait is bounded by hold_until.
        st.cv.wait_until(l, st.hold_until, [] { return false; });
      }
    } else if (st.phase == 2) {
      std::lock_guard<std::mutex> r_lock(rec.mu);
      rec.got.emplace_back(m->to_string(), m->is_duplicate());
    }
  });
  s.set_connection_lost_handler([&](const std::string&) {
    std::lock_guard<std::mutex> l(st.mu);
    st.lost = true;
    st.cv.notify_all();
  });

  auto not_measured = [&](const std::string& why) {
    j["verdict"] = "not_measured";
    j["reason"] = why;
  };
  bool session_made = false;
  try {
    mqtt::connect_options held, drain;
    persistent_options(c, kKeepAliveS, v5 ? r : 0, &held);
    persistent_options(c, 30, v5 ? r : 0, &drain);
    // 1. The session and its subscription; the keep-alive the broker imposes, if any.
    const mqtt::connect_response r1 =
        connect_within(s, held, "in-flight check: connect", c.timeout);
    session_made = true;
    int keep_alive_s = kKeepAliveS;
    if (v5 && r1.get_properties().contains(mqtt::property::SERVER_KEEP_ALIVE))
      keep_alive_s = mqtt::get<uint16_t>(r1.get_properties(), mqtt::property::SERVER_KEEP_ALIVE);
    must(s.subscribe(topic, 1), "in-flight check: subscribe", c.timeout);
    must(s.disconnect(), "in-flight check: disconnect", c.timeout);
    if (keep_alive_s == 0 || keep_alive_s > 10) {
      not_measured("the broker imposes a keep-alive of " + std::to_string(keep_alive_s) +
                   " s (Server Keep Alive): the check holds a message until the broker ends "
                   "the connection for a missed keep-alive, and does so only up to 10 s");
    } else {
      // 1.5 keep-alives (MQTT 5.0 section 3.1.2.10), and 7 s for a broker that looks at its
      // clients' keep-alives now and then (mosquitto 2.0: every 5 to 6 s).
      st.hold = milliseconds(keep_alive_s * 1500 + 7000);
      j["hold_bound_ms"] = st.hold.count();
      // 2. A backlog for the offline session.
      publish(c, topic, "f-", published);
      // 3. Connect, acknowledge `acks`, hold the next: wait for the hold to begin, then
      //    for the broker to end the connection (its keep-alive timer, 1.5 x keep-alive).
      {
        std::lock_guard<std::mutex> l(st.mu);
        st.phase = 1;
      }
      const auto connected_at = Clock::now();
      auto tok = s.connect(held);
      bool began = false, lost = false;
      int arrived = 0;
      {
        std::unique_lock<std::mutex> l(st.mu);
        began = st.cv.wait_until(l, connected_at + c.timeout, [&] { return st.holding; });
        if (began)
          lost = st.cv.wait_until(l, st.hold_until + milliseconds(3000), [&] { return st.lost; });
        st.phase = 0;
        arrived = st.arrived;
      }
      tok->wait_for(c.timeout);
      if (!began) {
        not_measured("the probe waited " + ms_text(c.timeout) + " for message " +
                     std::to_string(acks + 1) + " of " + std::to_string(published) +
                     " to hold, and " + std::to_string(arrived) +
                     " arrived (a queue limit? see the session check)");
      } else if (!lost) {
        not_measured("the broker did not end the connection within " +
                     ms_text(st.hold + milliseconds(3000)) +
                     " of the held message, 1.5 keep-alives being " +
                     std::to_string(keep_alive_s * 1500) +
                     " ms (MQTT 5.0 section 3.1.2.10): the PUBACKs after the hold reached it");
      } else {
        // 4. Connect once more: what was in flight comes again with DUP=1, then the rest.
        {
          std::lock_guard<std::mutex> l(st.mu);
          st.phase = 2;
        }
        connect_within(s, drain, "in-flight check: reconnect", c.timeout);
        wait_for_messages(rec, "f-", static_cast<size_t>(published - acks), milliseconds(1000),
                          c.timeout);
        std::set<std::string> all, dup;
        bool held_seen = false, held_dup = false;
        const std::string held_payload = "f-" + std::to_string(acks);
        {
          std::lock_guard<std::mutex> l(rec.mu);
          for (const auto& m : rec.got) {
            all.insert(m.first);
            if (m.second) dup.insert(m.first);
            if (m.first == held_payload) held_seen = true, held_dup = held_dup || m.second;
          }
        }
        const int in_flight = static_cast<int>(dup.size());
        j["delivered_after_reconnect"] = all.size();
        j["resent_with_dup"] = in_flight;
        if (!held_seen) {
          not_measured("the held message (" + held_payload +
                       ") did not come back at the next connect: the session did not keep it");
        } else if (!held_dup) {
          not_measured(
              "the broker resent the held message without DUP=1, so what was in flight "
              "cannot be told from what was queued");
        } else {
          j["in_flight"] = in_flight;
          // The whole remaining backlog was in flight: the window may be larger still.
          j["backlog_exhausted"] = in_flight >= published - acks;
          if (!v5) {
            j["verdict"] = "not_applicable";
            j["reason"] =
                "MQTT 3.1.1 has no Receive Maximum: this is the broker's own window "
                "(mosquitto: max_inflight_messages)";
          } else if (in_flight > r) {
            j["verdict"] = "exceeded";
          } else {
            j["verdict"] = "honoured";
          }
          if (in_flight > r)
            warnings->push_back(
                "the broker had " + std::to_string(in_flight) +
                " QoS 1 messages in flight to a consumer that stopped acknowledging after " +
                std::to_string(acks) + " PUBACKs" +
                (v5 ? ", although it was sent Receive Maximum " + std::to_string(r)
                    : std::string("")) +
                ": a consumer that crashes or waits for its store gets that many again at "
                "its next connect (each applied once; "
                "docs/brokers-and-tls.md#the-in-flight-window)");
        }
      }
    }
  } catch (const mqtt::exception& e) {
    j["verdict"] = "error";
    j["error"] = e.what();
  } catch (const ToolError& e) {  // from ctx.secure: a password file that cannot be read
    j["verdict"] = "error";
    j["error"] = e.message;
  }
  {
    std::lock_guard<std::mutex> l(st.mu);
    st.phase = 0;
  }
  const std::string not_cleaned = session_made ? end_session(c, s) : "";
  j["cleaned_up"] = not_cleaned.empty();
  if (!not_cleaned.empty())
    warnings->push_back("in-flight check: cleanup failed (" + not_cleaned +
                        "); the broker may keep session " + id);
  return j;
}

namespace {

// Runs `command` with /bin/sh -c, stdin from /dev/null and its output on stderr (stdout is
// the tool's report). Returns "" when it exited 0 within `bound`, else what went wrong; a
// command still running at `bound` is killed.
std::string run_command(const std::string& command, milliseconds bound) {
  const pid_t pid = fork();
  if (pid < 0) return std::string("fork failed: ") + std::strerror(errno);
  if (pid == 0) {
    const int in = open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, 0);
    dup2(2, 1);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = Clock::now() + bound;
  int status = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0) return std::string("waitpid failed: ") + std::strerror(errno);
    if (Clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "it was still running after " + ms_text(bound) + " (killed)";
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (WIFEXITED(status)) return "it exited " + std::to_string(WEXITSTATUS(status));
  return "it was killed by signal " + std::to_string(WTERMSIG(status));
}

}  // namespace

json probe_reload(const ProbeContext& c, const ReloadCheck& rc, json* warnings) {
  const std::string topic = c.topic + "/reload";
  const std::string id = c.client_id + "-reload";
  json j = {{"client_id", id}};
  if (rc.command.empty()) {
    j["verdict"] = "not_measured";
    j["reason"] =
        "needs --reload-command: the probe cannot make the broker reload its configuration "
        "without it";
    return j;
  }
  j["command"] = rc.command;
  j["count"] = rc.count;
  j["paused_before_reload_ms"] = rc.pause_ms;
  j["waited_after_reload_ms"] = rc.settle_ms;
  Received rec;
  mqtt::async_client s(c.broker, id, mqtt::create_options(c.mqtt_version), nullptr);
  s.set_message_callback([&](mqtt::const_message_ptr m) {
    std::lock_guard<std::mutex> l(rec.mu);
    rec.got.emplace_back(m->to_string(), m->is_duplicate());
  });
  bool session_made = false;
  try {
    mqtt::connect_options o;
    persistent_options(c, 30, 0, &o);
    // 1. The session, subscribed, then offline; `count` messages queued for it.
    connect_within(s, o, "reload check: connect", c.timeout);
    session_made = true;
    must(s.subscribe(topic, 1), "reload check: subscribe", c.timeout);
    must(s.disconnect(), "reload check: disconnect", c.timeout);
    publish(c, topic, "before-", rc.count);
    // 2. Optionally a pause (a broker restart then), the reload, its settling.
    if (rc.pause_ms > 0) {
      std::cerr << "probe: offline before the reload for " << rc.pause_ms
                << " ms (restart the broker now to measure a restart followed by a reload)"
                << std::endl;
      std::this_thread::sleep_for(milliseconds(rc.pause_ms));
    }
    if (const std::string why = run_command(rc.command, c.timeout); !why.empty())
      throw mqtt::exception(-1, "reload check: the reload command failed: " + why);
    std::this_thread::sleep_for(milliseconds(rc.settle_ms));
    // 3. `count` more while still offline (the broker may just have restarted: the
    //    publisher tries again within the timeout), then the session connects again.
    publish(c, topic, "after-", rc.count);
    mqtt::connect_options again;
    persistent_options(c, 30, 0, &again);  // the password file read again
    const mqtt::connect_response r2 =
        connect_within(s, again, "reload check: reconnect", c.timeout);
    j["session_present"] = r2.is_session_present();
    wait_for_messages(rec, "", static_cast<size_t>(2 * rc.count), milliseconds(1000), c.timeout);
    const int before = static_cast<int>(rec.distinct("before-"));
    const int after = static_cast<int>(rec.distinct("after-"));
    j["queued_before_reload"] = {{"sent", rc.count}, {"arrived", before}};
    j["published_after_reload"] = {{"sent", rc.count}, {"arrived", after}};
    if (!r2.is_session_present()) {
      j["verdict"] = "session_lost";
      warnings->push_back("reload check: the broker had no session for " + id +
                          " after the reload (session present = 0)");
    } else if (before + after < 2 * rc.count) {
      j["verdict"] = "dropped";
      warnings->push_back(
          "reload check: " + std::to_string(2 * rc.count - before - after) + " of " +
          std::to_string(2 * rc.count) +
          " messages for an offline persistent session never arrived (queued before the "
          "reload: " +
          std::to_string(before) + " of " + std::to_string(rc.count) +
          "; published after it: " + std::to_string(after) + " of " + std::to_string(rc.count) +
          "), although the broker acknowledged each and kept the session: nothing tells a "
          "consumer they are lost. Avoid reloads while sessions are offline, or restart "
          "instead (docs/brokers-and-tls.md#reloads-and-offline-sessions)");
    } else {
      j["verdict"] = "kept";
    }
  } catch (const mqtt::exception& e) {
    j["verdict"] = "error";
    j["error"] = e.what();
  } catch (const ToolError& e) {  // from ctx.secure: a password file that cannot be read
    j["verdict"] = "error";
    j["error"] = e.message;
  }
  const std::string not_cleaned = session_made ? end_session(c, s) : "";
  j["cleaned_up"] = not_cleaned.empty();
  if (!not_cleaned.empty())
    warnings->push_back("reload check: cleanup failed (" + not_cleaned +
                        "); the broker may keep session " + id);
  return j;
}

}  // namespace mqtt_inbox::cli

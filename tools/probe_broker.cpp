// `mqtt-inbox probe-broker`: checks that the broker keeps a persistent session and the
// QoS 1 messages queued for it while offline, with --shared what it does with the turns of
// a shared subscription's member that went away, and (probe_broker_checks.h) how many
// messages it keeps in flight to a consumer that stops acknowledging and, with
// --reload-command, whether a reload keeps an offline session's messages
// (docs/admin-tool.md). With probe_broker_checks.cpp the only files of the tool that use
// Paho; they hold no SQL.
#include <mqtt/async_client.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "format.h"
#include "probe_broker_checks.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

namespace {

constexpr int kKeepAliveS = 30;  // the probe's keep-alive, s

// The broker's own limits from an MQTT 5 CONNACK (MQTT 5.0 section 3.2.2.3). Each entry:
// "value" as sent, or the value the specification gives an absent property, and "sent".
// A limit a broker does not send is not necessarily absent in practice: a broker may
// enforce what it does not announce.
json connack_limits(const mqtt::connect_response& r, int requested_keep_alive_s) {
  const mqtt::properties& p = r.get_properties();
  json j = json::object();
  auto entry = [&](const char* name, mqtt::property::code code, auto sample, json absent) {
    using T = decltype(sample);
    const bool sent = p.contains(code);
    json value = absent;
    if (sent) value = static_cast<int64_t>(mqtt::get<T>(p, code));
    j[name] = {{"value", value}, {"sent", sent}};
  };
  entry("receive_maximum", mqtt::property::RECEIVE_MAXIMUM, uint16_t{}, 65535);
  entry("maximum_packet_size", mqtt::property::MAXIMUM_PACKET_SIZE, uint32_t{}, nullptr);
  entry("maximum_qos", mqtt::property::MAXIMUM_QOS, uint8_t{}, 2);
  entry("retain_available", mqtt::property::RETAIN_AVAILABLE, uint8_t{}, 1);
  entry("session_expiry_interval_s", mqtt::property::SESSION_EXPIRY_INTERVAL, uint32_t{},
        nullptr);  // absent: the broker uses the client's
  entry("server_keep_alive_s", mqtt::property::SERVER_KEEP_ALIVE, uint16_t{},
        requested_keep_alive_s);
  entry("topic_alias_maximum", mqtt::property::TOPIC_ALIAS_MAXIMUM, uint16_t{}, 0);
  entry("wildcard_subscription_available", mqtt::property::WILDCARD_SUBSCRIPTION_AVAILABLE,
        uint8_t{}, 1);
  entry("subscription_identifiers_available", mqtt::property::SUBSCRIPTION_IDENTIFIERS_AVAILABLE,
        uint8_t{}, 1);
  entry("shared_subscription_available", mqtt::property::SHARED_SUBSCRIPTION_AVAILABLE, uint8_t{},
        1);
  if (p.contains(mqtt::property::REASON_STRING))
    j["reason_string"] = mqtt::get<std::string>(p, mqtt::property::REASON_STRING);
  if (p.contains(mqtt::property::SERVER_REFERENCE))
    j["server_reference"] = mqtt::get<std::string>(p, mqtt::property::SERVER_REFERENCE);
  return j;
}

// Warnings about broker limits that matter to an inbox.
void warn_about_limits(const json& limits, json* warnings) {
  if (limits["maximum_qos"]["value"].get<int64_t>() < 1)
    warnings->push_back(
        "the broker grants QoS 0 only (Maximum QoS 0): nothing is ever "
        "redelivered; mqtt-inbox refuses such a subscription");
  const json& mps = limits["maximum_packet_size"]["value"];
  if (!mps.is_null() && mps.get<int64_t>() < 1024 * 1024 + 1024)
    warnings->push_back("the broker accepts packets up to " + mps.dump() +
                        " bytes: a publisher's larger message is refused by the broker, "
                        "below ConsumerOptions::max_payload_bytes' default (1 MiB)");
  if (limits["server_keep_alive_s"]["sent"].get<bool>())
    warnings->push_back("the broker imposes a keep-alive of " +
                        limits["server_keep_alive_s"]["value"].dump() +
                        " s: a store wait longer than 1.5 times that drops the connection "
                        "(the message is redelivered, not lost)");
}

std::string limit_text(const json& e, const char* absent_meaning) {
  if (e["sent"].get<bool>()) return e["value"].dump();
  return (e["value"].is_null() ? std::string("") : e["value"].dump() + " ") +
         "(not sent: " + absent_meaning + ")";
}

// Counts of payloads by prefix ("s1-", "s2-") per member of the shared subscription.
struct MemberInbox {
  std::mutex mu;
  std::vector<std::string> got;
  int count(const std::string& prefix) {
    std::lock_guard<std::mutex> l(mu);
    int n = 0;
    for (const auto& p : got) n += p.compare(0, prefix.size(), prefix) == 0 ? 1 : 0;
    return n;
  }
};

// Waits until `total()` reaches `target`, or nothing new arrived for `quiet` (after at
// least one quiet period), or `timeout` passed.
template <typename F>
void wait_settled(F total, int target, std::chrono::milliseconds quiet,
                  std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  auto last_change = start;
  int seen = total();
  while (std::chrono::steady_clock::now() - start < timeout) {
    const int now = total();
    if (now >= target) return;
    if (now != seen) seen = now, last_change = std::chrono::steady_clock::now();
    if (std::chrono::steady_clock::now() - last_change >= quiet) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// What the broker does with the turns of a member of a shared subscription that went
// away with its session kept (issue 31; docs/brokers-and-tls.md#shared-subscriptions):
// members A and B (durable sessions, client ids <id>-share-a/-b) subscribe to
// $share/<group>/<topic>/shared; `n` messages while both are connected; A disconnects; `n`
// more; A comes back. Throws mqtt::exception on a broker error.
json probe_shared(const std::string& broker, int mqtt_version, const std::string& client_id,
                  const std::string& group, const std::string& topic, int n,
                  std::chrono::milliseconds timeout, const mqtt::connect_options& persistent,
                  const mqtt::connect_options& clean, const mqtt::connect_options& publisher,
                  json* warnings) {
  const std::string filter = "$share/" + group + "/" + topic;
  json j = {{"filter", filter}, {"count", n}};
  MemberInbox in_a, in_b;
  mqtt::async_client a(broker, client_id + "-share-a", mqtt::create_options(mqtt_version), nullptr);
  mqtt::async_client b(broker, client_id + "-share-b", mqtt::create_options(mqtt_version), nullptr);
  a.set_message_callback([&](mqtt::const_message_ptr m) {
    std::lock_guard<std::mutex> l(in_a.mu);
    in_a.got.push_back(m->to_string());
  });
  b.set_message_callback([&](mqtt::const_message_ptr m) {
    std::lock_guard<std::mutex> l(in_b.mu);
    in_b.got.push_back(m->to_string());
  });
  auto must = [&](const mqtt::token_ptr& t, const char* what) {
    if (!t->wait_for(timeout)) throw mqtt::exception(-1, std::string(what) + " timed out");
  };
  mqtt::async_client pub(broker, client_id + "-share-pub", mqtt::create_options(mqtt_version),
                         nullptr);
  auto publish = [&](const std::string& prefix) {
    for (int i = 0; i < n; ++i)
      must(pub.publish(mqtt::make_message(topic, prefix + std::to_string(i), 1, false)),
           "publish (waiting for PUBACK)");
  };
  const auto quiet = std::chrono::milliseconds(1000);
  // Both members' sessions ended (clean start, expiry 0), the publisher disconnected;
  // false if a session may be left on the broker.
  auto cleanup = [&]() -> bool {
    bool cleaned = true;
    auto all = [&](const std::vector<mqtt::token_ptr>& tokens) {
      bool ok = true;
      for (const auto& t : tokens) ok = t->wait_for(timeout) && ok;
      return ok;
    };
    try {
      std::vector<mqtt::token_ptr> t;
      for (mqtt::async_client* c : {&a, &b, &pub})
        if (c->is_connected()) t.push_back(c->disconnect());
      all(t);
      t.clear();
      for (mqtt::async_client* c : {&a, &b}) t.push_back(c->connect(clean));
      cleaned = all(t);
      t.clear();
      for (mqtt::async_client* c : {&a, &b})
        if (c->is_connected()) t.push_back(c->disconnect());
      all(t);
    } catch (const mqtt::exception&) {
      cleaned = false;
    }
    return cleaned;
  };
  try {
    {  // the three connects at once: each can take Paho about a second
      auto ta = a.connect(persistent), tb = b.connect(persistent), tp = pub.connect(publisher);
      must(ta, "member A connect");
      must(tb, "member B connect");
      must(tp, "publisher connect");
    }
    must(a.subscribe(filter, 1), "member A subscribe");
    must(b.subscribe(filter, 1), "member B subscribe");
    // 1. Both members live.
    publish("s1-");
    // All n, then a little longer: a broker that does not share sends each member all n.
    wait_settled([&] { return in_a.count("s1-") + in_b.count("s1-"); }, n, quiet, timeout);
    wait_settled([&] { return in_a.count("s1-") + in_b.count("s1-"); }, 2 * n,
                 std::chrono::milliseconds(300), timeout);
    const int a1 = in_a.count("s1-"), b1 = in_b.count("s1-");
    j["both_live"] = {{"to_a", a1}, {"to_b", b1}};
    if (a1 + b1 == 0) {
      j["verdict"] = "unsupported";
      warnings->push_back("nothing published to " + topic + " arrived through " + filter +
                          ": the broker does not support shared subscriptions");
    } else if (a1 >= n && b1 >= n) {
      j["verdict"] = "not_shared";
      warnings->push_back("every member of " + filter +
                          " got every message: the broker treats it as a plain subscription");
    } else {
      // 2. A goes away, its session kept.
      must(a.disconnect(), "member A disconnect");
      publish("s2-");
      wait_settled([&] { return in_b.count("s2-"); }, n, quiet, timeout);
      const int b2 = in_b.count("s2-");
      // 3. A comes back with its client id and session.
      must(a.connect(persistent), "member A reconnect");
      wait_settled([&] { return in_a.count("s2-") + in_b.count("s2-"); }, n, quiet, timeout);
      const int a2 = in_a.count("s2-");
      j["member_away"] = {{"to_b_while_a_away", b2}, {"to_a_on_return", a2}};
      if (b2 >= n) {
        j["verdict"] = "redistributed";
      } else if (a2 + b2 >= n) {
        j["verdict"] = "parked";
        warnings->push_back(
            "shared subscription: a member away with its session kept still gets its turns "
            "(" +
            std::to_string(n - b2) + " of " + std::to_string(n) +
            " waited for A's return): a member that stays dead leaves its share unseen until "
            "a process reconnects its client id (docs/brokers-and-tls.md#shared-subscriptions)");
      } else {
        j["verdict"] = "dropped";
        warnings->push_back("shared subscription: " + std::to_string(n - a2 - b2) + " of " +
                            std::to_string(n) +
                            " messages published while member A was away reached no member");
      }
    }
  } catch (const mqtt::exception&) {
    cleanup();
    throw;
  }
  j["cleaned_up"] = cleanup();
  return j;
}

}  // namespace

int cmd_probe(const ProbeArgs& a) {
  const connection_flags::Flags& c = a.connection;
  const bool v5 = c.mqtt_version == "5";
  const int mqtt_version = v5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1;
  std::random_device rd;
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "%d-%08x", static_cast<int>(getpid()), rd());
  const std::string client_id =
      c.client_id.empty() ? std::string("mqtt-inbox-probe-") + suffix : c.client_id;
  const std::string topic = a.topic_prefix + "/" + suffix;
  const auto timeout = std::chrono::milliseconds(a.timeout_ms);

  json report = {{"broker", c.broker},
                 {"mqtt_version", c.mqtt_version},
                 {"client_id", client_id},
                 {"topic", topic},
                 {"sent", 0},
                 {"received", 0},
                 {"paused_offline_ms", a.pause_offline_ms}};
  json warnings = json::array();

  // TLS and credentials from the flags, applied to every connect options object below.
  // `ssl` outlives them all (Paho C++ 1.2.0 bug #337, connection_flags.h).
  mqtt::ssl_options ssl;
  auto secure = [&](mqtt::connect_options* o) {
    if (const mi::Status s = connection_flags::to_paho_options(c, &ssl, o); !s.ok())
      fail(kUsage, s.message());
  };

  std::mutex mu;
  std::vector<std::pair<std::string, bool>> got;  // payload, dup
  // Paho C++ 1.2.0 copies connect_options without re-pointing the C struct at the copy's
  // properties: set them on long-lived objects, and pass those (as src/mqtt/subscriber.cpp does).
  mqtt::connect_options persistent;
  {
    auto b = mqtt::connect_options_builder()
                 .mqtt_version(mqtt_version)
                 .connect_timeout(timeout)
                 .keep_alive_interval(std::chrono::seconds(kKeepAliveS));
    if (v5)
      b.clean_start(false);
    else
      b.clean_session(false);
    persistent = b.finalize();
    secure(&persistent);
    if (v5)
      persistent.set_properties(
          {{mqtt::property::SESSION_EXPIRY_INTERVAL, static_cast<int>(a.session_expiry_s)}});
  }
  mqtt::connect_options clean;
  {
    auto b = mqtt::connect_options_builder().mqtt_version(mqtt_version).connect_timeout(timeout);
    if (v5)
      b.clean_start(true);
    else
      b.clean_session(true);
    clean = b.finalize();
    secure(&clean);
    if (v5) clean.set_properties({{mqtt::property::SESSION_EXPIRY_INTERVAL, 0}});
  }
  auto persistent_opts = [&]() -> const mqtt::connect_options& { return persistent; };
  auto expiry_of = [&](const mqtt::connect_response& r) -> json {
    if (v5 && r.get_properties().contains(mqtt::property::SESSION_EXPIRY_INTERVAL))
      return mqtt::get<uint32_t>(r.get_properties(), mqtt::property::SESSION_EXPIRY_INTERVAL);
    return nullptr;
  };
  mqtt::async_client sub(c.broker, client_id, mqtt::create_options(mqtt_version), nullptr);
  sub.set_message_callback([&](mqtt::const_message_ptr m) {
    std::lock_guard<std::mutex> l(mu);
    got.emplace_back(m->to_string(), m->is_duplicate());
  });
  auto connect = [&](const mqtt::connect_options& o,
                     std::chrono::milliseconds budget) -> mqtt::connect_response {
    const auto deadline = std::chrono::steady_clock::now() + budget;
    for (;;) {
      try {
        auto tok = sub.connect(o);
        if (!tok->wait_for(budget)) throw mqtt::exception(-1, "connect timed out");
        return tok->get_connect_response();
      } catch (const mqtt::exception& e) {
        if (std::chrono::steady_clock::now() + std::chrono::milliseconds(200) >= deadline) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  };
  int exit_code = kOk;
  bool cleanup_needed = false;
  try {
    // 1. A persistent session with a QoS 1 subscription.
    const auto r1 = connect(persistent_opts(), timeout);
    cleanup_needed = true;
    report["session_present_on_first_connect"] = r1.is_session_present();
    report["requested_session_expiry_s"] = v5 ? json(a.session_expiry_s) : json();
    report["connack_session_expiry_s_first"] = expiry_of(r1);
    if (v5) report["broker_limits"] = connack_limits(r1, kKeepAliveS);
    if (!sub.subscribe(topic, 1)->wait_for(timeout))
      throw mqtt::exception(-1, "subscribe timed out");
    if (!sub.disconnect()->wait_for(timeout)) throw mqtt::exception(-1, "disconnect timed out");

    // 2. While it is offline, a second client publishes QoS 1 messages to it.
    {
      mqtt::async_client pub(c.broker, client_id + "-pub", mqtt::create_options(mqtt_version),
                             nullptr);
      auto po = mqtt::connect_options_builder().mqtt_version(mqtt_version).connect_timeout(timeout);
      if (v5)
        po.clean_start(true);
      else
        po.clean_session(true);
      mqtt::connect_options pub_opts = po.finalize();
      secure(&pub_opts);
      if (!pub.connect(pub_opts)->wait_for(timeout))
        throw mqtt::exception(-1, "publisher connect timed out");
      for (int i = 0; i < a.count; ++i) {
        if (!pub.publish(mqtt::make_message(topic, "probe-" + std::to_string(i), 1, false))
                 ->wait_for(timeout))
          throw mqtt::exception(-1, "publish (waiting for PUBACK) timed out");
        report["sent"] = i + 1;
      }
      pub.disconnect()->wait_for(timeout);
    }
    if (a.pause_offline_ms > 0) {
      std::cerr << "probe: offline for " << a.pause_offline_ms
                << " ms (restart the broker now to test persistence)" << std::endl;
      std::this_thread::sleep_for(std::chrono::milliseconds(a.pause_offline_ms));
    }

    // 3. Reconnect with the same client id: the broker should still hold the session and
    //    send the queued messages right after CONNACK.
    const auto r2 = connect(persistent_opts(), timeout + std::chrono::milliseconds(5000));
    report["session_present"] = r2.is_session_present();
    report["connack_session_expiry_s"] = expiry_of(r2);
    json effective = nullptr;
    std::string source = "none (MQTT 3.1.1: the broker's persistent_client_expiration applies)";
    if (v5) {
      if (!report["connack_session_expiry_s"].is_null())
        effective = report["connack_session_expiry_s"], source = "CONNACK";
      else
        effective = a.session_expiry_s,
        source = "requested (the broker returned none, so it accepted it)";
    }
    report["effective_session_expiry_s"] = effective;
    report["session_expiry_source"] = source;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (static_cast<int>(got.size()) >= a.count) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // late duplicates
    std::lock_guard<std::mutex> l(mu);
    std::set<std::string> distinct;
    int dup_true = 0;
    for (const auto& m : got) {
      distinct.insert(m.first);
      dup_true += m.second ? 1 : 0;
    }
    report["received"] = got.size();
    report["distinct_received"] = distinct.size();
    report["dup_flags"] = {{"set", dup_true}, {"clear", static_cast<int>(got.size()) - dup_true}};
  } catch (const mqtt::exception& e) {
    // Paho says "TCP/TLS connect failure" for every transport failure: find out why.
    const std::string why =
        e.get_return_code() < 0 ? connection_flags::diagnose(c, a.timeout_ms) : "";
    report["error"] = std::string(e.what()) + (why.empty() ? "" : ": " + why);
    exit_code = kBroker;
  }
  // Cleanup: drop the subscription and the session (clean start, expiry 0).
  bool cleaned = false;
  if (cleanup_needed) {
    try {
      if (sub.is_connected()) {
        sub.unsubscribe(topic)->wait_for(timeout);
        sub.disconnect()->wait_for(timeout);
      }
      if (sub.connect(clean)->wait_for(timeout)) {
        sub.disconnect()->wait_for(timeout);
        cleaned = true;
      }
    } catch (const mqtt::exception& e) {
      warnings.push_back(std::string("cleanup failed: ") + e.what() +
                         "; the broker may keep session " + client_id);
    }
  }
  report["cleaned_up"] = cleaned;

  std::string verdict = "error";
  if (exit_code == kOk) {
    const int sent = report["sent"].get<int>();
    const int distinct = report["distinct_received"].get<int>();
    const bool session = report["session_present"].get<bool>();
    if (!session) {
      verdict = "session_lost";
      warnings.push_back(
          "the broker did not keep the session (session_present=0): unacked and queued messages "
          "are lost when the "
          "consumer reconnects. Check persistence (and that its location is writable), the session "
          "expiry, "
          "and that the client uses a persistent session");
    } else if (distinct < sent) {
      verdict = "messages_dropped";
      warnings.push_back(std::to_string(sent - distinct) + " of " + std::to_string(sent) +
                         " messages queued while offline never arrived although the broker acked "
                         "them: a queue limit "
                         "(mosquitto max_queued_messages / max_queued_bytes) or message expiry "
                         "drops messages silently");
    } else {
      verdict = "ok";
    }
    if (v5 && !report["effective_session_expiry_s"].is_null() &&
        report["effective_session_expiry_s"].get<int64_t>() <
            static_cast<int64_t>(a.session_expiry_s))
      warnings.push_back("the broker lowered the session expiry to " +
                         report["effective_session_expiry_s"].dump() +
                         " s: size the retention window and the offline budget to it");
    if (report.contains("broker_limits")) warn_about_limits(report["broker_limits"], &warnings);
    if (session && report["session_present_on_first_connect"].get<bool>())
      warnings.push_back(
          "session_present was already set on the first connect of a fresh client id");
    if (verdict != "ok") exit_code = kProblems;
  }
  report["verdict"] = verdict;
  if (a.shared && exit_code != kBroker) {
    try {
      report["shared_subscription"] =
          probe_shared(c.broker, mqtt_version, client_id, std::string("mqtt-inbox-probe-") + suffix,
                       topic + "/shared", a.count, timeout, persistent, clean, clean, &warnings);
      const std::string v = report["shared_subscription"]["verdict"].get<std::string>();
      if (v != "parked" && v != "redistributed" && exit_code == kOk) exit_code = kProblems;
    } catch (const mqtt::exception& e) {
      report["shared_subscription"] = {{"verdict", "error"}, {"error", e.what()}};
      exit_code = kBroker;
    }
  }
  if (exit_code != kBroker) {
    ProbeContext ctx;
    ctx.broker = c.broker;
    ctx.mqtt_version = mqtt_version;
    ctx.client_id = client_id;
    ctx.topic = topic;
    ctx.timeout = timeout;
    ctx.session_expiry_s = a.session_expiry_s;
    ctx.secure = secure;
    // Informational: a large window costs duplicates, not messages, so neither its verdict
    // nor an error in it changes the exit code (the error is in its section).
    if (!a.no_in_flight) report["in_flight"] = probe_in_flight(ctx, a.receive_maximum, &warnings);
    ReloadCheck rc;
    rc.command = a.reload_command;
    rc.count = a.count;
    rc.pause_ms = a.pause_before_reload_ms;
    rc.settle_ms = a.reload_settle_ms;
    report["reload"] = probe_reload(ctx, rc, &warnings);
    const std::string v = report["reload"]["verdict"].get<std::string>();
    if (v == "error")
      exit_code = kBroker;
    else if ((v == "dropped" || v == "session_lost") && exit_code == kOk)
      exit_code = kProblems;
  }
  report["warnings"] = warnings;
  if (g.json)
    emit(report);
  else {
    auto s = [](const json& v) {
      return v.is_null() ? std::string("-") : v.is_string() ? v.get<std::string>() : v.dump();
    };
    print_kv({{"broker", c.broker + " (MQTT " + c.mqtt_version + ")"},
              {"client id", client_id},
              {"session kept (session_present)", s(report.value("session_present", json()))},
              {"queued messages",
               s(report["distinct_received"]) + " of " + s(report["sent"]) + " arrived"},
              {"DUP flags", report.contains("dup_flags")
                                ? "set " + s(report["dup_flags"]["set"]) + ", clear " +
                                      s(report["dup_flags"]["clear"])
                                : "-"},
              {"effective session expiry",
               s(report.value("effective_session_expiry_s", json())) + " s (" +
                   report.value("session_expiry_source", std::string("-")) + ")"},
              {"cleaned up", cleaned ? "yes" : "no"},
              {"verdict", verdict}});
    if (report.contains("broker_limits")) {
      const json& l = report["broker_limits"];
      std::cout << "broker limits (MQTT 5 CONNACK):\n";
      const char* dflt = "the MQTT 5 default";
      print_kv(
          {{"receive maximum", limit_text(l["receive_maximum"], dflt)},
           {"maximum packet size", limit_text(l["maximum_packet_size"], "no limit announced")},
           {"maximum QoS", limit_text(l["maximum_qos"], dflt)},
           {"retain available", limit_text(l["retain_available"], dflt)},
           {"granted session expiry (s)",
            limit_text(l["session_expiry_interval_s"], "the requested one applies")},
           {"server keep alive (s)", limit_text(l["server_keep_alive_s"], "the client's applies")},
           {"topic alias maximum", limit_text(l["topic_alias_maximum"], dflt)},
           {"wildcard subscriptions", limit_text(l["wildcard_subscription_available"], dflt)},
           {"subscription identifiers", limit_text(l["subscription_identifiers_available"], dflt)},
           {"shared subscriptions", limit_text(l["shared_subscription_available"], dflt)}});
    }
    if (report.contains("shared_subscription")) {
      const json& sh = report["shared_subscription"];
      std::vector<std::pair<std::string, std::string>> kv = {
          {"shared subscription", s(sh.value("filter", json()))},
          {"a member's turns while it is away", s(sh["verdict"])}};
      if (sh.contains("both_live"))
        kv.push_back({"both members live: to A / to B", s(sh["both_live"]["to_a"]) + " / " +
                                                            s(sh["both_live"]["to_b"]) + " of " +
                                                            s(sh["count"])});
      if (sh.contains("member_away"))
        kv.push_back({"A away: to B / to A on its return",
                      s(sh["member_away"]["to_b_while_a_away"]) + " / " +
                          s(sh["member_away"]["to_a_on_return"]) + " of " + s(sh["count"])});
      std::cout << "shared subscription (--shared):\n";
      print_kv(kv);
      if (sh.contains("error")) std::cout << "ERROR: " << sh["error"].get<std::string>() << "\n";
    }
    if (report.contains("in_flight")) {
      const json& f = report["in_flight"];
      std::vector<std::pair<std::string, std::string>> kv;
      if (f.contains("in_flight"))
        kv.push_back({"in flight when the consumer stopped acknowledging",
                      s(f["in_flight"]) + (f.value("backlog_exhausted", false)
                                               ? " (all that was left: at least that)"
                                               : "")});
      kv.push_back({"Receive Maximum sent", s(f.value("receive_maximum_sent", json()))});
      kv.push_back({"published / acknowledged before stopping",
                    s(f["published"]) + " / " + s(f["acked_before_stopping"])});
      kv.push_back({"Receive Maximum",
                    s(f["verdict"]) + (f.contains("reason") ? " (" + s(f["reason"]) + ")" : "")});
      std::cout << "in-flight window (a consumer that stops acknowledging):\n";
      print_kv(kv);
      if (f.contains("error")) std::cout << "ERROR: " << f["error"].get<std::string>() << "\n";
    }
    if (report.contains("reload")) {
      const json& r = report["reload"];
      std::vector<std::pair<std::string, std::string>> kv;
      if (r.contains("command")) kv.push_back({"reload command", s(r["command"])});
      if (r.contains("queued_before_reload"))
        kv.push_back({"queued before the reload", s(r["queued_before_reload"]["arrived"]) + " of " +
                                                      s(r["queued_before_reload"]["sent"]) +
                                                      " arrived"});
      if (r.contains("published_after_reload"))
        kv.push_back({"published after the reload, session offline",
                      s(r["published_after_reload"]["arrived"]) + " of " +
                          s(r["published_after_reload"]["sent"]) + " arrived"});
      if (r.contains("session_present"))
        kv.push_back({"session kept (session_present)", s(r["session_present"])});
      kv.push_back({"reload keeps an offline session's messages",
                    s(r["verdict"]) + (r.contains("reason") ? " (" + s(r["reason"]) + ")" : "")});
      std::cout << "reload (--reload-command):\n";
      print_kv(kv);
      if (r.contains("error")) std::cout << "ERROR: " << r["error"].get<std::string>() << "\n";
    }
    if (report.contains("error"))
      std::cout << "ERROR: " << report["error"].get<std::string>() << "\n";
    for (const auto& w : warnings) std::cout << "warning: " << w.get<std::string>() << "\n";
  }
  return exit_code;
}

}  // namespace mqtt_inbox::cli

// publisher: publishes N credit events with stable, producer-assigned message ids, for
// the ledger example. Each id goes both in the JSON body and, with MQTT 5, in the
// "message-id" user property. It can re-send a fraction as duplicates and mix in
// malformed messages, and waits for every PUBACK so nothing is lost on the way in.
//
//   publisher --broker tcp://127.0.0.1:1883 --topic credits/demo --count 2000
//             --duplicates 0.25 --seed 7
//
// TLS and credentials: the flags of connection_flags.h, as for the consumers.
//
// A connection lost on the way (a broker restart) is retried every 1..5 s; the session is
// persistent (clean session off; MQTT 5: session expiry --session-expiry-s), so Paho
// sends the messages still waiting for their PUBACK again once it is back (one Paho gave
// up on without a PUBACK is published again by the publisher itself). If no PUBACK
// arrives for --ack-timeout-ms (30 s), it gives up with exit 1, saying how many were
// acked: running it again is safe, the ids are the producer's and the inbox drops the
// duplicates.
//
// Exit codes: 0 every message acked; 1 a usage error, the broker unreachable or refusing,
// or no PUBACK for --ack-timeout-ms; 2 a connection flag or file that cannot be used.
//
// Last line: "publisher: unique=N duplicates=D malformed=M total_amount=T".
#include <mqtt/async_client.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "command_line.h"
#include "connection_flags.h"

namespace {

struct Event {
  std::string id;  // empty: no id at all
  std::string payload;
};

// Malformed inputs for the dead-letter path: each must end up dead-lettered, never
// applied and never silently dropped.
Event malformed(int k, const std::string& prefix) {
  const std::string id = prefix + "-bad-" + std::to_string(k);
  switch (k % 4) {
    case 0:
      return {"", R"({"account":"acct-0","amount":5})"};  // missing id
    case 1:
      return {id, R"({"message_id":")" + id + R"(","account":"acct-0","amount":)"};  // cut JSON
    case 2:
      return {id,
              R"({"message_id":")" + id + R"(","account":"acct-0","amount":"5"})"};  // wrong type
    default:
      return {"", R"({"message_id":"   ","account":"acct-0","amount":5})"};  // blank id
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Publish credit events with producer-assigned ids (mqtt-inbox example)"};
  connection_flags::Flags connection;
  connection.client_id = "publisher";
  connection.mqtt_version = "5";
  connection_flags::add(app, &connection, connection_flags::Role::kPublisher);
  std::string topic, prefix = "credit";
  int count = 1000, accounts = 10, malformed_count = 0, window = 100;
  double dup_fraction = 0.0, rate = 0.0;
  unsigned seed = 1;
  app.add_option("--topic", topic, "Topic to publish to")
      ->required()
      ->check(command_line::topic_name());
  app.add_option("--count", count, "Unique credit events")->check(CLI::PositiveNumber);
  app.add_option("--duplicates", dup_fraction, "Fraction of events re-sent as duplicates")
      ->check(CLI::Range(0.0, 10.0));
  app.add_option("--malformed", malformed_count, "Malformed messages mixed in");
  app.add_option("--accounts", accounts, "Number of accounts")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Random seed");
  app.add_option("--id-prefix", prefix, "Prefix of the message ids");
  app.add_option("--rate", rate, "Messages per second (0 = as fast as PUBACKs allow)");
  app.add_option("--window", window, "PUBACKs outstanding at most")->check(CLI::PositiveNumber);
  int ack_timeout_ms = 30000, session_expiry_s = 300;
  app.add_option("--ack-timeout-ms", ack_timeout_ms,
                 "Give up (exit 1) when no PUBACK arrived for this long, ms, reconnects included")
      ->check(CLI::PositiveNumber);
  app.add_option("--session-expiry-s", session_expiry_s,
                 "MQTT 5: how long the broker keeps the session across a lost connection, s")
      ->check(CLI::PositiveNumber);
  if (int rc = command_line::parse(app, argc, argv, "publisher"); rc >= 0) return rc;
  const bool v5 = connection.mqtt_version == "5";

  std::mt19937_64 rng(seed);
  std::vector<Event> events;
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    const std::string id = prefix + "-" + std::to_string(i);
    const int64_t amount = static_cast<int64_t>(rng() % 1000) + 1;
    total += amount;
    nlohmann::json j = {{"message_id", id},
                        {"account", "acct-" + std::to_string(rng() % accounts)},
                        {"amount", amount}};
    events.push_back({id, j.dump()});
  }
  // The stream: every event once, duplicates re-sent at a random later position.
  std::vector<Event> stream = events;
  const int duplicates = static_cast<int>(dup_fraction * count + 0.5);
  for (int k = 0; k < duplicates; ++k) {
    const size_t i = rng() % events.size();
    size_t first = 0;
    while (stream[first].id != events[i].id) ++first;
    const size_t at = first + 1 + rng() % (stream.size() - first);
    stream.insert(stream.begin() + static_cast<long>(at), events[i]);
  }
  for (int k = 0; k < malformed_count; ++k)
    stream.insert(stream.begin() + static_cast<long>(rng() % (stream.size() + 1)),
                  malformed(k, prefix));

  mqtt::ssl_options ssl;  // outlives opts (Paho C++ 1.2.0 bug #337, connection_flags.h)
  auto opts = mqtt::connect_options_builder()
                  .mqtt_version(v5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1)
                  .clean_session(false)
                  .clean_start(false)
                  .max_inflight(window)
                  .automatic_reconnect(std::chrono::seconds(1), std::chrono::seconds(5))
                  .finalize();
  // A persistent session: with a clean one, Paho C forgets the messages in flight when the
  // connection drops and their tokens never complete (the publisher used to hang there
  // after a broker restart). With it, Paho sends them again after the reconnect.
  if (v5)
    opts.set_properties(
        {{mqtt::property::SESSION_EXPIRY_INTERVAL, static_cast<int>(session_expiry_s)}});
  if (auto s = connection_flags::to_paho_options(connection, &ssl, &opts); !s.ok()) {
    std::fprintf(stderr, "publisher: %s\n", s.to_string().c_str());
    return 2;
  }
  try {
    mqtt::async_client cli(
        connection.broker, connection.client_id,
        mqtt::create_options(v5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1, window + 10), nullptr);
    std::mutex lost_mu;
    std::string lost_cause;  // why the connection was last lost, for the give-up message
    cli.set_connection_lost_handler([&](const std::string& cause) {
      std::lock_guard<std::mutex> lock(lost_mu);
      lost_cause = cause.empty() ? "connection lost" : "connection lost: " + cause;
    });
    cli.connect(opts)->wait();
    auto publish = [&](size_t n) {
      auto msg = mqtt::make_message(topic, stream[n].payload, 1, false);
      if (v5 && !stream[n].id.empty())
        msg->set_properties({{mqtt::property::USER_PROPERTY, "message-id", stream[n].id}});
      return cli.publish(msg);
    };
    std::deque<std::pair<mqtt::delivery_token_ptr, size_t>> inflight;  // token, stream index
    size_t acked = 0;
    int failed_in_a_row = 0;
    // The oldest publish's PUBACK, or exit 1 once none came for --ack-timeout-ms.
    auto wait_front = [&]() -> bool {
      bool done = false;
      try {
        done = inflight.front().first->wait_for(std::chrono::milliseconds(ack_timeout_ms));
      } catch (const mqtt::exception& e) {
        // Paho gave up on it without a PUBACK (the broker answered a reconnect without our
        // session, say): publish it again, after the others. A few failures in a row
        // without one PUBACK between them are not a passing outage: report it.
        if (++failed_in_a_row > window + 10) throw;
        const size_t n = inflight.front().second;
        inflight.pop_front();
        inflight.emplace_back(publish(n), n);
        return true;
      }
      if (done) {
        inflight.pop_front();
        ++acked;
        failed_in_a_row = 0;
        return true;
      }
      std::lock_guard<std::mutex> lock(lost_mu);
      std::fprintf(stderr,
                   "publisher: no PUBACK for %d ms (%s); %zu of %zu messages acked. Publishing "
                   "again is safe: the ids are stable and the inbox drops duplicates\n",
                   ack_timeout_ms, lost_cause.empty() ? "broker not answering" : lost_cause.c_str(),
                   acked, stream.size());
      return false;
    };
    const auto start = std::chrono::steady_clock::now();
    for (size_t n = 0; n < stream.size(); ++n) {
      inflight.emplace_back(publish(n), n);
      while (static_cast<int>(inflight.size()) >= window)
        if (!wait_front()) std::_Exit(1);  // the broker's PUBACK: it has the message
      if (rate > 0)
        std::this_thread::sleep_until(
            start + std::chrono::microseconds(static_cast<int64_t>((n + 1) * 1e6 / rate)));
    }
    while (!inflight.empty())
      if (!wait_front()) std::_Exit(1);  // not destroying a client that still has work

    cli.disconnect()->wait();
  } catch (const mqtt::exception& e) {
    // Paho says "TCP/TLS connect failure" for every transport failure: find out why.
    const std::string why =
        e.get_return_code() < 0 ? connection_flags::diagnose(connection, 5000) : "";
    std::fprintf(stderr, "publisher: %s%s%s\n", e.what(), why.empty() ? "" : ": ", why.c_str());
    return 1;
  }
  std::printf("publisher: unique=%d duplicates=%d malformed=%d total_amount=%lld\n", count,
              duplicates, malformed_count, static_cast<long long>(total));
  return 0;
}

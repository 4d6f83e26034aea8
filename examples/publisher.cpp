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
// A connection lost on the way (a broker restart) is made again by the publisher itself,
// not by Paho's automatic reconnect: a new Paho client after 1 s, then 2 s, 4 s, 5 s, 5 s
// ... between attempts, and every message the lost connection left without a PUBACK is
// published again, oldest first, before the next new one. If no PUBACK arrives for
// --ack-timeout-ms (30 s; reconnects included), it gives up with exit 1, saying how many
// were acked: running it again is safe, the ids are the producer's and the inbox drops
// the duplicates.
//
// Exit codes: 0 every message acked; 1 a usage error, the broker unreachable or refusing,
// or no PUBACK for --ack-timeout-ms; 2 a connection flag or file that cannot be used.
//
// Last line: "publisher: unique=N duplicates=D malformed=M total_amount=T".
#include <mqtt/async_client.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
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
  app.option_defaults()->always_capture_default();  // --help shows every default
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
  app.add_option("--id-prefix", prefix,
                 "Prefix of the message ids: <prefix>-<n>, malformed ones <prefix>-bad-<k>");
  app.add_option("--rate", rate, "Messages per second (0 = as fast as PUBACKs allow)");
  app.add_option("--window", window, "PUBACKs outstanding at most")->check(CLI::PositiveNumber);
  int ack_timeout_ms = 30000;
  app.add_option("--ack-timeout-ms", ack_timeout_ms,
                 "Give up (exit 1) when no PUBACK arrived for this long, ms, reconnects included")
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
  // A clean session, and Paho's automatic reconnect off: each connection is a new Paho
  // client, and the messages the last one left without a PUBACK are published again here,
  // oldest first. Nothing of the publisher's lives on the broker between connections (a
  // QoS 1 PUBLISH the broker took is already on its way to the subscribers), so a session
  // would hold nothing it needs. Paho's own resend of its in-flight publishes on a session
  // is what the library's Subscriber found sent malformed after a broker restart
  // (src/mqtt/subscriber.cpp, renew_client), and Paho C's automatic reconnect freed a
  // string its receive thread still read (ThreadSanitizer, programs_test).
  mqtt::connect_options_builder builder;
  if (v5)
    builder.mqtt_version(MQTTVERSION_5).clean_start(true);
  else
    builder.mqtt_version(MQTTVERSION_3_1_1).clean_session(true);
  auto opts = builder.max_inflight(window).automatic_reconnect(false).finalize();
  if (auto s = connection_flags::to_paho_options(connection, &ssl, &opts); !s.ok()) {
    std::fprintf(stderr, "publisher: %s\n", s.to_string().c_str());
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  // Why the last connection ended: set by Paho's thread, read by the main one. Outlives
  // every client (declared before `cli`).
  struct Link {
    std::mutex mu;
    bool lost = false;
    std::string cause;
  } link;
  auto lost = [&link] {
    std::lock_guard<std::mutex> lock(link.mu);
    return link.lost;
  };
  std::unique_ptr<mqtt::async_client> cli;
  // A new client, without buffering while disconnected: a publish after a drop fails at
  // once instead of waiting in Paho for a connection this client will never make.
  auto make_client = [&] {
    mqtt::create_options co(v5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1, window + 10);
    co.set_send_while_disconnected(false);
    auto c =
        std::make_unique<mqtt::async_client>(connection.broker, connection.client_id, co, nullptr);
    c->set_connection_lost_handler([&link](const std::string& cause) {
      std::lock_guard<std::mutex> lock(link.mu);
      link.lost = true;
      link.cause = cause.empty() ? "connection lost" : "connection lost: " + cause;
    });
    return c;
  };
  // One CONNECT, waiting until Paho ends the attempt; the wait is in the same expression
  // as connect(), whose copy of the options Paho C reads during it (Paho C++ 1.2.0 bug
  // #325, src/mqtt/connect.cpp). Throws mqtt::exception when it fails.
  auto connect = [&](int timeout_s) {
    opts.set_connect_timeout(std::chrono::seconds(timeout_s));
    cli->connect(opts)->wait();
  };

  std::deque<std::pair<mqtt::delivery_token_ptr, size_t>> inflight;  // token, stream index
  std::deque<size_t> again;  // stream indices to publish (again) before the next new one
  size_t next = 0, acked = 0;
  int failed_in_a_row = 0, backoff_ms = 1000;
  constexpr int kBackoffMaxMs = 5000;
  std::string why_away;  // the last failed reconnect, for the give-up message
  const auto start = Clock::now();
  auto last_progress = start;  // the last PUBACK, or the first publish after none due
  const auto deadline = [&] { return last_progress + milliseconds(ack_timeout_ms); };
  auto give_up = [&] {
    std::string cause;
    {
      std::lock_guard<std::mutex> lock(link.mu);
      cause = !why_away.empty() ? why_away : link.lost ? link.cause : "broker not answering";
    }
    std::fprintf(stderr,
                 "publisher: no PUBACK for %d ms (%s); %zu of %zu messages acked. Publishing "
                 "again is safe: the ids are stable and the inbox drops duplicates\n",
                 ack_timeout_ms, cause.c_str(), acked, stream.size());
    std::_Exit(1);  // not destroying a client that may still be connecting
  };
  // When --rate lets the next new message go.
  auto due = [&](size_t n) {
    return start + std::chrono::microseconds(rate > 0 ? static_cast<int64_t>(n * 1e6 / rate) : 0);
  };
  auto publish = [&](size_t n) {
    auto msg = mqtt::make_message(topic, stream[n].payload, 1, false);
    if (v5 && !stream[n].id.empty())
      msg->set_properties({{mqtt::property::USER_PROPERTY, "message-id", stream[n].id}});
    return cli->publish(msg);
  };
  // The connection is gone: what it left without a PUBACK goes first in line, in its
  // order, and the client goes (no one waits on its tokens any more).
  auto drop_connection = [&] {
    for (auto it = inflight.rbegin(); it != inflight.rend(); ++it) again.push_front(it->second);
    if (inflight.empty()) last_progress = Clock::now();  // the wait for a PUBACK starts
    inflight.clear();
    cli.reset();
  };

  try {
    cli = make_client();
    connect(30);  // the first CONNECT: failing it is exit 1, with the reason
  } catch (const mqtt::exception& e) {
    // Paho says "TCP/TLS connect failure" for every transport failure: find out why.
    const std::string why =
        e.get_return_code() < 0 ? connection_flags::diagnose(connection, 5000) : "";
    std::fprintf(stderr, "publisher: %s%s%s\n", e.what(), why.empty() ? "" : ": ", why.c_str());
    return 1;
  }
  std::fprintf(stderr, "publisher: connected; publishing %zu messages\n", stream.size());
  try {
    while (acked < stream.size()) {
      if (!cli) {
        // Reconnect: backoff doubled from 1 s up to 5 s, never past the give-up time.
        const auto now = Clock::now();
        if (now >= deadline()) give_up();
        std::this_thread::sleep_until(std::min(now + milliseconds(backoff_ms), deadline()));
        backoff_ms = std::min(backoff_ms * 2, kBackoffMaxMs);
        const auto left = deadline() - Clock::now();
        if (left <= Clock::duration::zero()) give_up();
        const int timeout_s = static_cast<int>(std::min<int64_t>(
            30, 1 + std::chrono::duration_cast<std::chrono::seconds>(left).count()));
        {
          std::lock_guard<std::mutex> lock(link.mu);
          link.lost = false;
        }
        try {
          cli = make_client();
          connect(timeout_s);
        } catch (const mqtt::exception& e) {
          why_away = std::string("reconnect failed: ") + e.what();
          cli.reset();
          continue;
        }
        std::fprintf(
            stderr,
            "publisher: reconnected; %zu of %zu acked, publishing again the %zu without a PUBACK\n",
            acked, stream.size(), again.size());
        why_away.clear();
        backoff_ms = 1000;
      }
      // Publish while the window has room: first what a lost connection left, then the
      // next new message when --rate lets it go.
      while (static_cast<int>(inflight.size()) < window) {
        const bool redo = !again.empty();
        if (!redo && (next >= stream.size() || Clock::now() < due(next))) break;
        const size_t n = redo ? again.front() : next;
        mqtt::delivery_token_ptr tok;
        try {
          tok = publish(n);
        } catch (const mqtt::exception&) {
          if (lost() || !cli->is_connected()) break;  // handled below
          throw;
        }
        if (inflight.empty()) last_progress = Clock::now();  // the wait for a PUBACK starts
        inflight.emplace_back(std::move(tok), n);
        if (redo)
          again.pop_front();
        else
          ++next;
      }
      if (lost() || !cli->is_connected()) {
        {
          std::lock_guard<std::mutex> lock(link.mu);
          if (!link.lost) link.cause = "connection lost";
          link.lost = true;
          std::fprintf(stderr, "publisher: %s; %zu of %zu acked, reconnecting\n",
                       link.cause.c_str(), acked, stream.size());
        }
        drop_connection();
        continue;
      }
      // Until the oldest publish's PUBACK, in slices of at most 50 ms so that neither a
      // lost connection nor the time of the next message under --rate is missed.
      auto slice = milliseconds(50);
      if (next < stream.size() && static_cast<int>(inflight.size()) < window)
        slice = std::max(
            milliseconds(0),
            std::min(slice, std::chrono::duration_cast<milliseconds>(due(next) - Clock::now())));
      if (inflight.empty()) {
        std::this_thread::sleep_for(slice);
        continue;
      }
      try {
        if (inflight.front().first->wait_for(slice)) {
          inflight.pop_front();
          ++acked;
          failed_in_a_row = 0;
          last_progress = Clock::now();
          continue;
        }
      } catch (const mqtt::exception& e) {
        if (!lost() && cli->is_connected()) {
          // Refused on a live connection (an MQTT 5 PUBACK with an error code, say): publish
          // it again, after the others. Many in a row without one PUBACK between them are
          // not a passing refusal: report it and exit 1.
          if (++failed_in_a_row > window + 10) {
            std::fprintf(stderr, "publisher: %d publishes in a row failed without a PUBACK: %s\n",
                         failed_in_a_row, e.what());
            std::_Exit(1);
          }
          again.push_back(inflight.front().second);
          inflight.pop_front();
        }
        continue;  // a lost connection: handled above
      }
      if (Clock::now() >= deadline()) give_up();
    }
    try {
      cli->disconnect()->wait_for(milliseconds(5000));
    } catch (const mqtt::exception&) {
      // Every message has its PUBACK: a failed DISCONNECT loses nothing.
    }
  } catch (const mqtt::exception& e) {  // Paho refused a publish on a live connection
    std::fprintf(stderr, "publisher: %s; %zu of %zu messages acked\n", e.what(), acked,
                 stream.size());
    return 1;
  }
  std::printf("publisher: unique=%d duplicates=%d malformed=%d total_amount=%lld\n", count,
              duplicates, malformed_count, static_cast<long long>(total));
  return 0;
}

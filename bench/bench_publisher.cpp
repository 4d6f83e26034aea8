// bench_publisher: publishes N ledger credits at QoS 1 and waits for every PUBACK (never
// mosquitto_pub -l: it loses messages). Each payload carries a unique id and the
// publish time (CLOCK_MONOTONIC ns, comparable across processes on one machine):
//   {"message_id":"<uuid>","account":"acct-3","amount":17,"t_pub_ns":123456789}
//
//   bench_publisher --broker tcp://127.0.0.1:PORT --topic bench/credits --count 20000
//                   [--rate 200] [--window 100]
#include <mqtt/async_client.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <deque>
#include <random>
#include <thread>

#include "bench_util.h"

int main(int argc, char** argv) {
  CLI::App app{"Publish ledger credits for the mqtt-inbox benchmarks"};
  std::string broker, topic, client_id = "bench-pub", label = "publisher";
  int count = 20000, window = 100, accounts = 10;
  double rate = 0;
  uint64_t seed = 1;
  app.add_option("--broker", broker, "Broker URI")->required();
  app.add_option("--topic", topic, "Topic")->required();
  app.add_option("--count", count, "Messages");
  app.add_option("--rate", rate, "Messages per second (0 = as fast as PUBACKs allow)");
  app.add_option("--window", window, "PUBACKs outstanding at most");
  app.add_option("--accounts", accounts, "Accounts");
  app.add_option("--client-id", client_id, "Client id");
  app.add_option("--seed", seed, "Seed of the random ids");
  app.add_option("--label", label, "Name in the JSON line");
  CLI11_PARSE(app, argc, argv);

  std::mt19937_64 rng(seed);
  mqtt::async_client cli(broker, client_id, mqtt::create_options(MQTTVERSION_3_1_1, window + 10),
                         nullptr);
  auto opts = mqtt::connect_options_builder()
                  .mqtt_version(MQTTVERSION_3_1_1)
                  .clean_session(true)
                  .max_inflight(window)
                  .finalize();
  int64_t t0 = 0, t1 = 0;
  try {
    cli.connect(opts)->wait();
    std::deque<mqtt::delivery_token_ptr> inflight;
    t0 = bench::now_ns();
    for (int n = 0; n < count; ++n) {
      if (rate > 0) {
        const int64_t due = t0 + static_cast<int64_t>(n * 1e9 / rate);
        std::this_thread::sleep_for(std::chrono::nanoseconds(due - bench::now_ns()));
      }
      char payload[200];
      std::snprintf(payload, sizeof payload,
                    R"({"message_id":"%s","account":"acct-%d","amount":%d,"t_pub_ns":%lld})",
                    bench::uuid_like(rng).c_str(), n % accounts, n % 1000 + 1,
                    static_cast<long long>(bench::now_ns()));
      inflight.push_back(cli.publish(mqtt::make_message(topic, payload, 1, false)));
      while (static_cast<int>(inflight.size()) >= window) {
        inflight.front()->wait();
        inflight.pop_front();
      }
    }
    for (auto& t : inflight) t->wait();
    t1 = bench::now_ns();
    cli.disconnect()->wait();
  } catch (const mqtt::exception& e) {
    std::fprintf(stderr, "bench_publisher: %s\n", e.what());
    return 1;
  }
  const double secs = static_cast<double>(t1 - t0) / 1e9;
  bench::Json()
      .add("bench", "publisher")
      .add("label", label)
      .add("count", count)
      .add("rate_target", rate)
      .add("seconds", secs)
      .add("msgs_per_s", count / secs)
      .print();
  std::fprintf(stderr, "publisher[%s]: %d msgs in %.2f s = %.0f msg/s (all PUBACKed)\n",
               label.c_str(), count, secs, count / secs);
  return 0;
}

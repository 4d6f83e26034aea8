// stp_consumer: the ledger in store-then-process mode, with fault switches, run as a child
// process by tests/store_then_process_test.cpp. The aggregate key is the credit's
// "account"; the handler applies the credit and appends (account, message id, seq) to a
// table `seen`, so a test can read the order each account's credits were processed in.
//
//   stp_consumer BROKER CLIENT_ID TOPIC DB [--crash-in-handler ID] [--workers N]
//                [--lease-ms N] [--batch N] [--handler-sleep-ms N] [--mqtt-version 3.1.1|5]
//                [--max-attempts N] [--wall-offset-file PATH] [--steady-offset-ms N]
//                [--prepare-sleep-ms N]
//
// --crash-in-handler ID   SIGKILL itself inside the handler transaction whenever ID runs.
// --handler-sleep-ms N    the handler sleeps N ms inside its transaction (a slow handler).
// --prepare-sleep-ms N    a prepare function sleeps N ms, holding a claim but no lock (slow
//                         work that does not hold up receipt).
// --wall-offset-file PATH the Inbox's wall clock is the system's plus the number of ms in
//                         PATH, read at every call: a test steps the clock of a running
//                         process by rewriting the file.
// --steady-offset-ms N    the Inbox's monotonic clock is the system's plus N (fixed for the
//                         run: a monotonic clock never goes back within a process; another
//                         N for the next run is a reboot).
// SIGTERM: stops and prints the counters as "key=value" words on one line.
#include <signal.h>

#include <any>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <mqtt_inbox/mqtt_inbox.h>
#include <mqtt_inbox/store_then_process.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "ledger.h"

namespace {

class OffsetClock final : public mqtt_inbox::Clock {
 public:
  OffsetClock(std::string wall_offset_file, int64_t steady_offset_ms)
      : file_(std::move(wall_offset_file)), steady_offset_(steady_offset_ms) {}
  int64_t wall_ms() override {
    int64_t offset = 0;
    if (!file_.empty()) {
      std::ifstream f(file_);
      f >> offset;
      if (!f) offset = 0;
    }
    return system_->wall_ms() + offset;
  }
  int64_t steady_ms() override { return system_->steady_ms() + steady_offset_; }
  void sleep_ms(int64_t ms) override { system_->sleep_ms(ms); }

 private:
  mqtt_inbox::Clock* system_ = mqtt_inbox::Clock::system();
  std::string file_;
  int64_t steady_offset_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: stp_consumer BROKER CLIENT_ID TOPIC DB [options]\n");
    return 64;
  }
  mqtt_inbox::SubscriberOptions mqtt;
  mqtt.broker_uri = argv[1];
  mqtt.client_id = argv[2];
  // Tests run in parallel with the same client id against different brokers: keep the
  // client-id lock next to the test's database.
  mqtt.client_id_lock_dir = std::string(argv[4]).substr(0, std::string(argv[4]).rfind('/'));
  mqtt.reconnect_backoff_initial_ms = 50;
  mqtt.reconnect_backoff_max_ms = 200;
  const std::string topic = argv[3], db_path = argv[4];
  std::string crash_in_handler, wall_offset_file;
  int handler_sleep_ms = 0;
  int64_t steady_offset_ms = 0;
  mqtt_inbox::StoreThenProcessOptions o;
  o.consumer.retry_backoff_initial = std::chrono::milliseconds(10);
  o.consumer.retry_backoff_max = std::chrono::milliseconds(20);
  o.aggregate_key = mqtt_inbox::aggregate_key_from_json_field("account");
  o.poll_interval_ms = 50;
  for (int i = 5; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--crash-in-handler")
      crash_in_handler = value;
    else if (flag == "--workers")
      o.workers = std::stoi(value);
    else if (flag == "--lease-ms")
      o.lease_ms = std::stoll(value);
    else if (flag == "--batch")
      o.batch_size = std::stoi(value);
    else if (flag == "--handler-sleep-ms")
      handler_sleep_ms = std::stoi(value);
    else if (flag == "--max-attempts")
      o.consumer.max_attempts = std::stoi(value);
    else if (flag == "--wall-offset-file")
      wall_offset_file = value;
    else if (flag == "--steady-offset-ms")
      steady_offset_ms = std::stoll(value);
    else if (flag == "--prepare-sleep-ms") {
      const int ms = std::stoi(value);
      o.prepare = [ms](const mqtt_inbox::StoredDelivery&) -> std::any {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        return {};
      };
    } else if (flag == "--mqtt-version")
      mqtt.mqtt_version =
          value == "5" ? mqtt_inbox::MqttVersion::kV5 : mqtt_inbox::MqttVersion::kV3_1_1;
    else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 64;
    }
  }
  auto log = spdlog::stdout_logger_mt("stp_consumer");
  log->set_level(spdlog::level::info);
  log->flush_on(spdlog::level::info);
  mqtt.logger = log;

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  OffsetClock clock(wall_offset_file, steady_offset_ms);
  mqtt_inbox::InboxOptions iopts;
  iopts.logger = log;
  iopts.clock = &clock;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(db_path, iopts, &inbox); !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
  inbox->with_connection([](SQLite::Database& db) {
    ledger::create_tables(db);
    db.exec(
        "CREATE TABLE IF NOT EXISTS seen (id INTEGER PRIMARY KEY, account TEXT NOT NULL,"
        " message_id TEXT NOT NULL, seq INTEGER NOT NULL, attempt INTEGER NOT NULL)");
  });

  auto handler = [&](SQLite::Database& db, const mqtt_inbox::StoredDelivery& d) {
    if (d.message_id == crash_in_handler) {
      log->info("crash inside the handler on {} (attempt {})", d.message_id, d.attempt);
      raise(SIGKILL);
    }
    if (handler_sleep_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(handler_sleep_ms));
    ledger::apply_credit(db, mqtt_inbox::Delivery{d.message, d.message_id, d.attempt});
    SQLite::Statement q(
        db, "INSERT INTO seen (account, message_id, seq, attempt) VALUES (?1, ?2, ?3, ?4)");
    q.bind(1, d.aggregate_key);
    q.bind(2, d.message_id);
    q.bind(3, d.seq);
    q.bind(4, d.attempt);
    q.exec();
  };
  std::unique_ptr<mqtt_inbox::StoreThenProcess> stp;
  if (auto s = mqtt_inbox::StoreThenProcess::create(inbox.get(), "ledger", handler, o, &stp);
      !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
  if (auto s = stp->start(); !s.ok()) {
    log->error("{}", s.to_string());
    return 1;
  }
  std::unique_ptr<mqtt_inbox::Subscriber> sub;
  if (auto s = mqtt_inbox::Subscriber::create(mqtt, &sub); !s.ok()) {
    log->error("{}", s.to_string());
    return 2;
  }
  (void)sub->subscribe(topic, stp.get());
  (void)sub->start();
  int sig = 0;
  sigwait(&stop, &sig);
  (void)sub->stop();
  (void)stp->stop();
  const auto c = stp->counters();
  std::printf(
      "counters: stored=%lld duplicates=%lld processed=%lld reaped=%lld dead_lettered=%lld "
      "claims_lost=%lld\n",
      static_cast<long long>(c.stored), static_cast<long long>(c.duplicates),
      static_cast<long long>(c.processed), static_cast<long long>(c.reaped),
      static_cast<long long>(c.dead_lettered), static_cast<long long>(c.claims_lost));
  std::fflush(stdout);
  return 0;
}

// A consumer as a child process that counts what Paho C traces, for paho_trace_test:
//   paho_trace_child DB BROKER_URI TOPIC COUNT
// Installs a Paho trace callback before anything else, makes an Inbox, a Consumer (the
// ledger handler) and a Subscriber, then counts the trace entries Paho hands the callback
// below MQTTASYNC_TRACE_ERROR from that point on, while COUNT credits published on TOPIC
// are processed. Prints "below_error=N processed=M" and exits 0 once M = COUNT (1 after
// 30 s). Environment variables reach Paho as they are (MQTT_C_CLIENT_TRACE).
#include <MQTTAsync.h>
#include <mqtt_inbox/mqtt_inbox.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "ledger.h"

using namespace mqtt_inbox;

namespace {
std::atomic<bool> counting{false};
std::atomic<long> below_error{0};

void on_trace(enum MQTTASYNC_TRACE_LEVELS level, char*) {
  if (counting.load() && level < MQTTASYNC_TRACE_ERROR) ++below_error;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: paho_trace_child DB BROKER_URI TOPIC COUNT\n");
    return 2;
  }
  MQTTAsync_setTraceCallback(on_trace);
  const std::string db = argv[1];
  const long count = std::stol(argv[4]);
  std::unique_ptr<Inbox> inbox;
  if (Status s = Inbox::open(db, {}, &inbox); !s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.to_string().c_str());
    return 1;
  }
  inbox->with_connection([](SQLite::Database& d) { ledger::create_tables(d); });
  std::unique_ptr<Consumer> consumer;
  if (!Consumer::create(inbox.get(), "ledger", ledger::CreditHandler{}, {}, &consumer).ok())
    return 1;
  SubscriberOptions o;
  o.broker_uri = argv[2];
  o.client_id = "paho-trace-child";
  o.client_id_lock_dir = db.substr(0, db.rfind('/'));
  std::unique_ptr<Subscriber> sub;
  if (Status s = Subscriber::create(o, &sub); !s.ok()) {
    std::fprintf(stderr, "subscriber: %s\n", s.to_string().c_str());
    return 1;
  }
  counting = true;  // from the library's first Paho client on
  if (!sub->subscribe(argv[3], consumer.get()).ok() || !sub->start().ok()) return 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (consumer->counters().processed < count && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  (void)sub->stop();
  const long processed = static_cast<long>(consumer->counters().processed);
  std::printf("below_error=%ld processed=%ld\n", below_error.load(), processed);
  std::fflush(stdout);
  return processed == count ? 0 : 1;
}

// The outbox relay as a child process with a fault switch, for relay_test's crash cases:
//   relay_child DB BROKER_URI POINT SEQ
// POINT is none, before_publish (the row committed, not yet published), after_publish
// (handed to Paho, its PUBACK not yet marked) or before_mark (PUBACKs received, marks not
// written); the process SIGKILLs itself at that point for the first row with seq >= SEQ
// (before_mark: at the first batch of marks once that row was published, as PUBACKs are
// marked in batches, RelayOptions::mark_linger_ms).
// Without a fault it relays until no row is pending and exits 0.
#include <mqtt_inbox/mqtt_inbox.h>
#include <mqtt_inbox/relay.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

using namespace mqtt_inbox;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: relay_child DB BROKER_URI POINT SEQ\n");
    return 2;
  }
  const std::string point = argv[3];
  const int64_t at = std::stoll(argv[4]);
  InboxOptions io;
  io.exclusive = false;
  std::unique_ptr<Inbox> inbox;
  if (Status s = Inbox::open(argv[1], io, &inbox); !s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.to_string().c_str());
    return 1;
  }
  std::unique_ptr<Outbox> outbox;
  if (!Outbox::create(inbox.get(), {}, &outbox).ok()) return 1;
  RelayOptions o;
  o.broker_uri = argv[2];
  o.client_id = "relay-child";
  // The lock beside the database: tests run in parallel, each in a folder of its own.
  const std::string db = argv[1];
  o.client_id_lock_dir = db.find('/') == std::string::npos ? "." : db.substr(0, db.rfind('/'));
  o.max_inflight = 8;
  o.poll_interval_ms = 20;
  o.reconnect_backoff_initial_ms = 50;
  o.reconnect_backoff_max_ms = 300;
  auto die_at = [at](int64_t seq) {
    if (seq >= at) ::kill(::getpid(), SIGKILL);
  };
  if (point == "before_publish") o.before_publish_hook = die_at;
  if (point == "after_publish") o.after_publish_hook = die_at;
  std::atomic<int64_t> last_published{0};
  if (point == "before_mark") {
    o.after_publish_hook = [&last_published](int64_t seq) { last_published = seq; };
    o.before_mark_hook = [&last_published, die_at](int64_t) { die_at(last_published.load()); };
  }
  std::unique_ptr<Relay> relay;
  if (Status s = Relay::create(outbox.get(), o, &relay); !s.ok()) {
    std::fprintf(stderr, "relay: %s\n", s.to_string().c_str());
    return 1;
  }
  if (!relay->start().ok()) return 1;
  for (;;) {
    std::vector<OutboxClassUsage> usage;
    if (outbox->usage(&usage).ok()) {
      int64_t pending = 0;
      for (const auto& u : usage) pending += u.rows;
      if (pending == 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  (void)relay->stop();
  return 0;
}

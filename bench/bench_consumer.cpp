// bench_consumer: the MQTT side of the benchmarks.
//   --mode inbox    Inbox + Consumer + Subscriber running ledger::CreditHandler (the ledger
//                   example's handler), synchronous FULL or NORMAL, with the Pruner running
//                   as in ledger_consumer (examples/consumer_service.h): library defaults.
//   --mode ceiling  a bare Paho callback subscriber that does nothing: the transport
//                   ceiling for the same stream (same persistent session, QoS 1).
//   --work W        ceiling mode only: what the callback does instead of nothing, to see
//                   what the transport costs around a commit-like wait. spin:US (busy
//                   for US microseconds: the thread stays on the CPU), sleep:US
//                   (nanosleep), fsync:BYTES (pwrite BYTES to a file next to --db, then
//                   fdatasync: a commit's I/O without SQLite). Adds gap_p50_us/gap_mean_us
//                   (from one callback's return to the next one's entry: Paho's work per
//                   message, the PUBACK, the next PUBLISH's receipt) and work_p50_us.
//   --phase setup   connect once with the persistent session, subscribe, disconnect: the
//                   broker then queues messages for this client while it is offline.
//   --phase run     consume until --count messages are done (committed, in inbox mode),
//                   then print one JSON line and a human summary.
//   --latency       also record publish->commit (inbox) or publish->callback (ceiling)
//                   latency from the t_pub_ns field in each payload, split into stages:
//                     transport   publish -> message callback entered
//                     pre_claim   callback -> claim transaction begins (id extraction,
//                                 lookup read, attempt record)
//                     claim       claim transaction: insert, handler, COMMIT (fsync)
//                   In this mode the message id comes from an extractor (which stamps the
//                   callback entry time) instead of the built-in JSON field reader.
//   --ready-file F  written once connected (the live phase starts the publisher then).
//   --emit-topic T  inbox mode: the handler also enqueues one event per credit to topic T
//                   in its claim transaction (as ledger_consumer --emit-topic), and an
//                   outbox Relay (its own connection, MQTT 5) publishes them; the run ends
//                   once every event is PUBACKed. Adds the relay's commit-to-PUBACK and
//                   publish-to-PUBACK latency (RelayCounters: p50/p99 over the last 1,024
//                   PUBACKs) as relay_commit_to_puback_p50_ms, ..., and what the relay's
//                   marks add to the WAL: relay_wal_frames_per_credit and
//                   relay_wal_bytes_per_credit are counted from the same message as
//                   vfs_wal_frames_per_msg but to the relay's stop (so the marks of the
//                   last events count too), relay_marks_per_credit is the relay's mark_sent
//                   transactions per credit (RelayOptions::before_mark_hook) over the run.
//   --relay-poll-only  with --emit-topic: RelayOptions::wake_on_commit = false (the relay
//                   finds the events at a 200 ms poll only, its default before the wake-up).
#include <mqtt/async_client.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include <mqtt_inbox/mqtt_inbox.h>

#include "bench_util.h"
#include "ledger.h"

namespace {

int64_t t_pub_of(const std::string& payload) {
  const size_t at = payload.find("\"t_pub_ns\":");
  if (at == std::string::npos) return 0;
  return std::strtoll(payload.c_str() + at + 11, nullptr, 10);
}

std::string id_of(const std::string& payload) {
  const size_t at = payload.find("\"message_id\":\"");
  if (at == std::string::npos) return {};
  const size_t b = at + 14, e = payload.find('"', b);
  return e == std::string::npos ? std::string() : payload.substr(b, e - b);
}

// Per-message stage times, filled on Paho's receive thread (one message at a time).
struct Stages {
  int64_t t_pub = 0, t_cb = 0, t_claim = 0;
};
thread_local Stages g_cur;

struct Samples {
  std::mutex mu;
  std::vector<double> total, transport, pre_claim, claim;
  void add(const Stages& s, int64_t t_end) {
    if (s.t_pub == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    total.push_back((t_end - s.t_pub) / 1e6);
    if (s.t_cb) transport.push_back((s.t_cb - s.t_pub) / 1e6);
    if (s.t_cb && s.t_claim) pre_claim.push_back((s.t_claim - s.t_cb) / 1e6);
    if (s.t_claim) claim.push_back((t_end - s.t_claim) / 1e6);
  }
};

void add_dist(bench::Json& j, const std::string& name, const std::vector<double>& v) {
  if (v.empty()) return;
  j.add(name + "_p50_ms", bench::percentile(v, 50))
      .add(name + "_p99_ms", bench::percentile(v, 99))
      .add(name + "_max_ms", *std::max_element(v.begin(), v.end()));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MQTT consumer side of the mqtt-inbox benchmarks"};
  std::string mode = "inbox", phase = "run", broker, topic, client_id, db_path, sync = "full",
              label, ready_file;
  int count = 20000, timeout_s = 600;
  bool latency = false, metadata = false, relay_poll_only = false;
  std::string work, emit_topic;
  app.add_option("--mode", mode)->check(CLI::IsMember({"inbox", "ceiling"}));
  app.add_option("--phase", phase)->check(CLI::IsMember({"setup", "run"}));
  app.add_option("--broker", broker)->required();
  app.add_option("--topic", topic)->required();
  app.add_option("--client-id", client_id)->required();
  app.add_option("--db", db_path, "Database file (inbox mode; deleted first)");
  app.add_option("--sync", sync)->check(CLI::IsMember({"full", "normal"}));
  app.add_option("--count", count, "Messages to wait for");
  app.add_option("--timeout", timeout_s, "Give up after this many seconds");
  app.add_option("--label", label, "Name in the JSON line");
  app.add_option("--ready-file", ready_file, "Touched once connected");
  app.add_flag("--latency", latency, "Record per-message latency stages");
  app.add_option("--work", work, "Ceiling mode: spin:US | sleep:US | fsync:BYTES per message");
  app.add_flag("--metadata", metadata, "InboxOptions::record_metadata = true (default false)");
  app.add_option("--emit-topic", emit_topic, "Inbox mode: enqueue one event per credit, relayed");
  app.add_flag("--relay-poll-only", relay_poll_only,
               "With --emit-topic: the relay is not woken by commits, only by its poll");
  CLI11_PARSE(app, argc, argv);
  if (label.empty()) label = mode + "_" + sync;

  if (phase == "setup") {
    mqtt::async_client cli(broker, client_id, mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
    auto opts = mqtt::connect_options_builder()
                    .mqtt_version(MQTTVERSION_3_1_1)
                    .clean_session(false)
                    .finalize();
    try {
      cli.connect(opts)->wait();
      cli.subscribe(topic, 1)->wait();
      cli.disconnect()->wait();
    } catch (const mqtt::exception& e) {
      std::fprintf(stderr, "bench_consumer setup: %s\n", e.what());
      return 1;
    }
    return 0;
  }

  bench::Drain done(count);
  Samples samples;
  int page_size = 0;

  // --work: what the ceiling's callback does, and the gaps between callbacks.
  std::string work_kind;
  int64_t work_amount = 0;
  if (!work.empty()) {
    const size_t colon = work.find(':');
    work_kind = work.substr(0, colon);
    if (colon == std::string::npos ||
        (work_kind != "spin" && work_kind != "sleep" && work_kind != "fsync")) {
      std::fprintf(stderr, "--work: spin:US, sleep:US or fsync:BYTES\n");
      return 2;
    }
    work_amount = std::stoll(work.substr(colon + 1));
  }
  int work_fd = -1;
  std::string work_buf;
  mqtt_inbox::RelayCounters relayed;    // --emit-topic: the relay's figures at the end
  bench::WriteSnapshot relay_stopped;   // --emit-topic: the write counters after its stop
  std::atomic<int64_t> relay_marks{0};  // --emit-topic: mark_sent transactions
  std::vector<double> gaps_us, work_us;
  int64_t last_return = 0;

  if (mode == "ceiling") {
    if (work_kind == "fsync") {
      const std::string f = (db_path.empty() ? std::string("bench_work") : db_path) + ".work";
      work_fd = ::open(f.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0644);
      if (work_fd < 0) {
        std::perror(f.c_str());
        return 1;
      }
      work_buf.assign(static_cast<size_t>(work_amount), 'w');
    }
    mqtt::async_client cli(broker, client_id, mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
    cli.set_message_callback([&](mqtt::const_message_ptr m) {
      const int64_t entry = bench::now_ns();
      if (last_return) gaps_us.push_back(static_cast<double>(entry - last_return) / 1e3);
      if (latency) {
        Stages s;
        s.t_pub = t_pub_of(m->get_payload());
        s.t_cb = entry;
        samples.add(s, s.t_cb);
      }
      if (work_kind == "spin") {
        while (bench::now_ns() < entry + work_amount * 1000) {
        }
      } else if (work_kind == "sleep") {
        std::this_thread::sleep_for(std::chrono::microseconds(work_amount));
      } else if (work_kind == "fsync") {
        if (::pwrite(work_fd, work_buf.data(), work_buf.size(), 0) < 0 || ::fdatasync(work_fd) != 0)
          std::perror("work");
      }
      if (!work_kind.empty()) work_us.push_back(static_cast<double>(bench::now_ns() - entry) / 1e3);
      done.one();
      last_return = bench::now_ns();
    });
    auto opts = mqtt::connect_options_builder()
                    .mqtt_version(MQTTVERSION_3_1_1)
                    .clean_session(false)
                    .finalize();
    try {
      auto tok = cli.connect(opts);
      tok->wait();
      if (!tok->get_connect_response().is_session_present()) cli.subscribe(topic, 1)->wait();
      if (!ready_file.empty()) std::ofstream(ready_file) << "ready\n";
      if (!done.wait(timeout_s)) {
        std::fprintf(stderr, "ceiling: timeout after %lld of %d\n",
                     static_cast<long long>(done.done()), count);
        return 1;
      }
      cli.disconnect()->wait();
    } catch (const mqtt::exception& e) {
      std::fprintf(stderr, "bench_consumer ceiling: %s\n", e.what());
      return 1;
    }
    if (work_fd >= 0) ::close(work_fd);
  } else {
    if (db_path.empty()) {
      std::fprintf(stderr, "--db is required in inbox mode\n");
      return 2;
    }
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path + suffix);
    auto log =
        std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
    mqtt_inbox::InboxOptions io;
    io.logger = log;
    io.synchronous =
        sync == "full" ? mqtt_inbox::Synchronous::kFull : mqtt_inbox::Synchronous::kNormal;
    io.record_metadata = metadata;
    bench::register_counting_vfs();  // the WAL figures; forwards everything to the default
    io.vfs = "counting";
    io.after_commit_hook = [&](const std::string&, const std::string&) {
      if (latency) samples.add(g_cur, bench::now_ns());
      done.one();
    };
    if (latency)
      io.before_claim_hook = [&](const std::string&, const std::string&) {
        g_cur.t_claim = bench::now_ns();
      };
    std::unique_ptr<mqtt_inbox::Inbox> inbox;
    if (auto s = mqtt_inbox::Inbox::open(db_path, io, &inbox); !s.ok()) {
      std::fprintf(stderr, "open: %s\n", s.to_string().c_str());
      return 1;
    }
    inbox->with_connection([&](SQLite::Database& db) {
      ledger::create_tables(db);
      page_size = db.execAndGet("PRAGMA page_size").getInt();
    });
    mqtt_inbox::ConsumerOptions co;
    if (latency) {
      co.message_id.user_property.clear();
      co.message_id.json_field.clear();
      co.message_id.extractor = [](const mqtt_inbox::Message& m) -> std::optional<std::string> {
        g_cur = Stages{};
        g_cur.t_cb = bench::now_ns();
        g_cur.t_pub = t_pub_of(m.payload);
        std::string id = id_of(m.payload);
        if (id.empty()) return std::nullopt;
        return id;
      };
    }
    // --emit-topic: the outbox and its relay, as ledger_consumer --emit-topic runs them.
    std::unique_ptr<mqtt_inbox::Outbox> outbox;
    std::unique_ptr<mqtt_inbox::Relay> relay;
    mqtt_inbox::Handler handler = ledger::CreditHandler{};
    if (!emit_topic.empty()) {
      if (auto s = mqtt_inbox::Outbox::create(inbox.get(), {}, &outbox); !s.ok()) {
        std::fprintf(stderr, "outbox: %s\n", s.to_string().c_str());
        return 1;
      }
      mqtt_inbox::RelayOptions ro;
      ro.broker_uri = broker;
      ro.client_id = client_id + "-relay";
      ro.logger = log;
      ro.wake_on_commit = !relay_poll_only;
      if (relay_poll_only) ro.poll_interval_ms = 200;  // the default before issue 27's wake-up
      ro.before_mark_hook = [&relay_marks](int64_t) { ++relay_marks; };
      if (auto s = mqtt_inbox::Relay::create(outbox.get(), ro, &relay); !s.ok()) {
        std::fprintf(stderr, "relay: %s\n", s.to_string().c_str());
        return 1;
      }
      handler = [credit = ledger::CreditHandler{}, &outbox, &emit_topic](
                    SQLite::Database& db, const mqtt_inbox::Delivery& d) {
        credit(db, d);
        mqtt_inbox::OutgoingMessage event;
        event.topic = emit_topic;
        event.message_id = mqtt_inbox::derived_message_id(d.message_id, "credited");
        event.payload = ledger::credited_event(db, d, event.message_id);
        outbox->enqueue_or_throw(db, event);
      };
      (void)relay->start();
    }
    std::unique_ptr<mqtt_inbox::Consumer> consumer;
    if (auto s = mqtt_inbox::Consumer::create(inbox.get(), "ledger", handler, co, &consumer);
        !s.ok()) {
      std::fprintf(stderr, "consumer: %s\n", s.to_string().c_str());
      return 1;
    }
    mqtt_inbox::SubscriberOptions so;
    so.broker_uri = broker;
    so.client_id = client_id;
    so.logger = log;
    // Retention as ledger_consumer runs it: a window covering the session expiry.
    mqtt_inbox::RetentionOptions retention;
    retention.broker_session_expiry = std::chrono::seconds(so.session_expiry_s);
    retention.window = retention.broker_session_expiry + std::chrono::hours(24);
    std::unique_ptr<mqtt_inbox::Pruner> pruner;
    if (auto s = mqtt_inbox::Pruner::create(inbox.get(), retention, &pruner); !s.ok()) {
      std::fprintf(stderr, "pruner: %s\n", s.to_string().c_str());
      return 1;
    }
    (void)pruner->start();
    std::unique_ptr<mqtt_inbox::Subscriber> sub;
    if (auto s = mqtt_inbox::Subscriber::create(so, &sub); !s.ok()) {
      std::fprintf(stderr, "subscriber: %s\n", s.to_string().c_str());
      return 1;
    }
    (void)sub->subscribe(topic, consumer.get());
    (void)sub->start();
    if (!sub->wait_connected(30000)) {
      std::fprintf(stderr, "inbox: not connected after 30 s\n");
      return 1;
    }
    if (!ready_file.empty()) std::ofstream(ready_file) << "ready\n";
    if (!done.wait(timeout_s)) {
      std::fprintf(stderr, "inbox: timeout after %lld of %d\n", static_cast<long long>(done.done()),
                   count);
      std::_Exit(1);
    }
    if (relay) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (relay->counters().acked < count && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      relayed = relay->counters();
      if (relayed.acked < count)
        std::fprintf(stderr, "relay: WARNING %lld of %d events PUBACKed\n",
                     static_cast<long long>(relayed.acked), count);
      (void)relay->stop();
      relay_stopped = bench::WriteSnapshot::now();
    }
    (void)sub->stop();
    const auto c = consumer->counters();
    if (c.processed != count || c.dead_lettered != 0)
      std::fprintf(stderr, "inbox: WARNING processed=%lld dead_lettered=%lld duplicates=%lld\n",
                   static_cast<long long>(c.processed), static_cast<long long>(c.dead_lettered),
                   static_cast<long long>(c.duplicates));
  }

  bench::Json j;
  j.add("bench", "consumer")
      .add("label", label)
      .add("mode", mode)
      .add("sync", mode == "inbox" ? sync : std::string("none"))
      .add("count", count);
  done.add_to(j, page_size > 0 ? page_size : 4096);
  if (!work.empty() && !gaps_us.empty()) {
    double sum = 0;
    for (double g : gaps_us) sum += g;
    j.add("work", work)
        .add("gap_p50_us", bench::percentile(gaps_us, 50))
        .add("gap_mean_us", sum / static_cast<double>(gaps_us.size()))
        .add("work_p50_us", bench::percentile(work_us, 50));
  }
  if (!emit_topic.empty())
    j.add("relay_acked", relayed.acked)
        .add("relay_commit_to_puback_p50_ms", relayed.commit_to_puback_p50_ms)
        .add("relay_commit_to_puback_p99_ms", relayed.commit_to_puback_p99_ms)
        .add("relay_puback_p50_ms", relayed.puback_latency_p50_ms)
        .add("relay_puback_p99_ms", relayed.puback_latency_p99_ms)
        .add("relay_wal_bytes_per_credit",
             (relay_stopped.wal_bytes - done.warm_snapshot().wal_bytes) / done.measured())
        .add("relay_wal_frames_per_credit",
             (relay_stopped.wal_bytes - done.warm_snapshot().wal_bytes) / done.measured() /
                 ((page_size > 0 ? page_size : 4096) + 24))
        .add("relay_marks_per_credit", static_cast<double>(relay_marks.load()) / count)
        .add("relay_poll_only", relay_poll_only ? 1 : 0);
  if (latency) {
    add_dist(j, "latency", samples.total);
    add_dist(j, "transport", samples.transport);
    add_dist(j, "pre_claim", samples.pre_claim);
    add_dist(j, "claim", samples.claim);
  }
  j.print();
  std::fprintf(stderr, "consumer[%s]: %.0f msgs in %.2f s = %.0f msg/s", label.c_str(),
               done.measured(), done.seconds(), done.rate());
  if (latency && !samples.total.empty())
    std::fprintf(stderr, "; latency p50 %.2f ms p99 %.2f ms max %.2f ms",
                 bench::percentile(samples.total, 50), bench::percentile(samples.total, 99),
                 *std::max_element(samples.total.begin(), samples.total.end()));
  if (!emit_topic.empty())
    std::fprintf(stderr, "; relay commit-to-PUBACK p50 %.2f ms p99 %.2f ms",
                 relayed.commit_to_puback_p50_ms, relayed.commit_to_puback_p99_ms);
  std::fprintf(stderr, "\n");
  return 0;
}

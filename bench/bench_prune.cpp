// bench_prune: what a full retention pass costs the message stream (issue 5).
// Fills N expired ids, then measures the claim-commit latency of a steady stream of
// ledger credits through Consumer::handle, first without pruning and then while a
// Pruner deletes all N in batches, and prints p50/p99 of both and the prune's rows/s.
//
//   bench_prune --dir /var/tmp --rows 1000000 --rate 200 --batch 500
//
// --fresh F adds F ids inside the window (kept): a steady-state pass, where a window's
// worth of ids is stored and only the oldest slice has expired (e.g. --rows 6000
// --fresh 1000000: one hour of a 7-day window).
//
// Goal: p99 during the prune <= 2 x p99 without it.
#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdio>
#include <thread>

#include <mqtt_inbox/mqtt_inbox.h>

#include "bench_util.h"
#include "ledger.h"

int main(int argc, char** argv) {
  CLI::App app{"Commit latency of a steady stream without and during a full prune"};
  std::string dir = "/var/tmp";
  int64_t rows = 1'000'000, fresh = 0;
  double rate = 200;
  int batch = 500, seconds = 0, max_batch_ms = mqtt_inbox::RetentionOptions{}.max_batch_ms;
  int autocheckpoint = mqtt_inbox::InboxOptions{}.wal_autocheckpoint_pages;
  double pause_factor = mqtt_inbox::RetentionOptions{}.pause_factor;
  bool normal = false;
  app.add_option("--dir", dir, "Folder for the database (not tmpfs)");
  app.add_option("--rows", rows, "Expired ids to fill");
  app.add_option("--fresh", fresh, "Ids inside the retention window to fill (kept)");
  app.add_option("--rate", rate, "Messages per second of the stream");
  app.add_option("--batch", batch, "Pruner batch_rows");
  app.add_option("--max-batch-ms", max_batch_ms, "Pruner max_batch_ms");
  app.add_option("--pause-factor", pause_factor, "Pruner pause_factor");
  app.add_option("--autocheckpoint", autocheckpoint,
                 "InboxOptions::wal_autocheckpoint_pages (0 = off)");
  app.add_option("--baseline-seconds", seconds, "Length of the no-prune phase (0 = 10 s)");
  app.add_flag("--normal", normal, "synchronous=NORMAL instead of FULL");
  CLI11_PARSE(app, argc, argv);
  if (seconds <= 0) seconds = 10;

  const std::string path = dir + "/bench_prune.db";
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
  mqtt_inbox::InboxOptions io;
  io.wal_autocheckpoint_pages = autocheckpoint;
  io.synchronous = normal ? mqtt_inbox::Synchronous::kNormal : mqtt_inbox::Synchronous::kFull;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(path, io, &inbox); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  std::mt19937_64 rng(7);
  const int64_t t_fill = bench::now_ns();
  inbox->with_connection([&](SQLite::Database& db) {
    ledger::create_tables(db);
    db.exec("PRAGMA synchronous = OFF");
    db.exec("BEGIN");
    SQLite::Statement ins(db,
                          "INSERT INTO inbox_processed (consumer_name, message_id, received_at,"
                          " topic, payload_hash) VALUES ('ledger', ?1, ?2, 'credits/bench', ?3)");
    const int64_t now = inbox->retention_clock_ms();
    for (int64_t i = 0; i < rows + fresh; ++i) {
      ins.bind(1, bench::uuid_like(rng));
      // The first `rows` are ancient on the retention clock (expired), the rest current.
      ins.bind(2, i < rows ? i : now);
      ins.bind(3, static_cast<int64_t>(rng()));
      ins.exec();
      ins.reset();
    }
    db.exec("COMMIT");
    db.exec(normal ? "PRAGMA synchronous = NORMAL" : "PRAGMA synchronous = FULL");
    db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  });
  const double fill_s = static_cast<double>(bench::now_ns() - t_fill) / 1e9;

  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  (void)mqtt_inbox::Consumer::create(inbox.get(), "ledger", ledger::apply_credit, {}, &consumer);
  mqtt_inbox::RetentionOptions ro;
  ro.window = std::chrono::hours(8 * 24);
  ro.batch_rows = batch;
  ro.max_batch_ms = max_batch_ms;
  ro.pause_factor = pause_factor;
  ro.pass_budget = std::chrono::hours(1);
  ro.stats_log_period_ms = 0;
  std::unique_ptr<mqtt_inbox::Pruner> pruner;
  if (auto s = mqtt_inbox::Pruner::create(inbox.get(), ro, &pruner); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }

  int64_t seq = 0;
  // Paced stream; returns per-message handle() latencies in microseconds.
  auto stream = [&](const std::function<bool(int64_t)>& more) {
    std::vector<double> lat;
    const int64_t start = bench::now_ns();
    for (int64_t n = 0; more(n); ++n) {
      const int64_t due = start + static_cast<int64_t>(static_cast<double>(n) * 1e9 / rate);
      while (bench::now_ns() < due) std::this_thread::sleep_for(std::chrono::microseconds(100));
      mqtt_inbox::Message m;
      m.topic = "credits/bench";
      const std::string id = "live-" + std::to_string(seq++);
      m.payload = "{\"message_id\":\"" + id + "\",\"account\":\"acct-" + std::to_string(seq % 50) +
                  "\",\"amount\":1}";
      const int64_t t0 = bench::now_ns();
      consumer->handle(m);
      lat.push_back(static_cast<double>(bench::now_ns() - t0) / 1e3);
    }
    return lat;
  };

  const int64_t baseline_n = static_cast<int64_t>(rate * seconds);
  const auto base = stream([&](int64_t n) { return n < baseline_n; });

  std::atomic<bool> done{false};
  mqtt_inbox::PruneResult pr;
  int64_t prune_ns = 0;
  std::thread t([&] {
    const int64_t t0 = bench::now_ns();
    (void)pruner->prune_once(&pr);
    prune_ns = bench::now_ns() - t0;
    done = true;
  });
  const auto during = stream([&](int64_t) { return !done.load(); });
  t.join();

  const double p50a = bench::percentile(base, 50), p99a = bench::percentile(base, 99);
  const double p50b = bench::percentile(during, 50), p99b = bench::percentile(during, 99);
  const double rows_per_s =
      static_cast<double>(pr.processed_deleted) / (static_cast<double>(prune_ns) / 1e9);
  bench::Json()
      .add("bench", "prune")
      .add("synchronous", normal ? "NORMAL" : "FULL")
      .add("rows", rows)
      .add("fresh", fresh)
      .add("fill_s", fill_s)
      .add("batch_rows", static_cast<int64_t>(batch))
      .add("max_batch_ms", static_cast<int64_t>(max_batch_ms))
      .add("wal_autocheckpoint_pages", static_cast<int64_t>(autocheckpoint))
      .add("pause_factor", pause_factor)
      .add("batches", pr.batches)
      .add("rate", rate)
      .add("baseline_p50_us", p50a)
      .add("baseline_p99_us", p99a)
      .add("during_p50_us", p50b)
      .add("during_p99_us", p99b)
      .add("during_messages", static_cast<int64_t>(during.size()))
      .add("pruned", pr.processed_deleted)
      .add("prune_s", static_cast<double>(prune_ns) / 1e9)
      .add("prune_rows_per_s", rows_per_s)
      .add("p99_ratio", p99a > 0 ? p99b / p99a : 0)
      .print();
  std::fprintf(stderr,
               "prune: %lld expired ids, %lld kept (filled in %.1f s), stream %.0f msg/s, %s\n"
               "  commit latency without prune: p50 %.0f us, p99 %.0f us (%zu msgs)\n"
               "  commit latency during prune:  p50 %.0f us, p99 %.0f us (%zu msgs)\n"
               "  p99 ratio %.2f (goal <= 2); prune deleted %lld rows in %.1f s = %.0f rows/s, "
               "%lld pages freed\n"
               "  reproduce: bench_prune --dir %s --rows %lld --fresh %lld --rate %.0f --batch %d "
               "--max-batch-ms %d"
               " --pause-factor %g --autocheckpoint %d%s\n",
               static_cast<long long>(rows), static_cast<long long>(fresh), fill_s, rate,
               normal ? "NORMAL" : "FULL", p50a, p99a, base.size(), p50b, p99b, during.size(),
               p99a > 0 ? p99b / p99a : 0.0, static_cast<long long>(pr.processed_deleted),
               static_cast<double>(prune_ns) / 1e9, rows_per_s,
               static_cast<long long>(pr.pages_freed), dir.c_str(), static_cast<long long>(rows),
               static_cast<long long>(fresh), rate, batch, max_batch_ms, pause_factor,
               autocheckpoint, normal ? " --normal" : "");
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
  return 0;
}

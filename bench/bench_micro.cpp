// bench_micro: Google Benchmark micro-benchmarks of the core (no MQTT), on a temp db:
//   BM_HandleNewId        Consumer::handle, ledger handler, a new id each time
//   BM_HandleDuplicate    Consumer::handle of an id already processed (claim conflicts,
//                         rollback)
//   BM_ClaimNewId         Store::process, the claim transaction without the Consumer, same handler
//   BM_ClaimDuplicate     Store::process of an id already claimed (insert conflicts,
//                         rollback)
// The handler is ledger::CreditHandler, as in ledger_consumer.
// Argument: 1 = synchronous FULL, 0 = NORMAL.
// (A prune batch benchmark belongs here once include/mqtt_inbox exposes a prune API.)
//
//   bench_micro --benchmark_format=json   (or --benchmark_out=f.json)
#include <benchmark/benchmark.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <random>

#include <unistd.h>

#include <mqtt_inbox/mqtt_inbox.h>

#include "bench_util.h"
#include "ledger.h"
#include "store/claims.h"
#include "store/inbox.h"
#include "store/store.h"

namespace {

struct Fixture {
  std::string path;
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  ledger::CreditHandler handler;
  mqtt_inbox::TransactionHandler bound;  // `handler` as the store's claim calls it
  std::mt19937_64 rng{1};

  explicit Fixture(bool full) {
    path = (std::filesystem::temp_directory_path() /
            ("mqtt_inbox_micro_" + std::to_string(::getpid()) + ".db"))
               .string();
    cleanup();
    mqtt_inbox::InboxOptions io;
    io.logger =
        std::make_shared<spdlog::logger>("micro", std::make_shared<spdlog::sinks::null_sink_mt>());
    io.synchronous = full ? mqtt_inbox::Synchronous::kFull : mqtt_inbox::Synchronous::kNormal;
    if (!mqtt_inbox::Inbox::open(path, io, &inbox).ok()) std::abort();
    inbox->with_connection([](SQLite::Database& db) { ledger::create_tables(db); });
    if (!mqtt_inbox::Consumer::create(inbox.get(), "ledger", handler, {}, &consumer).ok())
      std::abort();
    bound = mqtt_inbox::Handler(std::ref(handler));
  }
  mqtt_inbox::detail::Store& store() {
    return *mqtt_inbox::detail::InboxImpl::store_of(inbox.get());
  }
  ~Fixture() {
    consumer.reset();
    bound = mqtt_inbox::TransactionHandler();
    handler = ledger::CreditHandler{};  // its statements belong to the inbox's connection
    inbox.reset();
    cleanup();
  }
  void cleanup() {
    for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(path + s);
  }
  mqtt_inbox::Message message(const std::string& id) {
    mqtt_inbox::Message m;
    m.topic = "bench/credits";
    m.payload = R"({"message_id":")" + id + R"(","account":"acct-1","amount":5})";
    return m;
  }
};

void BM_HandleNewId(benchmark::State& state) {
  Fixture f(state.range(0) != 0);
  for (auto _ : state) {
    state.PauseTiming();
    const auto m = f.message(bench::uuid_like(f.rng));
    state.ResumeTiming();
    if (f.consumer->handle(m) != mqtt_inbox::Outcome::kProcessed)
      state.SkipWithError("not processed");
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_HandleDuplicate(benchmark::State& state) {
  Fixture f(state.range(0) != 0);
  const auto m = f.message("the-same-id");
  (void)f.consumer->handle(m);
  for (auto _ : state)
    if (f.consumer->handle(m) != mqtt_inbox::Outcome::kDuplicate) state.SkipWithError("not dup");
  state.SetItemsProcessed(state.iterations());
}

void BM_ClaimNewId(benchmark::State& state) {
  Fixture f(state.range(0) != 0);
  for (auto _ : state) {
    state.PauseTiming();
    const std::string id = bench::uuid_like(f.rng);
    const auto m = f.message(id);
    state.ResumeTiming();
    mqtt_inbox::detail::ProcessReport r;
    if (!f.store().process("ledger", m, id, f.bound, 5, std::nullopt, nullptr, nullptr, &r).ok() ||
        r.result != mqtt_inbox::detail::ClaimResult::kProcessed)
      state.SkipWithError("claim failed");
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_ClaimDuplicate(benchmark::State& state) {
  Fixture f(state.range(0) != 0);
  const std::string id = "the-same-id";
  const auto m = f.message(id);
  mqtt_inbox::detail::ProcessReport r;
  (void)f.store().process("ledger", m, id, f.bound, 5, std::nullopt, nullptr, nullptr, &r);
  for (auto _ : state) {
    if (!f.store().process("ledger", m, id, f.bound, 5, std::nullopt, nullptr, nullptr, &r).ok() ||
        r.result != mqtt_inbox::detail::ClaimResult::kDuplicate)
      state.SkipWithError("not a duplicate");
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(BM_HandleNewId)->ArgName("full")->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HandleDuplicate)->ArgName("full")->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ClaimNewId)->ArgName("full")->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ClaimDuplicate)->ArgName("full")->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);

namespace {

// Console output plus one JSON object per result line on stdout. No colour: the output
// goes to a log (ConsoleReporter's default turns colour on whatever --benchmark_color says).
class JsonLinesReporter : public benchmark::ConsoleReporter {
 public:
  JsonLinesReporter() : ConsoleReporter(OO_Tabular) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      bench::Json()
          .add("bench", "micro")
          .add("name", r.benchmark_name())
          .add("iterations", static_cast<int64_t>(r.iterations))
          .add("real_us_per_op", r.GetAdjustedRealTime())
          .add("cpu_us_per_op", r.GetAdjustedCPUTime())
          .add("ops_per_s", 1e6 / r.GetAdjustedRealTime())
          .print();
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  JsonLinesReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

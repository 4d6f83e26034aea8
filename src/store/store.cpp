// The Store front (store/store.h): opening, the connection's lock and the errors' one
// path (classified, counted, latched), start-up waits, health, statistics, the retention
// clock, and the application's set-up. The claim decision is in store/claims.cpp, the
// dead letters' rules in store/dead_letters.cpp, the session records' in
// store/sessions.cpp.
#include "store/store.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "store/reentry.h"
#include "store/retention_rows.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

namespace {

// Constant-initialised (std::atomic's constexpr constructor): set before any Inbox::open
// that follows enable_postgres_store(), whatever the order of static initialisers.
std::atomic<BackendMaker> g_postgres_backend{nullptr};

Status check_common_options(const InboxOptions& o) {
  if (o.busy_timeout_ms < 0) return Status::InvalidArgument("busy_timeout_ms < 0");
  if (o.startup_backoff_initial.count() < 1 || o.startup_backoff_max < o.startup_backoff_initial ||
      o.startup_deadline_ms < 0 || o.startup_log_interval_ms < 0)
    return Status::InvalidArgument(
        "start-up options: need 1 ms <= startup_backoff_initial <= startup_backoff_max, "
        "startup_deadline_ms >= 0, startup_log_interval_ms >= 0");
  return Status::Ok();
}

}  // namespace

void register_postgres_backend(BackendMaker maker) {
  g_postgres_backend.store(maker, std::memory_order_release);
}

bool is_postgres_location(const std::string& location) {
  return location.rfind("postgresql://", 0) == 0 || location.rfind("postgres://", 0) == 0;
}

Store::Store(const std::string& location, const InboxOptions& options)
    : location_(location),
      options_(options),
      clock_(options.clock ? options.clock : Clock::system()),
      log_(logger_or_default(options.logger)),
      sessions_(*this),
      startup_("inbox " + location, location, options.startup_backoff_initial.count(),
               options.startup_backoff_max.count(), options.startup_log_interval_ms, clock_, log_) {
}

Store::~Store() = default;

StoreBackend::StoreBackend(Store& front)
    : options(front.options()), clock(front.clock()), log(front.log()), front_(front) {}

Status Store::open(const std::string& location, const InboxOptions& options,
                   std::unique_ptr<Store>* out) {
  if (location.empty()) return Status::InvalidArgument("database location is empty");
  if (Status s = check_common_options(options); !s.ok()) return s;
  auto store = std::make_unique<Store>(location, options);
  std::unique_ptr<StoreBackend> backend;
  const bool postgres = is_postgres_location(location);
  if (postgres) {
#if MQTT_INBOX_WITH_POSTGRES
    BackendMaker make = g_postgres_backend.load(std::memory_order_acquire);
    if (!make)
      return Status::InvalidArgument(
          "the PostgreSQL store is not enabled in this program: link the library "
          "mqtt_inbox_postgres (CMake: mqtt_inbox::postgres, pkg-config: mqtt_inbox_postgres) "
          "and call mqtt_inbox::enable_postgres_store() (mqtt_inbox/postgres.h) before "
          "Inbox::open of a postgresql:// location");
    if (Status s = make(*store, &backend); !s.ok()) return s;
#else
    return Status::InvalidArgument(
        "this build of mqtt-inbox has no PostgreSQL store (configured with "
        "MQTT_INBOX_WITH_POSTGRES=OFF): it cannot open a postgresql:// location");
#endif
  } else {
    if (Status s = make_sqlite_backend(*store, &backend); !s.ok()) return s;
  }
  store->backend_ = std::move(backend);
  StoreBackend* b = store->backend_.get();
  Store* front = store.get();
  const Status s = store->wait_at_startup(
      postgres ? "connecting to PostgreSQL" : "opening the database", [b, front](int lock_wait_ms) {
        std::lock_guard<std::mutex> lock(b->mu);
        const Status opened = b->open(lock_wait_ms);
        return opened.ok() ? opened : front->store_error(opened);
      });
  if (!s.ok()) return b->failed_open(s);
  *out = std::move(store);
  return Status::Ok();
}

void Store::name_user(const std::string& consumer) {
  std::lock_guard<std::mutex> lock(backend_->mu);
  backend_->name_user(consumer);
}

Status Store::check_handler_type(const std::type_info* type, const char* what) const {
  if (!type) return Status::InvalidArgument(std::string(what) + " is empty");
  if (*type == backend_->handler_type()) return Status::Ok();
  // typeid(T*) of the handler's first parameter: "T*", demangled, names T.
  std::string taken = type->name();
  int rc = -1;
  if (char* d = abi::__cxa_demangle(type->name(), nullptr, nullptr, &rc)) {
    taken = d;
    std::free(d);
  }
  if (!taken.empty() && taken.back() == '*') taken.back() = '&';
  return Status::InvalidArgument(std::string(what) + " takes " + taken +
                                 ", a transaction of "
                                 "another store: " +
                                 location_ + "'s handlers take " + backend_->handler_type_name());
}

Status Store::locked(const char* what, FunctionRef<void()> fn) {
  if (Status s = backend_->ready(); !s.ok()) return store_error(s);
  try {
    fn();
  } catch (const StoreRefused& e) {
    backend_->rollback();
    return Status(Status::Code::kRejected, e.what());
  } catch (...) {
    const Status s = backend_->classify_current(what);
    backend_->rollback();
    return store_error(s);
  }
  return Status::Ok();
}

Status Store::write_txn(const char* what, FunctionRef<void(StoreBackend&)> fn) {
  StoreBackend& b = *backend_;
  return on_connection(what, [&] {
    b.begin();
    fn(b);
    std::string why;
    if (b.commit(nullptr, &why) == CommitOutcome::kRefused)
      throw StoreRefused(std::string(what) + ": " + why);
  });
}

Status Store::read_txn(const char* what, FunctionRef<void(StoreBackend&)> fn) {
  StoreBackend& b = *backend_;
  return on_connection(what, [&] {
    b.begin_read();
    try {
      fn(b);
    } catch (...) {
      b.end_read();
      throw;
    }
    b.end_read();
  });
}

Status Store::on_connection(const char* what, FunctionRef<void()> fn) {
  if (in_handler_of(owner_))
    return refuse_if_in_handler(owner_,
                                ("the store's connection (" + std::string(what) + ")").c_str());
  if (unusable()) return fatal_status();
  std::lock_guard<std::mutex> lock(backend_->mu);
  return locked(what, fn);
}

Status Store::store_error(Status s, bool holding_connection) {
  if (s.ok()) return s;
  if (s.is_transient_store_error()) ++store_errors_;
  if (s.is_fatal_store_error()) latch_fatal(s);
  if (holding_connection) backend_->on_store_error(s);
  return s;
}

void Store::latch_fatal(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    if (fatal_.load()) return;
    fatal_error_ = s.to_string();
    fatal_ = true;
  }
  if (backend_) backend_->on_fatal();
  startup_.set_fatal(s);
  log_->critical("inbox {}: {}", location_,
                 backend_ ? backend_->fatal_advice(s.to_string()) : s.to_string());
}

Status Store::fatal_status() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return Status(Status::Code::kCorruption,
                backend_ ? backend_->fatal_text(fatal_error_) : location_ + ": " + fatal_error_);
}

Health Store::health() const {
  Health h = startup_.health();
  if (fatal_.load()) {
    h.fatal = true;
    std::lock_guard<std::mutex> lock(stats_mu_);
    h.last_error = fatal_error_;
  }
  return h;
}

// The first attempt waits at most this long for a lock, so that a wait is reported
// (startup_progress, systemd's STATUS=) about 1 s after it begins, not a whole busy
// timeout later; the attempts after it wait the full one.
constexpr int64_t kFirstStartupAttemptMs = 1000;

Status Store::wait_at_startup(const char* what, const std::function<Status(int)>& op) {
  const int64_t deadline = options_.startup_deadline_ms;
  const int64_t t0 = clock_->steady_ms();
  bool first = true;
  return startup_.until_ready(
      what,
      [&]() -> Status {
        if (fatal_.load()) return fatal_status();
        int64_t wait = options_.busy_timeout_ms;
        if (first) wait = std::min<int64_t>(wait, kFirstStartupAttemptMs);
        first = false;
        if (deadline > 0)
          wait = std::clamp<int64_t>(deadline - (clock_->steady_ms() - t0), 0, wait);
        return op(static_cast<int>(wait));
      },
      deadline, options_.startup_progress);
}

void Store::record_commit(int64_t us) {
  const auto v = static_cast<int32_t>(std::min<int64_t>(us, INT32_MAX));
  latency_us_[latency_next_.fetch_add(1, std::memory_order_relaxed) % kLatencySamples].store(
      v, std::memory_order_relaxed);
  int64_t seen = commit_max_us_.load(std::memory_order_relaxed);
  while (us > seen && !commit_max_us_.compare_exchange_weak(seen, us)) {
  }
}

void Store::note_commit() { last_commit_steady_ms_ = clock_->steady_ms(); }

InboxStats Store::stats() const {
  InboxStats s;
  s.processed = processed_.load();
  s.duplicates = duplicates_.load();
  s.dead_lettered = dead_lettered_.load();
  s.retries = retries_.load();
  s.store_errors = store_errors_.load();
  s.pruned = pruned_.load();
  s.dead_letters_pruned = dead_letters_pruned_.load();
  s.sessions_lost = sessions_lost_.load();
  const int64_t seen = s.processed + s.duplicates;
  s.duplicate_ratio = seen ? static_cast<double>(s.duplicates) / static_cast<double>(seen) : 0.0;

  const uint64_t n = std::min<uint64_t>(latency_next_.load(), kLatencySamples);
  std::vector<int32_t> lat;
  lat.reserve(n);
  for (uint64_t i = 0; i < n; ++i) lat.push_back(latency_us_[i].load(std::memory_order_relaxed));
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    s.commit_p50_us = lat[lat.size() / 2];
    s.commit_p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  }
  s.commit_max_us = commit_max_us_.load();
  backend_->file_stats(&s);
  s.retention_clock_ms = retention_clock();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s.consumers = consumer_rows_;
    s.outbox = outbox_rows_;
    s.rows_measured_at = rows_measured_at_;
  }
  return s;
}

Status Store::refresh_row_stats() {
  if (Status r = refuse_if_in_handler(owner_, "Inbox::refresh_row_stats"); !r.ok()) return r;
  if (unusable()) return fatal_status();
  return backend_->measure_rows();
}

void Store::set_row_stats(std::map<std::string, ConsumerRows> rows, OutboxRows outbox) {
  const int64_t at = std::max<int64_t>(1, retention_clock());  // 0 means "never measured"
  std::lock_guard<std::mutex> lock(stats_mu_);
  consumer_rows_ = std::move(rows);
  outbox_rows_ = std::move(outbox);
  rows_measured_at_ = at;
}

int64_t Store::retention_clock() const {
  const int64_t t = clock_base_ms_.load() + (clock_->steady_ms() - steady_base_ms_.load());
  int64_t seen = clock_high_.load(std::memory_order_relaxed);
  while (t > seen && !clock_high_.compare_exchange_weak(seen, t)) {
  }
  return std::max(t, seen);
}

void Store::set_retention_clock_base(int64_t base_ms) {
  steady_base_ms_ = clock_->steady_ms();
  clock_base_ms_ = base_ms;
}

Status Store::persist_retention_clock() {
  if (Status r = refuse_if_in_handler(owner_, "Store::persist_retention_clock"); !r.ok()) return r;
  return backend_->retention_rows().persist_clock();
}

Status Store::setup(const std::type_info* type, const std::function<void(const TxnRef&)>& fn) {
  if (Status r = refuse_if_in_handler(owner_, "Inbox::setup"); !r.ok()) return r;
  if (Status s = check_handler_type(type, "Inbox::setup's function"); !s.ok()) return s;
  return wait_at_startup("running the application's set-up", [&](int lock_wait_ms) -> Status {
    if (unusable()) return fatal_status();
    std::lock_guard<std::mutex> lock(backend_->mu);
    if (Status s = backend_->ready(); !s.ok()) return store_error(s);
    try {
      backend_->setup(lock_wait_ms, [&](const TxnRef& txn) { fn(txn); });
    } catch (const std::exception& e) {
      const Status s = backend_->classify_current("application set-up");
      backend_->rollback();
      // Not the store's own error: the function's (a std::logic_error, ...).
      if (s.code() == Status::Code::kInternal)
        return Status::InvalidArgument(std::string("application set-up: ") + e.what());
      return store_error(s);
    } catch (...) {
      backend_->rollback();
      return Status::InvalidArgument("application set-up threw a non-standard exception");
    }
    return Status::Ok();
  });
}

Status Store::setup_sql(const std::string& sql) {
  if (Status r = refuse_if_in_handler(owner_, "Inbox::setup_sql"); !r.ok()) return r;
  return wait_at_startup("running the application's set-up", [&](int lock_wait_ms) -> Status {
    if (unusable()) return fatal_status();
    std::lock_guard<std::mutex> lock(backend_->mu);
    return locked("application set-up", [&] { backend_->setup_sql(lock_wait_ms, sql); });
  });
}

void Store::with_connection(const std::type_info* type, FunctionRef<void(const TxnRef&)> fn) {
  if (Status r = refuse_if_in_handler(owner_, "Inbox::with_connection"); !r.ok())
    throw std::logic_error(r.message());
  if (!type || *type != backend_->connection_type())
    throw std::logic_error("Inbox::with_connection: the function does not take " + location_ +
                           "'s connection type");
  std::lock_guard<std::mutex> lock(backend_->mu);
  // The backend throws its own exception for an unusable store (SQLite: SQLITE_CORRUPT).
  if (!unusable())
    if (Status s = backend_->ready(); !s.ok()) throw std::runtime_error(store_error(s).to_string());
  backend_->with_connection(fn);
}

}  // namespace mqtt_inbox::detail

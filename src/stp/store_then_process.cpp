// Store-then-process (include/mqtt_inbox/store_then_process.h, docs/store-then-process.md):
// receipt stores the raw message (the PUBACK follows that commit); workers process stored
// rows in arrival order per aggregate key. This file: create() and its option checks, the
// state shared by the parts (stp/store_then_process_impl.h), counters and health, and the
// aggregate-key helpers. The parts: stp/receipt.cpp, stp/workers.cpp and
// stp/maintenance.cpp; the rows they read and write are the store's (store/stp_rows.h).
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "store/inbox.h"
#include "store/lifetime.h"
#include "store/reentry.h"
#include "store/store.h"
#include "store/stp_rows.h"
#include "stp/store_then_process_impl.h"
#include "util/log.h"
#include "util/text.h"

namespace mqtt_inbox {

namespace {

// A random token naming this process instance in claimant columns.
std::string instance_token() {
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d-%08x", static_cast<int>(getpid()), rd());
  return buf;
}

}  // namespace

std::function<std::string(const Message&)> aggregate_key_from_topic_level(size_t index) {
  return [index](const Message& m) {
    size_t start = 0;
    for (size_t level = 0; level < index; ++level) {
      const size_t slash = m.topic.find('/', start);
      if (slash == std::string::npos) return std::string();
      start = slash + 1;
    }
    const size_t end = m.topic.find('/', start);
    return m.topic.substr(start, end == std::string::npos ? std::string::npos : end - start);
  };
}

std::function<std::string(const Message&)> aggregate_key_from_json_field(std::string field) {
  return [field = std::move(field)](const Message& m) {
    const auto j = nlohmann::json::parse(m.payload, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::string();
    const auto it = j.find(field);
    if (it == j.end()) return std::string();
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_integer()) return it->dump();
    return std::string();
  };
}

void StoreThenProcess::Impl::count(int64_t StoreThenProcessCounters::*field, int64_t n) {
  std::lock_guard<std::mutex> lock(state_mu);
  counters.*field += n;
}

void StoreThenProcess::Impl::worker_error(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(state_mu);
    ++counters.worker_store_errors;
    counters.last_worker_error = s.to_string();
  }
  if (s.is_fatal_store_error()) {
    // Not holding the store's shared connection: it is not needed (the latch only stops
    // every use of the store).
    (void)store->store_error(s, /*holding_connection=*/false);
    retry->set_fatal(s);
  }
}

void StoreThenProcess::Impl::notify_workers() {
  {
    std::lock_guard<std::mutex> lock(run_mu);
    ++wake_gen;
  }
  wake.notify_all();
}

// Sleeps up to `ms`, or until stop() or a wake-up. Returns false when stopping.
bool StoreThenProcess::Impl::idle(int64_t ms, uint64_t* seen_gen) {
  std::unique_lock<std::mutex> lock(run_mu);
  wake.wait_for(lock, std::chrono::milliseconds(ms),
                [&] { return stopping.load() || wake_gen != *seen_gen; });
  *seen_gen = wake_gen;
  return !stopping.load();
}

StoreThenProcess::StoreThenProcess(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

// The store's rows (and their connections) close with impl_, after the threads are gone.
StoreThenProcess::~StoreThenProcess() { (void)stop(); }

Status StoreThenProcess::create(Inbox* inbox, const std::string& name,
                                StoredTransactionHandler handler,
                                const StoreThenProcessOptions& options,
                                std::unique_ptr<StoreThenProcess>* out) {
  detail::Store* store = detail::InboxImpl::store_of(inbox);
  if (!store) return Status::InvalidArgument("inbox is null");
  if (Status r = detail::refuse_if_in_handler(inbox, "StoreThenProcess::create"); !r.ok()) return r;
  if (!handler) return Status::InvalidArgument("handler is empty");
  // A handler written for the other store is refused by name (handler.h).
  if (Status s =
          store->check_handler_type(handler.transaction_type(), "the store-then-process handler");
      !s.ok())
    return s;
  if (name.empty() || name.size() > 200 || !detail::is_valid_utf8(name))
    return Status::InvalidArgument("consumer name must be 1..200 bytes of UTF-8");
  if (!handler) return Status::InvalidArgument("handler is empty");
  const ConsumerOptions& c = options.consumer;
  if (c.max_attempts < 1) return Status::InvalidArgument("max_attempts must be >= 1");
  if (c.message_id.max_id_bytes < 1)
    return Status::InvalidArgument("message_id.max_id_bytes must be >= 1");
  if (c.message_id.user_property.empty() && c.message_id.json_field.empty() &&
      !c.message_id.extractor)
    return Status::InvalidArgument("no message id source configured");
  if (c.retry_backoff_initial.count() < 0 || c.retry_backoff_max < c.retry_backoff_initial ||
      c.store_backoff_initial.count() < 1 || c.store_backoff_max < c.store_backoff_initial)
    return Status::InvalidArgument("backoff: need 0 <= initial <= max (store initial >= 1 ms)");
  if (Status s = detail::check_lifetime_options(c); !s.ok()) return s;
  if (options.workers < 0) return Status::InvalidArgument("workers must be >= 0");
  if (options.batch_size < 1) return Status::InvalidArgument("batch_size must be >= 1");
  if (options.poll_interval_ms < 1) return Status::InvalidArgument("poll_interval_ms must be >= 1");
  if (options.lease_ms < 1) return Status::InvalidArgument("lease_ms must be >= 1");
  if (options.reap_interval_ms < 0 || options.compact_after_ms < 0 ||
      options.dedup_retention_ms < 0 || options.prune_interval_ms < 0 ||
      options.slow_handler_warn_ms < 0)
    return Status::InvalidArgument("intervals and retention durations must be >= 0");

  store->name_user(name);
  auto impl = std::make_unique<Impl>();
  impl->inbox = inbox;
  impl->store = store;
  impl->name = name;
  impl->handler = std::move(handler);
  impl->options = options;
  impl->clock = inbox->options().clock ? inbox->options().clock : Clock::system();
  impl->log = detail::logger_or_default(inbox->options().logger);
  impl->retry =
      std::make_unique<detail::StoreRetry>("store-then-process '" + name + "'", store->location(),
                                           options.consumer, impl->clock, impl->log);
  impl->token = instance_token();
  // At start-up: waited out like Inbox::open while the store is transiently unavailable.
  Impl* m = impl.get();
  const Status opened = store->wait_at_startup(
      "opening the store-then-process maintenance connection",
      [m, store](int) -> Status { return store->stp_rows().open(m->name, &m->rows); });
  if (!opened.ok()) return opened;
  out->reset(new StoreThenProcess(std::move(impl)));
  return Status::Ok();
}

const std::string& StoreThenProcess::name() const { return impl_->name; }

Health StoreThenProcess::health() const {
  Health h = impl_->retry->health();
  Impl& m = *impl_;
  const int64_t now = m.store->retention_clock();
  std::lock_guard<std::mutex> lock(m.state_mu);
  const Impl::Held* longest = nullptr;
  for (auto it = m.held.begin(); it != m.held.end();) {
    // A row rescheduled here but taken and finished elsewhere (another process, on a
    // shared store) is forgotten a lease after its next run was due.
    if (now - it->second.next_run > m.options.lease_ms) {
      it = m.held.erase(it);
      continue;
    }
    if (!longest || it->second.since < longest->since) longest = &it->second;
    ++it;
  }
  if (longest) {
    h.dependency.waiting = true;
    h.dependency.waited_ms = std::max<int64_t>(0, now - longest->since);
    h.dependency.message_id = detail::printable(longest->message_id);
    h.dependency.attempt = longest->runs;
    h.dependency.reason = longest->reason;
    h.dependency.next_run_in_ms = std::max<int64_t>(0, longest->next_run - now);
  }
  return h;
}

StoreThenProcessCounters StoreThenProcess::counters() const {
  StoreThenProcessCounters c;
  {
    std::lock_guard<std::mutex> lock(impl_->state_mu);
    c = impl_->counters;
  }
  c.store_retries = impl_->retry->store_retries();
  return c;
}

SessionRecords* StoreThenProcess::sessions() const { return &impl_->inbox->sessions(); }

}  // namespace mqtt_inbox

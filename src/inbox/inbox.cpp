// The public Inbox's calls that any store answers the same way: the dead-letter
// administration, the session records, stats and health, over the store's interfaces
// (store/store.h). The calls typed with SQLite are in store/sqlite/ (open.cpp, inbox.cpp).
#include "mqtt_inbox/inbox.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "store/dead_letters.h"
#include "store/reentry.h"
#include "store/sessions.h"
#include "store/store.h"

namespace mqtt_inbox {

Inbox::Inbox(std::unique_ptr<detail::Store> store) : store_(std::move(store)) {
  store_->owner = this;
}

Inbox::~Inbox() = default;

Status Inbox::open(const std::string& location, const InboxOptions& options,
                   std::unique_ptr<Inbox>* out) {
  std::unique_ptr<detail::Store> store;
  if (Status s = detail::open_store(location, options, &store); !s.ok()) return s;
  out->reset(new Inbox(std::move(store)));
  return Status::Ok();
}

detail::Store& Inbox::store() const { return *store_; }

const std::string& Inbox::path() const { return store_->location(); }

Health Inbox::health() const { return store_->health(); }

int64_t Inbox::retention_clock_ms() const { return store_->retention_clock(); }

InboxStats Inbox::stats() const {
  const detail::Store& m = *store_;
  InboxStats s;
  s.processed = m.processed.load();
  s.duplicates = m.duplicates.load();
  s.dead_lettered = m.dead_lettered.load();
  s.retries = m.retries.load();
  s.store_errors = m.store_errors.load();
  s.pruned = m.pruned.load();
  s.dead_letters_pruned = m.dead_letters_pruned.load();
  s.sessions_lost = m.sessions_lost.load();
  const int64_t seen = s.processed + s.duplicates;
  s.duplicate_ratio = seen ? static_cast<double>(s.duplicates) / static_cast<double>(seen) : 0.0;

  const uint64_t n = std::min<uint64_t>(m.latency_next.load(), detail::Store::kLatencySamples);
  std::vector<int32_t> lat;
  lat.reserve(n);
  for (uint64_t i = 0; i < n; ++i) lat.push_back(m.latency_us[i].load(std::memory_order_relaxed));
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    s.commit_p50_us = lat[lat.size() / 2];
    s.commit_p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  }
  s.commit_max_us = m.commit_max_us.load();
  m.file_stats(&s);
  s.retention_clock_ms = m.retention_clock();
  {
    std::lock_guard<std::mutex> lock(m.stats_mu);
    s.consumers = m.consumer_rows;
    s.outbox = m.outbox_rows;
    s.rows_measured_at = m.rows_measured_at;
  }
  return s;
}

Status Inbox::refresh_row_stats() {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::refresh_row_stats"); !r.ok()) return r;
  return store_->refresh_row_stats();
}

Status Inbox::list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::list_dead_letters"); !r.ok()) return r;
  return store_->dead_letters().list(filter, out);
}

Status Inbox::get_dead_letter(int64_t id, DeadLetter* out) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::get_dead_letter"); !r.ok()) return r;
  return store_->dead_letters().get(id, out);
}

Status Inbox::purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::purge_dead_letters"); !r.ok()) return r;
  return store_->dead_letters().purge(filter, removed);
}

Status Inbox::requeue_dead_letter(int64_t id) {
  if (Status r = detail::refuse_if_in_handler(this, "Inbox::requeue_dead_letter"); !r.ok())
    return r;
  return store_->dead_letters().requeue(id);
}

SessionRecords& Inbox::sessions() const { return store_->sessions(); }

}  // namespace mqtt_inbox

// Fleet (fleet.h): the member's two threads. The lease thread renews the slot leases in
// the store (store/slot_leases.h) and decides which slots this member holds and which it
// gives back to spread them; the slot thread runs a Subscriber for each slot held with a
// fresh lease and stops the others. Holds no SQL (the leases do) and no Paho (the
// Subscriber does). docs/fleet.md has the design.
//
// A slot's state moves kFree -> kHeld (the lease thread took it) -> kGivingBack (the
// lease thread wants it spread) -> kStopped (the slot thread stopped its Subscriber) ->
// kFree (the lease thread gave the lease back). A failed renewal sends every slot to
// kFree at once: the slot thread then stops their Subscribers.
#include "mqtt_inbox/fleet.h"

#include <spdlog/spdlog.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "mqtt_inbox/inbox.h"
#include "store/inbox.h"
#include "store/slot_leases.h"
#include "store/store.h"
#include "util/log.h"

namespace mqtt_inbox {

namespace {

enum SlotState : int { kFree, kHeld, kGivingBack, kStopped };

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool valid_group(const std::string& g) {
  if (g.empty() || g.size() > 64) return false;
  return std::all_of(g.begin(), g.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace

struct Fleet::Impl {
  struct Slot {
    std::atomic<int> state{kFree};
    // Made, stopped and reset by the slot thread (by stop() after it ends); the pointer
    // changes under subscribers_mu, which health() reads it under.
    std::unique_ptr<Subscriber> subscriber;
    std::future<Status> stopping;  // its stop() under way; the slot thread's
    bool start_failing = false;    // the last start failed (logged once); slot thread's
    bool stop_failing = false;     // the last stop failed (logged once); slot thread's
  };

  Inbox* inbox = nullptr;
  FleetOptions options;
  std::shared_ptr<spdlog::logger> log;
  std::vector<std::pair<std::string, MessageSink*>> routes;
  std::unique_ptr<detail::SlotLeases> leases;
  std::vector<std::unique_ptr<Slot>> slots;
  // Steady ms at the start of the last successful renewal; LLONG_MIN: none valid.
  std::atomic<int64_t> renewed_at{LLONG_MIN};

  mutable std::mutex mu;
  mutable std::mutex subscribers_mu;  // Slot::subscriber's pointer (never held across a
                                      // blocking call: health() reads Subscriber::health())
  std::condition_variable cv;
  bool started = false, stopping = false;
  bool slots_changed = false;  // wakes the slot thread: the lease thread changed a state
  bool release_ready = false;  // wakes the lease thread: a slot may be given back now
  bool lease_done = false;     // the lease thread ended (stop() waits for it)
  FleetHealth figures;         // members, target, counters, last_error (under mu)
  std::thread lease_thread, slot_thread;

  std::string client_id(int slot) const {
    const std::string& prefix =
        options.subscriber.client_id.empty() ? options.group : options.subscriber.client_id;
    return prefix + "-" + std::to_string(slot);
  }

  // Whether this member may serve its slots now: half a lease since its last renewal
  // started. The server frees them one whole lease after that renewal ended.
  bool fresh() const {
    const int64_t at = renewed_at.load();
    return at != LLONG_MIN && steady_ms() - at < options.lease_ms / 2;
  }

  bool may_serve(int slot) const { return slots[slot]->state.load() == kHeld && fresh(); }

  void wake_slots() {
    std::lock_guard<std::mutex> lock(mu);
    slots_changed = true;
    cv.notify_all();
  }

  // --- the lease thread ---
  void lease_loop() {
    struct Done {  // tells stop() the thread ended, however it returns
      Impl& m;
      ~Done() {
        std::lock_guard<std::mutex> lock(m.mu);
        m.lease_done = true;
        m.cv.notify_all();
      }
    } done{*this};
    int wait_ms = options.renew_interval_ms;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (stopping) return;
      }
      std::vector<int> release;
      for (int i = 0; i < options.slots; ++i)
        if (slots[i]->state.load() == kStopped) release.push_back(i);
      const int64_t t0 = steady_ms();
      detail::SlotLeaseRound round;
      const Status s = leases->round(release, &round);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) return;  // stop() stops the Subscribers and leaves the group
      }
      if (s.ok()) {
        renewed_at.store(t0);
        apply(round, release);
        wait_ms = options.renew_interval_ms;
      } else {
        lost(s);
        wait_ms = std::min(std::max(wait_ms * 2, options.renew_interval_ms), options.lease_ms);
      }
      wake_slots();
      // A slot given back wakes the next round at once, so the member that waits for it
      // gets it a round sooner.
      // Rounds start renew_interval_ms apart, however long one took, so a slow server
      // does not stretch the time between renewals.
      const int64_t next = t0 + (s.ok() ? options.renew_interval_ms : wait_ms);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(0, next - steady_ms())),
                  [&] { return stopping || release_ready; });
      release_ready = false;
    }
  }

  void apply(const detail::SlotLeaseRound& round, const std::vector<int>& released) {
    std::vector<bool> held(options.slots, false);
    for (int slot : round.held) held[slot] = true;
    int64_t taken = 0, given = 0;
    for (int slot : released) {
      slots[slot]->state.store(kFree);
      log->info("fleet {}: gave slot {} back (client '{}') to spread the slots over {} members",
                options.group, slot, client_id(slot), round.members);
    }
    int keeping = 0;
    for (int i = 0; i < options.slots; ++i) {
      const int st = slots[i]->state.load();
      if (held[i] && st == kFree) {
        slots[i]->state.store(kHeld);
        ++taken;
        log->info("fleet {}: took slot {} (client '{}'); {} member(s), share {}", options.group, i,
                  client_id(i), round.members, round.target);
      } else if (!held[i] && (st == kHeld || st == kGivingBack)) {
        slots[i]->state.store(kFree);
        log->warn("fleet {}: slot {} is no longer held by this member; stopping it", options.group,
                  i);
      }
      if (held[i] && slots[i]->state.load() == kHeld) ++keeping;
    }
    // More than the share: give back the highest slots, once their Subscribers stopped.
    for (int i = options.slots - 1; i >= 0 && keeping > round.target; --i) {
      if (slots[i]->state.load() != kHeld) continue;
      slots[i]->state.store(kGivingBack);
      --keeping;
      ++given;
    }
    std::lock_guard<std::mutex> lock(mu);
    figures.members = round.members;
    figures.target = round.target;
    figures.slots_taken += taken;
    figures.slots_given_back += given;
  }

  void lost(const Status& s) {
    renewed_at.store(LLONG_MIN);
    int had = 0;
    for (auto& slot : slots)
      if (slot->state.exchange(kFree) != kFree) ++had;
    if (had > 0)
      log->warn(
          "FLEET LEASE LOST: fleet {}: renewing the slot leases failed ({}); stopping this "
          "member's {} slot(s) now; a live member takes them once the server frees them",
          options.group, s.to_string(), had);
    else
      log->warn("fleet {}: renewing the slot leases failed: {}", options.group, s.to_string());
    std::lock_guard<std::mutex> lock(mu);
    if (had > 0) ++figures.leases_lost;
    figures.last_error = s.to_string();
  }

  // --- the slot thread ---
  void slot_loop() {
    const int tick_ms = std::max(20, options.renew_interval_ms / 4);
    bool was_fresh = true;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::milliseconds(tick_ms),
                    [&] { return stopping || slots_changed; });
        if (stopping) return;
        slots_changed = false;
      }
      const bool now_fresh = fresh();
      if (was_fresh && !now_fresh && renewed_at.load() != LLONG_MIN)
        log->warn(
            "fleet {}: no lease renewal for {} ms (half a lease): stopping every slot until "
            "one succeeds",
            options.group, steady_ms() - renewed_at.load());
      was_fresh = now_fresh;
      for (int i = 0; i < options.slots; ++i) {
        Slot& slot = *slots[i];
        // A stop runs on a thread of its own (it may wait stop_timeout_ms for a message
        // in the callback), so this loop never waits for one: the other slots' staleness
        // is acted on at the next tick whatever one slot's stop does.
        if (slot.stopping.valid() &&
            slot.stopping.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
          stopped(i, slot.stopping.get());
        const bool want = may_serve(i);
        if (want && !slot.subscriber && !slot.stopping.valid()) start_slot(i);
        // A Subscriber once asked to stop is stopped until it has (it reconnects no
        // more): a slot served again gets a new one.
        if (slot.subscriber && !slot.stopping.valid() && (!want || slot.stop_failing)) {
          Subscriber* sub = slot.subscriber.get();
          slot.stopping = std::async(std::launch::async, [sub] { return sub->stop(); });
        }
      }
      bool released = false;
      for (int i = 0; i < options.slots; ++i) {
        int expected = kGivingBack;
        if (!slots[i]->subscriber && !slots[i]->stopping.valid() &&
            slots[i]->state.compare_exchange_strong(expected, kStopped))
          released = true;
      }
      if (released) {
        std::lock_guard<std::mutex> lock(mu);
        release_ready = true;
        cv.notify_all();
      }
    }
  }

  void start_slot(int i) {
    SubscriberOptions so = options.subscriber;
    so.client_id = client_id(i);
    so.logger = log;
    so.may_connect = [this, i] { return may_serve(i); };
    std::unique_ptr<Subscriber> sub;
    Status s = Subscriber::create(so, &sub);
    for (const auto& [filter, sink] : routes) {
      if (!s.ok()) break;
      s = sub->subscribe("$share/" + options.group + "/" + filter, sink);
    }
    if (s.ok()) s = sub->start();
    if (!s.ok()) {
      // Once at warn per episode: the slot thread tries again every tick.
      if (!slots[i]->start_failing)
        log->warn("fleet {}: slot {} (client '{}') did not start: {}; trying again", options.group,
                  i, so.client_id, s.to_string());
      slots[i]->start_failing = true;
      return;
    }
    slots[i]->start_failing = false;
    std::lock_guard<std::mutex> lock(subscribers_mu);
    slots[i]->subscriber = std::move(sub);
  }

  // The outcome of slot i's Subscriber::stop(). OK: the Subscriber goes. kBusy: a message
  // is still in the callback, waiting for the store; the Subscriber stays, its connection
  // too (nothing unacked is lost; a new holder elsewhere takes the client id over once),
  // and the slot thread asks it to stop again, until the store answers.
  void stopped(int i, const Status& s) {
    Slot& slot = *slots[i];
    if (s.ok()) {
      std::unique_ptr<Subscriber> gone;
      {
        std::lock_guard<std::mutex> lock(subscribers_mu);
        gone = std::move(slot.subscriber);
      }
      slot.stop_failing = false;
      return;
    }
    if (!slot.stop_failing)
      log->error("fleet {}: slot {} did not stop: {}; asking again", options.group, i,
                 s.to_string());
    slot.stop_failing = true;
  }

  // Fleet::stop(), after both threads ended: waits for the stops under way, then stops
  // every Subscriber left, in parallel. Returns the first failure (kBusy).
  Status stop_all() {
    Status first;
    for (int i = 0; i < options.slots; ++i)
      if (slots[i]->stopping.valid()) stopped(i, slots[i]->stopping.get());
    std::vector<std::future<Status>> stops(options.slots);
    for (int i = 0; i < options.slots; ++i) {
      Subscriber* sub = slots[i]->subscriber.get();
      if (sub) stops[i] = std::async(std::launch::async, [sub] { return sub->stop(); });
    }
    for (int i = 0; i < options.slots; ++i) {
      if (!stops[i].valid()) continue;
      const Status s = stops[i].get();
      stopped(i, s);
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  }
};

Fleet::Fleet(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Fleet::~Fleet() { (void)stop(); }

Status Fleet::create(Inbox* inbox, const FleetOptions& options, std::unique_ptr<Fleet>* out) {
  out->reset();
  if (!inbox) return Status::InvalidArgument("Fleet::create: null inbox");
  if (!valid_group(options.group))
    return Status::InvalidArgument(
        "FleetOptions::group must be 1..64 characters of "
        "[A-Za-z0-9_-], got '" +
        options.group + "'");
  if (options.slots < 1 || options.slots > 1024)
    return Status::InvalidArgument("FleetOptions::slots must be 1..1024, got " +
                                   std::to_string(options.slots));
  if (options.lease_ms < 1000 || options.lease_ms > 3600000)
    return Status::InvalidArgument("FleetOptions::lease_ms must be 1000..3600000, got " +
                                   std::to_string(options.lease_ms));
  auto impl = std::make_unique<Impl>();
  impl->inbox = inbox;
  impl->options = options;
  if (impl->options.renew_interval_ms == 0) impl->options.renew_interval_ms = options.lease_ms / 5;
  if (impl->options.renew_interval_ms < 10 ||
      impl->options.renew_interval_ms > options.lease_ms / 3)
    return Status::InvalidArgument("FleetOptions::renew_interval_ms must be 10 .. lease_ms / 3 (" +
                                   std::to_string(options.lease_ms / 3) + "), got " +
                                   std::to_string(impl->options.renew_interval_ms) +
                                   ": a member must renew well within its lease");
  if (options.subscriber.may_connect)
    return Status::InvalidArgument(
        "FleetOptions::subscriber.may_connect is the fleet's own (a slot connects only "
        "while its lease is fresh): leave it empty");
  if (static_cast<int64_t>(options.subscriber.session_expiry_s) * 1000 <
      10 * static_cast<int64_t>(options.lease_ms))
    return Status::InvalidArgument(
        "FleetOptions::subscriber.session_expiry_s (" +
        std::to_string(options.subscriber.session_expiry_s) + " s) must be at least 10 leases (" +
        std::to_string(options.lease_ms / 100) +
        " s): a slot's session must outlast the time its slot waits for a new holder, or "
        "the broker deletes what it parked there (docs/fleet.md#session-expiry)");
  // The slots' options are checked once here, as each slot's Subscriber will be made.
  {
    SubscriberOptions probe = options.subscriber;
    probe.client_id = impl->client_id(options.slots - 1);
    std::unique_ptr<Subscriber> unused;
    if (Status s = Subscriber::create(probe, &unused); !s.ok()) return s;
  }
  impl->log = detail::logger_or_default(options.subscriber.logger);
  detail::SlotLeaseOptions lo;
  lo.group = options.group;
  lo.slots = options.slots;
  lo.lease_ms = options.lease_ms;
  // PostgreSQL keeps 63 bytes of an application_name: the process id before the host.
  lo.member_name =
      "mqtt-inbox fleet " + options.group + " " + std::to_string(::getpid()) + "@" + host_name();
  detail::Store* store = detail::InboxImpl::store_of(inbox);
  if (!store) return Status::InvalidArgument("Fleet::create: inbox is null");
  if (Status s = store->open_slot_leases(lo, &impl->leases); !s.ok()) return s;
  for (int i = 0; i < options.slots; ++i) impl->slots.push_back(std::make_unique<Impl::Slot>());
  out->reset(new Fleet(std::move(impl)));
  return Status::Ok();
}

Status Fleet::subscribe(const std::string& topic_filter, MessageSink* sink) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->started) return Status::InvalidArgument("Fleet::subscribe after start()");
  if (!sink) return Status::InvalidArgument("Fleet::subscribe: null sink");
  if (topic_filter.rfind("$share/", 0) == 0)
    return Status::InvalidArgument("Fleet::subscribe: give '" + topic_filter +
                                   "' without its $share/ prefix: the fleet adds "
                                   "$share/" +
                                   impl_->options.group + "/");
  // Checked as every slot's Subscriber will check it.
  SubscriberOptions probe = impl_->options.subscriber;
  probe.client_id = impl_->client_id(0);
  std::unique_ptr<Subscriber> check;
  if (Status s = Subscriber::create(probe, &check); !s.ok()) return s;
  if (Status s = check->subscribe("$share/" + impl_->options.group + "/" + topic_filter, sink);
      !s.ok())
    return s;
  for (const auto& r : impl_->routes)
    if (r.first == topic_filter)
      return Status::InvalidArgument("Fleet::subscribe: '" + topic_filter + "' twice");
  impl_->routes.emplace_back(topic_filter, sink);
  return Status::Ok();
}

Status Fleet::start() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->started) return Status::InvalidArgument("Fleet::start called twice");
    if (impl_->routes.empty())
      return Status::InvalidArgument("Fleet::start: nothing subscribed (Fleet::subscribe)");
    impl_->started = true;
  }
  impl_->log->info("fleet {}: joining with {} slot(s), lease {} ms", impl_->options.group,
                   impl_->options.slots, impl_->options.lease_ms);
  impl_->lease_thread = std::thread([this] { impl_->lease_loop(); });
  impl_->slot_thread = std::thread([this] { impl_->slot_loop(); });
  return Status::Ok();
}

bool Fleet::wait_serving(int slots, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (static_cast<int>(health().connected.size()) >= slots) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status Fleet::stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->started || impl_->stopping) return Status::Ok();
    impl_->stopping = true;
    impl_->cv.notify_all();
  }
  impl_->slot_thread.join();
  // The Subscribers first, while the leases still hold: nobody else may connect their
  // client ids before they stopped (the server frees the slots only a lease after the
  // last renewal, or when the lease connection closes below).
  const Status s = impl_->stop_all();
  // The lease thread ends after its round. A round blocked on a server that stopped
  // answering (TCP_USER_TIMEOUT ends it only when nothing acknowledges the bytes) is
  // broken after a lease: every Subscriber has been asked to stop by then.
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    if (!impl_->cv.wait_for(lock, std::chrono::milliseconds(impl_->options.lease_ms),
                            [&] { return impl_->lease_done; })) {
      lock.unlock();
      impl_->log->warn(
          "fleet {}: stop: the lease round has not returned for {} ms (the server does not "
          "answer); breaking its connection",
          impl_->options.group, impl_->options.lease_ms);
      impl_->leases->interrupt();
    }
  }
  impl_->lease_thread.join();
  if (!s.ok()) return s;  // a message waits for the store: keep the leases to the exit
  impl_->leases->leave();
  impl_->log->info("fleet {}: left the group", impl_->options.group);
  return Status::Ok();
}

FleetHealth Fleet::health() const {
  FleetHealth h;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    h = impl_->figures;
  }
  const int64_t at = impl_->renewed_at.load();
  h.renewed_ms_ago = at == LLONG_MIN ? -1 : steady_ms() - at;
  h.lease_ms = impl_->options.lease_ms;
  h.slot_count = impl_->options.slots;
  for (int i = 0; i < impl_->options.slots; ++i) {
    const int st = impl_->slots[i]->state.load();
    if (st == kHeld || st == kGivingBack || st == kStopped) h.slots.push_back(i);
  }
  std::lock_guard<std::mutex> lock(impl_->subscribers_mu);
  for (int i = 0; i < impl_->options.slots; ++i) {
    const Subscriber* sub = impl_->slots[i]->subscriber.get();
    if (!sub) continue;
    h.serving.push_back(i);
    h.serving_health.push_back(sub->health());
    if (sub->is_connected()) h.connected.push_back(i);
  }
  return h;
}

}  // namespace mqtt_inbox

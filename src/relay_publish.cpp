// The outbox relay's publishing (relay_impl.h): rows out in seq order within the
// in-flight window, PUBACKs recorded by Paho's callback thread and marked by the relay's
// in batches, rows that can never be published made dead, and the figures.
#include <algorithm>

#include "log.h"
#include "relay_impl.h"
#include "relay_message.h"
#include "textfile.h"

namespace mqtt_inbox {

namespace {
constexpr int kSuccessReasonLimit = 0x80;  // MQTT 5.0 section 2.4: >= 0x80 is a failure
}  // namespace

void Relay::Impl::complete(const mqtt::token& tok, bool failed) noexcept {
  try {
    const auto n = reinterpret_cast<uintptr_t>(tok.get_user_context());
    const int reason = static_cast<int>(tok.get_reason_code());
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu);
    auto it = inflight.find(n);
    if (it == inflight.end()) return;  // a publish of an earlier connection
    const int64_t seq = it->second.seq;
    if (!failed || reason >= kSuccessReasonLimit)
      figures.acked(reason, now - it->second.published_at);
    inflight.erase(it);
    if (reason >= kSuccessReasonLimit) {
      rejections.push_back({seq, reason, mqtt::exception::reason_code_str(reason)});
      ++rejected_count;
    } else if (failed) {
      resend = true;  // not acked: publish it again, after everything before it
    } else {
      acked.push_back(seq);
      ++acked_count;
    }
    woken = true;
    wake.notify_all();
  } catch (...) {
    // Nothing may escape into Paho; an unrecorded ack only causes a resend.
  }
}

void Relay::Impl::on_connection_lost() {
  connected = false;
  std::lock_guard<std::mutex> lock(mu);
  lost = true;
  woken = true;
  wake.notify_all();
}

void Relay::Impl::lent_connection_up(const mqtt::properties& connack) {
  std::lock_guard<std::mutex> lock(mu);
  lent_up = true;
  ++lent_epoch;
  lent_connack = connack;
  woken = true;
  wake.notify_all();
}

void Relay::Impl::lent_connection_down() {
  {
    std::lock_guard<std::mutex> lock(mu);
    lent_up = false;
  }
  on_connection_lost();
}

// Marks collected PUBACKs. On a store error they are kept and tried again.
void Relay::Impl::flush_marks() {
  std::vector<int64_t> sent;
  std::vector<Rejection> dead;
  {
    std::lock_guard<std::mutex> lock(mu);
    sent.swap(acked);
    dead.swap(rejections);
  }
  for (size_t i = 0; i < sent.size(); i += static_cast<size_t>(options.mark_batch)) {
    std::vector<int64_t> batch(
        sent.begin() + static_cast<std::ptrdiff_t>(i),
        sent.begin() + static_cast<std::ptrdiff_t>(
                           std::min(sent.size(), i + static_cast<size_t>(options.mark_batch))));
    if (options.before_mark_hook) options.before_mark_hook(batch.front());
    const Status s = outbox->mark_sent(batch);
    if (!s.ok()) {
      log->warn("outbox relay: marking {} row(s) sent failed, retrying: {}", batch.size(),
                s.to_string());
      std::lock_guard<std::mutex> lock(mu);
      acked.insert(acked.end(), sent.begin() + static_cast<std::ptrdiff_t>(i), sent.end());
      break;
    }
  }
  for (size_t i = 0; i < dead.size(); ++i) {
    const auto& r = dead[i];
    const Status s = outbox->mark_dead(
        r.seq, OutboxDeadReason::kRejectedByBroker, r.code,
        "PUBACK reason code " + std::to_string(r.code) + (r.text.empty() ? "" : ": " + r.text));
    if (!s.ok()) {
      log->warn("outbox relay: marking row {} dead failed, retrying: {}", r.seq, s.to_string());
      std::lock_guard<std::mutex> lock(mu);
      rejections.insert(rejections.end(), dead.begin() + static_cast<std::ptrdiff_t>(i),
                        dead.end());
      break;
    }
  }
}

// Publishes pending rows after `*last_seq` while the window has room. Returns false if
// the connection must be made again.
bool Relay::Impl::publish_more(int64_t* last_seq) {
  size_t in_flight;
  {
    std::lock_guard<std::mutex> lock(mu);
    in_flight = inflight.size();
  }
  const int room = window() - static_cast<int>(in_flight);
  if (room <= 0) return true;
  const bool v5 = options.mqtt_version == MqttVersion::kV5;
  std::vector<OutboxRow> rows;
  const Status s = outbox->fetch_pending(*last_seq, room, &rows);
  if (!s.ok()) {
    log->warn("outbox relay: reading pending rows failed, retrying: {}", s.to_string());
    return true;
  }
  for (const auto& row : rows) {
    std::string why;
    if (const auto reason = detail::unpublishable(row, v5, maximum_packet_size.load(), &why)) {
      const Status d = outbox->mark_dead(row.seq, *reason, 0, why);
      if (!d.ok()) {  // read again from this row at the next poll
        log->warn("outbox relay: marking row {} dead failed, retrying: {}", row.seq,
                  d.to_string());
        return true;
      }
      ++(*reason == OutboxDeadReason::kExpired ? expired_count : too_large_count);
      *last_seq = row.seq;
      continue;
    }
    if (options.before_publish_hook) options.before_publish_hook(row.seq);
    // The client first, then the check for a lost connection: a lender makes a new client
    // at its reconnect only after telling this relay the connection is down (`lost`), and
    // may connect it before telling it the connection is up. A copy taken before the swap
    // is the old client, on which a publish fails; one taken after finds `lost` set. So
    // no row of this batch goes out on a connection whose republish has not begun, ahead
    // of the rows before it.
    const std::shared_ptr<mqtt::async_client> client_now = publisher();
    const uint64_t n = ++pubno;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (lost || resend) return true;  // the caller sees it and starts over
      inflight[n] = InFlight{row.seq, Clock::now()};
      max_inflight_seen =
          std::max<int64_t>(max_inflight_seen.load(), static_cast<int64_t>(inflight.size()));
    }
    try {
      client_now->publish(detail::to_paho_message(row, v5),
                          reinterpret_cast<void*>(static_cast<uintptr_t>(n)), *link);
    } catch (const mqtt::exception& e) {
      log->warn("outbox relay: publish of row {} failed, reconnecting: {}", row.seq, e.what());
      return false;
    }
    ++published;
    *last_seq = row.seq;
    if (options.after_publish_hook) options.after_publish_hook(row.seq);
  }
  return true;
}

RelayCounters Relay::Impl::snapshot() const {
  RelayCounters c;
  c.published = published.load();
  c.acked = acked_count.load();
  c.rejected = rejected_count.load();
  c.connects = connects.load();
  c.max_inflight_seen = max_inflight_seen.load();
  c.receive_maximum = receive_maximum.load();
  c.maximum_packet_size = maximum_packet_size.load();
  c.expired = expired_count.load();
  c.too_large = too_large_count.load();
  c.connected = connected.load();
  figures.fill(&c, Clock::now());
  return c;
}

// Writes the Prometheus textfile when its period is up, or now if `force`.
void Relay::Impl::write_metrics(bool force) {
  if (options.prometheus_textfile.empty()) return;
  const auto now = Clock::now();
  if (!force && now < next_metrics) return;
  next_metrics = now + std::chrono::milliseconds(options.metrics_period_ms);
  std::string error;
  if (!detail::write_textfile(options.prometheus_textfile, prometheus_text(snapshot()), &error))
    log->warn("outbox relay: {}", error);
}

// Publishes on the connection just made, from the first pending row, until it is lost,
// a publish must be made again, or stop(). The caller has cleared lost, resend and
// inflight. Returns false if a publish failed locally.
bool Relay::Impl::publish_on_connection() {
  connected = true;
  // Everything still pending goes out again from the first row, in order.
  flush_marks();
  int64_t last_seq = 0;
  bool ok = true;
  while (ok && !is_stopping()) {
    flush_marks();
    write_metrics(false);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (lost || resend) break;
    }
    ok = publish_more(&last_seq);
    if (ok) sleep_for(options.poll_interval_ms);
  }
  flush_marks();  // the PUBACKs that came before the end: rows stay pending no longer
  return ok;
}

bool Relay::Impl::pause_for(int ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    write_metrics(false);
    std::unique_lock<std::mutex> lock(mu);
    const auto step =
        std::min(deadline, Clock::now() + std::chrono::milliseconds(options.metrics_period_ms));
    if (wake.wait_until(lock, step, [&] { return stopping; })) return false;
    if (Clock::now() >= deadline) return true;
  }
}

}  // namespace mqtt_inbox

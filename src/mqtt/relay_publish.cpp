// The outbox relay's publishing (mqtt/relay_impl.h): rows out in seq order within the
// in-flight window, PUBACKs recorded by Paho's callback thread and marked by the relay's
// in batches, rows that can never be published made dead, and the figures.
#include <algorithm>

#include "mqtt/publish_outcome.h"
#include "mqtt/relay_impl.h"
#include "mqtt/relay_message.h"
#include "util/log.h"
#include "util/textfile.h"

namespace mqtt_inbox {

// Every outcome of a publish token (mqtt/publish_outcome.h): only an MQTT 5 PUBACK with a
// reason code >= 0x80 is a refusal; a token that failed without a PUBACK is published
// again, whatever reason code it carries (Paho C++ sets 255 for every MQTT 3.1.1 failure).
void Relay::Impl::complete(const mqtt::token& tok, bool failed) noexcept {
  try {
    const auto n = reinterpret_cast<uintptr_t>(tok.get_user_context());
    const int reason = static_cast<int>(tok.get_reason_code());
    const detail::PublishOutcome outcome = detail::classify_publish(
        failed, options.mqtt_version == MqttVersion::kV5, tok.get_return_code(), reason);
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu);
    auto it = inflight.find(n);
    if (it == inflight.end() || it->second.failed) return;  // an earlier connection's
    const InFlight f = it->second;
    bool wake_thread = true;
    switch (outcome) {
      case detail::PublishOutcome::kAcked:
        figures.acked(reason, now - f.published_at, now - f.enqueued_at);
        // The thread is woken when it can publish more (more_pending), when marks are due
        // now, and by the first PUBACK to mark, so that it sleeps no longer than
        // mark_linger_ms from then (next_wait_ms); not by every PUBACK of a stream.
        wake_thread = more_pending || acked.empty() || options.mark_linger_ms == 0 ||
                      acked.size() + 1 >= static_cast<size_t>(options.mark_batch);
        if (acked.empty()) acked_since = now;
        acked.push_back(f.seq);
        ++acked_count;
        break;
      case detail::PublishOutcome::kRefused:
        figures.acked(reason, now - f.published_at, now - f.enqueued_at);
        rejections.push_back({f.seq, OutboxDeadReason::kRejectedByBroker, reason,
                              "PUBACK reason code " + std::to_string(reason) + ": " +
                                  mqtt::exception::reason_code_str(reason)});
        ++rejected_count;
        break;
      case detail::PublishOutcome::kRepublish:
        // Not acked: publish it again, after everything before it. Kept in flight, as
        // failed, so that the end of the connection can be blamed on it (drop_culprit).
        it->second.failed = true;
        resend = true;
        break;
    }
    if (outcome != detail::PublishOutcome::kRepublish) {
      last_puback_at = now;
      inflight.erase(it);
    }
    if (wake_thread) {
      woken = true;
      wake.notify_all();
    }
  } catch (...) {
    // Nothing may escape into Paho; an unrecorded ack only causes a resend.
  }
}

void Relay::Impl::on_connection_lost() {
  connected = false;
  std::lock_guard<std::mutex> lock(mu);
  if (!lost) lost_at = Clock::now();
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

// Marks collected PUBACKs sent when due or `force`, and refused rows dead at once, each
// with the publishes counted for it. On a store error they are kept and tried again after
// poll_interval_ms (at once if forced).
void Relay::Impl::flush_marks(bool force) {
  const auto now = Clock::now();
  if (!force && now < marks_retry_at) return;
  std::vector<int64_t> sent;
  std::vector<Rejection> dead;
  Clock::time_point since{};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (force || acked.size() >= static_cast<size_t>(options.mark_batch) ||
        now - acked_since >= std::chrono::milliseconds(options.mark_linger_ms)) {
      sent.swap(acked);
      since = acked_since;
    }
    dead.swap(rejections);
  }
  // What was not marked goes back in front of what came meanwhile, tried again later. A
  // flush that marked everything ends the wait: the marks of PUBACKs that come after it
  // are due by the linger again, not at the failed flush's retry time (a forced flush on a
  // new connection after a store outage otherwise left the next marks waiting a whole
  // poll interval).
  bool any_failed = false;
  auto failed = [&] {
    any_failed = true;
    marks_retry_at = Clock::now() + std::chrono::milliseconds(options.poll_interval_ms);
  };
  for (size_t i = 0; i < sent.size(); i += static_cast<size_t>(options.mark_batch)) {
    const size_t end = std::min(sent.size(), i + static_cast<size_t>(options.mark_batch));
    std::vector<OutboxMark> batch;
    batch.reserve(end - i);
    for (size_t k = i; k < end; ++k) batch.push_back(mark_of(sent[k]));
    if (options.before_mark_hook) options.before_mark_hook(batch.front().seq);
    const Status s = outbox->mark_sent(batch);
    if (!s.ok()) {
      log->warn("outbox relay: marking {} row(s) sent failed, retrying: {}", sent.size() - i,
                s.to_string());
      failed();
      std::lock_guard<std::mutex> lock(mu);
      acked.insert(acked.begin(), sent.begin() + static_cast<std::ptrdiff_t>(i), sent.end());
      acked_since = since;
      break;
    }
    for (const OutboxMark& m : batch) publishes.erase(m.seq);
  }
  for (size_t i = 0; i < dead.size(); ++i) {
    const auto& r = dead[i];
    const Status s = outbox->mark_dead(mark_of(r.seq), r.reason, r.code, r.text);
    if (!s.ok()) {
      log->warn("outbox relay: marking row {} dead failed, retrying: {}", r.seq, s.to_string());
      failed();
      std::lock_guard<std::mutex> lock(mu);
      rejections.insert(rejections.begin(), dead.begin() + static_cast<std::ptrdiff_t>(i),
                        dead.end());
      break;
    }
    publishes.erase(r.seq);
  }
  if (!any_failed) marks_retry_at = Clock::time_point{};
}

int Relay::Impl::next_wait_ms() {
  const auto now = Clock::now();
  auto until = now + std::chrono::milliseconds(options.poll_interval_ms);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!acked.empty() || !rejections.empty()) {
      auto due = rejections.empty()
                     ? acked_since + std::chrono::milliseconds(options.mark_linger_ms)
                     : now;
      until = std::min(until, std::max(due, marks_retry_at));
    }
  }
  if (!options.prometheus_textfile.empty()) until = std::min(until, next_metrics);
  // The relay turn is renewed in time, whatever the poll: its server session ends after a
  // lease without a statement.
  const int64_t to_renew = std::chrono::duration_cast<std::chrono::milliseconds>(
                               turn_renew_at - std::chrono::steady_clock::now())
                               .count();
  const int64_t wait = std::min<int64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count(), to_renew);
  return static_cast<int>(std::max<int64_t>(0, wait));
}

// Publishes pending rows after `*last_seq` while the window has room. Returns false if
// the connection must be made again.
bool Relay::Impl::publish_more(int64_t* last_seq) {
  if (!hold_turn()) {
    // Another relay of this outbox holds the turn. On its own connection the relay
    // disconnects (run_own waits for the turn); on a lent one it publishes nothing and,
    // once the turn is back, starts again from the first pending row.
    if (!lender) {
      turn_lost = true;
      return false;
    }
    *last_seq = 0;
    return true;
  }
  size_t in_flight;
  {
    std::lock_guard<std::mutex> lock(mu);
    in_flight = inflight.size();
  }
  const int room = window() - static_cast<int>(in_flight);
  if (room <= 0) {
    std::lock_guard<std::mutex> lock(mu);
    more_pending = true;  // the window is full: a PUBACK makes room
    return true;
  }
  const bool v5 = options.mqtt_version == MqttVersion::kV5;
  std::vector<OutboxRow> rows;
  const Status s = outbox->fetch_pending(*last_seq, room, &rows);
  if (!s.ok()) {
    log->warn("outbox relay: reading pending rows failed, retrying: {}", s.to_string());
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    more_pending = static_cast<int>(rows.size()) == room;
  }
  // The first read of a connection starts at the first pending row: counts kept for rows
  // before it are of rows no longer pending (marked by another path, dropped, purged).
  if (*last_seq == 0)
    publishes.erase(publishes.begin(),
                    rows.empty() ? publishes.end() : publishes.lower_bound(rows.front().seq));
  const auto fetched_at = Clock::now();
  for (const auto& row : rows) {
    // The turn is checked per row too: a slow batch (a store wait, Paho's lock) must not
    // carry publishing past the turn's half lease. The next call renews it.
    if (std::chrono::steady_clock::now() >= turn_valid_until) return true;
    std::string why;
    if (const auto reason = detail::unpublishable(row, v5, maximum_packet_size.load(),
                                                  options.max_packet_size, &why)) {
      const Status d = outbox->mark_dead(mark_of(row.seq), *reason, 0, why);
      if (!d.ok()) {  // read again from this row at the next poll
        log->warn("outbox relay: marking row {} dead failed, retrying: {}", row.seq, d.to_string());
        return true;
      }
      publishes.erase(row.seq);
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
      inflight[n] =
          InFlight{row.seq, Clock::now(), fetched_at - std::chrono::milliseconds(row.waited_ms)};
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
    ++publishes[row.seq];
    *last_seq = row.seq;
    if (options.after_publish_hook) options.after_publish_hook(row.seq);
  }
  return true;
}

std::optional<int64_t> Relay::Impl::blame_locked() {
  const bool any = !inflight.empty();
  const InFlight oldest = any ? inflight.begin()->second : InFlight{};
  return detail::drop_culprit(any, oldest.seq, oldest.published_at, last_puback_at,
                              lost ? lost_at : Clock::now(),
                              std::chrono::milliseconds(kConnectionDropWindowMs));
}

void Relay::Impl::connection_ended(std::optional<int64_t> culprit) {
  const std::optional<int64_t> dead = drops.connection_ended(culprit);
  if (culprit && !dead) {
    log->warn(
        "outbox relay: the connection ended right after row {} was published ({} of {} "
        "times in a row before it becomes a dead letter)",
        *culprit, drops.count(), kConnectionDropsBeforeDeadLetter);
  }
  if (!dead) return;
  const std::string text =
      "the broker closed the connection " + std::to_string(kConnectionDropsBeforeDeadLetter) +
      " times in a row right after this row was published (the oldest without PUBACK, none "
      "after it): larger than the broker accepts (MQTT 3.1.1 cannot announce the limit; set "
      "RelayOptions::max_packet_size), or refused by it";
  std::lock_guard<std::mutex> lock(mu);
  rejections.push_back({*dead, OutboxDeadReason::kConnectionDropped, 0, text});
  ++connection_dropped_count;
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
  c.connection_dropped = connection_dropped_count.load();
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
  // Everything still pending goes out again from the first row, in order: the rows
  // PUBACKed before are marked first, so they are not among them.
  flush_marks(/*force=*/true);
  int64_t last_seq = 0;
  bool ok = true;
  while (ok && !is_stopping()) {
    flush_marks(/*force=*/false);
    write_metrics(false);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (lost || resend) break;
    }
    ok = publish_more(&last_seq);
    if (ok) sleep_for(next_wait_ms());
  }
  // The PUBACKs that came before the end: rows stay pending no longer.
  flush_marks(/*force=*/true);
  return ok;
}

bool Relay::Impl::hold_turn() {
  const auto now = std::chrono::steady_clock::now();
  if (now >= turn_renew_at) {
    bool held = false;
    const Status s = outbox->renew_relay_turn(options.turn_lease_ms, &held);
    if (!s.ok())
      log->warn("outbox relay: cannot renew the outbox's relay turn ({}); not publishing",
                s.to_string());
    if (held) turn_valid_until = now + std::chrono::milliseconds(options.turn_lease_ms / 2);
    if (s.ok() && (held != turn_held || !turn_state_logged)) {
      if (held)
        log->info("outbox relay: holds the outbox's relay turn; publishing");
      else
        log->info(
            "outbox relay: another relay of this outbox holds the turn; standing by, "
            "disconnected (docs/outbox.md#several-relays)");
      turn_state_logged = true;
    }
    turn_held = held;
    turn_renew_at = now + std::chrono::milliseconds(options.turn_lease_ms / 5);
  }
  return turn_held && std::chrono::steady_clock::now() < turn_valid_until;
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

// RelayFigures (mqtt/relay_figures.h) and the relay's Prometheus text (relay.h).
#include "mqtt/relay_figures.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace mqtt_inbox {
namespace detail {

void RelayFigures::started(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kStopped) return;
  state_ = State::kOffline;
  offline_since_ = now;
}

void RelayFigures::connected(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kOffline) offline_ += now - offline_since_;
  state_ = State::kOnline;
}

void RelayFigures::disconnected(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kOnline) return;
  state_ = State::kOffline;
  offline_since_ = now;
}

void RelayFigures::stopped(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kOffline) offline_ += now - offline_since_;
  state_ = State::kStopped;
}

void RelayFigures::acked(int reason_code, Clock::duration latency, Clock::duration since_enqueue) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  const Sample sample{duration_cast<microseconds>(latency).count(),
                      duration_cast<microseconds>(since_enqueue).count()};
  std::lock_guard<std::mutex> lock(mu_);
  ++by_reason_[reason_code];
  ++latency_count_;
  latency_sum_us_ += sample.puback_us;
  if (latency_us_.size() < kLatencySamples) {
    latency_us_.push_back(sample);
  } else {
    latency_us_[next_] = sample;
    next_ = (next_ + 1) % kLatencySamples;
  }
}

void RelayFigures::fill(RelayCounters* c, Clock::time_point now) const {
  std::vector<Sample> ring;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ring = latency_us_;
    c->acks_by_reason = by_reason_;
    c->puback_latency_count = latency_count_;
    c->puback_latency_sum_ms = static_cast<double>(latency_sum_us_) / 1000.0;
    Clock::duration offline = offline_;
    if (state_ == State::kOffline) offline += now - offline_since_;
    c->offline_ms = std::chrono::duration_cast<std::chrono::milliseconds>(offline).count();
  }
  c->puback_latency_samples = static_cast<int64_t>(ring.size());
  if (ring.empty()) return;
  // Nearest rank: the smallest sample with at least q of the samples at or below it.
  auto quantile = [](std::vector<int64_t>& samples, double q) {
    size_t rank = static_cast<size_t>(q * static_cast<double>(samples.size()) + 0.999999);
    rank = std::min(std::max<size_t>(rank, 1), samples.size()) - 1;
    std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(rank),
                     samples.end());
    return static_cast<double>(samples[rank]) / 1000.0;
  };
  std::vector<int64_t> puback, commit;
  puback.reserve(ring.size());
  commit.reserve(ring.size());
  for (const Sample& s : ring) {
    puback.push_back(s.puback_us);
    commit.push_back(s.commit_us);
  }
  c->puback_latency_p50_ms = quantile(puback, 0.50);
  c->puback_latency_p99_ms = quantile(puback, 0.99);
  c->commit_to_puback_p50_ms = quantile(commit, 0.50);
  c->commit_to_puback_p99_ms = quantile(commit, 0.99);
}

}  // namespace detail

namespace {

void metric(std::ostringstream& o, const char* name, const char* type, const char* help,
            double value) {
  o << "# HELP mqtt_inbox_relay_" << name << ' ' << help << "\n# TYPE mqtt_inbox_relay_" << name
    << ' ' << type << "\nmqtt_inbox_relay_" << name << ' ' << value << '\n';
}

std::string hex_code(int code) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", code & 0xFF);
  return buf;
}

}  // namespace

std::string prometheus_text(const RelayCounters& c) {
  std::ostringstream o;
  o.precision(17);
  metric(o, "connected", "gauge", "1 while the relay has a connection to the broker.",
         c.connected ? 1 : 0);
  metric(o, "connects_total", "counter", "Connections the relay published on.",
         static_cast<double>(c.connects));
  metric(o, "offline_seconds_total", "counter",
         "Time without a connection since the relay started.",
         static_cast<double>(c.offline_ms) / 1000.0);
  metric(o, "published_total", "counter", "Publishes handed to the MQTT client, resends included.",
         static_cast<double>(c.published));
  o << "# HELP mqtt_inbox_relay_pubacks_total PUBACKs received, by reason code (MQTT 5.0 "
       "section 3.4.2.1; 0x00 on MQTT 3.1.1).\n# TYPE mqtt_inbox_relay_pubacks_total counter\n";
  for (const auto& r : c.acks_by_reason)
    o << "mqtt_inbox_relay_pubacks_total{reason_code=\"" << hex_code(r.first) << "\"} " << r.second
      << '\n';
  o << "# HELP mqtt_inbox_relay_dead_lettered_total Outbox rows the relay made dead letters, by "
       "reason.\n# TYPE mqtt_inbox_relay_dead_lettered_total counter\n"
    << "mqtt_inbox_relay_dead_lettered_total{reason=\"rejected_by_broker\"} " << c.rejected << '\n'
    << "mqtt_inbox_relay_dead_lettered_total{reason=\"expired\"} " << c.expired << '\n'
    << "mqtt_inbox_relay_dead_lettered_total{reason=\"payload_too_large\"} " << c.too_large << '\n'
    << "mqtt_inbox_relay_dead_lettered_total{reason=\"connection_dropped\"} "
    << c.connection_dropped << '\n';
  o << "# HELP mqtt_inbox_relay_puback_latency_seconds Publish-to-PUBACK latency; quantiles over "
       "the last PUBACKs (up to 1024).\n# TYPE mqtt_inbox_relay_puback_latency_seconds summary\n";
  if (c.puback_latency_samples > 0)
    o << "mqtt_inbox_relay_puback_latency_seconds{quantile=\"0.5\"} "
      << c.puback_latency_p50_ms / 1000.0 << '\n'
      << "mqtt_inbox_relay_puback_latency_seconds{quantile=\"0.99\"} "
      << c.puback_latency_p99_ms / 1000.0 << '\n';
  o << "mqtt_inbox_relay_puback_latency_seconds_sum " << c.puback_latency_sum_ms / 1000.0 << '\n'
    << "mqtt_inbox_relay_puback_latency_seconds_count " << c.puback_latency_count << '\n';
  o << "# HELP mqtt_inbox_relay_commit_to_puback_seconds From a row's enqueue, in the "
       "transaction that committed it, to its PUBACK; quantiles over the last PUBACKs (up to "
       "1024).\n# TYPE mqtt_inbox_relay_commit_to_puback_seconds gauge\n";
  if (c.puback_latency_samples > 0)
    o << "mqtt_inbox_relay_commit_to_puback_seconds{quantile=\"0.5\"} "
      << c.commit_to_puback_p50_ms / 1000.0 << '\n'
      << "mqtt_inbox_relay_commit_to_puback_seconds{quantile=\"0.99\"} "
      << c.commit_to_puback_p99_ms / 1000.0 << '\n';
  metric(o, "inflight_max", "gauge", "Most publishes seen without PUBACK at once.",
         static_cast<double>(c.max_inflight_seen));
  metric(o, "receive_maximum", "gauge", "The broker's Receive Maximum at the last CONNACK.",
         c.receive_maximum);
  return o.str();
}

}  // namespace mqtt_inbox

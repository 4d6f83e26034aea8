#include "mqtt_inbox/stats.h"

#include <cstdio>
#include <sstream>

namespace mqtt_inbox {

std::string summary_line(const InboxStats& s) {
  char buf[512];
  // Rows are known only once measured; 0 would read as "an empty inbox".
  std::string rows = "unknown";
  if (s.rows_measured_at != 0) {
    int64_t n = 0;
    for (const auto& c : s.consumers) n += c.second.rows;
    rows = std::to_string(n);
  }
  std::snprintf(buf, sizeof buf,
                "processed=%lld duplicates=%lld (%.1f%%) dead_lettered=%lld retries=%lld "
                "store_errors=%lld pruned=%lld rows=%s commit_p50=%lldus p99=%lldus max=%lldus "
                "db=%lldB wal=%lldB sessions_lost=%lld",
                static_cast<long long>(s.processed), static_cast<long long>(s.duplicates),
                100.0 * s.duplicate_ratio, static_cast<long long>(s.dead_lettered),
                static_cast<long long>(s.retries), static_cast<long long>(s.store_errors),
                static_cast<long long>(s.pruned), rows.c_str(),
                static_cast<long long>(s.commit_p50_us), static_cast<long long>(s.commit_p99_us),
                static_cast<long long>(s.commit_max_us), static_cast<long long>(s.db_bytes),
                static_cast<long long>(s.wal_bytes), static_cast<long long>(s.sessions_lost));
  return buf;
}

namespace {

// Label values escape backslash, double quote and newline (exposition format 0.0.4).
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void metric(std::ostringstream& o, const char* name, const char* type, const char* help,
            double value) {
  o << "# HELP mqtt_inbox_" << name << ' ' << help << "\n# TYPE mqtt_inbox_" << name << ' ' << type
    << "\nmqtt_inbox_" << name << ' ' << value << '\n';
}

}  // namespace

std::string prometheus_text(const InboxStats& s) {
  std::ostringstream o;
  o.precision(17);
  metric(o, "processed_total", "counter", "Claims committed with their effect.",
         static_cast<double>(s.processed));
  metric(o, "duplicates_total", "counter", "Deliveries skipped as already processed.",
         static_cast<double>(s.duplicates));
  metric(o, "dead_lettered_total", "counter", "Messages written to the dead letters.",
         static_cast<double>(s.dead_lettered));
  metric(o, "retries_total", "counter", "Handler attempts that failed.",
         static_cast<double>(s.retries));
  metric(o, "store_errors_total", "counter", "Store operations that failed and were retried.",
         static_cast<double>(s.store_errors));
  metric(o, "pruned_total", "counter", "Processed ids deleted by retention.",
         static_cast<double>(s.pruned));
  metric(o, "sessions_lost_total", "counter",
         "Broker sessions found gone at CONNACK although the inbox recorded them.",
         static_cast<double>(s.sessions_lost));
  metric(o, "duplicate_ratio", "gauge", "Duplicates over all deliveries since start.",
         s.duplicate_ratio);
  metric(o, "commit_p50_microseconds", "gauge", "Median claim transaction latency.",
         static_cast<double>(s.commit_p50_us));
  metric(o, "commit_p99_microseconds", "gauge", "99th percentile claim transaction latency.",
         static_cast<double>(s.commit_p99_us));
  metric(o, "commit_max_microseconds", "gauge", "Longest claim transaction since start.",
         static_cast<double>(s.commit_max_us));
  metric(o, "db_bytes", "gauge", "Size of the main database file.",
         static_cast<double>(s.db_bytes));
  metric(o, "wal_bytes", "gauge", "Size of the WAL file.", static_cast<double>(s.wal_bytes));
  o << "# HELP mqtt_inbox_rows Processed ids retained, per consumer.\n# TYPE mqtt_inbox_rows "
       "gauge\n";
  for (const auto& c : s.consumers)
    o << "mqtt_inbox_rows{consumer=\"" << label(c.first) << "\"} " << c.second.rows << '\n';
  if (s.rows_measured_at == 0) return o.str();
  const auto per_class = [&](const char* name, const char* type, const char* help,
                             int64_t OutboxClassRows::*field) {
    o << "# HELP mqtt_inbox_outbox_" << name << ' ' << help << "\n# TYPE mqtt_inbox_outbox_" << name
      << ' ' << type << '\n';
    for (const auto& c : s.outbox.classes)
      o << "mqtt_inbox_outbox_" << name << "{class=\"" << label(c.first) << "\"} "
        << c.second.*field << '\n';
  };
  per_class("pending_rows", "gauge", "Outbox rows waiting for their PUBACK, per class.",
            &OutboxClassRows::pending_rows);
  per_class("pending_bytes", "gauge", "Bytes of the pending outbox rows, per class.",
            &OutboxClassRows::pending_bytes);
  per_class("dropped_total", "counter", "Outbox rows dropped by drop_oldest, per class.",
            &OutboxClassRows::dropped);
  metric(o, "outbox_sent_rows", "gauge", "Sent outbox rows kept for the retention window.",
         static_cast<double>(s.outbox.sent_rows));
  metric(o, "outbox_dead_rows", "gauge", "Outbox dead letters.",
         static_cast<double>(s.outbox.dead_rows));
  // Seconds with the milliseconds as decimals, printed exactly (not 300.00099999999998).
  char age[32];
  std::snprintf(age, sizeof age, "%lld.%03lld",
                static_cast<long long>(s.outbox.oldest_pending_age_ms / 1000),
                static_cast<long long>(s.outbox.oldest_pending_age_ms % 1000));
  o << "# HELP mqtt_inbox_outbox_oldest_pending_age_seconds Age of the oldest pending outbox row"
       " on the retention clock (0: none pending).\n"
       "# TYPE mqtt_inbox_outbox_oldest_pending_age_seconds gauge\n"
       "mqtt_inbox_outbox_oldest_pending_age_seconds "
    << age << '\n';
  return o.str();
}

}  // namespace mqtt_inbox

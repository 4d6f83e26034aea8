// mqtt-inbox: inspect, repair and verify an inbox on a live device (docs/admin-tool.md).
//
//   mqtt-inbox stats DB                      mqtt-inbox check DB / migrate DB
//   mqtt-inbox prune DB [--older-than 8d]    mqtt-inbox export DB [--since 2d]
//   mqtt-inbox dead-letters list|show|replay|purge DB ...
//   mqtt-inbox replay DB --consumer C ...    mqtt-inbox probe-broker --broker URL
//
// Every command prints a table by default and JSON with --json. It works on a database a
// running consumer is using: every write goes through the library (short BEGIN IMMEDIATE
// transactions, the busy timeout), every read is a short statement of its own.
//
// Exit codes (also in docs/admin-tool.md):
//   0 ok; 1 usage; 2 check or probe found problems; 3 store error (missing file, not an
//   inbox, SQLite error); 4 refused (safety rule, no confirmation, already replayed);
//   5 schema version differs from this tool's (older: run `migrate`; newer: upgrade the
//   tool); 6 not possible without a library change (see the message); 7 broker
//   unreachable or protocol error; 8 nothing matched (unknown id or consumer).
#include <CLI/CLI.hpp>
#include <SQLiteCpp/SQLiteCpp.h>
#include <mqtt/async_client.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <mqtt_inbox/dead_letter.h>
#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/retention.h>
#include <mqtt_inbox/store_then_process.h>
#include <mqtt_inbox/version.h>

using nlohmann::json;
namespace mi = mqtt_inbox;

namespace {

enum Exit {
  kOk = 0,
  kUsage = 1,
  kProblems = 2,
  kStoreError = 3,
  kRefused = 4,
  kSchema = 5,
  kUnsupported = 6,
  kBroker = 7,
  kNotFound = 8,
};

struct ToolError {
  int code;
  std::string message;
};

[[noreturn]] void fail(int code, const std::string& message) { throw ToolError{code, message}; }

struct Globals {
  bool json = false;
  int busy_timeout_ms = 5000;
} g;

// ------------------------------------------------------------------ time and text

int64_t wall_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "90s", "15m", "8h", "7d", "250ms" -> ms. Returns false if malformed.
bool parse_duration(const std::string& text, int64_t* out) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 15) return false;
  const int64_t n = std::stoll(text.substr(0, i));
  const std::string unit = text.substr(i);
  int64_t mul = 0;
  if (unit == "ms") mul = 1;
  else if (unit == "s") mul = 1000;
  else if (unit == "m") mul = 60 * 1000;
  else if (unit == "h") mul = 3600 * 1000;
  else if (unit == "d") mul = 24LL * 3600 * 1000;
  else return false;
  *out = n * mul;
  return true;
}

int64_t duration_or_usage(const std::string& text, const char* what) {
  int64_t ms = 0;
  if (!parse_duration(text, &ms))
    fail(kUsage, std::string(what) + ": '" + text + "' is not a duration (e.g. 90s, 15m, 8h, 7d)");
  return ms;
}

// A point in time on a clock whose "now" is `now_ms`:
//   all digits            -> that value, ms
//   a duration (2h, 7d)   -> now - duration ("2 hours ago" on that clock)
//   2024-05-01[THH:MM[:SS]][Z] -> UTC wall time; + (now - wall now) for the retention clock,
//                            which started at the wall clock but does not run while down.
int64_t parse_time(const std::string& text, int64_t now_ms, const char* what) {
  if (!text.empty() && std::all_of(text.begin(), text.end(), ::isdigit)) return std::stoll(text);
  int64_t d = 0;
  if (parse_duration(text, &d)) return now_ms - d;
  std::tm tm{};
  int y = 0, mo = 0, da = 0, h = 0, mi_ = 0, s = 0;
  const int n = std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d", &y, &mo, &da, &h, &mi_, &s);
  if (n >= 3 && y >= 1970 && mo >= 1 && mo <= 12 && da >= 1 && da <= 31) {
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = da;
    tm.tm_hour = n >= 4 ? h : 0;
    tm.tm_min = n >= 5 ? mi_ : 0;
    tm.tm_sec = n >= 6 ? s : 0;
    const int64_t wall = static_cast<int64_t>(timegm(&tm)) * 1000;
    return wall + (now_ms - wall_now_ms());
  }
  fail(kUsage, std::string(what) + ": '" + text +
                   "' is not a time (ms, a duration ago like 2h, or 2024-05-01T12:00:00Z)");
}

std::string iso(int64_t ms) {
  if (ms <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string human_ms(int64_t ms) {
  char buf[48];
  const double a = static_cast<double>(ms < 0 ? -ms : ms);
  if (a >= 86400000.0 && ms % 3600000 == 0)
    std::snprintf(buf, sizeof buf, "%lldd%s", static_cast<long long>(ms / 86400000),
                  ms % 86400000 ? (" " + std::to_string(ms % 86400000 / 3600000) + "h").c_str() : "");
  else if (a >= 86400000.0) std::snprintf(buf, sizeof buf, "%.1fd", ms / 86400000.0);
  else if (a >= 3600000.0) std::snprintf(buf, sizeof buf, "%.1fh", ms / 3600000.0);
  else if (a >= 60000.0) std::snprintf(buf, sizeof buf, "%.1fm", ms / 60000.0);
  else std::snprintf(buf, sizeof buf, "%.1fs", ms / 1000.0);
  return buf;
}

std::string human_bytes(int64_t b) {
  char buf[48];
  if (b >= 1 << 20) std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else if (b >= 1 << 10) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  return buf;
}

std::string hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string base64(const std::string& bytes) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += t[v >> 18];
    out += t[(v >> 12) & 63];
    out += t[(v >> 6) & 63];
    out += t[v & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= uint8_t(bytes[i + 1]) << 8;
    out += t[v >> 18];
    out += t[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? t[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// Printable for a terminal: control and non-ASCII bytes as \xNN.
std::string printable(const std::string& s, size_t max = 60) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  return out;
}

bool is_utf8_text(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::strict).size() > 0 &&
         std::none_of(s.begin(), s.end(), [](char c) {
           return static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t' && c != '\r';
         });
}

bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

// A text for JSON output: the string itself if valid UTF-8, else with \xNN escapes.
std::string json_text(const std::string& s) { return valid_utf8(s) ? s : printable(s, s.size() * 4); }

void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size());
  for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string cell = i < r.size() ? r[i] : "";
      out += cell;
      if (i + 1 < w.size()) out += std::string(w[i] - cell.size() + 2, ' ');
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    std::cout << out << "\n";
  };
  line(header);
  std::vector<std::string> dashes;
  for (size_t x : w) dashes.push_back(std::string(x, '-'));
  line(dashes);
  for (const auto& r : rows) line(r);
}

void print_kv(const std::vector<std::pair<std::string, std::string>>& kv) {
  size_t w = 0;
  for (const auto& p : kv) w = std::max(w, p.first.size());
  for (const auto& p : kv) std::cout << p.first << std::string(w - p.first.size() + 2, ' ') << p.second << "\n";
}

void emit(const json& j) { std::cout << j.dump(2) << std::endl; }

// ------------------------------------------------------------------ opening the database

// The tool shares the file with a running consumer: never take the consumer's exclusive
// per-database lock (InboxOptions::exclusive, where the library has it).
template <typename T>
auto set_non_exclusive(T& o, int) -> decltype(o.exclusive = false, void()) {
  o.exclusive = false;
}
template <typename T>
void set_non_exclusive(T&, long) {}

mi::InboxOptions tool_inbox_options();

std::shared_ptr<spdlog::logger> tool_logger() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = spdlog::stderr_color_mt("mqtt-inbox");
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return log;
}

struct FileFacts {
  int user_version = 0;
  std::string journal_mode;
  bool has_inbox_tables = false;
};

void require_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(kStoreError, "no such database: " + path);
  if (!S_ISREG(st.st_mode)) fail(kStoreError, "not a regular file: " + path);
}

// Reads the schema version with a read-only connection: never creates, migrates or writes.
FileFacts read_facts(const std::string& path) {
  require_file(path);
  FileFacts f;
  try {
    SQLite::Database db(path, SQLite::OPEN_READONLY, g.busy_timeout_ms);
    f.user_version = db.execAndGet("PRAGMA user_version").getInt();
    f.journal_mode = db.execAndGet("PRAGMA journal_mode").getString();
    f.has_inbox_tables =
        db.execAndGet("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'inbox_processed'")
            .getInt() > 0;
  } catch (const SQLite::Exception& e) {
    fail(kStoreError, path + ": " + e.what());
  }
  if (!f.has_inbox_tables && f.user_version == 0)
    fail(kStoreError, path + " is not an mqtt-inbox database (no inbox tables)");
  return f;
}

mi::InboxOptions tool_inbox_options() {
  mi::InboxOptions o;
  o.busy_timeout_ms = g.busy_timeout_ms;
  o.logger = tool_logger();
  set_non_exclusive(o, 0);
  return o;
}

void require_current_schema(const std::string& path, const FileFacts& f) {
  if (f.user_version > mi::kSchemaVersion)
    fail(kSchema, path + " has schema version " + std::to_string(f.user_version) +
                      ", newer than this tool's " + std::to_string(mi::kSchemaVersion) +
                      ": use the mqtt-inbox tool of the release that wrote it");
  if (f.user_version < mi::kSchemaVersion)
    fail(kSchema, path + " has schema version " + std::to_string(f.user_version) + ", older than this tool's " +
                      std::to_string(mi::kSchemaVersion) +
                      ". Nothing was changed. Run `mqtt-inbox migrate " + path +
                      "` after upgrading the application that uses it (an older library refuses a "
                      "newer schema).");
}

// Opens through the library once the schema is known to be current, so Inbox::open applies
// no migration. Inbox::open switches the file to WAL if it was not (a repair) and persists
// the retention clock when closed (only ever a value the clock already had).
std::unique_ptr<mi::Inbox> open_inbox(const std::string& path) {
  const FileFacts f = read_facts(path);
  require_current_schema(path, f);
  std::unique_ptr<mi::Inbox> inbox;
  const mi::Status s = mi::Inbox::open(path, tool_inbox_options(), &inbox);
  if (!s.ok()) fail(s.code() == mi::Status::Code::kCorruption ? kSchema : kStoreError, s.to_string());
  return inbox;
}

void check_status(const mi::Status& s, const std::string& what) {
  if (s.ok()) return;
  fail(s.code() == mi::Status::Code::kNotFound ? kNotFound : kStoreError, what + ": " + s.to_string());
}

// Plain read-only SQL on the inbox's connection (inspection the library has no call for).
// Each call is one short statement; exceptions become a store error.
template <typename Fn>
void read_sql(mi::Inbox& inbox, const std::string& what, Fn&& fn) {
  std::string error;
  inbox.with_connection([&](SQLite::Database& db) {
    try {
      fn(db);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!error.empty()) fail(kStoreError, what + ": " + error);
}

std::map<std::string, std::string> read_meta(mi::Inbox& inbox) {
  std::map<std::string, std::string> meta;
  read_sql(inbox, "reading inbox_meta", [&](SQLite::Database& db) {
    SQLite::Statement q(db, "SELECT key, value FROM inbox_meta");
    while (q.executeStep()) meta[q.getColumn(0).getString()] = q.getColumn(1).getString();
  });
  return meta;
}

std::optional<int64_t> meta_int(const std::map<std::string, std::string>& meta, const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end()) return std::nullopt;
  try {
    return std::stoll(it->second);
  } catch (...) {
    return std::nullopt;
  }
}

// A StoreThenProcess for the tool's own use: no workers, never started, so its handler
// never runs. Only replay() and stats() are used; they run on its maintenance connection.
std::unique_ptr<mi::StoreThenProcess> stp_for(mi::Inbox* inbox, const std::string& consumer,
                                              int64_t lease_ms = 0) {
  mi::StoreThenProcessOptions o;
  if (lease_ms > 0) o.lease_ms = lease_ms;
  o.workers = 0;
  o.prune_interval_ms = 0;
  std::unique_ptr<mi::StoreThenProcess> stp;
  auto never = [](SQLite::Database&, const mi::StoredDelivery&) {
    throw std::logic_error("the admin tool never processes rows");
  };
  check_status(mi::StoreThenProcess::create(inbox, consumer, never, o, &stp),
               "opening store-then-process consumer '" + consumer + "'");
  return stp;
}

std::set<std::string> stp_consumers(mi::Inbox& inbox) {
  std::set<std::string> out;
  read_sql(inbox, "listing store-then-process consumers", [&](SQLite::Database& db) {
    SQLite::Statement q(db, "SELECT DISTINCT consumer_name FROM inbox_messages");
    while (q.executeStep()) out.insert(q.getColumn(0).getString());
  });
  return out;
}

// ------------------------------------------------------------------ stats

int cmd_stats(const std::string& path) {
  auto inbox = open_inbox(path);
  const FileFacts facts = read_facts(path);
  check_status(inbox->refresh_row_stats(), "measuring rows");
  const mi::InboxStats s = inbox->stats();
  const auto meta = read_meta(*inbox);
  const int64_t clock = s.retention_clock_ms;

  std::set<std::string> names;
  for (const auto& c : s.consumers) names.insert(c.first);
  std::map<std::string, std::map<std::string, int64_t>> dead_by_reason;
  std::map<std::string, int64_t> replayed, attempts;
  read_sql(*inbox, "counting dead letters", [&](SQLite::Database& db) {
    SQLite::Statement q(db, "SELECT consumer_name, reason, status, count(*) FROM inbox_dead_letters"
                            " GROUP BY consumer_name, reason, status");
    while (q.executeStep()) {
      const std::string c = q.getColumn(0).getString();
      names.insert(c);
      if (q.getColumn(2).getString() == "dead") dead_by_reason[c][q.getColumn(1).getString()] += q.getColumn(3).getInt64();
      else replayed[c] += q.getColumn(3).getInt64();
    }
    SQLite::Statement a(db, "SELECT consumer_name, count(*) FROM inbox_attempts GROUP BY consumer_name");
    while (a.executeStep()) {
      names.insert(a.getColumn(0).getString());
      attempts[a.getColumn(0).getString()] = a.getColumn(1).getInt64();
    }
  });
  const std::set<std::string> stp_names = stp_consumers(*inbox);
  names.insert(stp_names.begin(), stp_names.end());

  json j;
  j["database"] = path;
  j["schema_version"] = facts.user_version;
  j["library_schema_version"] = mi::kSchemaVersion;
  j["db_bytes"] = s.db_bytes;
  j["wal_bytes"] = s.wal_bytes;
  j["retention_clock_ms"] = clock;
  j["wall_clock_ms"] = wall_now_ms();
  j["persisted_retention_clock_ms"] = meta_int(meta, "retention_clock_ms") ? json(*meta_int(meta, "retention_clock_ms")) : json();
  j["required_window_ms"] = meta_int(meta, "required_window_ms") ? json(*meta_int(meta, "required_window_ms")) : json();
  j["consumers"] = json::array();
  std::vector<std::vector<std::string>> rows;
  for (const auto& name : names) {
    json c;
    c["name"] = name;
    mi::ConsumerRows r;
    if (auto it = s.consumers.find(name); it != s.consumers.end()) r = it->second;
    c["processed_rows"] = r.rows;
    c["oldest_received_at"] = r.oldest_received_at;
    c["newest_received_at"] = r.newest_received_at;
    c["oldest_age_ms"] = r.rows ? clock - r.oldest_received_at : 0;
    c["attempts_in_progress"] = attempts[name];
    json reasons = json::object();
    int64_t dead_total = 0;
    for (const auto& kv : dead_by_reason[name]) {
      reasons[kv.first] = kv.second;
      dead_total += kv.second;
    }
    c["dead_letters"] = {{"dead", dead_total}, {"by_reason", reasons}, {"replayed", replayed[name]}};
    std::string stp_cell = "-";
    if (stp_names.count(name)) {
      auto stp = stp_for(inbox.get(), name);
      mi::StoreThenProcessStats st;
      check_status(stp->stats(&st), "store-then-process stats");
      c["store_then_process"] = {{"pending", st.pending}, {"processing", st.processing},
                                 {"done", st.done}, {"dead", st.dead}};
      stp_cell = std::to_string(st.pending) + "/" + std::to_string(st.processing) + "/" +
                 std::to_string(st.done) + "/" + std::to_string(st.dead);
    } else {
      c["store_then_process"] = nullptr;
    }
    j["consumers"].push_back(c);
    std::string reasons_cell;
    for (const auto& kv : dead_by_reason[name])
      reasons_cell += (reasons_cell.empty() ? "" : ",") + kv.first + "=" + std::to_string(kv.second);
    rows.push_back({name, std::to_string(r.rows), r.rows ? human_ms(clock - r.oldest_received_at) : "-",
                    r.rows ? human_ms(clock - r.newest_received_at) : "-", std::to_string(dead_total),
                    reasons_cell.empty() ? "-" : reasons_cell, std::to_string(attempts[name]), stp_cell});
  }
  if (g.json) {
    emit(j);
    return kOk;
  }
  print_kv({{"database", path},
            {"schema version", std::to_string(facts.user_version) + " (tool " + std::to_string(mi::kSchemaVersion) + ")"},
            {"db size", human_bytes(s.db_bytes)},
            {"wal size", human_bytes(s.wal_bytes)},
            {"retention clock", std::to_string(clock) + " ms (~" + iso(clock) + "; wall " + iso(wall_now_ms()) + ")"},
            {"required window", j["required_window_ms"].is_null() ? "not recorded (no Pruner has run)"
                                                                   : human_ms(j["required_window_ms"].get<int64_t>())}});
  std::cout << "\n";
  print_table({"consumer", "processed", "oldest age", "newest age", "dead", "dead by reason", "attempts",
               "stp pend/proc/done/dead"},
              rows);
  return kOk;
}

// ------------------------------------------------------------------ prune

struct PruneArgs {
  std::string older_than, dead_letters_older_than, session_expiry, max_offline, replay_window, margin;
  bool dry_run = false, force = false;
  int64_t budget_ms = 2000;
};

int cmd_prune(const std::string& path, const PruneArgs& a) {
  auto inbox = open_inbox(path);
  const auto meta = read_meta(*inbox);
  const std::optional<int64_t> stored = meta_int(meta, "required_window_ms");

  // The horizon to enforce: the one the application's Pruner recorded, raised by one
  // declared here; the library's defaults when neither exists.
  mi::RetentionOptions declared;
  bool declared_any = false;
  if (!a.session_expiry.empty()) declared.broker_session_expiry = std::chrono::milliseconds(duration_or_usage(a.session_expiry, "--session-expiry")), declared_any = true;
  if (!a.max_offline.empty()) declared.max_offline = std::chrono::milliseconds(duration_or_usage(a.max_offline, "--max-offline")), declared_any = true;
  if (!a.replay_window.empty()) declared.replay_window = std::chrono::milliseconds(duration_or_usage(a.replay_window, "--replay-window")), declared_any = true;
  if (!a.margin.empty()) declared.margin = std::chrono::milliseconds(duration_or_usage(a.margin, "--margin")), declared_any = true;
  int64_t required = 0;
  std::string source;
  if (stored) {
    required = *stored;
    source = "inbox_meta.required_window_ms";
  }
  if (declared_any || !stored) {
    const int64_t d = mi::Pruner::required_window_ms(declared);
    if (d > required) {
      required = d;
      source = declared_any ? "declared on the command line" : "library defaults (nothing recorded)";
    }
  }
  const int64_t window = a.older_than.empty() ? required : duration_or_usage(a.older_than, "--older-than");
  if (window <= 0) fail(kUsage, "--older-than must be > 0");
  const int64_t dl_window =
      a.dead_letters_older_than.empty() ? 0 : duration_or_usage(a.dead_letters_older_than, "--dead-letters-older-than");
  const bool below = window < required;
  if (below && !a.force)
    fail(kRefused, "refused: window " + human_ms(window) + " is below the redelivery horizon plus margin " +
                       human_ms(required) + " (" + source +
                       "); ids pruned now could be redelivered and processed twice. Use --force to override.");

  json j = {{"database", path}, {"window_ms", window}, {"required_window_ms", required},
            {"horizon_source", source}, {"forced_below_horizon", below}, {"dry_run", a.dry_run},
            {"dead_letter_window_ms", dl_window}};
  const int64_t clock = inbox->retention_clock_ms();
  const int64_t cutoff = clock - window;
  if (a.dry_run) {
    int64_t ids = 0, dls = 0;
    json per = json::object();
    read_sql(*inbox, "counting expired rows", [&](SQLite::Database& db) {
      SQLite::Statement q(db, "SELECT consumer_name, count(*) FROM inbox_processed WHERE received_at < ?1"
                              " GROUP BY consumer_name");
      q.bind(1, cutoff);
      while (q.executeStep()) {
        per[q.getColumn(0).getString()] = q.getColumn(1).getInt64();
        ids += q.getColumn(1).getInt64();
      }
      if (dl_window > 0) {
        SQLite::Statement d(db, "SELECT count(*) FROM inbox_dead_letters WHERE retention_at < ?1");
        d.bind(1, clock - dl_window);
        d.executeStep();
        dls = d.getColumn(0).getInt64();
      }
    });
    j["cutoff"] = cutoff;
    j["would_delete_processed"] = ids;
    j["would_delete_by_consumer"] = per;
    j["would_delete_dead_letters"] = dls;
    if (g.json) emit(j);
    else {
      print_kv({{"window", human_ms(window) + (below ? " (BELOW horizon, forced)" : "")},
                {"required window", human_ms(required) + " (" + source + ")"},
                {"cutoff (retention clock)", std::to_string(cutoff)},
                {"ids that would be deleted", std::to_string(ids)},
                {"dead letters that would be deleted", dl_window > 0 ? std::to_string(dls) : "none (kept; see --dead-letters-older-than)"}});
      std::cout << "dry run: nothing was deleted\n";
    }
    return kOk;
  }

  mi::RetentionOptions o;
  o.window = std::chrono::milliseconds(window);
  // Pruner::create records required_window_ms(o) in inbox_meta: make it exactly the horizon
  // enforced above, so the tool never lowers what the application declared.
  o.broker_session_expiry = std::chrono::milliseconds(required);
  o.max_offline = std::chrono::milliseconds(0);
  o.replay_window = std::chrono::milliseconds(0);
  o.margin = std::chrono::milliseconds(0);
  o.allow_window_below_horizon = a.force;
  o.dead_letter_window = std::chrono::milliseconds(dl_window);
  o.pass_budget = std::chrono::milliseconds(a.budget_ms);
  o.stats_log_period_ms = 0;
  // The Pruner picks a TRUNCATE checkpoint when its own Inbox committed nothing for a
  // period, which is always true of the tool's; TRUNCATE waits for the running consumer's
  // writes (up to the busy timeout each). So the tool leaves checkpoints to the consumer.
  o.checkpoint = false;
  std::unique_ptr<mi::Pruner> pruner;
  const mi::Status cs = mi::Pruner::create(inbox.get(), o, &pruner);
  if (!cs.ok()) fail(cs.code() == mi::Status::Code::kInvalidArgument ? kRefused : kStoreError, cs.to_string());
  mi::PruneResult r;
  const mi::Status ps = pruner->prune_once(&r);
  j["cutoff"] = r.cutoff;
  j["processed_deleted"] = r.processed_deleted;
  j["dead_letters_deleted"] = r.dead_letters_deleted;
  j["batches"] = r.batches;
  j["budget_exhausted"] = r.budget_exhausted;
  j["pages_freed"] = r.pages_freed;
  j["duration_ms"] = r.duration_ms;
  if (!ps.ok()) {
    j["error"] = ps.to_string();
    if (g.json) emit(j);
    fail(kStoreError, "pruning stopped: " + ps.to_string() + " (" + std::to_string(r.processed_deleted) +
                          " ids already deleted stay deleted)");
  }
  if (g.json) emit(j);
  else
    print_kv({{"window", human_ms(window) + (below ? " (BELOW horizon, forced)" : "")},
              {"required window", human_ms(required) + " (" + source + ")"},
              {"ids deleted", std::to_string(r.processed_deleted)},
              {"dead letters deleted", std::to_string(r.dead_letters_deleted)},
              {"batches", std::to_string(r.batches)},
              {"pages freed", std::to_string(r.pages_freed)},
              {"duration", std::to_string(r.duration_ms) + " ms"},
              {"more left", r.budget_exhausted ? "yes: the pass budget ran out; run prune again" : "no"}});
  return kOk;
}

// ------------------------------------------------------------------ dead letters

struct DlArgs {
  std::string consumer, reason, since, before, message_id;
  int64_t id = 0;
  int64_t limit = 100;
  bool include_replayed = false, yes = false, all = false;
  std::string payload_encoding = "base64";
};

mi::DeadLetterFilter dl_filter(const DlArgs& a) {
  mi::DeadLetterFilter f;
  if (!a.consumer.empty()) f.consumer_name = a.consumer;
  if (!a.reason.empty()) {
    mi::DeadLetterReason r;
    if (!mi::parse_dead_letter_reason(a.reason, &r))
      fail(kUsage, "--reason: unknown reason '" + a.reason +
                       "' (missing_id, invalid_id, payload_too_large, undecodable_payload, handler_failed, handler_crashed)");
    f.reason = r;
  }
  if (!a.message_id.empty()) f.message_id = a.message_id;
  const int64_t now = wall_now_ms();
  if (!a.since.empty()) f.since_ms = parse_time(a.since, now, "--since");
  if (!a.before.empty()) f.before_ms = parse_time(a.before, now, "--before");
  f.include_replayed = a.include_replayed;
  f.limit = a.limit;
  return f;
}

json dl_json(const mi::DeadLetter& d, bool with_payload, const std::string& encoding = "base64") {
  json j = {{"id", d.id},
            {"consumer", d.consumer_name},
            {"message_id", d.message_id ? json(json_text(*d.message_id)) : json()},
            {"topic", json_text(d.topic)},
            {"reason", mi::to_string(d.reason)},
            {"reason_text", json_text(d.reason_text)},
            {"attempts", d.attempts},
            {"qos", d.qos},
            {"payload_size", d.payload_size},
            {"payload_stored_bytes", d.payload.size()},
            {"payload_cut", static_cast<int64_t>(d.payload.size()) < d.payload_size},
            {"first_attempt_at", d.first_attempt_at_ms},
            {"last_attempt_at", d.last_attempt_at_ms},
            {"dead_lettered_at", d.dead_lettered_at_ms},
            {"redeliveries", d.redeliveries},
            {"status", d.replayed ? "replayed" : "dead"},
            {"replayed_at", d.replayed_at_ms ? json(*d.replayed_at_ms) : json()}};
  json props = json::parse(d.properties_json.empty() ? "{}" : d.properties_json, nullptr, false);
  j["properties"] = props.is_discarded() ? json(json_text(d.properties_json)) : props;
  if (with_payload) {
    j["payload_encoding"] = encoding;
    j["payload"] = encoding == "hex" ? hex(d.payload) : base64(d.payload);
    if (valid_utf8(d.payload)) j["payload_text"] = d.payload;
  }
  return j;
}

std::vector<mi::DeadLetter> dl_select(mi::Inbox& inbox, const DlArgs& a) {
  std::vector<mi::DeadLetter> rows;
  if (a.id > 0) {
    mi::DeadLetter d;
    const mi::Status s = inbox.get_dead_letter(a.id, &d);
    if (s.code() == mi::Status::Code::kNotFound) fail(kNotFound, "no dead letter with id " + std::to_string(a.id));
    check_status(s, "reading dead letter");
    rows.push_back(d);
    return rows;
  }
  check_status(inbox.list_dead_letters(dl_filter(a), &rows), "listing dead letters");
  return rows;
}

int cmd_dl_list(const std::string& path, const DlArgs& a) {
  auto inbox = open_inbox(path);
  const auto rows = dl_select(*inbox, a);
  if (g.json) {
    json arr = json::array();
    for (const auto& d : rows) arr.push_back(dl_json(d, false));
    emit({{"dead_letters", arr}, {"count", rows.size()}, {"limit", a.limit}});
    return kOk;
  }
  std::vector<std::vector<std::string>> t;
  for (const auto& d : rows)
    t.push_back({std::to_string(d.id), d.consumer_name, d.message_id ? printable(*d.message_id, 40) : "(none)",
                 mi::to_string(d.reason), std::to_string(d.attempts), iso(d.dead_lettered_at_ms),
                 d.replayed ? "replayed" : "dead", printable(d.topic, 30), std::to_string(d.payload_size)});
  print_table({"id", "consumer", "message id", "reason", "attempts", "dead-lettered at", "status", "topic", "bytes"}, t);
  std::cout << rows.size() << " row(s)" << (a.limit > 0 && static_cast<int64_t>(rows.size()) == a.limit ? " (limit reached; --limit 0 for all)" : "") << "\n";
  return kOk;
}

int cmd_dl_show(const std::string& path, const DlArgs& a) {
  if (a.id <= 0) fail(kUsage, "dead-letters show needs --id N");
  auto inbox = open_inbox(path);
  const auto rows = dl_select(*inbox, a);
  const mi::DeadLetter& d = rows.front();
  if (g.json) {
    emit(dl_json(d, true, a.payload_encoding));
    return kOk;
  }
  print_kv({{"id", std::to_string(d.id)},
            {"consumer", d.consumer_name},
            {"message id", d.message_id ? printable(*d.message_id, 300) : "(none)"},
            {"topic", printable(d.topic, 300)},
            {"reason", std::string(mi::to_string(d.reason)) + ": " + printable(d.reason_text, 300)},
            {"status", d.replayed ? "replayed at " + iso(d.replayed_at_ms.value_or(0)) : "dead"},
            {"attempts", std::to_string(d.attempts)},
            {"first attempt", iso(d.first_attempt_at_ms)},
            {"last attempt", iso(d.last_attempt_at_ms)},
            {"dead-lettered", iso(d.dead_lettered_at_ms)},
            {"redeliveries", std::to_string(d.redeliveries)},
            {"qos", std::to_string(d.qos)},
            {"properties", d.properties_json.empty() ? "{}" : printable(d.properties_json, 300)},
            {"payload size", std::to_string(d.payload_size) +
                                 (static_cast<int64_t>(d.payload.size()) < d.payload_size ? " (stored " + std::to_string(d.payload.size()) + ", cut)" : "")}});
  std::cout << "payload:\n" << (is_utf8_text(d.payload) ? d.payload : "hex " + hex(d.payload)) << "\n";
  return kOk;
}

int cmd_dl_replay(const std::string& path, const DlArgs& a) {
  if (a.id <= 0) fail(kUsage, "dead-letters replay needs --id N");
  auto inbox = open_inbox(path);
  mi::DeadLetter d;
  const mi::Status s = inbox->get_dead_letter(a.id, &d);
  if (s.code() == mi::Status::Code::kNotFound) fail(kNotFound, "no dead letter with id " + std::to_string(a.id));
  check_status(s, "reading dead letter");
  if (d.replayed) fail(kRefused, "dead letter " + std::to_string(d.id) + " was already replayed: refused, a replay never applies twice");
  if (!d.message_id)
    fail(kUnsupported, "dead letter " + std::to_string(d.id) + " (" + mi::to_string(d.reason) +
                           ") has no usable message id: it cannot be re-queued without one. Fix the producer and re-publish, "
                           "or have the application call Consumer::replay_dead_letter(" + std::to_string(d.id) + ").");
  // Store-then-process: is the message a stored row the workers dead-lettered?
  std::optional<std::string> status;
  read_sql(*inbox, "looking up the stored message", [&](SQLite::Database& db) {
    SQLite::Statement q(db, "SELECT status FROM inbox_messages WHERE consumer_name = ?1 AND message_id = ?2");
    q.bind(1, d.consumer_name);
    q.bind(2, *d.message_id);
    if (q.executeStep()) status = q.getColumn(0).getString();
  });
  if (!status)
    fail(kUnsupported,
         "dead letter " + std::to_string(d.id) + " belongs to a Consumer-mode consumer ('" + d.consumer_name +
             "'): replaying it runs the application's handler, which this tool does not have, and the library "
             "has no way to hand a dead letter to the running consumer. Nothing was changed. Call "
             "Consumer::replay_dead_letter(" + std::to_string(d.id) + ") from the application (docs/admin-tool.md).");
  if (*status != "dead")
    fail(kRefused, "the stored message of dead letter " + std::to_string(d.id) + " is '" + *status +
                       "', not 'dead': it was already re-queued or processed; refused");
  auto stp = stp_for(inbox.get(), d.consumer_name);
  mi::ReplayFilter f;
  f.message_id = *d.message_id;
  f.include_dead = true;
  mi::ReplayResult r;
  check_status(stp->replay(f, &r), "re-queuing");
  json j = {{"id", d.id}, {"consumer", d.consumer_name}, {"message_id", json_text(*d.message_id)},
            {"mode", "store_then_process"}, {"reset", r.reset}, {"not_replayable", r.not_replayable},
            {"in_flight", r.in_flight},
            {"note", "the dead-letter row keeps status 'dead': the library has no call to mark it re-queued"}};
  if (r.reset != 1) {
    if (g.json) emit(j);
    fail(kRefused, "nothing re-queued (payload compacted: " + std::to_string(r.not_replayable) +
                       ", in flight: " + std::to_string(r.in_flight) + ")");
  }
  if (g.json) emit(j);
  else
    std::cout << "dead letter " << d.id << ": message '" << printable(*d.message_id) << "' of '" << d.consumer_name
              << "' is pending again; the application's workers will process it.\n"
              << "note: the dead-letter row keeps status 'dead' (no library call marks it re-queued).\n";
  return kOk;
}

bool confirm(const std::string& question, bool yes) {
  if (yes) return true;
  if (!isatty(STDIN_FILENO))
    fail(kRefused, "refused: " + question + " needs confirmation; stdin is not a terminal, pass --yes");
  std::cerr << question << " [y/N] " << std::flush;
  std::string answer;
  std::getline(std::cin, answer);
  return answer == "y" || answer == "Y" || answer == "yes";
}

int cmd_dl_purge(const std::string& path, const DlArgs& a) {
  auto inbox = open_inbox(path);
  const bool any_filter = a.id > 0 || !a.consumer.empty() || !a.reason.empty() || !a.since.empty() ||
                          !a.before.empty() || !a.message_id.empty();
  if (!any_filter && !a.all) fail(kUsage, "purge needs a filter (--consumer, --reason, --since, --before, --message-id, --id) or --all");
  mi::DeadLetterFilter f;
  if (a.id > 0) {
    // DeadLetterFilter has no row id: narrow it to this row's consumer, id, reason and
    // millisecond, and refuse unless exactly this row matches.
    mi::DeadLetter d = dl_select(*inbox, a).front();
    f.consumer_name = d.consumer_name;
    f.reason = d.reason;
    f.message_id = d.message_id;
    f.since_ms = d.dead_lettered_at_ms;
    f.before_ms = d.dead_lettered_at_ms + 1;
    f.include_replayed = true;
  } else {
    f = dl_filter(a);
  }
  f.limit = 0;
  std::vector<mi::DeadLetter> rows;
  check_status(inbox->list_dead_letters(f, &rows), "counting dead letters");
  if (a.id > 0 && (rows.size() != 1 || rows.front().id != a.id))
    fail(kRefused, "cannot isolate dead letter " + std::to_string(a.id) + ": " + std::to_string(rows.size()) +
                       " rows share its consumer, id, reason and time (the library's filter has no row id)");
  if (rows.empty()) {
    if (g.json) emit({{"matched", 0}, {"removed", 0}});
    else std::cout << "no dead letters match\n";
    return kOk;
  }
  if (!confirm("Delete " + std::to_string(rows.size()) + " dead letter(s) from " + path + "?", a.yes)) {
    std::cerr << "not deleted\n";
    return kRefused;
  }
  int64_t removed = 0;
  check_status(inbox->purge_dead_letters(f, &removed), "purging");
  // The filter is evaluated again by the purge: rows dead-lettered since the count match too.
  if (g.json) emit({{"matched", rows.size()}, {"removed", removed}});
  else std::cout << removed << " dead letter(s) deleted" << (removed != static_cast<int64_t>(rows.size()) ? " (rows changed since the count)" : "") << "\n";
  return kOk;
}

// ------------------------------------------------------------------ store-then-process replay

struct ReplayArgs {
  std::string consumer, since, until, aggregate, message_id;
  bool include_dead = false, all = false;
};

int cmd_replay(const std::string& path, const ReplayArgs& a) {
  const bool by_time = !a.since.empty() || !a.until.empty();
  const int selectors = (by_time ? 1 : 0) + (!a.aggregate.empty() ? 1 : 0) + (!a.message_id.empty() ? 1 : 0);
  if (selectors == 0 && !a.all) fail(kUsage, "replay needs --since/--until, --aggregate, --id or --all");
  auto inbox = open_inbox(path);
  if (!stp_consumers(*inbox).count(a.consumer))
    fail(kNotFound, "no store-then-process rows for consumer '" + a.consumer + "' (replay is for the store-then-process mode)");
  const int64_t clock = inbox->retention_clock_ms();
  mi::ReplayFilter f;
  if (!a.since.empty()) f.received_since_ms = parse_time(a.since, clock, "--since");
  if (!a.until.empty()) f.received_before_ms = parse_time(a.until, clock, "--until");
  if (!a.aggregate.empty()) f.aggregate_key = a.aggregate;
  if (!a.message_id.empty()) f.message_id = a.message_id;
  f.include_dead = a.include_dead;
  auto stp = stp_for(inbox.get(), a.consumer);
  mi::ReplayResult r;
  check_status(stp->replay(f, &r), "replaying");
  json j = {{"consumer", a.consumer}, {"reset", r.reset}, {"not_replayable", r.not_replayable}, {"in_flight", r.in_flight}};
  if (f.received_since_ms) j["received_since"] = *f.received_since_ms;
  if (f.received_before_ms) j["received_before"] = *f.received_before_ms;
  if (g.json) emit(j);
  else
    print_kv({{"consumer", a.consumer},
              {"rows reset to pending", std::to_string(r.reset)},
              {"not replayable (payload compacted)", std::to_string(r.not_replayable)},
              {"in flight (left alone)", std::to_string(r.in_flight)}});
  if (r.reset == 0 && r.not_replayable == 0 && r.in_flight == 0) return kNotFound;
  return kOk;
}

// Store-then-process: return claims older than the lease to 'pending' now (the running
// application's workers do this on a timer; this is for a stuck device or after a crash).
int cmd_reap(const std::string& path, const std::string& consumer, int64_t lease_ms) {
  auto inbox = open_inbox(path);
  if (!stp_consumers(*inbox).count(consumer))
    fail(kNotFound, "no store-then-process rows for consumer '" + consumer + "'");
  auto stp = stp_for(inbox.get(), consumer, lease_ms);
  int64_t reaped = 0;
  check_status(stp->reap(&reaped), "reaping");
  if (g.json) emit(json{{"consumer", consumer}, {"reaped", reaped}});
  else print_kv({{"consumer", consumer}, {"claims returned to pending", std::to_string(reaped)}});
  return kOk;
}

// ------------------------------------------------------------------ check and migrate

int cmd_check(const std::string& path) {
  require_file(path);
  json j;
  json problems = json::array(), warnings = json::array();
  j["database"] = path;
  try {
    // Read-write only for the PASSIVE checkpoint; nothing else writes. Never creates.
    SQLite::Database db(path, SQLite::OPEN_READWRITE, g.busy_timeout_ms);
    const int version = db.execAndGet("PRAGMA user_version").getInt();
    j["schema_version"] = version;
    j["library_schema_version"] = mi::kSchemaVersion;
    if (version < mi::kSchemaVersion)
      problems.push_back("schema version " + std::to_string(version) + " is older than this tool's " +
                         std::to_string(mi::kSchemaVersion) + ": run `mqtt-inbox migrate` (after upgrading the application)");
    else if (version > mi::kSchemaVersion)
      problems.push_back("schema version " + std::to_string(version) + " is newer than this tool's " +
                         std::to_string(mi::kSchemaVersion) + ": use a newer mqtt-inbox");
    const bool tables = db.execAndGet("SELECT count(*) FROM sqlite_master WHERE name = 'inbox_processed'").getInt() > 0;
    if (!tables) problems.push_back("no inbox tables: not an mqtt-inbox database");

    const std::string mode = db.execAndGet("PRAGMA journal_mode").getString();
    j["journal_mode"] = mode;
    if (mode != "wal")
      problems.push_back("journal_mode is '" + mode + "', not 'wal': the inbox requires WAL (Inbox::open or `mqtt-inbox migrate` switches it back)");

    auto run_check = [&](const char* pragma, const char* key) {
      SQLite::Statement q(db, pragma);
      json lines = json::array();
      while (q.executeStep()) lines.push_back(q.getColumn(0).getString());
      const bool ok = lines.size() == 1 && lines[0] == "ok";
      j[key] = {{"ok", ok}, {"result", lines}};
      if (!ok) problems.push_back(std::string(pragma) + " reported " + lines.dump());
    };
    run_check("PRAGMA quick_check", "quick_check");
    run_check("PRAGMA integrity_check", "integrity_check");

    // synchronous is per connection and not stored in the file: only what the running
    // application recorded in inbox_meta can be checked (docs/admin-tool.md).
    std::map<std::string, std::string> meta;
    if (tables) {
      SQLite::Statement q(db, "SELECT key, value FROM inbox_meta");
      while (q.executeStep()) meta[q.getColumn(0).getString()] = q.getColumn(1).getString();
    }
    json sync;
    if (auto it = meta.find("synchronous"); it != meta.end()) {
      std::string v = it->second;
      std::transform(v.begin(), v.end(), v.begin(), ::tolower);
      const bool opt_in = meta.count("synchronous_opt_in") && meta["synchronous_opt_in"] != "0" &&
                          meta["synchronous_opt_in"] != "false";
      sync = {{"recorded", v}, {"opt_in", opt_in}};
      if (v != "full" && v != "2" && v != "extra" && v != "3" && !opt_in)
        problems.push_back("the application runs with synchronous=" + v +
                           " without an explicit opt-in: commits acked before a power loss can be lost");
      else if (v != "full" && v != "2" && v != "extra" && v != "3")
        warnings.push_back("synchronous=" + v + " (opted in): the last commits before a power loss can be lost after their PUBACK");
    } else {
      sync = {{"recorded", nullptr}};
      warnings.push_back("synchronous is not recorded in inbox_meta (this library version does not record it): cannot verify FULL");
    }
    j["synchronous"] = sync;
    j["required_window_ms"] = meta.count("required_window_ms") ? json(std::stoll(meta["required_window_ms"])) : json();
    if (!meta.count("required_window_ms"))
      warnings.push_back("no retention horizon recorded (no Pruner has run): `prune` falls back to the library defaults");

    if (tables && version >= 2) {
      // Stale claims (a worker died) and attempts left 'running' (a process died in a handler).
      const int64_t stale = db.execAndGet("SELECT count(*) FROM inbox_messages WHERE status = 'processing' AND claimed_at < " +
                                          std::to_string(wall_now_ms() - 60000))
                                .getInt64();
      j["processing_older_than_60s"] = stale;
      if (stale > 0) warnings.push_back(std::to_string(stale) + " store-then-process row(s) 'processing' for over 60 s: a worker may have died (the reaper returns them after lease_ms)");
    }
    if (tables) {
      const int64_t running = db.execAndGet("SELECT count(*) FROM inbox_attempts WHERE state = 'running'").getInt64();
      j["attempts_running"] = running;
    }

    struct stat st {};
    const int64_t wal_before = ::stat((path + "-wal").c_str(), &st) == 0 ? st.st_size : 0;
    int log = -1, ckpt = -1;
    const int rc = sqlite3_wal_checkpoint_v2(db.getHandle(), nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, &ckpt);
    j["wal"] = {{"bytes", wal_before}, {"checkpoint_rc", rc}, {"frames_in_wal", log}, {"frames_checkpointed", ckpt},
                {"fully_checkpointed", rc == SQLITE_OK && log == ckpt}};
    if (rc != SQLITE_OK && rc != SQLITE_BUSY)
      problems.push_back(std::string("wal_checkpoint(PASSIVE) failed: ") + sqlite3_errstr(rc));
    else if (log > 0 && ckpt < log)
      warnings.push_back("WAL not fully checkpointed (" + std::to_string(ckpt) + "/" + std::to_string(log) +
                         " frames): a reader holds an old snapshot, or the consumer is busy; it grows until readers finish");
    j["page_size"] = db.execAndGet("PRAGMA page_size").getInt64();
    j["page_count"] = db.execAndGet("PRAGMA page_count").getInt64();
    j["freelist_count"] = db.execAndGet("PRAGMA freelist_count").getInt64();
    j["auto_vacuum"] = db.execAndGet("PRAGMA auto_vacuum").getInt();
    if (j["auto_vacuum"].get<int>() != 2) warnings.push_back("auto_vacuum is not INCREMENTAL: pruning cannot give pages back");
  } catch (const SQLite::Exception& e) {
    problems.push_back(std::string("SQLite error: ") + e.what());
    j["problems"] = problems;
    j["warnings"] = warnings;
    j["ok"] = false;
    if (g.json) emit(j);
    fail(kStoreError, path + ": " + e.what());
  }
  j["problems"] = problems;
  j["warnings"] = warnings;
  j["ok"] = problems.empty();
  if (g.json) emit(j);
  else {
    print_kv({{"database", path},
              {"schema version", std::to_string(j["schema_version"].get<int>()) + " (tool " + std::to_string(mi::kSchemaVersion) + ")"},
              {"journal mode", j["journal_mode"].get<std::string>()},
              {"quick_check", j["quick_check"]["ok"].get<bool>() ? "ok" : "FAILED"},
              {"integrity_check", j["integrity_check"]["ok"].get<bool>() ? "ok" : "FAILED"},
              {"synchronous", j["synchronous"]["recorded"].is_null() ? "not recorded" : j["synchronous"]["recorded"].get<std::string>()},
              {"wal", human_bytes(j["wal"]["bytes"].get<int64_t>()) + ", checkpoint " +
                          std::to_string(j["wal"]["frames_checkpointed"].get<int>()) + "/" +
                          std::to_string(j["wal"]["frames_in_wal"].get<int>()) + " frames"}});
    for (const auto& p : problems) std::cout << "PROBLEM: " << p.get<std::string>() << "\n";
    for (const auto& w : warnings) std::cout << "warning: " << w.get<std::string>() << "\n";
    std::cout << (problems.empty() ? "check: OK" : "check: PROBLEMS FOUND") << "\n";
  }
  return problems.empty() ? kOk : kProblems;
}

int cmd_migrate(const std::string& path) {
  const FileFacts f = read_facts(path);
  if (f.user_version > mi::kSchemaVersion) require_current_schema(path, f);
  const int before = f.user_version;
  const bool was_wal = f.journal_mode == "wal";
  {
    std::unique_ptr<mi::Inbox> inbox;
    const mi::Status s = mi::Inbox::open(path, tool_inbox_options(), &inbox);  // applies every missing step
    if (!s.ok()) fail(s.code() == mi::Status::Code::kCorruption ? kSchema : kStoreError, "migrating: " + s.to_string());
  }
  const FileFacts after = read_facts(path);
  json j = {{"database", path}, {"from_version", before}, {"to_version", after.user_version},
            {"migrated", before != after.user_version}, {"journal_mode_fixed", !was_wal && after.journal_mode == "wal"}};
  if (g.json) emit(j);
  else if (before == after.user_version)
    std::cout << "schema is up to date (version " << after.user_version << ")" << (!was_wal ? "; journal mode switched to WAL" : "") << "\n";
  else
    std::cout << "schema migrated from version " << before << " to " << after.user_version << "\n";
  return kOk;
}

// ------------------------------------------------------------------ export

struct ExportArgs {
  std::string since, consumer, encoding = "base64";
};

int cmd_export(const std::string& path, const ExportArgs& a) {
  auto inbox = open_inbox(path);
  const int64_t clock = inbox->retention_clock_ms();
  const int64_t wall = wall_now_ms();
  std::optional<int64_t> since_clock, since_wall;
  if (!a.since.empty()) {
    since_clock = parse_time(a.since, clock, "--since");
    since_wall = parse_time(a.since, wall, "--since");
  }
  auto line = [](const json& j) { std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n"; };
  line({{"type", "header"}, {"database", path}, {"tool_version", MQTT_INBOX_VERSION_STRING},
        {"schema_version", mi::kSchemaVersion}, {"exported_at", wall}, {"retention_clock_ms", clock},
        {"since_received_at", since_clock ? json(*since_clock) : json()},
        {"since_dead_lettered_at", since_wall ? json(*since_wall) : json()}, {"payload_encoding", a.encoding}});
  // Processed ids, in pages of 1000 keyed on the primary key: each page is one short
  // statement, so the export never holds a read snapshot (which would stop checkpoints).
  int64_t processed = 0;
  std::string last_consumer, last_id;
  bool first = true;
  for (;;) {
    int64_t n = 0;
    read_sql(*inbox, "exporting processed ids", [&](SQLite::Database& db) {
      std::string sql = "SELECT consumer_name, message_id, received_at, topic, message_type, correlation_id, payload_hash"
                        " FROM inbox_processed WHERE (?1 OR (consumer_name, message_id) > (?2, ?3))";
      if (since_clock) sql += " AND received_at >= ?4";
      if (!a.consumer.empty()) sql += " AND consumer_name = ?5";
      sql += " ORDER BY consumer_name, message_id LIMIT 1000";
      SQLite::Statement q(db, sql);
      q.bind(1, first ? 1 : 0);
      q.bind(2, last_consumer);
      q.bind(3, last_id);
      if (since_clock) q.bind(4, *since_clock);
      if (!a.consumer.empty()) q.bind(5, a.consumer);
      while (q.executeStep()) {
        json j = {{"type", "processed"}, {"consumer", q.getColumn(0).getString()},
                  {"message_id", json_text(q.getColumn(1).getString())}, {"received_at", q.getColumn(2).getInt64()}};
        if (!q.getColumn(3).isNull()) j["topic"] = json_text(q.getColumn(3).getString());
        if (!q.getColumn(4).isNull()) j["message_type"] = json_text(q.getColumn(4).getString());
        if (!q.getColumn(5).isNull()) j["correlation_id"] = json_text(q.getColumn(5).getString());
        if (!q.getColumn(6).isNull()) j["payload_hash"] = q.getColumn(6).getInt64();
        line(j);
        last_consumer = q.getColumn(0).getString();
        last_id = q.getColumn(1).getString();
        ++n;
      }
    });
    first = false;
    processed += n;
    if (n < 1000) break;
  }
  mi::DeadLetterFilter f;
  if (!a.consumer.empty()) f.consumer_name = a.consumer;
  if (since_wall) f.since_ms = *since_wall;
  f.include_replayed = true;
  f.limit = 0;
  std::vector<mi::DeadLetter> dls;
  check_status(inbox->list_dead_letters(f, &dls), "exporting dead letters");
  for (const auto& d : dls) {
    json j = dl_json(d, true, a.encoding);
    j["type"] = "dead_letter";
    line(j);
  }
  line({{"type", "footer"}, {"processed", processed}, {"dead_letters", dls.size()}});
  return kOk;
}

// ------------------------------------------------------------------ probe-broker

struct ProbeArgs {
  std::string broker, version = "5", topic_prefix = "mqtt-inbox/probe";
  int timeout_ms = 5000, count = 10, pause_offline_ms = 0;
  uint32_t session_expiry_s = 300;
};

int cmd_probe(const ProbeArgs& a) {
  const bool v5 = a.version == "5";
  const int mqtt_version = v5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1;
  std::random_device rd;
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "%d-%08x", static_cast<int>(getpid()), rd());
  const std::string client_id = std::string("mqtt-inbox-probe-") + suffix;
  const std::string topic = a.topic_prefix + "/" + suffix;
  const auto timeout = std::chrono::milliseconds(a.timeout_ms);

  json report = {{"broker", a.broker}, {"mqtt_version", a.version}, {"client_id", client_id}, {"topic", topic},
                 {"sent", 0}, {"received", 0}, {"paused_offline_ms", a.pause_offline_ms}};
  json warnings = json::array();

  std::mutex mu;
  std::vector<std::pair<std::string, bool>> got;  // payload, dup
  // Paho C++ 1.2.0 copies connect_options without re-pointing the C struct at the copy's
  // properties: set them on long-lived objects, and pass those (as src/subscriber.cpp does).
  mqtt::connect_options persistent;
  {
    auto b = mqtt::connect_options_builder().mqtt_version(mqtt_version).connect_timeout(timeout).keep_alive_interval(std::chrono::seconds(30));
    if (v5) b.clean_start(false);
    else b.clean_session(false);
    persistent = b.finalize();
    if (v5) persistent.set_properties({{mqtt::property::SESSION_EXPIRY_INTERVAL, static_cast<int>(a.session_expiry_s)}});
  }
  mqtt::connect_options clean;
  {
    auto b = mqtt::connect_options_builder().mqtt_version(mqtt_version).connect_timeout(timeout);
    if (v5) b.clean_start(true);
    else b.clean_session(true);
    clean = b.finalize();
    if (v5) clean.set_properties({{mqtt::property::SESSION_EXPIRY_INTERVAL, 0}});
  }
  auto persistent_opts = [&]() -> const mqtt::connect_options& { return persistent; };
  auto expiry_of = [&](const mqtt::connect_response& r) -> json {
    if (v5 && r.get_properties().contains(mqtt::property::SESSION_EXPIRY_INTERVAL))
      return mqtt::get<uint32_t>(r.get_properties(), mqtt::property::SESSION_EXPIRY_INTERVAL);
    return nullptr;
  };
  mqtt::async_client sub(a.broker, client_id, mqtt::create_options(mqtt_version), nullptr);
  sub.set_message_callback([&](mqtt::const_message_ptr m) {
    std::lock_guard<std::mutex> l(mu);
    got.emplace_back(m->to_string(), m->is_duplicate());
  });
  auto connect = [&](const mqtt::connect_options& o, std::chrono::milliseconds budget) -> mqtt::connect_response {
    const auto deadline = std::chrono::steady_clock::now() + budget;
    for (;;) {
      try {
        auto tok = sub.connect(o);
        if (!tok->wait_for(budget)) throw mqtt::exception(-1, "connect timed out");
        return tok->get_connect_response();
      } catch (const mqtt::exception& e) {
        if (std::chrono::steady_clock::now() + std::chrono::milliseconds(200) >= deadline) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  };
  int exit_code = kOk;
  bool cleanup_needed = false;
  try {
    // 1. A persistent session with a QoS 1 subscription.
    const auto r1 = connect(persistent_opts(), timeout);
    cleanup_needed = true;
    report["session_present_on_first_connect"] = r1.is_session_present();
    report["requested_session_expiry_s"] = v5 ? json(a.session_expiry_s) : json();
    report["connack_session_expiry_s_first"] = expiry_of(r1);
    if (!sub.subscribe(topic, 1)->wait_for(timeout)) throw mqtt::exception(-1, "subscribe timed out");
    if (!sub.disconnect()->wait_for(timeout)) throw mqtt::exception(-1, "disconnect timed out");

    // 2. While it is offline, a second client publishes QoS 1 messages to it.
    {
      mqtt::async_client pub(a.broker, client_id + "-pub", mqtt::create_options(mqtt_version), nullptr);
      auto po = mqtt::connect_options_builder().mqtt_version(mqtt_version).connect_timeout(timeout);
      if (v5) po.clean_start(true);
      else po.clean_session(true);
      if (!pub.connect(po.finalize())->wait_for(timeout)) throw mqtt::exception(-1, "publisher connect timed out");
      for (int i = 0; i < a.count; ++i) {
        if (!pub.publish(mqtt::make_message(topic, "probe-" + std::to_string(i), 1, false))->wait_for(timeout))
          throw mqtt::exception(-1, "publish (waiting for PUBACK) timed out");
        report["sent"] = i + 1;
      }
      pub.disconnect()->wait_for(timeout);
    }
    if (a.pause_offline_ms > 0) {
      std::cerr << "probe: offline for " << a.pause_offline_ms << " ms (restart the broker now to test persistence)" << std::endl;
      std::this_thread::sleep_for(std::chrono::milliseconds(a.pause_offline_ms));
    }

    // 3. Reconnect with the same client id: the broker should still hold the session and
    //    send the queued messages right after CONNACK.
    const auto r2 = connect(persistent_opts(), timeout + std::chrono::milliseconds(5000));
    report["session_present"] = r2.is_session_present();
    report["connack_session_expiry_s"] = expiry_of(r2);
    json effective = nullptr;
    std::string source = "none (MQTT 3.1.1: the broker's persistent_client_expiration applies)";
    if (v5) {
      if (!report["connack_session_expiry_s"].is_null()) effective = report["connack_session_expiry_s"], source = "CONNACK";
      else effective = a.session_expiry_s, source = "requested (the broker returned none, so it accepted it)";
    }
    report["effective_session_expiry_s"] = effective;
    report["session_expiry_source"] = source;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (static_cast<int>(got.size()) >= a.count) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // late duplicates
    std::lock_guard<std::mutex> l(mu);
    std::set<std::string> distinct;
    int dup_true = 0;
    for (const auto& m : got) {
      distinct.insert(m.first);
      dup_true += m.second ? 1 : 0;
    }
    report["received"] = got.size();
    report["distinct_received"] = distinct.size();
    report["dup_flags"] = {{"set", dup_true}, {"clear", static_cast<int>(got.size()) - dup_true}};
  } catch (const mqtt::exception& e) {
    report["error"] = e.what();
    exit_code = kBroker;
  }
  // Cleanup: drop the subscription and the session (clean start, expiry 0).
  bool cleaned = false;
  if (cleanup_needed) {
    try {
      if (sub.is_connected()) {
        sub.unsubscribe(topic)->wait_for(timeout);
        sub.disconnect()->wait_for(timeout);
      }
      if (sub.connect(clean)->wait_for(timeout)) {
        sub.disconnect()->wait_for(timeout);
        cleaned = true;
      }
    } catch (const mqtt::exception& e) {
      warnings.push_back(std::string("cleanup failed: ") + e.what() + "; the broker may keep session " + client_id);
    }
  }
  report["cleaned_up"] = cleaned;

  std::string verdict = "error";
  if (exit_code == kOk) {
    const int sent = report["sent"].get<int>();
    const int distinct = report["distinct_received"].get<int>();
    const bool session = report["session_present"].get<bool>();
    if (!session) {
      verdict = "session_lost";
      warnings.push_back("the broker did not keep the session (session_present=0): unacked and queued messages are lost when the "
                         "consumer reconnects. Check persistence (and that its location is writable), the session expiry, "
                         "and that the client uses a persistent session");
    } else if (distinct < sent) {
      verdict = "messages_dropped";
      warnings.push_back(std::to_string(sent - distinct) + " of " + std::to_string(sent) +
                         " messages queued while offline never arrived although the broker acked them: a queue limit "
                         "(mosquitto max_queued_messages / max_queued_bytes) or message expiry drops messages silently");
    } else {
      verdict = "ok";
    }
    if (v5 && !report["effective_session_expiry_s"].is_null() &&
        report["effective_session_expiry_s"].get<int64_t>() < static_cast<int64_t>(a.session_expiry_s))
      warnings.push_back("the broker lowered the session expiry to " + report["effective_session_expiry_s"].dump() +
                         " s: size the retention window and the offline budget to it");
    if (session && report["session_present_on_first_connect"].get<bool>())
      warnings.push_back("session_present was already set on the first connect of a fresh client id");
    if (verdict != "ok") exit_code = kProblems;
  }
  report["verdict"] = verdict;
  report["warnings"] = warnings;
  if (g.json) emit(report);
  else {
    auto s = [](const json& v) { return v.is_null() ? std::string("-") : v.is_string() ? v.get<std::string>() : v.dump(); };
    print_kv({{"broker", a.broker + " (MQTT " + a.version + ")"},
              {"client id", client_id},
              {"session kept (session_present)", s(report.value("session_present", json()))},
              {"queued messages", s(report["distinct_received"]) + " of " + s(report["sent"]) + " arrived"},
              {"DUP flags", report.contains("dup_flags") ? "set " + s(report["dup_flags"]["set"]) + ", clear " + s(report["dup_flags"]["clear"]) : "-"},
              {"effective session expiry", s(report.value("effective_session_expiry_s", json())) + " s (" + report.value("session_expiry_source", std::string("-")) + ")"},
              {"cleaned up", cleaned ? "yes" : "no"},
              {"verdict", verdict}});
    if (report.contains("error")) std::cout << "ERROR: " << report["error"].get<std::string>() << "\n";
    for (const auto& w : warnings) std::cout << "warning: " << w.get<std::string>() << "\n";
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mqtt-inbox " MQTT_INBOX_VERSION_STRING ": inspect, repair and verify an mqtt-inbox database "
               "(docs/admin-tool.md).\nExit codes: 0 ok, 1 usage, 2 problems found, 3 store error, 4 refused, "
               "5 schema version mismatch, 6 needs a library change, 7 broker error, 8 nothing matched."};
  app.require_subcommand(1);
  app.fallthrough();
  app.add_flag("--json", g.json, "Print JSON instead of tables");
  app.add_option("--busy-timeout-ms", g.busy_timeout_ms, "How long to wait for another connection's lock (default 5000)")
      ->check(CLI::NonNegativeNumber);
  app.set_version_flag("--version", MQTT_INBOX_VERSION_STRING);

  std::string db;
  std::function<int()> run;

  auto* stats = app.add_subcommand("stats", "Rows per consumer, sizes, schema, dead letters, store-then-process counts");
  stats->add_option("DB", db, "Database file")->required();
  stats->callback([&] { run = [&] { return cmd_stats(db); }; });

  PruneArgs pa;
  auto* prune = app.add_subcommand("prune", "One pruning pass with the library's Pruner");
  prune->add_option("DB", db, "Database file")->required();
  prune->add_option("--older-than", pa.older_than, "Window: forget ids older than this (default: the recorded horizon)");
  prune->add_option("--dead-letters-older-than", pa.dead_letters_older_than, "Also delete dead letters older than this (default: keep)");
  prune->add_option("--session-expiry", pa.session_expiry, "Declare the broker session expiry (raises the horizon)");
  prune->add_option("--max-offline", pa.max_offline, "Declare the longest offline period (raises the horizon)");
  prune->add_option("--replay-window", pa.replay_window, "Declare a replay window (raises the horizon)");
  prune->add_option("--margin", pa.margin, "Margin above the declared horizon (default 1h)");
  prune->add_option("--budget-ms", pa.budget_ms, "Time the pass may spend deleting (default 2000)")->check(CLI::PositiveNumber);
  prune->add_flag("--dry-run", pa.dry_run, "Only count what would be deleted");
  prune->add_flag("--force", pa.force, "Accept a window below the horizon");
  prune->callback([&] { run = [&] { return cmd_prune(db, pa); }; });

  DlArgs da;
  auto* dl = app.add_subcommand("dead-letters", "List, show, re-queue or purge dead letters");
  dl->require_subcommand(1);
  dl->fallthrough();
  auto add_dl_filters = [&](CLI::App* c, bool filters) {
    c->add_option("DB", db, "Database file")->required();
    c->add_option("--id", da.id, "Dead-letter row id");
    if (!filters) return;
    c->add_option("--consumer", da.consumer, "Consumer name");
    c->add_option("--reason", da.reason, "missing_id|invalid_id|payload_too_large|undecodable_payload|handler_failed|handler_crashed");
    c->add_option("--since", da.since, "Dead-lettered at or after (ms, 2h = 2 hours ago, or 2024-05-01T12:00:00Z)");
    c->add_option("--before", da.before, "Dead-lettered before (same forms)");
    c->add_option("--message-id", da.message_id, "The producer's message id");
    c->add_flag("--include-replayed", da.include_replayed, "Also rows already replayed");
  };
  auto* dl_list = dl->add_subcommand("list", "Dead letters, newest first");
  add_dl_filters(dl_list, true);
  dl_list->add_option("--limit", da.limit, "Rows at most (0 = all; default 100)");
  dl_list->callback([&] { run = [&] { return cmd_dl_list(db, da); }; });
  auto* dl_show = dl->add_subcommand("show", "One dead letter with its payload");
  add_dl_filters(dl_show, false);
  dl_show->add_option("--payload-encoding", da.payload_encoding, "base64|hex (JSON output)")->check(CLI::IsMember({"base64", "hex"}));
  dl_show->callback([&] { run = [&] { return cmd_dl_show(db, da); }; });
  auto* dl_replay = dl->add_subcommand("replay", "Re-queue a dead letter for the application (store-then-process rows)");
  add_dl_filters(dl_replay, false);
  dl_replay->callback([&] { run = [&] { return cmd_dl_replay(db, da); }; });
  auto* dl_purge = dl->add_subcommand("purge", "Delete dead letters (asks unless --yes)");
  add_dl_filters(dl_purge, true);
  dl_purge->add_flag("--yes", da.yes, "Do not ask");
  dl_purge->add_flag("--all", da.all, "Allow purging without a filter");
  dl_purge->callback([&] { run = [&] { return cmd_dl_purge(db, da); }; });

  ReplayArgs ra;
  auto* replay = app.add_subcommand("replay", "Store-then-process: reset rows to pending so the workers run them again");
  replay->add_option("DB", db, "Database file")->required();
  replay->add_option("--consumer", ra.consumer, "Store-then-process consumer name")->required();
  replay->add_option("--since", ra.since, "Received at or after (retention clock ms, 2h = 2 hours ago, or a UTC time)");
  replay->add_option("--until", ra.until, "Received before (same forms)");
  replay->add_option("--aggregate", ra.aggregate, "Aggregate key");
  replay->add_option("--id", ra.message_id, "The producer's message id");
  replay->add_flag("--include-dead", ra.include_dead, "Also rows the workers dead-lettered");
  replay->add_flag("--all", ra.all, "Every finished row of the consumer");
  replay->callback([&] { run = [&] { return cmd_replay(db, ra); }; });

  std::string reap_consumer;
  int64_t reap_lease_ms = 0;
  auto* reap = app.add_subcommand("reap", "Store-then-process: return expired claims to pending now");
  reap->add_option("DB", db, "Database file")->required();
  reap->add_option("--consumer", reap_consumer, "Store-then-process consumer name")->required();
  reap->add_option("--lease-ms", reap_lease_ms, "Claims older than this are expired (default: the library's 60000)");
  reap->callback([&] { run = [&] { return cmd_reap(db, reap_consumer, reap_lease_ms); }; });

  auto* check = app.add_subcommand("check", "Schema, integrity, WAL and settings that void the guarantee");
  check->add_option("DB", db, "Database file")->required();
  check->callback([&] { run = [&] { return cmd_check(db); }; });

  auto* migrate = app.add_subcommand("migrate", "Apply the schema migrations of this release");
  migrate->add_option("DB", db, "Database file")->required();
  migrate->callback([&] { run = [&] { return cmd_migrate(db); }; });

  ExportArgs ea;
  auto* exp = app.add_subcommand("export", "JSON Lines of processed ids and dead letters, for a support ticket");
  exp->add_option("DB", db, "Database file")->required();
  exp->add_option("--since", ea.since, "Only rows since (a duration ago like 2d, ms, or a UTC time)");
  exp->add_option("--consumer", ea.consumer, "Only this consumer");
  exp->add_option("--payload-encoding", ea.encoding, "base64|hex")->check(CLI::IsMember({"base64", "hex"}));
  exp->callback([&] { run = [&] { return cmd_export(db, ea); }; });

  ProbeArgs pr;
  auto* probe = app.add_subcommand("probe-broker", "Check that the broker keeps sessions and queued QoS 1 messages");
  probe->add_option("--broker", pr.broker, "Broker URI, e.g. tcp://127.0.0.1:1883")->required();
  probe->add_option("--mqtt-version", pr.version, "3.1.1 or 5 (default 5)")->check(CLI::IsMember({"3.1.1", "5"}));
  probe->add_option("--timeout-ms", pr.timeout_ms, "Per step (default 5000)")->check(CLI::PositiveNumber);
  probe->add_option("--count", pr.count, "Messages queued while offline (default 10)")->check(CLI::Range(1, 100000));
  probe->add_option("--session-expiry-s", pr.session_expiry_s, "Session expiry requested with MQTT 5 (default 300)")->check(CLI::PositiveNumber);
  probe->add_option("--pause-offline-ms", pr.pause_offline_ms, "Stay offline this long after publishing (restart the broker meanwhile)");
  probe->add_option("--topic-prefix", pr.topic_prefix, "Topic prefix (default mqtt-inbox/probe)");
  probe->callback([&] { run = [&] { return cmd_probe(pr); }; });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kOk : kUsage;
  }
  try {
    return run();
  } catch (const ToolError& e) {
    std::cerr << "mqtt-inbox: " << e.message << std::endl;
    return e.code;
  } catch (const std::exception& e) {
    std::cerr << "mqtt-inbox: unexpected error: " << e.what() << std::endl;
    return kStoreError;
  }
}

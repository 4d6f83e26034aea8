// `mqtt-inbox outbox stats|list|show|replay|purge`: inspect the transactional outbox,
// replay its dead letters and purge finished rows, through the library's Outbox calls
// (include/mqtt_inbox/outbox.h, docs/admin-tool.md).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <mqtt_inbox/outbox.h>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

namespace {

// Only a broker's refusal came with a reason code (a PUBACK's, MQTT 5.0 section 3.4.2.1).
// An expired row, one too large, one whose publish kept dropping the connection never got
// a PUBACK: the 0 stored for them is "none", not 0x00 Success.
bool has_reason_code(const mi::OutboxRow& r) {
  return r.dead_reason && *r.dead_reason == mi::OutboxDeadReason::kRejectedByBroker;
}

// The tool's Outbox: no classes (the bounds belong to the application; the tool never
// enqueues), on the Inbox the tool opened, logging as the tool does (warnings, stderr).
std::unique_ptr<mi::Outbox> open_outbox(mi::Inbox* inbox) {
  std::unique_ptr<mi::Outbox> o;
  mi::OutboxOptions options;
  options.logger = tool_inbox_options().logger;
  check_status(mi::Outbox::create(inbox, options, &o), "opening the outbox");
  return o;
}

mi::OutboxState parse_state(const std::string& s) {
  for (auto st : {mi::OutboxState::kPending, mi::OutboxState::kSent, mi::OutboxState::kDead})
    if (s == mi::to_string(st)) return st;
  fail(kUsage, "--state: unknown state '" + s + "' (pending, sent, dead)");
}

json row_json(const mi::OutboxRow& r, bool with_payload, const std::string& encoding) {
  json props = json::object();
  const auto& p = r.properties;
  if (!p.user_properties.empty()) {
    json up = json::array();
    for (const auto& kv : p.user_properties)
      up.push_back({json_text(kv.first), json_text(kv.second)});
    props["user_properties"] = up;
  }
  if (p.content_type) props["content_type"] = json_text(*p.content_type);
  if (p.response_topic) props["response_topic"] = json_text(*p.response_topic);
  if (p.correlation_data) props["correlation_data"] = base64(*p.correlation_data);
  if (p.payload_format_indicator) props["payload_format_indicator"] = *p.payload_format_indicator;
  if (p.message_expiry_interval_s)
    props["message_expiry_interval_s"] = *p.message_expiry_interval_s;
  json j = {{"seq", r.seq},
            {"message_id", json_text(r.message_id)},
            {"ordering_key", json_text(r.ordering_key)},
            {"topic", json_text(r.topic)},
            {"state", mi::to_string(r.state)},
            {"attempts", r.attempts},
            {"size_bytes", r.size_bytes},
            {"payload_bytes", r.payload.size()},
            {"enqueued_at", r.enqueued_at_ms},
            {"sent_at", r.sent_at_ms ? json(r.sent_at_ms) : json()},
            {"dead_reason", r.dead_reason ? json(mi::to_string(*r.dead_reason)) : json()},
            {"reason_code", has_reason_code(r) ? json(r.reason_code) : json()},
            {"reason_text", r.dead_reason ? json(json_text(r.reason_text)) : json()},
            {"properties", props}};
  if (with_payload) {
    j["payload_encoding"] = encoding;
    j["payload"] = encoding == "hex" ? to_hex(r.payload) : base64(r.payload);
    if (is_utf8_text(r.payload)) j["payload_text"] = r.payload;
  }
  return j;
}

// A row's publishes are added to attempts when it is marked sent or dead
// (OutboxRow::attempts): a pending row's 0 says nothing about how often it went out.
std::string attempts_cell(const mi::OutboxRow& r) {
  return r.state == mi::OutboxState::kPending ? "-" : std::to_string(r.attempts);
}

std::string reason_cell(const mi::OutboxRow& r) {
  if (!r.dead_reason) return "-";
  std::string code;
  if (has_reason_code(r)) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", r.reason_code);
    code = std::string(" (") + hex + ")";
  }
  return std::string(mi::to_string(*r.dead_reason)) + code + " " + printable(r.reason_text, 40);
}

mi::OutboxRow get_or_fail(mi::Outbox& o, const std::string& id) {
  if (id.empty()) fail(kUsage, "needs --message-id ID");
  mi::OutboxRow r;
  const mi::Status s = o.get(id, &r);
  if (s.code() == mi::Status::Code::kNotFound) fail(kNotFound, s.message());
  check_status(s, "reading the outbox");
  return r;
}

}  // namespace

int cmd_outbox_stats(const std::string& path) {
  auto inbox = open_inbox(path);
  auto outbox = open_outbox(inbox.get());
  mi::OutboxSummary s;
  check_status(outbox->summary(&s), "reading the outbox");
  // How long the head of the queue has waited, on the retention clock (OutboxSummary).
  const bool pending = s.pending_rows > 0;
  if (g.json) {
    json classes = json::array();
    for (const auto& c : s.classes)
      classes.push_back({{"class", json_text(c.class_prefix)},
                         {"pending_rows", c.rows},
                         {"pending_bytes", c.bytes},
                         {"dropped", c.dropped}});
    emit({{"database", path},
          {"pending_rows", s.pending_rows},
          {"pending_bytes", s.pending_bytes},
          {"sent_rows", s.sent_rows},
          {"dead_rows", s.dead_rows},
          {"oldest_pending_enqueued_at", pending ? json(s.oldest_pending_enqueued_at_ms) : json()},
          {"oldest_pending_age_ms", pending ? json(s.oldest_pending_waited_ms) : json()},
          {"classes", classes}});
    return kOk;
  }
  print_kv({{"database", path},
            {"pending", std::to_string(s.pending_rows) + " rows, " + human_bytes(s.pending_bytes)},
            {"oldest pending", pending ? "waiting " + human_ms(s.oldest_pending_waited_ms) +
                                             " (enqueued " + iso(s.oldest_pending_enqueued_at_ms) +
                                             ", wall clock)"
                                       : "-"},
            {"sent (kept)", std::to_string(s.sent_rows)},
            {"dead letters", std::to_string(s.dead_rows)}});
  std::vector<std::vector<std::string>> t;
  for (const auto& c : s.classes)
    t.push_back({c.class_prefix.empty() ? "(unbounded)" : printable(c.class_prefix, 40),
                 std::to_string(c.rows), human_bytes(c.bytes), std::to_string(c.dropped)});
  if (!t.empty()) {
    std::cout << "\n";
    print_table({"class", "pending rows", "pending bytes", "dropped ever"}, t);
  }
  return kOk;
}

int cmd_outbox_list(const std::string& path, const OutboxArgs& a) {
  const mi::OutboxState state = parse_state(a.state.empty() ? "dead" : a.state);
  if (a.limit <= 0) fail(kUsage, "--limit must be > 0");
  auto inbox = open_inbox(path);
  auto outbox = open_outbox(inbox.get());
  std::vector<mi::OutboxRow> rows;
  check_status(outbox->list(state, static_cast<int>(a.limit), &rows), "listing the outbox");
  if (g.json) {
    json arr = json::array();
    for (const auto& r : rows) arr.push_back(row_json(r, false, "base64"));
    emit({{"state", mi::to_string(state)},
          {"rows", arr},
          {"count", rows.size()},
          {"limit", a.limit}});
    return kOk;
  }
  std::vector<std::vector<std::string>> t;
  for (const auto& r : rows)
    t.push_back({std::to_string(r.seq), printable(r.message_id, 40), printable(r.topic, 30),
                 printable(r.ordering_key, 20), attempts_cell(r), iso(r.enqueued_at_ms),
                 state == mi::OutboxState::kSent ? iso(r.sent_at_ms) : reason_cell(r),
                 std::to_string(r.payload.size())});
  print_table({"seq", "message id", "topic", "ordering key", "attempts", "enqueued at",
               state == mi::OutboxState::kSent ? "sent at" : "dead reason", "bytes"},
              t);
  std::cout << rows.size() << " " << mi::to_string(state) << " row(s), oldest first"
            << (static_cast<int64_t>(rows.size()) == a.limit
                    ? " (limit reached: --limit N for more)"
                    : "")
            << "\n";
  return kOk;
}

int cmd_outbox_show(const std::string& path, const OutboxArgs& a) {
  auto inbox = open_inbox(path);
  auto outbox = open_outbox(inbox.get());
  const mi::OutboxRow r = get_or_fail(*outbox, a.message_id);
  if (g.json) {
    emit(row_json(r, true, a.payload_encoding));
    return kOk;
  }
  const json j = row_json(r, false, "base64");
  print_kv({{"seq", std::to_string(r.seq)},
            {"message id", printable(r.message_id, 300)},
            {"topic", printable(r.topic, 300)},
            {"ordering key", printable(r.ordering_key, 300)},
            {"state", mi::to_string(r.state)},
            {"attempts", r.state == mi::OutboxState::kPending
                             ? "- (publishes are counted when the row is marked sent or dead)"
                             : std::to_string(r.attempts)},
            {"enqueued", iso(r.enqueued_at_ms)},
            {"sent", r.sent_at_ms ? iso(r.sent_at_ms) : "-"},
            {"dead reason", reason_cell(r)},
            {"properties", printable(j["properties"].dump(), 300)},
            {"size", std::to_string(r.size_bytes) + " bytes (payload " +
                         std::to_string(r.payload.size()) + ")"}});
  std::cout << "payload:\n"
            << (is_utf8_text(r.payload) ? r.payload : "hex " + to_hex(r.payload)) << "\n";
  return kOk;
}

int cmd_outbox_replay(const std::string& path, const OutboxArgs& a) {
  auto inbox = open_inbox(path);
  auto outbox = open_outbox(inbox.get());
  const mi::OutboxRow before = get_or_fail(*outbox, a.message_id);
  if (before.state != mi::OutboxState::kDead)
    fail(kRefused, "outbox message '" + printable(a.message_id, 60) + "' is " +
                       mi::to_string(before.state) +
                       ", not dead: only an outbox dead letter is replayed");
  const mi::Status s = outbox->replay_dead(a.message_id);
  if (s.code() == mi::Status::Code::kInvalidArgument) fail(kRefused, s.message());
  if (s.code() == mi::Status::Code::kNotFound) fail(kNotFound, s.message());
  check_status(s, "replaying");
  const mi::OutboxRow after = get_or_fail(*outbox, a.message_id);
  if (g.json) {
    emit({{"message_id", json_text(a.message_id)},
          {"state", mi::to_string(after.state)},
          {"old_seq", before.seq},
          {"seq", after.seq}});
    return kOk;
  }
  std::cout << "outbox message '" << printable(a.message_id, 60) << "' is pending again as row "
            << after.seq << " (was " << before.seq << ", " << reason_cell(before)
            << "): the running relay publishes it with the same message id.\n";
  return kOk;
}

int cmd_outbox_purge(const std::string& path, const OutboxArgs& a) {
  mi::OutboxPurgeFilter f;
  f.state = parse_state(a.state.empty() ? "dead" : a.state);
  if (f.state == mi::OutboxState::kPending)
    fail(kRefused, "pending rows are never purged: they are messages not yet delivered");
  if (a.message_id.empty() && a.before.empty() && !a.all)
    fail(kUsage, "purge needs a filter (--message-id, --before) or --all");
  if (!a.message_id.empty()) f.message_id = a.message_id;
  if (!a.before.empty()) f.before_ms = parse_time(a.before, wall_now_ms(), "--before");
  auto inbox = open_inbox(path);
  auto outbox = open_outbox(inbox.get());
  if (!a.message_id.empty()) {  // one row: it must exist in that state before we ask
    const mi::OutboxRow r = get_or_fail(*outbox, a.message_id);
    if (r.state != f.state)
      fail(kNotFound, "outbox message '" + printable(a.message_id, 60) + "' is " +
                          mi::to_string(r.state) + ", not " + mi::to_string(f.state) +
                          ": nothing to purge");
  }
  mi::OutboxSummary s;
  check_status(outbox->summary(&s), "counting the outbox");
  const int64_t in_state = f.state == mi::OutboxState::kDead ? s.dead_rows : s.sent_rows;
  if (in_state == 0) {
    if (g.json)
      emit({{"state", mi::to_string(f.state)}, {"removed", 0}});
    else
      std::cout << "no " << mi::to_string(f.state) << " outbox rows\n";
    return kOk;
  }
  const std::string what =
      !a.message_id.empty() ? "outbox row '" + printable(a.message_id, 60) + "'"
      : a.before.empty()
          ? "all " + std::to_string(in_state) + " " + mi::to_string(f.state) + " outbox rows"
          : "the " + std::string(mi::to_string(f.state)) + " outbox rows before " + a.before +
                " (of " + std::to_string(in_state) + ")";
  if (!confirm("Delete " + what + " from " + path + "?", a.yes)) {
    std::cerr << "not deleted\n";
    return kRefused;
  }
  int64_t removed = 0;
  check_status(outbox->purge(f, &removed), "purging");
  if (g.json)
    emit({{"state", mi::to_string(f.state)}, {"removed", removed}});
  else
    std::cout << removed << " " << mi::to_string(f.state) << " outbox row(s) deleted\n";
  return kOk;
}

}  // namespace mqtt_inbox::cli

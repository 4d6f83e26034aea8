// `mqtt-inbox dead-letters list|show|replay|purge`: inspect, re-queue and delete dead
// letters through the library's dead-letter calls (docs/admin-tool.md).
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "store/sqlite/admin.h"
#include "tool.h"

namespace mqtt_inbox::cli {

namespace mi = mqtt_inbox;

namespace {

mi::DeadLetterFilter dl_filter(const DlArgs& a) {
  mi::DeadLetterFilter f;
  if (!a.consumer.empty()) f.consumer_name = a.consumer;
  if (!a.reason.empty()) {
    mi::DeadLetterReason r;
    if (!mi::parse_dead_letter_reason(a.reason, &r))
      fail(kUsage, "--reason: unknown reason '" + a.reason + "' (" + dl_reason_names(", ") + ")");
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

}  // namespace

std::string dl_reason_names(const char* sep) {
  std::string out;
  for (mi::DeadLetterReason r : mi::kDeadLetterReasons)
    out += (out.empty() ? "" : sep) + std::string(mi::to_string(r));
  return out;
}

const char* dl_status(const mi::DeadLetter& d) {
  return d.replayed ? "replayed" : d.requeued ? "requeued" : "dead";
}

json dl_json(const mi::DeadLetter& d, bool with_payload, const std::string& encoding) {
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
            {"status", dl_status(d)},
            {"replayed_at", d.replayed_at_ms ? json(*d.replayed_at_ms) : json()}};
  json props = json::parse(d.properties_json.empty() ? "{}" : d.properties_json, nullptr, false);
  j["properties"] = props.is_discarded() ? json(json_text(d.properties_json)) : props;
  if (with_payload) {
    j["payload_encoding"] = encoding;
    j["payload"] = encoding == "hex" ? to_hex(d.payload) : base64(d.payload);
    if (detail::is_valid_utf8(d.payload)) j["payload_text"] = d.payload;
  }
  return j;
}

namespace {

std::vector<mi::DeadLetter> dl_select(mi::Inbox& inbox, const DlArgs& a) {
  std::vector<mi::DeadLetter> rows;
  if (a.id > 0) {
    mi::DeadLetter d;
    const mi::Status s = inbox.get_dead_letter(a.id, &d);
    if (s.code() == mi::Status::Code::kNotFound)
      fail(kNotFound, "no dead letter with id " + std::to_string(a.id));
    check_status(s, "reading dead letter");
    rows.push_back(d);
    return rows;
  }
  check_status(inbox.list_dead_letters(dl_filter(a), &rows), "listing dead letters");
  return rows;
}

}  // namespace

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
    t.push_back({std::to_string(d.id), d.consumer_name,
                 d.message_id ? printable(*d.message_id, 40) : "(none)", mi::to_string(d.reason),
                 printable(d.reason_text, 60), std::to_string(d.attempts),
                 iso(d.dead_lettered_at_ms), dl_status(d), printable(d.topic, 30),
                 std::to_string(d.payload_size)});
  print_table({"id", "consumer", "message id", "reason", "reason text", "attempts",
               "dead-lettered at", "status", "topic", "bytes"},
              t);
  std::cout << rows.size() << " row(s)"
            << (a.limit > 0 && static_cast<int64_t>(rows.size()) == a.limit
                    ? " (limit reached; --limit 0 for all)"
                    : "")
            << "\n";
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
  print_kv(
      {{"id", std::to_string(d.id)},
       {"consumer", d.consumer_name},
       {"message id", d.message_id ? printable(*d.message_id, 300) : "(none)"},
       {"topic", printable(d.topic, 300)},
       {"reason", std::string(mi::to_string(d.reason)) + ": " + printable(d.reason_text, 300)},
       {"status", d.replayed ? "replayed at " + iso(d.replayed_at_ms.value_or(0)) : dl_status(d)},
       {"attempts", std::to_string(d.attempts)},
       {"first attempt", iso(d.first_attempt_at_ms)},
       {"last attempt", iso(d.last_attempt_at_ms)},
       {"dead-lettered", iso(d.dead_lettered_at_ms)},
       {"redeliveries", std::to_string(d.redeliveries)},
       {"qos", std::to_string(d.qos)},
       {"properties", d.properties_json.empty() ? "{}" : printable(d.properties_json, 300)},
       {"payload size", std::to_string(d.payload_size) +
                            (static_cast<int64_t>(d.payload.size()) < d.payload_size
                                 ? " (stored " + std::to_string(d.payload.size()) + ", cut)"
                                 : "")}});
  std::cout << "payload:\n"
            << (is_utf8_text(d.payload) ? d.payload : "hex " + to_hex(d.payload)) << "\n";
  return kOk;
}

int cmd_dl_replay(const std::string& path, const DlArgs& a) {
  if (a.id <= 0) fail(kUsage, "dead-letters replay needs --id N");
  auto inbox = open_inbox(path);
  mi::DeadLetter d;
  const mi::Status s = inbox->get_dead_letter(a.id, &d);
  if (s.code() == mi::Status::Code::kNotFound)
    fail(kNotFound, "no dead letter with id " + std::to_string(a.id));
  check_status(s, "reading dead letter");
  if (d.replayed)
    fail(kRefused, "dead letter " + std::to_string(d.id) +
                       " was already replayed: refused, a replay never applies twice");
  if (d.requeued)
    fail(kRefused, "dead letter " + std::to_string(d.id) +
                       " is already requeued: the running consumer replays it");
  if (!d.message_id)
    fail(kUnsupported, "dead letter " + std::to_string(d.id) + " (" + mi::to_string(d.reason) +
                           ") has no usable message id: it cannot be re-queued without one. Fix "
                           "the producer and re-publish, "
                           "or have the application call Consumer::replay_dead_letter(" +
                           std::to_string(d.id) + ").");
  // Store-then-process: is the message a stored row the workers dead-lettered?
  std::optional<std::string> status;
  // The PostgreSQL store has no store-then-process rows (docs/postgres.md#what-is-supported).
  if (!is_postgres(path))
    check_read(
        mi::detail::read_sqlite_stored_status(*inbox, d.consumer_name, *d.message_id, &status),
        "looking up the stored message");
  if (!status) {
    // Consumer mode: only the application has the handler. Mark the row 'requeued'; the
    // running Consumer replays it on its own thread (ConsumerOptions::requeue_poll_ms).
    // The tool opened the file without the service's exclusive lock file, so this one
    // short write waits at most for one message's transaction.
    const mi::Status s2 = inbox->requeue_dead_letter(d.id);
    if (s2.code() == mi::Status::Code::kInvalidArgument) fail(kRefused, s2.message());
    check_status(s2, "requeuing");
    if (g.json)
      emit({{"id", d.id},
            {"consumer", d.consumer_name},
            {"message_id", json_text(*d.message_id)},
            {"mode", "consumer"},
            {"status", "requeued"}});
    else
      std::cout << "dead letter " << d.id << " of consumer '" << d.consumer_name
                << "' is requeued: the running consumer replays it through its handler within its "
                   "requeue_poll_ms (default 2 s) and marks it replayed, or dead again with the "
                   "new reason.\n"
                << "follow it with: mqtt-inbox dead-letters show " << path << " --id " << d.id
                << "\n";
    return kOk;
  }
  if (*status != "dead")
    fail(kRefused, "the stored message of dead letter " + std::to_string(d.id) + " is '" + *status +
                       "', not 'dead': it was already re-queued or processed; refused");
  auto stp = stp_for(inbox.get(), d.consumer_name);
  mi::ReplayFilter f;
  f.message_id = *d.message_id;
  f.include_dead = true;
  mi::ReplayResult r;
  check_status(stp->replay(f, &r), "re-queuing");
  json j = {
      {"id", d.id},
      {"consumer", d.consumer_name},
      {"message_id", json_text(*d.message_id)},
      {"mode", "store_then_process"},
      {"reset", r.reset},
      {"not_replayable", r.not_replayable},
      {"in_flight", r.in_flight},
      {"note",
       "the dead-letter row keeps status 'dead': the library has no call to mark it re-queued"}};
  if (r.reset != 1) {
    if (g.json) emit(j);
    fail(kRefused, "nothing re-queued (payload compacted: " + std::to_string(r.not_replayable) +
                       ", in flight: " + std::to_string(r.in_flight) + ")");
  }
  if (g.json)
    emit(j);
  else
    std::cout
        << "dead letter " << d.id << ": message '" << printable(*d.message_id, 60) << "' of '"
        << d.consumer_name << "' is pending again; the application's workers will process it.\n"
        << "note: the dead-letter row keeps status 'dead' (no library call marks it re-queued).\n";
  return kOk;
}

int cmd_dl_purge(const std::string& path, const DlArgs& a) {
  auto inbox = open_inbox(path);
  const bool any_filter = a.id > 0 || !a.consumer.empty() || !a.reason.empty() ||
                          !a.since.empty() || !a.before.empty() || !a.message_id.empty();
  if (!any_filter && !a.all)
    fail(kUsage,
         "purge needs a filter (--consumer, --reason, --since, --before, --message-id, --id) or "
         "--all");
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
    fail(kRefused,
         "cannot isolate dead letter " + std::to_string(a.id) + ": " + std::to_string(rows.size()) +
             " rows share its consumer, id, reason and time (the library's filter has no row id)");
  if (rows.empty()) {
    if (g.json)
      emit({{"matched", 0}, {"removed", 0}});
    else
      std::cout << "no dead letters match\n";
    return kOk;
  }
  if (!confirm("Delete " + std::to_string(rows.size()) + " dead letter(s) from " + path + "?",
               a.yes)) {
    std::cerr << "not deleted\n";
    return kRefused;
  }
  int64_t removed = 0;
  check_status(inbox->purge_dead_letters(f, &removed), "purging");
  // The filter is evaluated again by the purge: rows dead-lettered since the count match too.
  if (g.json)
    emit({{"matched", rows.size()}, {"removed", removed}});
  else
    std::cout << removed << " dead letter(s) deleted"
              << (removed != static_cast<int64_t>(rows.size()) ? " (rows changed since the count)"
                                                               : "")
              << "\n";
  return kOk;
}

}  // namespace mqtt_inbox::cli

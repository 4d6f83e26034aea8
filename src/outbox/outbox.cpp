// The transactional outbox's store (outbox.h): enqueue inside the caller's transaction
// with the class bounds, and the relay's fetch and marks on the Inbox's connection.
// Inspection and repair (list, usage, summary, get, replay_dead, purge) are in
// outbox/outbox_inspect.cpp; the state both share is in outbox/outbox_impl.h.
#include "mqtt_inbox/outbox.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "store/sqlite/store.h"
#include "util/log.h"
#include "inbox/message_id.h"
#include "outbox/outbox_impl.h"
#include "outbox/outbox_wake.h"
#include "inbox/properties_json.h"
#include "store/reentry.h"
#include "store/sqlite/util.h"
#include "util/text.h"

namespace mqtt_inbox {

const char* to_string(OutboxState state) {
  switch (state) {
    case OutboxState::kPending:
      return "pending";
    case OutboxState::kSent:
      return "sent";
    case OutboxState::kDead:
      return "dead";
  }
  return "unknown";
}

const char* to_string(OutboxDeadReason reason) {
  switch (reason) {
    case OutboxDeadReason::kRejectedByBroker:
      return "rejected_by_broker";
    case OutboxDeadReason::kExpired:
      return "expired";
    case OutboxDeadReason::kPayloadTooLarge:
      return "payload_too_large";
    case OutboxDeadReason::kConnectionDropped:
      return "connection_dropped";
  }
  return "unknown";
}

std::string derived_message_id(const std::string& incoming_id, const std::string& suffix,
                               size_t max_id_bytes) {
  std::string id = incoming_id + "/" + suffix;
  if (id.size() > max_id_bytes)
    throw OutboxRefused(Status::InvalidArgument(
        "derived message id '" + detail::printable(id) + "' is " + std::to_string(id.size()) +
        " bytes, longer than the outbox's " + std::to_string(max_id_bytes) +
        " (OutboxOptions::max_id_bytes, the next hop's limit): the incoming id is " +
        std::to_string(incoming_id.size()) + " bytes, and the suffix '" +
        detail::printable(suffix) + "' leaves room for " +
        (max_id_bytes > suffix.size() + 1
             ? std::to_string(max_id_bytes - suffix.size() - 1) + " at most"
             : std::string("none"))));
  if (std::string why = detail::validate_message_id(id, max_id_bytes); !why.empty())
    throw OutboxRefused(Status::InvalidArgument("derived message id refused: " + why));
  return id;
}

Status random_message_id(std::string* out) {
  unsigned char b[16];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status(Status::Code::kIoError, std::string("/dev/urandom: ") + std::strerror(errno));
  size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::read(fd, b + got, sizeof b - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      return Status(Status::Code::kIoError,
                    std::string("/dev/urandom: ") + (n == 0 ? "end of file" : std::strerror(e)));
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4 (RFC 4122 4.4)
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // variant 10
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[b[i] >> 4];
    s += hex[b[i] & 0x0f];
  }
  *out = std::move(s);
  return Status::Ok();
}

namespace detail {

OutboxRow read_outbox_row(SQLite::Statement& q, int64_t clock_now) {
  OutboxRow r;
  r.seq = q.getColumn(0).getInt64();
  r.message_id = q.getColumn(1).getString();
  r.ordering_key = q.getColumn(2).getString();
  r.topic = q.getColumn(3).getString();
  r.payload = q.getColumn(4).getString();
  detail::read_properties_json(q.getColumn(5).getString(), &r.properties);
  r.properties.topic = r.topic;
  r.properties.payload = r.payload;
  r.properties.ordering_key = r.ordering_key;
  r.properties.message_id = r.message_id;
  r.size_bytes = q.getColumn(6).getInt64();
  r.enqueued_at_ms = q.getColumn(7).getInt64();
  const std::string state = q.getColumn(8).getString();
  r.state = state == "sent"   ? OutboxState::kSent
            : state == "dead" ? OutboxState::kDead
                              : OutboxState::kPending;
  r.attempts = q.getColumn(9).getInt();
  r.sent_at_ms = q.getColumn(10).isNull() ? 0 : q.getColumn(10).getInt64();
  if (!q.getColumn(11).isNull()) {
    const std::string reason = q.getColumn(11).getString();
    for (auto c : {OutboxDeadReason::kRejectedByBroker, OutboxDeadReason::kExpired,
                   OutboxDeadReason::kPayloadTooLarge, OutboxDeadReason::kConnectionDropped})
      if (reason == to_string(c)) r.dead_reason = c;
  }
  r.reason_code = q.getColumn(12).isNull() ? 0 : q.getColumn(12).getInt();
  r.reason_text = q.getColumn(13).isNull() ? "" : q.getColumn(13).getString();
  r.waited_ms = std::max<int64_t>(0, clock_now - q.getColumn(14).getInt64());
  return r;
}

}  // namespace detail

void Outbox::Impl::count_drops(SQLite::Database& db, const OutboxClass& c, int64_t n,
                               const std::string& first_id, const char* why) {
  if (n == 0) return;
  SQLite::Statement count(db, "UPDATE outbox_usage SET dropped = dropped + ? WHERE class = ?");
  count.bind(1, n);
  count.bind(2, c.topic_prefix);
  count.exec();
  dropped += n;
  log->warn("outbox: class '{}' {}: dropped {} oldest pending row(s), first id '{}' "
            "(policy drop_oldest)",
            detail::printable(c.topic_prefix), why, n, detail::printable(first_id));
}

Status Outbox::Impl::enforce_age(SQLite::Database& db, const OutboxClass& c, int64_t new_seq,
                                 int64_t clock_now) {
  const int64_t cutoff = clock_now - c.max_age_ms;
  // The class's oldest pending row: the first of the partial index (class, seq).
  SQLite::Statement oldest(db,
                           "SELECT enqueued_clock, message_id FROM outbox_messages "
                           "WHERE class = ? AND state = 'pending' AND seq <> ? "
                           "ORDER BY seq LIMIT 1");
  oldest.bind(1, c.topic_prefix);
  oldest.bind(2, new_seq);
  if (!oldest.executeStep() || oldest.getColumn(0).getInt64() >= cutoff) return Status::Ok();
  const int64_t age = clock_now - oldest.getColumn(0).getInt64();
  const std::string first_id = oldest.getColumn(1).getString();
  oldest.tryReset();
  if (c.policy == OutboxFullPolicy::kReject) {
    ++rejected;
    return Status(Status::Code::kRejected,
                  "outbox full: class '" + c.topic_prefix + "' has a pending row " +
                      std::to_string(age) + " ms old (max_age_ms " +
                      std::to_string(c.max_age_ms) + "): the relay has not sent it");
  }
  SQLite::Statement drop(db,
                         "DELETE FROM outbox_messages WHERE class = ? AND state = 'pending' "
                         "AND seq <> ? AND enqueued_clock < ?");
  drop.bind(1, c.topic_prefix);
  drop.bind(2, new_seq);
  drop.bind(3, cutoff);
  count_drops(db, c, drop.exec(), first_id, "older than max_age_ms");
  return Status::Ok();
}

Status Outbox::Impl::make_room(SQLite::Database& db, const OutboxClass& c, int64_t size,
                               int64_t new_seq, int64_t clock_now) {
  if (c.max_age_ms > 0) {
    Status s = enforce_age(db, c, new_seq, clock_now);
    if (!s.ok()) return s;
  }
  if (c.max_bytes > 0 && size > c.max_bytes)
    return Status::InvalidArgument("outbox message of " + std::to_string(size) +
                                   " bytes is larger than class '" + c.topic_prefix +
                                   "' allows (max_bytes " + std::to_string(c.max_bytes) + ")");
  SQLite::Statement usage(db, "SELECT rows, bytes FROM outbox_usage WHERE class = ?");
  usage.bind(1, c.topic_prefix);
  int64_t rows = 0, bytes = 0;
  if (usage.executeStep()) {
    rows = usage.getColumn(0).getInt64();
    bytes = usage.getColumn(1).getInt64();
  }
  usage.tryReset();
  auto fits = [&] {  // rows and bytes include the new row
    return (c.max_rows <= 0 || rows <= c.max_rows) && (c.max_bytes <= 0 || bytes <= c.max_bytes);
  };
  if (fits()) return Status::Ok();
  if (c.policy == OutboxFullPolicy::kReject) {
    ++rejected;
    return Status(Status::Code::kRejected, "outbox full: class '" + c.topic_prefix + "' holds " +
                                               std::to_string(rows) + " rows, " +
                                               std::to_string(bytes) + " bytes (max_rows " +
                                               std::to_string(c.max_rows) + ", max_bytes " +
                                               std::to_string(c.max_bytes) + ")");
  }
  SQLite::Statement oldest(db,
                           "SELECT seq, size_bytes, message_id FROM outbox_messages "
                           "WHERE class = ? AND state = 'pending' AND seq <> ? "
                           "ORDER BY seq LIMIT 1");
  SQLite::Statement drop(db, "DELETE FROM outbox_messages WHERE seq = ?");
  int64_t n = 0;
  std::string first_id;
  while (!fits()) {
    oldest.bind(1, c.topic_prefix);
    oldest.bind(2, new_seq);
    if (!oldest.executeStep()) break;  // nothing left to drop (cannot happen: size fits)
    const int64_t seq = oldest.getColumn(0).getInt64();
    rows -= 1;
    bytes -= oldest.getColumn(1).getInt64();
    if (n == 0) first_id = oldest.getColumn(2).getString();
    oldest.tryReset();
    drop.bind(1, seq);
    drop.exec();
    drop.tryReset();
    ++n;
  }
  count_drops(db, c, n, first_id, "full");
  return Status::Ok();
}

Status Outbox::create(Inbox* inbox, const OutboxOptions& options, std::unique_ptr<Outbox>* out) {
  if (!inbox) return Status::InvalidArgument("Outbox::create: inbox is null");
  for (size_t i = 0; i < options.classes.size(); ++i) {
    const auto& c = options.classes[i];
    if (c.max_rows < 0 || c.max_bytes < 0 || c.max_age_ms < 0)
      return Status::InvalidArgument("outbox class '" + c.topic_prefix +
                                     "': max_rows, max_bytes and max_age_ms must be >= 0");
    for (size_t j = 0; j < i; ++j)
      if (options.classes[j].topic_prefix == c.topic_prefix)
        return Status::InvalidArgument("outbox class '" + c.topic_prefix + "' given twice");
  }
  if (options.max_id_bytes == 0) return Status::InvalidArgument("max_id_bytes must be > 0");
  auto impl = std::make_unique<Impl>();
  impl->inbox = inbox;
  impl->options = options;
  impl->log = detail::logger_or_default(options.logger);
  out->reset(new Outbox(std::move(impl)));
  return Status::Ok();
}

namespace {

// MQTT strings and binary data carry a two-byte length (MQTT 3.1.1 section 1.5.3, MQTT
// 5.0 sections 1.5.4 and 1.5.6), and a packet's remaining length is at most 268,435,455
// bytes (section 2.2.3 / 1.5.5).
constexpr size_t kMaxMqttString = 65535;
constexpr size_t kMaxMqttPacket = 268435455;

// Why `text` cannot be an MQTT UTF-8 string (`what` names it), or "".
std::string mqtt_string_problem(const std::string& what, const std::string& text) {
  if (text.size() > kMaxMqttString)
    return what + " is " + std::to_string(text.size()) + " bytes, longer than MQTT's " +
           std::to_string(kMaxMqttString);
  if (!detail::is_valid_utf8(text))
    return what + " '" + detail::printable(text) + "' is not valid UTF-8";
  if (text.find('\0') != std::string::npos)
    return what + " '" + detail::printable(text) + "' holds the character U+0000";
  return "";
}

// Why a topic name cannot be published to (`what` names it), or "".
std::string topic_problem(const std::string& what, const std::string& topic) {
  if (topic.empty()) return what + " is empty";
  if (topic.find_first_of("+#") != std::string::npos)
    return what + " '" + detail::printable(topic) + "' holds a wildcard ('+' or '#')";
  return mqtt_string_problem(what, topic);
}

// Every refusal of an outgoing message that no retry can change (outbox.h OutboxRefused)
// but the id's and the class's, which enqueue_or_throw checks itself: "" if none. The
// MQTT 5 properties are checked whatever version the relay speaks: a 3.1.1 relay drops
// them, but the row must be publishable on either (and a next hop may be 5).
std::string refusal(const OutgoingMessage& m) {
  if (std::string why = topic_problem("outbox topic", m.topic); !why.empty()) return why;
  if (m.response_topic)
    if (std::string why = topic_problem("response topic", *m.response_topic); !why.empty())
      return why;
  if (m.content_type)
    if (std::string why = mqtt_string_problem("content type", *m.content_type); !why.empty())
      return why;
  for (const auto& p : m.user_properties) {
    if (std::string why = mqtt_string_problem("user property name", p.first); !why.empty())
      return why;
    if (std::string why = mqtt_string_problem(
            "user property '" + detail::printable(p.first) + "' value", p.second);
        !why.empty())
      return why;
  }
  if (m.correlation_data && m.correlation_data->size() > kMaxMqttString)
    return "correlation data is " + std::to_string(m.correlation_data->size()) +
           " bytes, longer than MQTT's " + std::to_string(kMaxMqttString);
  if (m.payload_format_indicator) {
    if (*m.payload_format_indicator > 1)
      return "payload format indicator " + std::to_string(*m.payload_format_indicator) +
             " is neither 0 (bytes) nor 1 (UTF-8)";
    if (*m.payload_format_indicator == 1 && !detail::is_valid_utf8(m.payload))
      return "payload format indicator 1 (UTF-8) on a payload that is not valid UTF-8 (a "
             "broker answers 0x99, payload format invalid)";
  }
  // The topic and payload alone (no header, no property): a lower bound of the packet.
  if (m.topic.size() + m.payload.size() > kMaxMqttPacket)
    return "outbox message of " + std::to_string(m.topic.size() + m.payload.size()) +
           " bytes (topic and payload) is larger than an MQTT packet can be (" +
           std::to_string(kMaxMqttPacket) + ")";
  return "";
}

}  // namespace

Outbox::Outbox(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Outbox::~Outbox() = default;

void Outbox::enqueue_or_throw(SQLite::Database& db, const OutgoingMessage& m,
                              std::string* message_id) {
  // Every refusal but a full class is for good (OutboxRefused): the same message is
  // refused on every attempt. The members are listed in outbox.h; all are checked before
  // anything is written, except the class's max_bytes (make_room).
  if (sqlite3_get_autocommit(db.getHandle()))
    throw OutboxRefused(Status::InvalidArgument("outbox enqueue needs an open transaction"));
  if (std::string why = refusal(m); !why.empty())
    throw OutboxRefused(Status::InvalidArgument(why));
  std::string id = m.message_id;
  if (id.empty()) {
    Status s = random_message_id(&id);
    if (!s.ok()) throw OutboxRejected(s);  // /dev/urandom failed: may work next time
  }
  if (std::string why = detail::validate_message_id(id, impl_->options.max_id_bytes); !why.empty())
    throw OutboxRefused(Status::InvalidArgument("outbox message id refused: " + why));
  const std::string key = m.ordering_key.empty() ? m.topic : m.ordering_key;
  const std::string props = detail::properties_json(m);
  const int64_t size = static_cast<int64_t>(id.size() + key.size() + m.topic.size() +
                                            m.payload.size() + props.size());
  const OutboxClass* c = impl_->class_of(m.topic);

  // Claim the id first (guarantees.md section 3): INSERT ... ON CONFLICT DO NOTHING, and
  // no change means the id is already present and names this message: nothing to add,
  // and no room to make. A new row is then fitted into its class; a refusal takes it out
  // again, so that enqueue() leaves nothing behind even if the caller commits.
  SQLite::Statement ins(db,
                        "INSERT INTO outbox_messages (message_id, ordering_key, class, topic, "
                        "payload, properties, qos, size_bytes, enqueued_at, enqueued_clock) "
                        "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING");
  ins.bind(1, id);
  ins.bind(2, key);
  ins.bind(3, c ? c->topic_prefix : std::string());
  ins.bind(4, m.topic);
  ins.bind(5, m.payload.data(), static_cast<int>(m.payload.size()));
  ins.bind(6, props);
  ins.bind(7, size);
  auto& in = detail::sqlite_store(impl_->inbox);
  ins.bind(8, in.clock->wall_ms());
  const int64_t clock_now = in.retention_clock();
  ins.bind(9, clock_now);
  if (ins.exec() == 0) {
    ++impl_->duplicates;
  } else {
    const int64_t seq = sqlite3_last_insert_rowid(db.getHandle());
    if (c) {
      Status s = impl_->make_room(db, *c, size, seq, clock_now);
      if (!s.ok()) {
        SQLite::Statement undo(db, "DELETE FROM outbox_messages WHERE seq = ?");
        undo.bind(1, seq);
        undo.exec();
        if (s.code() == Status::Code::kRejected) throw OutboxFull(s);
        throw OutboxRefused(s);  // larger than its class's max_bytes: it never fits
      }
    }
    ++impl_->enqueued;
    // Wake the relays once this transaction commits (a no-op on another connection).
    in.commit_wake->arm(db.getHandle());
  }
  if (message_id) *message_id = id;
}

Status Outbox::enqueue(SQLite::Database& db, const OutgoingMessage& m, std::string* message_id) {
  try {
    enqueue_or_throw(db, m, message_id);
    return Status::Ok();
  } catch (const OutboxRejected& e) {
    return e.status();
  } catch (const SQLite::Exception& e) {
    return detail::to_status(e, "outbox enqueue");
  } catch (const std::exception& e) {
    return Status::Internal(std::string("outbox enqueue: ") + e.what());
  }
}

Status Outbox::fetch_pending(int64_t after_seq, int limit, std::vector<OutboxRow>* out) {
  out->clear();
  if (limit <= 0) return Status::InvalidArgument("fetch_pending: limit must be > 0");
  auto& in = detail::sqlite_store(impl_->inbox);
  auto& db = *in.db;
  // A read: one statement, so one snapshot, and no write lock. It counted an attempt on
  // every row it handed out before: a write transaction per fetch, and so about one per
  // event once commits woke the relay. The relay now counts its publishes and adds them
  // with the mark (OutboxMark).
  return impl_->read_on_inbox("Outbox::fetch_pending", [&] {
    out->clear();
    const int64_t clock_now = in.retention_clock();
    SQLite::Statement q(db, std::string("SELECT ") + detail::kOutboxRowColumns +
                                " FROM outbox_messages WHERE state = 'pending' AND seq > ? "
                                "ORDER BY seq LIMIT ?");
    q.bind(1, after_seq);
    q.bind(2, limit);
    while (q.executeStep()) out->push_back(detail::read_outbox_row(q, clock_now));
  });
}

Status Outbox::mark_sent(const std::vector<OutboxMark>& rows) {
  if (rows.empty()) return Status::Ok();
  auto& in = detail::sqlite_store(impl_->inbox);
  int64_t changed = 0;
  Status s = impl_->on_inbox("Outbox::mark_sent", /*relaxed_sync=*/true, [&] {
    changed = 0;
    SQLite::Statement up(*in.db,
                         "UPDATE outbox_messages SET state = 'sent', sent_at = ?, "
                         "retention_at = ?, attempts = attempts + ? "
                         "WHERE seq = ? AND state = 'pending'");
    const int64_t now = in.clock->wall_ms();
    const int64_t retention_now = in.retention_clock();
    for (const OutboxMark& r : rows) {
      up.bind(1, now);
      up.bind(2, retention_now);
      up.bind(3, std::max(0, r.publishes));
      up.bind(4, r.seq);
      changed += up.exec();
      up.tryReset();
    }
  });
  if (s.ok()) impl_->sent += changed;
  return s;
}

Status Outbox::mark_dead(const OutboxMark& row, OutboxDeadReason reason, int reason_code,
                         const std::string& text) {
  auto& in = detail::sqlite_store(impl_->inbox);
  int changed = 0;
  Status s = impl_->on_inbox("Outbox::mark_dead", /*relaxed_sync=*/false, [&] {
    SQLite::Statement up(*in.db,
                         "UPDATE outbox_messages SET state = 'dead', dead_reason = ?, "
                         "reason_code = ?, reason_text = ?, dead_at = ?, retention_at = ?, "
                         "attempts = attempts + ? WHERE seq = ? AND state = 'pending'");
    up.bind(1, to_string(reason));
    up.bind(2, reason_code);
    up.bind(3, text);
    up.bind(4, in.clock->wall_ms());
    up.bind(5, in.retention_clock());
    up.bind(6, std::max(0, row.publishes));
    up.bind(7, row.seq);
    changed = up.exec();
  });
  if (s.ok() && changed > 0) {
    ++impl_->dead;
    impl_->log->warn("outbox: row {} is an outbox dead letter: {} (reason code 0x{:02x}): {}",
                     row.seq, to_string(reason), reason_code, detail::printable(text));
  }
  return s;
}

namespace detail {

uint64_t OutboxAccess::add_commit_waker(Outbox& outbox, std::function<void()> wake) {
  return sqlite_store(outbox.impl_->inbox).commit_wake->add(std::move(wake));
}

void OutboxAccess::remove_commit_waker(Outbox& outbox, uint64_t id) {
  sqlite_store(outbox.impl_->inbox).commit_wake->remove(id);
}

}  // namespace detail

OutboxCounters Outbox::counters() const {
  OutboxCounters c;
  c.enqueued = impl_->enqueued.load();
  c.duplicates = impl_->duplicates.load();
  c.rejected = impl_->rejected.load();
  c.dropped = impl_->dropped.load();
  c.sent = impl_->sent.load();
  c.dead = impl_->dead.load();
  return c;
}

}  // namespace mqtt_inbox

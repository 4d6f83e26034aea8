// The transactional outbox's policy (outbox.h): what an enqueue refuses, the class a
// topic belongs to and its bounds, inside the caller's transaction; the relay side (the
// relay's turn, fetch, marks and wake-up: outbox/relay_source.h); the counters and logs. The rows
// are the store's (store/outbox_rows.h). Inspection and repair (list, usage, summary, get,
// replay_dead, purge) are in outbox/outbox_inspect.cpp; the state both share is in
// outbox/outbox_impl.h.
#include "mqtt_inbox/outbox.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <utility>

#include "inbox/message_id.h"
#include "inbox/properties_json.h"
#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/topic.h"
#include "outbox/outbox_impl.h"
#include "store/inbox.h"
#include "store/outbox_rows.h"
#include "store/reentry.h"
#include "util/log.h"
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

OutboxRow to_outbox_row(StoredOutboxRow&& stored) {
  OutboxRow r = std::move(stored.row);
  read_properties_json(stored.properties_json, &r.properties);
  r.properties.topic = r.topic;
  r.properties.payload = r.payload;
  r.properties.ordering_key = r.ordering_key;
  r.properties.message_id = r.message_id;
  return r;
}

void to_outbox_rows(std::vector<StoredOutboxRow>&& stored, std::vector<OutboxRow>* out) {
  out->clear();
  out->reserve(stored.size());
  for (auto& s : stored) out->push_back(to_outbox_row(std::move(s)));
}

}  // namespace detail

void detail::OutboxImpl::count_drops(const detail::TxnRef& txn, const OutboxClass& c, int64_t n,
                                     const std::string& first_id, const char* why) {
  if (n == 0) return;
  rows->count_drops(txn, c.topic_prefix, n);
  dropped += n;
  log->warn(
      "outbox: class '{}' {}: dropped {} oldest pending row(s), first id '{}' "
      "(policy drop_oldest)",
      detail::printable(c.topic_prefix), why, n, detail::printable(first_id));
}

Status detail::OutboxImpl::enforce_age(const detail::TxnRef& txn, const OutboxClass& c,
                                       int64_t new_seq, int64_t clock_now) {
  const int64_t cutoff = clock_now - c.max_age_ms;
  detail::OldestPending oldest;
  if (!rows->oldest_pending(txn, c.topic_prefix, new_seq, &oldest) ||
      oldest.enqueued_clock >= cutoff)
    return Status::Ok();
  const int64_t age = clock_now - oldest.enqueued_clock;
  if (c.policy == OutboxFullPolicy::kReject) {
    ++rejected;
    return Status(Status::Code::kRejected,
                  "outbox full: class '" + c.topic_prefix + "' has a pending row " +
                      std::to_string(age) + " ms old (max_age_ms " + std::to_string(c.max_age_ms) +
                      "): the relay has not sent it");
  }
  count_drops(txn, c, rows->remove_pending_before(txn, c.topic_prefix, new_seq, cutoff),
              oldest.message_id, "older than max_age_ms");
  return Status::Ok();
}

Status detail::OutboxImpl::make_room(const detail::TxnRef& txn, const OutboxClass& c, int64_t size,
                                     int64_t new_seq, int64_t clock_now) {
  if (c.max_age_ms > 0) {
    Status s = enforce_age(txn, c, new_seq, clock_now);
    if (!s.ok()) return s;
  }
  if (c.max_bytes > 0 && size > c.max_bytes)
    return Status::InvalidArgument("outbox message of " + std::to_string(size) +
                                   " bytes is larger than class '" + c.topic_prefix +
                                   "' allows (max_bytes " + std::to_string(c.max_bytes) + ")");
  int64_t n_rows = 0, bytes = 0;
  rows->class_usage(txn, c.topic_prefix, &n_rows, &bytes);
  auto fits = [&] {  // n_rows and bytes include the new row
    return (c.max_rows <= 0 || n_rows <= c.max_rows) && (c.max_bytes <= 0 || bytes <= c.max_bytes);
  };
  if (fits()) return Status::Ok();
  if (c.policy == OutboxFullPolicy::kReject) {
    ++rejected;
    return Status(Status::Code::kRejected, "outbox full: class '" + c.topic_prefix + "' holds " +
                                               std::to_string(n_rows) + " rows, " +
                                               std::to_string(bytes) + " bytes (max_rows " +
                                               std::to_string(c.max_rows) + ", max_bytes " +
                                               std::to_string(c.max_bytes) + ")");
  }
  int64_t n = 0;
  std::string first_id;
  detail::OldestPending oldest;
  while (!fits()) {
    // Nothing left to drop cannot happen: the new row alone fits (checked above).
    if (!rows->oldest_pending(txn, c.topic_prefix, new_seq, &oldest)) break;
    n_rows -= 1;
    bytes -= oldest.size_bytes;
    if (n == 0) first_id = oldest.message_id;
    rows->remove(txn, oldest.seq);
    ++n;
  }
  count_drops(txn, c, n, first_id, "full");
  return Status::Ok();
}

Status Outbox::create(Inbox* inbox, const OutboxOptions& options, std::unique_ptr<Outbox>* out) {
  detail::Store* store = detail::InboxImpl::store_of(inbox);
  if (!store) return Status::InvalidArgument("Outbox::create: inbox is null");
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
  *out = std::make_unique<detail::OutboxImpl>(inbox, store, options);
  return Status::Ok();
}

Outbox::~Outbox() = default;

detail::OutboxImpl::OutboxImpl(const Inbox* owner, Store* front, const OutboxOptions& opts)
    : inbox(owner),
      store(front),
      rows(&front->outbox()),
      options(opts),
      // Without a logger of its own, the outbox logs where its Inbox does (docs/outbox.md).
      log(opts.logger ? opts.logger : front->log()) {}

detail::RelaySource* detail::RelaySource::of(Outbox* outbox) {
  return dynamic_cast<OutboxImpl*>(outbox);
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

// Why a topic name cannot be published to (`what` names it), or "": the check every
// program's topic options get at start (topic.h).
std::string topic_problem(const std::string& what, const std::string& topic) {
  return check_topic_name(topic, what).message();
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

void detail::OutboxImpl::enqueue_in(const TxnRef& txn, const OutgoingMessage& m,
                                    std::string* message_id) {
  enqueue(txn, m, message_id);
}

Status detail::OutboxImpl::enqueue_status(const TxnRef& txn, const OutgoingMessage& m,
                                          std::string* message_id) {
  try {
    enqueue(txn, m, message_id);
    return Status::Ok();
  } catch (const OutboxRejected& e) {
    return e.status();
  } catch (const std::exception& e) {
    Status s;
    if (rows->store_error(e, "outbox enqueue", &s)) return s;
    return Status::Internal(std::string("outbox enqueue: ") + e.what());
  }
}

void detail::OutboxImpl::enqueue(const detail::TxnRef& txn, const OutgoingMessage& m,
                                 std::string* message_id) {
  // Every refusal but a full class is for good (OutboxRefused): the same message is
  // refused on every attempt. The members are listed in outbox.h; all are checked before
  // anything is written, except the class's max_bytes (make_room).
  bool open = false;
  try {
    open = rows->in_transaction(txn);
  } catch (const std::invalid_argument& e) {  // a transaction of another store (outbox_rows.h)
    throw OutboxRefused(Status::InvalidArgument(e.what()));
  }
  if (!open)
    throw OutboxRefused(Status::InvalidArgument("outbox enqueue needs an open transaction"));
  if (std::string why = refusal(m); !why.empty()) throw OutboxRefused(Status::InvalidArgument(why));
  std::string id = m.message_id;
  if (id.empty()) {
    Status s = random_message_id(&id);
    if (!s.ok()) throw OutboxRejected(s);  // /dev/urandom failed: may work next time
  }
  if (std::string why = detail::validate_message_id(id, options.max_id_bytes); !why.empty())
    throw OutboxRefused(Status::InvalidArgument("outbox message id refused: " + why));
  const std::string key = m.ordering_key.empty() ? m.topic : m.ordering_key;
  const std::string props = detail::properties_json(m);
  const int64_t size = static_cast<int64_t>(id.size() + key.size() + m.topic.size() +
                                            m.payload.size() + props.size());
  const OutboxClass* c = class_of(m.topic);
  static const std::string kNoClass;

  // Claim the id first (guarantees.md section 3): INSERT ... ON CONFLICT DO NOTHING, and
  // no row added means the id is already present and names this message: nothing to add,
  // and no room to make. A new row is then fitted into its class; a refusal takes it out
  // again, so that enqueue() leaves nothing behind even if the caller commits.
  detail::NewOutboxRow row;
  row.message_id = &id;
  row.ordering_key = &key;
  row.class_prefix = c ? &c->topic_prefix : &kNoClass;
  row.topic = &m.topic;
  row.payload = &m.payload;
  row.properties_json = &props;
  row.size_bytes = size;
  row.enqueued_at_ms = store->clock()->wall_ms();
  const int64_t clock_now = store->retention_clock();
  row.enqueued_clock = clock_now;
  int64_t seq = 0;
  if (!rows->insert(txn, row, &seq)) {
    ++duplicates;
  } else {
    if (c) {
      Status s = make_room(txn, *c, size, seq, clock_now);
      if (!s.ok()) {
        rows->remove(txn, seq);
        if (s.code() == Status::Code::kRejected) throw OutboxFull(s);
        throw OutboxRefused(s);  // larger than its class's max_bytes: it never fits
      }
    }
    ++enqueued;
    // Wake the relays once this transaction commits.
    rows->wake_after_commit(txn);
  }
  if (message_id) *message_id = id;
}

Status detail::OutboxImpl::renew_relay_turn(int lease_ms, bool* held) {
  *held = false;
  if (lease_ms < 1000 || lease_ms > 3600000)
    return Status::InvalidArgument("renew_relay_turn: lease_ms must be 1000..3600000, got " +
                                   std::to_string(lease_ms));
  // A store one process holds (SQLite's file, InboxOptions::exclusive): its relay is the one.
  if (!store->shared_by_processes()) {
    *held = true;
    return Status::Ok();
  }
  if (!relay_turn) {
    detail::SlotLeaseOptions o;
    o.group = "outbox relay";
    o.slots = 1;
    o.lease_ms = lease_ms;
    o.member_name = "mqtt-inbox outbox relay " + std::to_string(::getpid());
    if (Status s = store->open_slot_leases(o, &relay_turn); !s.ok()) return s;
  }
  detail::SlotLeaseRound round;
  // Never given back to spread: a turn moves only when its holder goes.
  const Status s = relay_turn->round({}, &round);
  if (!s.ok()) return s;
  *held = !round.held.empty();
  return Status::Ok();
}

void detail::OutboxImpl::give_back_relay_turn() {
  if (relay_turn) relay_turn->leave();
}

bool detail::OutboxImpl::relays_take_turns() const { return store->shared_by_processes(); }

Status detail::OutboxImpl::fetch_pending(int64_t after_seq, int limit,
                                         std::vector<OutboxRow>* out) {
  out->clear();
  if (limit <= 0) return Status::InvalidArgument("fetch_pending: limit must be > 0");
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::fetch_pending"); !r.ok()) return r;
  // A read (store/outbox_rows.h). It counted an attempt on every row it handed out before:
  // a write transaction per fetch, and so about one per event once commits woke the
  // relay. The relay now counts its publishes and adds them with the mark (OutboxMark).
  std::vector<detail::StoredOutboxRow> stored;
  Status s = rows->fetch_pending(after_seq, limit, &stored);
  if (s.ok()) detail::to_outbox_rows(std::move(stored), out);
  return s;
}

Status detail::OutboxImpl::mark_sent(const std::vector<OutboxMark>& marks) {
  if (marks.empty()) return Status::Ok();
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::mark_sent"); !r.ok()) return r;
  int64_t changed = 0;
  Status s = rows->mark_sent(marks, &changed);
  if (s.ok()) sent += changed;
  return s;
}

Status detail::OutboxImpl::mark_dead(const OutboxMark& row, OutboxDeadReason reason,
                                     int reason_code, const std::string& text) {
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::mark_dead"); !r.ok()) return r;
  bool changed = false;
  Status s = rows->mark_dead(row, reason, reason_code, text, &changed);
  if (s.ok() && changed) {
    ++dead;
    // A reason code only where a PUBACK gave one (as `mqtt-inbox outbox list` shows it).
    if (reason == OutboxDeadReason::kRejectedByBroker)
      log->warn("outbox: row {} is an outbox dead letter: {} (reason code 0x{:02x}): {}", row.seq,
                to_string(reason), reason_code, detail::printable(text));
    else
      log->warn("outbox: row {} is an outbox dead letter: {}: {}", row.seq, to_string(reason),
                detail::printable(text));
  }
  return s;
}

uint64_t detail::OutboxImpl::add_commit_waker(std::function<void()> wake) {
  return rows->add_commit_waker(std::move(wake));
}

void detail::OutboxImpl::remove_commit_waker(uint64_t id) { rows->remove_commit_waker(id); }

OutboxCounters detail::OutboxImpl::counters() const {
  OutboxCounters c;
  c.enqueued = enqueued.load();
  c.duplicates = duplicates.load();
  c.rejected = rejected.load();
  c.dropped = dropped.load();
  c.sent = sent.load();
  c.dead = dead.load();
  return c;
}

}  // namespace mqtt_inbox

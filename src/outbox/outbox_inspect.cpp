// The transactional outbox's inspection and repair (outbox.h): list, usage, summary, get,
// replay_dead and purge, on the Inbox's connection under its mutex (Outbox::Impl::on_inbox).
// What the relay and the enqueuers use is in outbox/outbox.cpp.
#include <SQLiteCpp/SQLiteCpp.h>
#include <sqlite3.h>

#include <algorithm>
#include <string>
#include <vector>

#include "util/log.h"
#include "mqtt_inbox/outbox.h"
#include "outbox/outbox_impl.h"

namespace mqtt_inbox {

Status Outbox::list(OutboxState state, int limit, std::vector<OutboxRow>* out) {
  out->clear();
  if (limit <= 0) return Status::InvalidArgument("list: limit must be > 0");
  auto& in = detail::sqlite_store(impl_->inbox);
  auto& db = *in.db;
  return impl_->on_inbox("Outbox::list", /*relaxed_sync=*/false, [&] {
    out->clear();
    const int64_t clock_now = in.retention_clock();
    // The state as a literal, so the query can use that state's partial index.
    SQLite::Statement q(db, std::string("SELECT ") + detail::kOutboxRowColumns +
                                " FROM outbox_messages WHERE state = '" + to_string(state) +
                                "' ORDER BY seq LIMIT ?");
    q.bind(1, limit);
    while (q.executeStep()) out->push_back(detail::read_outbox_row(q, clock_now));
  });
}

Status Outbox::usage(std::vector<OutboxClassUsage>* out) {
  out->clear();
  auto& db = *detail::sqlite_store(impl_->inbox).db;
  return impl_->on_inbox("Outbox::usage", /*relaxed_sync=*/false, [&] {
    out->clear();
    SQLite::Statement q(db, "SELECT class, rows, bytes, dropped FROM outbox_usage ORDER BY class");
    while (q.executeStep())
      out->push_back({q.getColumn(0).getString(), q.getColumn(1).getInt64(),
                      q.getColumn(2).getInt64(), q.getColumn(3).getInt64()});
  });
}

Status Outbox::summary(OutboxSummary* out) {
  *out = OutboxSummary{};
  auto& in = detail::sqlite_store(impl_->inbox);
  auto& db = *in.db;
  return impl_->on_inbox("Outbox::summary", /*relaxed_sync=*/false, [&] {
    out->classes.clear();
    SQLite::Statement u(db, "SELECT class, rows, bytes, dropped FROM outbox_usage ORDER BY class");
    while (u.executeStep())
      out->classes.push_back({u.getColumn(0).getString(), u.getColumn(1).getInt64(),
                              u.getColumn(2).getInt64(), u.getColumn(3).getInt64()});
    // Each count is answered from that state's partial index, never from a scan of the
    // payloads.
    SQLite::Statement q(db,
                        "SELECT (SELECT count(*) FROM outbox_messages WHERE state = 'pending'),"
                        " (SELECT count(*) FROM outbox_messages WHERE state = 'sent'),"
                        " (SELECT count(*) FROM outbox_messages WHERE state = 'dead'),"
                        " (SELECT enqueued_at FROM outbox_messages WHERE state = 'pending'"
                        "  ORDER BY seq LIMIT 1),"
                        " (SELECT enqueued_clock FROM outbox_messages WHERE state = 'pending'"
                        "  ORDER BY seq LIMIT 1)");
    if (q.executeStep()) {
      out->pending_rows = q.getColumn(0).getInt64();
      out->sent_rows = q.getColumn(1).getInt64();
      out->dead_rows = q.getColumn(2).getInt64();
      out->oldest_pending_enqueued_at_ms = q.getColumn(3).isNull() ? 0 : q.getColumn(3).getInt64();
      if (!q.getColumn(4).isNull())
        out->oldest_pending_waited_ms =
            std::max<int64_t>(0, in.retention_clock() - q.getColumn(4).getInt64());
    }
    out->pending_bytes = 0;
    for (const auto& c : out->classes) out->pending_bytes += c.bytes;
  });
}

Status Outbox::get(const std::string& message_id, OutboxRow* out) {
  auto& in = detail::sqlite_store(impl_->inbox);
  auto& db = *in.db;
  bool found = false;
  Status s = impl_->on_inbox("Outbox::get", /*relaxed_sync=*/false, [&] {
    const int64_t clock_now = in.retention_clock();
    SQLite::Statement q(db, std::string("SELECT ") + detail::kOutboxRowColumns +
                                " FROM outbox_messages WHERE message_id = ?");
    q.bind(1, message_id);
    found = q.executeStep();
    if (found) *out = detail::read_outbox_row(q, clock_now);
  });
  if (s.ok() && !found)
    return Status(Status::Code::kNotFound,
                  "no outbox message with id '" + detail::printable(message_id) + "'");
  return s;
}

Status Outbox::replay_dead(const std::string& message_id) {
  auto& in = detail::sqlite_store(impl_->inbox);
  std::string state;  // "" = no such row
  int64_t new_seq = 0;
  Status s = impl_->on_inbox("Outbox::replay_dead", /*relaxed_sync=*/false, [&] {
    state.clear();
    SQLite::Statement q(*in.db, "SELECT state FROM outbox_messages WHERE message_id = ?");
    q.bind(1, message_id);
    if (!q.executeStep()) return;
    state = q.getColumn(0).getString();
    q.tryReset();
    if (state != "dead") return;
    // A new seq: the row is read, deleted and inserted again (message_id is UNIQUE).
    // AUTOINCREMENT never hands out a seq used before, so the relay cannot skip it. The
    // triggers count the pending row in its class again; the dead one counted nowhere.
    SQLite::Statement read(*in.db,
                           "SELECT ordering_key, class, topic, payload, properties, size_bytes, "
                           "enqueued_at FROM outbox_messages WHERE message_id = ?");
    read.bind(1, message_id);
    read.executeStep();
    const std::string key = read.getColumn(0).getString(), cls = read.getColumn(1).getString(),
                      topic = read.getColumn(2).getString(),
                      payload = read.getColumn(3).getString(),
                      props = read.getColumn(4).getString();
    const int64_t size = read.getColumn(5).getInt64(), enqueued_at = read.getColumn(6).getInt64();
    read.tryReset();
    SQLite::Statement del(*in.db, "DELETE FROM outbox_messages WHERE message_id = ?");
    del.bind(1, message_id);
    del.exec();
    SQLite::Statement ins(*in.db,
                          "INSERT INTO outbox_messages (message_id, ordering_key, class, topic, "
                          "payload, properties, qos, size_bytes, enqueued_at, "
                          "enqueued_clock) VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?)");
    ins.bind(1, message_id);
    ins.bind(2, key);
    ins.bind(3, cls);
    ins.bind(4, topic);
    ins.bind(5, payload.data(), static_cast<int>(payload.size()));
    ins.bind(6, props);
    ins.bind(7, size);
    ins.bind(8, enqueued_at);
    ins.bind(9, in.retention_clock());  // a replay starts its age bound afresh
    ins.exec();
    in.commit_wake->arm(in.db->getHandle());  // a running relay sends it after the commit
    new_seq = sqlite3_last_insert_rowid(in.db->getHandle());
  });
  if (!s.ok()) return s;
  if (state.empty())
    return Status(Status::Code::kNotFound,
                  "no outbox message with id '" + detail::printable(message_id) + "'");
  if (state != "dead")
    return Status::InvalidArgument("outbox message '" + detail::printable(message_id) + "' is " +
                                   state + ", not dead: only an outbox dead letter is replayed");
  impl_->log->info("outbox: dead letter '{}' replayed: pending again as row {}",
                   detail::printable(message_id), new_seq);
  return s;
}

Status Outbox::purge(const OutboxPurgeFilter& f, int64_t* removed) {
  if (removed) *removed = 0;
  if (f.state == OutboxState::kPending)
    return Status::InvalidArgument(
        "outbox purge: pending rows are never purged (they are messages not yet delivered)");
  auto& db = *detail::sqlite_store(impl_->inbox).db;
  int64_t n = 0;
  Status s = impl_->on_inbox("Outbox::purge", /*relaxed_sync=*/false, [&] {
    const bool dead = f.state == OutboxState::kDead;
    std::string sql = std::string("DELETE FROM outbox_messages WHERE state = '") +
                      (dead ? "dead" : "sent") + "'";
    if (f.message_id) sql += " AND message_id = :id";
    if (f.before_ms) sql += dead ? " AND dead_at < :before" : " AND sent_at < :before";
    SQLite::Statement q(db, sql);
    if (f.message_id) q.bind(":id", *f.message_id);
    if (f.before_ms) q.bind(":before", *f.before_ms);
    n = q.exec();
  });
  if (s.ok()) {
    if (removed) *removed = n;
    if (n > 0) impl_->log->info("outbox: {} {} row(s) purged", n, to_string(f.state));
  }
  return s;
}

}  // namespace mqtt_inbox

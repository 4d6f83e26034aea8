// The transactional outbox's inspection and repair (outbox.h): list, usage, summary, get,
// replay_dead and purge, on the store's connection (store/outbox_rows.h). This keeps what
// the store does not decide: the re-entry checks, the arguments refused, what a replay or
// a purge logs. What the enqueuers and the relay use is in outbox/outbox.cpp.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mqtt_inbox/outbox.h"
#include "outbox/outbox_impl.h"
#include "store/outbox_rows.h"
#include "store/reentry.h"
#include "util/log.h"
#include "util/text.h"

namespace mqtt_inbox {

Status detail::OutboxImpl::list(OutboxState state, int limit, std::vector<OutboxRow>* out) {
  out->clear();
  if (limit <= 0) return Status::InvalidArgument("list: limit must be > 0");
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::list"); !r.ok()) return r;
  std::vector<detail::StoredOutboxRow> stored;
  Status s = rows->list(state, limit, &stored);
  if (s.ok()) detail::to_outbox_rows(std::move(stored), out);
  return s;
}

Status detail::OutboxImpl::usage(std::vector<OutboxClassUsage>* out) {
  out->clear();
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::usage"); !r.ok()) return r;
  return rows->usage(out);
}

Status detail::OutboxImpl::summary(OutboxSummary* out) {
  *out = OutboxSummary{};
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::summary"); !r.ok()) return r;
  return rows->summary(out);
}

Status detail::OutboxImpl::get(const std::string& message_id, OutboxRow* out) {
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::get"); !r.ok()) return r;
  detail::StoredOutboxRow stored;
  bool found = false;
  Status s = rows->get(message_id, &stored, &found);
  if (s.ok() && !found)
    return Status(Status::Code::kNotFound,
                  "no outbox message with id '" + detail::printable(message_id) + "'");
  if (s.ok()) *out = detail::to_outbox_row(std::move(stored));
  return s;
}

Status detail::OutboxImpl::replay_dead(const std::string& message_id) {
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::replay_dead"); !r.ok()) return r;
  std::optional<OutboxState> state;  // nullopt = no such row
  int64_t new_seq = 0;
  Status s = rows->replay_dead(message_id, &state, &new_seq);
  if (!s.ok()) return s;
  if (!state)
    return Status(Status::Code::kNotFound,
                  "no outbox message with id '" + detail::printable(message_id) + "'");
  if (*state != OutboxState::kDead)
    return Status::InvalidArgument("outbox message '" + detail::printable(message_id) + "' is " +
                                   to_string(*state) +
                                   ", not dead: only an outbox dead letter is replayed");
  log->info("outbox: dead letter '{}' replayed: pending again as row {}",
            detail::printable(message_id), new_seq);
  return s;
}

Status detail::OutboxImpl::purge(const OutboxPurgeFilter& f, int64_t* removed) {
  if (removed) *removed = 0;
  if (f.state == OutboxState::kPending)
    return Status::InvalidArgument(
        "outbox purge: pending rows are never purged (they are messages not yet delivered)");
  if (Status r = detail::refuse_if_in_handler(inbox, "Outbox::purge"); !r.ok()) return r;
  int64_t n = 0;
  Status s = rows->purge(f, &n);
  if (s.ok()) {
    if (removed) *removed = n;
    if (n > 0) log->info("outbox: {} {} row(s) purged", n, to_string(f.state));
  }
  return s;
}

}  // namespace mqtt_inbox

// The public Inbox's calls (inbox.h) over the Store front: the same on every store.
#include "store/inbox.h"

#include <utility>

#include "store/reentry.h"

namespace mqtt_inbox {

Inbox::~Inbox() = default;

Status Inbox::open(const std::string& location, const InboxOptions& options,
                   std::unique_ptr<Inbox>* out) {
  std::unique_ptr<detail::Store> store;
  if (Status s = detail::Store::open(location, options, &store); !s.ok()) return s;
  out->reset(new detail::InboxImpl(std::move(store)));
  return Status::Ok();
}

namespace detail {

InboxImpl::InboxImpl(std::unique_ptr<Store> store) : store_(std::move(store)) {
  store_->set_owner(this);
}

InboxImpl::~InboxImpl() = default;

Store* InboxImpl::store_of(Inbox* inbox) {
  auto* impl = dynamic_cast<InboxImpl*>(inbox);
  return impl ? impl->store_.get() : nullptr;
}

const std::string& InboxImpl::path() const { return store_->location(); }

const InboxOptions& InboxImpl::options() const { return store_->options(); }

Status InboxImpl::setup_sql(const std::string& sql) { return store_->setup_sql(sql); }

Health InboxImpl::health() const { return store_->health(); }

int64_t InboxImpl::retention_clock_ms() const { return store_->retention_clock(); }

InboxStats InboxImpl::stats() const { return store_->stats(); }

Status InboxImpl::refresh_row_stats() { return store_->refresh_row_stats(); }

Status InboxImpl::list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) {
  if (Status r = refuse_if_in_handler(this, "Inbox::list_dead_letters"); !r.ok()) return r;
  return store_->list_dead_letters(filter, out);
}

Status InboxImpl::get_dead_letter(int64_t id, DeadLetter* out) {
  if (Status r = refuse_if_in_handler(this, "Inbox::get_dead_letter"); !r.ok()) return r;
  return store_->get_dead_letter(id, out);
}

Status InboxImpl::purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed) {
  if (Status r = refuse_if_in_handler(this, "Inbox::purge_dead_letters"); !r.ok()) return r;
  return store_->purge_dead_letters(filter, removed);
}

Status InboxImpl::requeue_dead_letter(int64_t id) {
  if (Status r = refuse_if_in_handler(this, "Inbox::requeue_dead_letter"); !r.ok()) return r;
  return store_->requeue_dead_letter(id);
}

SessionRecords& InboxImpl::sessions() const { return store_->sessions(); }

Status InboxImpl::setup_with(const std::type_info* type, std::function<void(const TxnRef&)> fn) {
  return store_->setup(type, fn);
}

void InboxImpl::with_connection_of(const std::type_info* type,
                                   const std::function<void(const TxnRef&)>& fn) {
  store_->with_connection(type, fn);
}

}  // namespace detail
}  // namespace mqtt_inbox

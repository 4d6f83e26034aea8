// InboxImpl: the public Inbox (inbox.h) as the library implements it, over the Store front
// (store/store.h). The library's parts made on an Inbox (Consumer, Outbox, Pruner,
// StoreThenProcess, Fleet) reach its store through InboxImpl::store_of.
//
// Thread safety: as Inbox.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "mqtt_inbox/inbox.h"
#include "store/store.h"

namespace mqtt_inbox::detail {

class InboxImpl final : public Inbox {
 public:
  explicit InboxImpl(std::unique_ptr<Store> store);
  ~InboxImpl() override;

  // The store behind `inbox`; null if `inbox` is null or not the library's (a class of
  // the application's derived from Inbox).
  static Store* store_of(Inbox* inbox);
  Store& store() const { return *store_; }

  const std::string& path() const override;
  const InboxOptions& options() const override;
  Status setup_sql(const std::string& sql) override;
  Health health() const override;
  int64_t retention_clock_ms() const override;
  InboxStats stats() const override;
  Status refresh_row_stats() override;
  Status list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) override;
  Status get_dead_letter(int64_t id, DeadLetter* out) override;
  Status purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed) override;
  Status requeue_dead_letter(int64_t id) override;
  SessionRecords& sessions() const override;

 private:
  Status setup_with(const std::type_info* type, std::function<void(const TxnRef&)> fn) override;
  void with_connection_of(const std::type_info* type,
                          const std::function<void(const TxnRef&)>& fn) override;

  std::unique_ptr<Store> store_;
};

}  // namespace mqtt_inbox::detail

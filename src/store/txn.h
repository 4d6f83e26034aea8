// Internal: the application's handler as the store-agnostic policy holds it. A handler is
// written for one kind of store: it takes that store's open transaction (SQLite: the
// inbox's SQLite::Database, inside BEGIN IMMEDIATE; PostgreSQL: the libpqxx transaction).
// The policy (the Consumer, store-then-process) never touches that transaction: the store
// opens it, wraps it in a Txn, and calls the StoreHandler with it; bind_handler() adapts
// the public, typed handler to that call in the one place that knows its type.
//
// Thread safety: a Txn lives on the stack of the thread that runs the transaction.
#pragma once

#include <functional>
#include <stdexcept>
#include <typeinfo>

#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/message.h"

namespace mqtt_inbox::detail {

// A store's open transaction, as a handler of that store's kind receives it.
class Txn {
 public:
  virtual ~Txn() = default;
  // The type a handler of this store takes (SQLite::Database, pqxx::transaction_base).
  virtual const std::type_info& handle_type() const = 0;
};

// The transaction of a store whose handlers take a `Handle&`.
template <typename Handle>
class TypedTxn final : public Txn {
 public:
  explicit TypedTxn(Handle& handle) : handle_(handle) {}
  const std::type_info& handle_type() const override { return typeid(Handle); }
  Handle& handle() const { return handle_; }

 private:
  Handle& handle_;
};

// The handler as the policy calls it: inside the store's transaction `txn`, with what the
// mode hands it: a Delivery (Consumer) or a StoredDelivery (store-then-process).
template <typename D>
using StoreHandlerOf = std::function<void(const Txn& txn, const D& delivery)>;
using StoreHandler = StoreHandlerOf<Delivery>;

template <typename T>
struct NotDeduced {
  using type = T;
};

// Adapts a handler written for a store whose transaction is a `Handle&` and that takes a
// `D` (bind_handler<SQLite::Database>(handler) for a Consumer's Handler,
// bind_handler<SQLite::Database, StoredDelivery>(...) for a StoredHandler). Called with a
// transaction of another kind (a handler bound for one store run by another: a bug of the
// library, not of the application) it throws std::logic_error, which fails the attempt.
template <typename Handle, typename D = Delivery>
StoreHandlerOf<D> bind_handler(
    std::function<void(Handle&, const typename NotDeduced<D>::type&)> handler) {
  return [h = std::move(handler)](const Txn& txn, const D& d) {
    if (txn.handle_type() != typeid(Handle))
      throw std::logic_error("handler bound for another kind of store");
    h(static_cast<const TypedTxn<Handle>&>(txn).handle(), d);
  };
}

// The public Handler (handler.h), a handler of the SQLite store, bound as above:
// bind_handler<SQLite::Database>, made in store/sqlite/claim.cpp where SQLite::Database is
// a complete type, so that the policy binds a handler without an SQLite header.
StoreHandler bind_sqlite_handler(Handler handler);

// Runs `fn` with `db` as the SQLite store's transaction, a TypedTxn<SQLite::Database> on
// the stack: how the public SQLite-typed calls (Outbox::enqueue, given a handler's
// connection) reach the store's interfaces (store/outbox_rows.h). Made in
// store/sqlite/outbox_rows.cpp, where SQLite::Database is complete; what `fn` throws
// passes through.
void with_sqlite_txn(SQLite::Database& db, const std::function<void(const Txn&)>& fn);

}  // namespace mqtt_inbox::detail

// Handler: the application's business change for one message, run by the library inside
// its own transaction on the inbox's store, right after the claim row was inserted.
// Everything the handler writes through the transaction it is given commits atomically
// with the claim, or not at all. A handler is a function of (T&, const Delivery&), where T
// is the store's transaction: SQLite::Database on an SQLite inbox (mqtt_inbox/sqlite.h:
// Handler), pqxx::transaction_base on a PostgreSQL one (mqtt_inbox/postgres.h: PgHandler).
// Give the handler to Consumer::create as a lambda or std::function; it becomes a
// TransactionHandler, and create() refuses one written for the other store. Rules, the
// same on every store (each store header adds its own notes):
//  - The library owns the transaction. Do not end it or try to: no BEGIN, COMMIT,
//    ROLLBACK or END, no commit() or abort() on the transaction object, no closing the
//    connection. Every store refuses it (SQLite at prepare time with SQLITE_AUTH;
//    PostgreSQL rolls everything back and refuses the rest), nothing of the handler's
//    work commits, and the message is dead-lettered at once as handler_ended_transaction
//    with the text "handler ended the transaction: it ran COMMIT" (or what it ran),
//    whatever the handler did with the error. SAVEPOINT, RELEASE and ROLLBACK TO of your
//    own are fine. A handler that returns normally after an error it did not report
//    rolled the transaction back or aborted it fails the attempt by the same name ("... it
//    was rolled back inside the handler"): retried, then handler_failed. The same holds for
//    a store-then-process handler (store_then_process.h).
//  - Finalize or reset every statement you prepare on the inbox's connection before
//    returning. A statement left stepped is reset by the library, with a warning naming
//    it (it would hold a read snapshot and stop checkpoints).
//  - Signal failure by throwing. Any exception rolls back the claim and the handler's
//    writes; the message is retried (ConsumerOptions::max_attempts) and then
//    dead-lettered as handler_failed. For input that can never succeed, throw one of the
//    two permanent failures below: the message is dead-lettered at once, without retries
//    or backoff, and acked, with what() as the dead letter's reason text:
//      UndecodablePayload  the bytes cannot be decoded (bad JSON, wrong types)
//                          -> reason undecodable_payload
//      RejectMessage       it decodes, but the application refuses its content (a value
//                          out of range, an unknown account) -> reason invalid_payload
//    A dependency of the handler's own that is down (a local service, a serial device,
//    another database) is not a failure of the message: throw RetryLater (below). The
//    message is rolled back and retried on the dependency schedule
//    (ConsumerOptions::dependency_*), no attempt counted, and dead-lettered as
//    dependency_unavailable only once the schedule is over.
//    The outbox throws a third for you: OutboxRefused (outbox.h), when an outgoing
//    message can never be enqueued (an id too long, a topic MQTT forbids, a message
//    larger than its class) -> reason outbox_refused. OutboxFull is not a failure.
//  - The store's own exceptions (SQLite::Exception, pqxx's) are judged by their code
//    (each store's one table, docs/api-guide.md#errors): a failure of
//    the store (busy, full, I/O, read only, a lost connection) is retried until the store
//    recovers and never counts as an attempt; a corrupt store stops the inbox without an
//    ack; anything else (a constraint, a syntax error) is a failed attempt.
//  - Keep it short and local: the PUBACK waits for the commit, and on SQLite the handler
//    holds the single write lock. External side effects (HTTP, e-mail, other brokers) are
//    outside the transaction and may repeat; give them their own idempotency key, or
//    publish through the outbox (outbox.h).
//  - It may run more than once for the same message (after a rollback or a crash); only
//    its committed effect is exactly-once.
//  - The transaction and `delivery` (and what delivery refers to) are valid only during
//    the call: copy what you keep (message.h, Delivery).
//  - Do not call back into the library for the inbox it runs for. While it runs, the
//    handler holds that inbox's connection, so such a call would wait for its own thread:
//    on Paho's callback thread a silent hang, no PUBACK, no log. The library detects the
//    call on the handler's thread and refuses it: every method of that Inbox, of its
//    SessionRecords, and of a Consumer, Pruner or StoreThenProcess made on it, that takes
//    the connection returns kInvalidArgument naming the call (Inbox::with_connection
//    throws std::logic_error; Consumer::handle and StoreThenProcess::handle return
//    kRefused and record nothing; Pruner::stop only asks its thread to stop, ~Pruner
//    joins it). The handler's own message is then dead-lettered at once as
//    handler_reentered, with the call in the reason text, whatever the handler did with
//    the refusal; the stream goes on with the next message. Calls that never wait stay
//    allowed: Inbox::path, options, retention_clock_ms, stats, health;
//    SessionRecords::note_lost; Consumer::name, health, counters, extract_message_id;
//    StoreThenProcess::name, health, counters; Pruner::required_window_ms. Instead of
//    the inbox's calls, read or write through the transaction the handler is given: it
//    sees the inbox's tables (inbox_processed, inbox_dead_letters, ...) inside the same
//    transaction. A PrepareFn (store_then_process.h) holds no connection and may call
//    anything.
#pragma once

#include <functional>
#include <stdexcept>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "mqtt_inbox/message.h"

namespace mqtt_inbox {

namespace detail {

// A store's transaction as a handler receives it: the address of the store's own object
// (an SQLite::Database, a pqxx::transaction_base) and the type of a pointer to it
// (typeid(T*): a handler's header may have declared T without defining it). Made by the
// library.
struct TxnRef {
  void* handle = nullptr;
  const std::type_info* type = nullptr;
};

// The parameters of a callable with one call operator: First and Second (void if absent).
template <typename F>
struct CallableParams : CallableParams<decltype(&F::operator())> {};
template <typename R, typename... A>
struct CallableParams<R (*)(A...)> : CallableParams<R(A...)> {};
template <typename C, typename R, typename... A>
struct CallableParams<R (C::*)(A...)> : CallableParams<R(A...)> {};
template <typename C, typename R, typename... A>
struct CallableParams<R (C::*)(A...) const> : CallableParams<R(A...)> {};
template <typename C, typename R, typename... A>
struct CallableParams<R (C::*)(A...) noexcept> : CallableParams<R(A...)> {};
template <typename C, typename R, typename... A>
struct CallableParams<R (C::*)(A...) const noexcept> : CallableParams<R(A...)> {};
template <typename R, typename A>
struct CallableParams<R(A)> {
  using First = A;
};
template <typename R, typename A, typename B>
struct CallableParams<R(A, B)> {
  using First = A;
  using Second = B;
};

// The object type a callable's first parameter refers to (SQLite::Database for a
// function of SQLite::Database&).
template <typename F>
using FirstParamObject =
    std::remove_cv_t<std::remove_reference_t<typename CallableParams<std::decay_t<F>>::First>>;

// Whether a callable is empty (a null std::function or function pointer).
template <typename F>
bool is_empty_callable(const F& f) {
  if constexpr (std::is_constructible_v<bool, const F&>)
    return !static_cast<bool>(f);
  else
    return false;
}

}  // namespace detail

// A handler bound to the type of transaction it takes: what Consumer::create and
// StoreThenProcess::create accept. Made implicitly from a function of (T&, const D&), a
// lambda (not a generic one: its first parameter names the store's type) or a
// std::function; T is the store's transaction type (mqtt_inbox/sqlite.h,
// mqtt_inbox/postgres.h). An empty std::function makes an empty handler. Thread safety: a
// value; the handler is called on the thread that runs the message.
template <typename D>
class TransactionHandlerOf {
 public:
  TransactionHandlerOf() = default;
  template <typename F,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, TransactionHandlerOf>>>
  TransactionHandlerOf(F fn) {  // NOLINT: implicit, so that a lambda can be given
    using T = detail::FirstParamObject<F>;
    static_assert(std::is_lvalue_reference_v<typename detail::CallableParams<F>::First>,
                  "a handler takes the store's transaction by reference: (T& txn, const D& d)");
    static_assert(std::is_invocable_v<F&, T&, const D&>,
                  "a handler is a function of (T& txn, const D& delivery)");
    if (detail::is_empty_callable(fn)) return;
    type_ = &typeid(T*);
    call_ = [f = std::move(fn)](const detail::TxnRef& txn, const D& d) mutable {
      f(*static_cast<T*>(txn.handle), d);
    };
  }

  explicit operator bool() const noexcept { return static_cast<bool>(call_); }
  // The type of a pointer to the transaction the handler takes (typeid(T*)); null for an
  // empty handler.
  const std::type_info* transaction_type() const noexcept { return type_; }
  // Runs it with the library's transaction `txn`, of transaction_type(). Internal.
  void operator()(const detail::TxnRef& txn, const D& d) const { call_(txn, d); }

 private:
  const std::type_info* type_ = nullptr;
  std::function<void(const detail::TxnRef&, const D&)> call_;
};

using TransactionHandler = TransactionHandlerOf<Delivery>;

// Throw from a handler when the payload can never be processed (bad JSON, wrong types).
// The message is dead-lettered at once as undecodable_payload with what() as the reason
// text.
class UndecodablePayload : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~UndecodablePayload() override;
};

// Throw from a handler when a well-formed message is invalid for the application and
// retrying cannot change that, e.g.
//   throw mqtt_inbox::RejectMessage("setpoint 95 C out of range 5..35");
// The handler's writes are rolled back and the message is dead-lettered at once (no
// retries, no backoff) as invalid_payload, with what() as the reason text, then acked.
// Works alike in Consumer mode and in store-then-process handlers and PrepareFns.
class RejectMessage : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~RejectMessage() override;
};

// Throw from a handler when the message cannot be applied *yet* because something the
// handler needs is down, and nothing is wrong with the message, e.g.
//   throw mqtt_inbox::RetryLater("meter gateway 10.0.0.7: connection refused");
// The handler's writes are rolled back and no attempt is counted (max_attempts is for
// failures). The message is run again on the dependency schedule (options.h,
// ConsumerOptions::dependency_*): dependency_immediate_attempts runs at the
// retry_backoff_* pace, then delays from dependency_backoff_initial doubling up to
// dependency_backoff_max, until dependency_wait_max has passed since its first "not yet";
// a "not yet" after that is the dead letter dependency_unavailable, with what() and the
// wait in its text. A run that fails or succeeds ends the wait.
//  - Consumer: the message stays unacked and the stream waits behind it (per-session
//    order holds; Paho's callback is held, docs/operations.md#waiting-for-a-dependency
//    says what that means for the connection). health() says "waiting for a dependency".
//  - StoreThenProcess: the row is rescheduled (its next_attempt_at), its aggregate's later
//    rows wait behind it, other aggregates go on, and nothing holds the session.
// Do not throw it for input that can never succeed (RejectMessage) or for a failure you
// want counted (any other exception).
class RetryLater : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~RetryLater() override;
};

}  // namespace mqtt_inbox

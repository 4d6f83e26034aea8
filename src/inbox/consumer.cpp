// The per-message policy: what happens to one delivery between "arrived" and "may be
// acked". Every path out of run() has a durable record behind it. It holds the store's
// front (store/store.h), which makes the claim decision, and the handler bound to the
// store's transaction type (handler.h), never a store's own type.
#include "mqtt_inbox/consumer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "inbox/message_id.h"
#include "inbox/properties_json.h"
#include "inbox/retained.h"
#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/inbox.h"
#include "store/claims.h"
#include "store/inbox.h"
#include "store/lifetime.h"
#include "store/reentry.h"
#include "store/retry.h"
#include "store/store.h"
#include "util/log.h"
#include "util/log_context.h"
#include "util/text.h"

namespace mqtt_inbox {

using detail::ClaimResult;
using detail::MessageState;
using detail::ProcessReport;

const char* to_string(Outcome outcome) {
  switch (outcome) {
    case Outcome::kProcessed:
      return "processed";
    case Outcome::kDuplicate:
      return "duplicate";
    case Outcome::kDeadLettered:
      return "dead_lettered";
    case Outcome::kAlreadyDeadLettered:
      return "already_dead_lettered";
    case Outcome::kSkipped:
      return "skipped";
    case Outcome::kRefused:
      return "refused";
  }
  return "unknown";
}

const char* to_string(DeadLetterReason reason) {
  switch (reason) {
    case DeadLetterReason::kMissingId:
      return "missing_id";
    case DeadLetterReason::kInvalidId:
      return "invalid_id";
    case DeadLetterReason::kPayloadTooLarge:
      return "payload_too_large";
    case DeadLetterReason::kUndecodablePayload:
      return "undecodable_payload";
    case DeadLetterReason::kInvalidPayload:
      return "invalid_payload";
    case DeadLetterReason::kHandlerFailed:
      return "handler_failed";
    case DeadLetterReason::kHandlerCrashed:
      return "handler_crashed";
    case DeadLetterReason::kRetained:
      return "retained";
    case DeadLetterReason::kHandlerReentered:
      return "handler_reentered";
    case DeadLetterReason::kOutboxFull:
      return "outbox_full";
    case DeadLetterReason::kOutboxRefused:
      return "outbox_refused";
    case DeadLetterReason::kHandlerEndedTransaction:
      return "handler_ended_transaction";
    case DeadLetterReason::kExpired:
      return "expired";
    case DeadLetterReason::kDependencyUnavailable:
      return "dependency_unavailable";
  }
  return "unknown";
}

bool parse_dead_letter_reason(const std::string& text, DeadLetterReason* out) {
  for (auto r : kDeadLetterReasons) {
    if (text == to_string(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

struct Consumer::Impl {
  detail::Store* store = nullptr;
  SessionRecords* sessions = nullptr;  // the Inbox's (MessageSink::sessions())
  std::string name;
  TransactionHandler handler;  // the application's, for the store's transaction
  ConsumerOptions options;
  Clock* clock = nullptr;
  std::shared_ptr<spdlog::logger> log;

  // Counters: guarded by their own mutex, never held across I/O, so readers never wait
  // for the store or the handler. Health lives in `retry`, under the same rule.
  mutable std::mutex state_mu;
  ConsumerCounters counters;
  std::unique_ptr<detail::StoreRetry> retry;

  // The requeue thread (ConsumerOptions::requeue_poll_ms): replays dead letters the admin
  // tool marked 'requeued'. `stopping` also makes its store waits give up.
  std::atomic<bool> stopping{false};
  std::mutex poll_mu;  // pairs with poll_cv; guards nothing else
  std::condition_variable poll_cv;
  std::thread poller;

  // Messages held for a dependency (RetryLater) right now, one per run() that waits: what
  // health().dependency shows (the longest). Under state_mu. Times on the retention clock.
  struct Held {
    std::string message_id;
    int runs = 0;          // runs that said "not yet" so far
    int64_t since = 0;     // the first of them
    int64_t next_run = 0;  // when the next run starts
    std::string reason;    // what the last one said
  };
  std::map<uint64_t, Held> held;
  uint64_t next_held = 0;

  void count(int64_t ConsumerCounters::*field) {
    std::lock_guard<std::mutex> lock(state_mu);
    ++(counters.*field);
  }
  // Set when this thread's last run() parked its message: replay_requeued() reads it for
  // the replay it just ran (a counter would also count the transport thread's parks).
  static bool& parked_by_this_thread() {
    thread_local bool parked = false;
    return parked;
  }

  // `parked`: the row is written 'requeued' (reason outbox_full): the requeue thread
  // replays it, with nobody asking (dead_letter.h kOutboxFull).
  Outcome dead_letter(const Message& m, const std::optional<std::string>& id,
                      DeadLetterReason reason, const std::string& text, int attempts,
                      int64_t first_attempt_ms, std::optional<int64_t> replace_id,
                      const std::atomic<bool>* stop = nullptr, bool parked = false) {
    DeadLetter dl;
    dl.consumer_name = name;
    dl.message_id = id;
    dl.topic = m.topic;
    // A parked message is replayed from this row, so it keeps every byte (at most
    // max_payload_bytes: a larger one was dead-lettered before its handler ran).
    dl.payload = parked ? m.payload : m.payload.substr(0, options.dead_letter_payload_bytes);
    dl.payload_size = static_cast<int64_t>(m.payload.size());
    dl.properties_json = detail::properties_json(m);
    dl.qos = m.qos;
    dl.reason = reason;
    dl.reason_text = text;
    dl.attempts = attempts;
    dl.first_attempt_at_ms = first_attempt_ms;
    dl.last_attempt_at_ms = clock->wall_ms();
    dl.requeued = parked;
    int64_t row = 0;
    until_stored(
        parked ? "parking a message" : "writing a dead letter",
        [&] { return store->add_dead_letter(dl, replace_id, &row); }, stop);
    if (parked) {
      // Once at info; a replay that finds the outbox still full (every poll, for as long
      // as the uplink is down) at debug.
      count(&ConsumerCounters::outbox_full_parked);
      parked_by_this_thread() = true;
      log->log(replace_id ? spdlog::level::debug : spdlog::level::info,
               "consumer '{}': parked message '{}' (row {}) until the relay makes room: {}", name,
               id ? detail::printable(*id) : std::string("<no id>"), row,
               detail::printable(text, 300));
      return Outcome::kDeadLettered;
    }
    count(&ConsumerCounters::dead_lettered);
    log->warn("consumer '{}': dead-lettered message '{}' on topic '{}' as {} (row {}): {}", name,
              id ? detail::printable(*id) : std::string("<no id>"), detail::printable(m.topic),
              to_string(reason), row, detail::printable(text, 300));
    return Outcome::kDeadLettered;
  }

  // While the store fails, the message has no durable outcome, so the caller must not
  // return (that would release the PUBACK): see detail::StoreRetry.
  template <typename Op>
  void until_stored(const char* what, Op&& op, const std::atomic<bool>* stop = nullptr) {
    retry->until_stored(what, std::forward<Op>(op), stop);
  }

  // A retained message under RetainedPolicy kSkip or kDeadLetter (defined below).
  Outcome retained(const Message& m);

  // A redelivery of an id that is already a dead letter: counted on that row, not run.
  Outcome already_dead_lettered(const std::string& id, const std::atomic<bool>* stop = nullptr) {
    int64_t row = 0;
    DeadLetter bump;
    bump.consumer_name = name;
    bump.message_id = id;
    until_stored(
        "counting a redelivery", [&] { return store->add_dead_letter(bump, std::nullopt, &row); },
        stop);
    count(&ConsumerCounters::already_dead_lettered);
    return Outcome::kAlreadyDeadLettered;
  }

  // Sleeps `ms` on the store's clock. With `stop` (the requeue thread), in slices, giving
  // up like a store wait (StoreRetry::Stopped) once it is set: ~Consumer does not wait
  // out a dependency's delay.
  void pause(int64_t ms, const std::atomic<bool>* stop) {
    if (!stop) return clock->sleep_ms(ms);
    for (int64_t left = ms; left > 0; left -= 100) {
      if (stop->load()) throw detail::StoreRetry::Stopped{};
      clock->sleep_ms(std::min<int64_t>(left, 100));
    }
  }

  // One message's wait for a dependency (the handler's RetryLater): its schedule
  // (store/lifetime.h), its entry in `held` for health(), and its log lines: a warning
  // when it begins, a line per delayed run, one when it ends. Ends with the run() it
  // belongs to.
  class HeldWait {
   public:
    HeldWait(Impl& c, const std::string& id) : c_(c), id_(id) {}
    ~HeldWait() { forget(); }
    HeldWait(const HeldWait&) = delete;
    HeldWait& operator=(const HeldWait&) = delete;

    // The handler said "not yet" (`why`): the delay before the next run, ms, or -1 when the
    // schedule is over.
    int64_t not_yet(const std::string& why) {
      const int64_t now = c_.store->retention_clock();
      if (runs_++ == 0) {
        since_ = now;
        first_wall_ms_ = c_.clock->wall_ms();
      }
      const int64_t delay = detail::not_yet_delay_ms(c_.options, runs_, since_, now);
      if (delay < 0) {
        forget();
        return delay;
      }
      {
        std::lock_guard<std::mutex> lock(c_.state_mu);
        if (!slot_) {
          slot_ = c_.next_held++;
          c_.held[*slot_].message_id = id_;
        }
        Held& h = c_.held[*slot_];
        h.runs = runs_;
        h.since = since_;
        h.next_run = now + delay;
        h.reason = why;
      }
      const std::string text = detail::printable(why, 300);
      if (runs_ == 1)
        c_.log->warn(
            "consumer '{}': message '{}' waits for a dependency: the handler said \"not yet\" "
            "({}); held unacked, next run in {} ms, dead letter dependency_unavailable after "
            "{}",
            c_.name, detail::printable(id_), text, delay,
            detail::duration_text(c_.options.dependency_wait_max.count()));
      else
        c_.log->log(runs_ <= c_.options.dependency_immediate_attempts ? spdlog::level::debug
                                                                      : spdlog::level::info,
                    "consumer '{}': message '{}' still waits for a dependency ({}, run {}): "
                    "{}; next run in {} ms",
                    c_.name, detail::printable(id_), detail::duration_text(now - since_), runs_,
                    text, delay);
      return delay;
    }

    // A run that did not say "not yet" ends the wait.
    void end(ClaimResult result) {
      if (runs_ == 0) return;
      c_.log->info(
          "consumer '{}': message '{}' no longer waits for a dependency after {} and {} "
          "\"not yet\" run(s): {}",
          c_.name, detail::printable(id_), detail::duration_text(waited()), runs_,
          result == ClaimResult::kProcessed ? "applied" : "the wait ends");
      forget();
      runs_ = 0;
    }

    int runs() const { return runs_; }
    int64_t waited() const { return c_.store->retention_clock() - since_; }
    int64_t first_wall_ms() const { return first_wall_ms_; }

   private:
    void forget() {
      if (!slot_) return;
      std::lock_guard<std::mutex> lock(c_.state_mu);
      c_.held.erase(*slot_);
      slot_.reset();
    }

    Impl& c_;
    const std::string& id_;
    int runs_ = 0;
    int64_t since_ = 0, first_wall_ms_ = 0;
    std::optional<uint64_t> slot_;
  };

  // `stop`: set for the requeue thread only, which may give up while the store fails
  // (StoreRetry::Stopped); a transport's caller never does. `id_out`, if set, receives
  // the message id once it is extracted (handle()'s debug line).
  // `received_at`: when the transport handed the message over (retention clock), from
  // which its expiry counts; none for a replay (the operator decides, never expired).
  Outcome run(const Message& m, std::optional<int64_t> replay_of,
              const std::atomic<bool>* stop = nullptr, std::string* id_out = nullptr,
              std::optional<int64_t> received_at = std::nullopt) {
    detail::LogContextScope log_fields(name);  // CONSUMER= (and below the id) in the journal
    if (m.retain && !replay_of && options.retained != RetainedPolicy::kProcess) return retained(m);
    if (m.payload.size() > options.max_payload_bytes) {
      // Only the user property is consulted: parsing an oversized payload is what the
      // limit exists to avoid. With an id, a redelivery finds this dead letter again.
      std::optional<std::string> id;
      if (const std::string* v = m.user_property(options.message_id.user_property))
        if (detail::validate_message_id(*v, options.message_id.max_id_bytes).empty()) id = *v;
      if (id && !replay_of) {
        MessageState st;
        until_stored(
            "looking up a message", [&] { return store->lookup(name, *id, &st); }, stop);
        if (st.processed) return duplicate();
      }
      return dead_letter(m, id, DeadLetterReason::kPayloadTooLarge,
                         "payload is " + std::to_string(m.payload.size()) + " bytes, limit is " +
                             std::to_string(options.max_payload_bytes),
                         0, 0, replay_of, stop);
    }

    std::string id;
    DeadLetterReason reason;
    std::string why;
    // The id's JSON source parses the payload for the handler too (Delivery::payload_json).
    nlohmann::json document;
    if (!detail::extract_message_id(m, options.message_id, &id, &reason, &why, &document))
      return dead_letter(m, std::nullopt, reason, why, 0, 0, replay_of, stop);
    const nlohmann::json* payload_json = document.is_discarded() ? nullptr : &document;
    log_fields.set_message_id(id);
    if (id_out) *id_out = id;

    // The message's lifetime (store/lifetime.h): its expiry, and a wait for a dependency.
    const std::optional<detail::Expiry> expiry =
        received_at ? detail::expiry_of(m, options.expired, *received_at) : std::nullopt;
    HeldWait wait(*this, id);
    int64_t backoff = options.retry_backoff_initial.count();
    for (;;) {
      // One transaction decides and applies: duplicate, dead-lettered, out of attempts,
      // expired, or the handler's outcome (Store::process, store/claims.cpp).
      ProcessReport r;
      until_stored(
          "committing",
          [&] {
            return store->process(name, m, id, handler, options.max_attempts, replay_of,
                                  payload_json, expiry ? &*expiry : nullptr, &r);
          },
          stop);
      const MessageState& st = r.state;
      if (r.result != ClaimResult::kNotYet) wait.end(r.result);
      switch (r.result) {
        case ClaimResult::kProcessed:
          count(&ConsumerCounters::processed);
          return Outcome::kProcessed;
        case ClaimResult::kDuplicate:
          return duplicate();
        case ClaimResult::kDeadLettered:
          return already_dead_lettered(id, stop);
        case ClaimResult::kAttemptsExhausted: {
          // Attempts were used up without a recorded outcome. A 'running' last attempt
          // means the process died inside the handler: do not run it again.
          const DeadLetterReason cause = st.last_attempt_running ? DeadLetterReason::kHandlerCrashed
                                                                 : DeadLetterReason::kHandlerFailed;
          const std::string text = st.last_attempt_running
                                       ? "the process died inside the handler on " +
                                             std::to_string(st.attempts) + " attempt(s)"
                                       : "handler failed " + std::to_string(st.attempts) +
                                             " time(s); last error: " + st.last_error;
          return dead_letter(m, id, cause, text, st.attempts, st.first_attempt_at_ms, replay_of,
                             stop);
        }
        case ClaimResult::kDeadLetterNow:
          // Permanent: retrying cannot change the outcome, so no backoff holds the stream.
          return dead_letter(m, id, r.reason, r.handler_error, r.attempt, st.first_attempt_at_ms,
                             replay_of, stop);
        case ClaimResult::kOutboxFull:
          // Backpressure, not a failure: parked with no attempt counted, replayed by the
          // requeue thread once the relay has made room (outbox.h OutboxFull).
          return dead_letter(m, id, DeadLetterReason::kOutboxFull, r.handler_error, 0,
                             st.first_attempt_at_ms, replay_of, stop, /*parked=*/true);
        case ClaimResult::kExpired:
          // Honour the producer: never applied (ConsumerOptions::expired).
          count(&ConsumerCounters::expired);
          return dead_letter(m, id, DeadLetterReason::kExpired, r.handler_error, st.attempts,
                             st.first_attempt_at_ms, replay_of, stop);
        case ClaimResult::kNotYet: {
          // A dependency of the handler's is down: not the message's fault, no attempt.
          // It is held (unacked, the stream behind it) and run again on the schedule.
          count(&ConsumerCounters::not_yet);
          const int64_t delay = wait.not_yet(r.handler_error);
          if (delay < 0)
            return dead_letter(
                m, id, DeadLetterReason::kDependencyUnavailable,
                detail::dependency_unavailable_text(wait.runs(), wait.waited(), r.handler_error),
                wait.runs(), wait.first_wall_ms(), replay_of, stop);
          pause(delay, stop);
          continue;
        }
        case ClaimResult::kHandlerFailed:
          break;
      }
      count(&ConsumerCounters::handler_failures);
      log->warn("consumer '{}': handler failed on message '{}' (attempt {}/{}): {}", name,
                detail::printable(id), r.attempt, options.max_attempts,
                detail::printable(r.handler_error, 300));
      if (r.attempt >= options.max_attempts)
        return dead_letter(m, id, DeadLetterReason::kHandlerFailed, r.handler_error, r.attempt,
                           st.first_attempt_at_ms, replay_of, stop);
      clock->sleep_ms(backoff);
      backoff = std::min<int64_t>(backoff * 2, options.retry_backoff_max.count());
    }
  }

  // Replays one dead letter by id, as Consumer::replay_dead_letter does. `stop` as for run().
  // `requeued_only`: only a row still 'requeued' (another caller may have replayed it).
  Status replay(int64_t id, Outcome* outcome, const std::atomic<bool>* stop,
                bool requeued_only = false) {
    DeadLetter dl;
    Status s = store->get_dead_letter(id, &dl);
    if (!s.ok()) return s;
    if (requeued_only && !dl.requeued)
      return Status::InvalidArgument("dead letter " + std::to_string(id) +
                                     " is no longer requeued");
    if (dl.consumer_name != name)
      return Status::InvalidArgument("dead letter " + std::to_string(id) +
                                     " belongs to consumer '" + dl.consumer_name + "', not '" +
                                     name + "'");
    if (dl.replayed)
      return Status::InvalidArgument("dead letter " + std::to_string(id) + " was already replayed");
    if (dl.payload_size > static_cast<int64_t>(dl.payload.size()))
      return Status::InvalidArgument("dead letter " + std::to_string(id) +
                                     " holds a cut payload; it cannot be replayed");
    *outcome = run(detail::message_from_dead_letter(dl), id, stop);
    return Status::Ok();
  }

  Status replay_requeued(int64_t* replayed) {
    int64_t n = 0;
    std::vector<int64_t> ids;
    std::set<int64_t> refused;  // ids replay() refused in this pass
    for (;;) {
      Status s = store->requeued_dead_letters(name, 16, &ids);
      if (s.ok())
        ids.erase(std::remove_if(ids.begin(), ids.end(),
                                 [&](int64_t id) { return refused.count(id) > 0; }),
                  ids.end());
      if (!s.ok() || ids.empty()) {
        if (replayed) *replayed = n;
        return s;
      }
      for (int64_t id : ids) {
        if (stopping.load()) {
          if (replayed) *replayed = n;
          return Status::Aborted("the consumer is stopping");
        }
        Outcome o = Outcome::kProcessed;
        parked_by_this_thread() = false;
        try {
          s = replay(id, &o, &stopping, true);
        } catch (const detail::StoreRetry::Stopped&) {
          if (replayed) *replayed = n;
          return Status::Aborted("the consumer is stopping; dead letter " + std::to_string(id) +
                                 " stays requeued");
        }
        if (!s.ok()) {
          // Gone (purged) or changed since it was listed: nothing to replay. A row that
          // stays 'requeued' and is refused every time is skipped for the rest of the pass.
          log->warn("consumer '{}': requeued dead letter {} not replayed: {}", name, id,
                    s.to_string());
          refused.insert(id);
          continue;
        }
        if (parked_by_this_thread()) {
          // Parked again: the outbox is still full, and so it is for the rows after this
          // one. They wait for the next poll, in their order (row ids), instead of each
          // running its handler in vain.
          if (replayed) *replayed = n;
          return Status::Ok();
        }
        ++n;
        log->info("consumer '{}': requeued dead letter {} replayed: {}", name, id, to_string(o));
      }
    }
  }

  void poll_requeued() {
    const auto period = std::chrono::milliseconds(options.requeue_poll_ms);
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(poll_mu);
        if (poll_cv.wait_for(lock, period, [&] { return stopping.load(); })) return;
      }
      const Status s = replay_requeued(nullptr);
      if (!s.ok() && s.code() != Status::Code::kAborted)
        log->warn("consumer '{}': looking for requeued dead letters failed: {}", name,
                  s.to_string());
    }
  }

  Outcome duplicate() {
    count(&ConsumerCounters::duplicates);
    return Outcome::kDuplicate;
  }
};

Consumer::Consumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Consumer::~Consumer() {
  {
    std::lock_guard<std::mutex> lock(impl_->poll_mu);
    impl_->stopping = true;
  }
  impl_->poll_cv.notify_all();
  if (impl_->poller.joinable()) impl_->poller.join();
}

Status Consumer::create(Inbox* inbox, const std::string& name, TransactionHandler handler,
                        const ConsumerOptions& options, std::unique_ptr<Consumer>* out) {
  detail::Store* store = detail::InboxImpl::store_of(inbox);
  if (!store) return Status::InvalidArgument("inbox is null");
  if (!handler) return Status::InvalidArgument("handler is empty");
  // A handler written for the other store is refused by name (handler.h).
  if (Status s = store->check_handler_type(handler.transaction_type(), "the consumer's handler");
      !s.ok())
    return s;
  if (name.empty() || name.size() > 200 || !detail::is_valid_utf8(name))
    return Status::InvalidArgument("consumer name must be 1..200 bytes of UTF-8");
  if (!handler) return Status::InvalidArgument("handler is empty");
  if (options.max_attempts < 1) return Status::InvalidArgument("max_attempts must be >= 1");
  if (options.message_id.max_id_bytes < 1)
    return Status::InvalidArgument("message_id.max_id_bytes must be >= 1");
  if (options.message_id.user_property.empty() && options.message_id.json_field.empty() &&
      !options.message_id.extractor)
    return Status::InvalidArgument("no message id source configured");
  if (options.retry_backoff_initial.count() < 0 ||
      options.retry_backoff_max < options.retry_backoff_initial ||
      options.store_backoff_initial.count() < 1 ||
      options.store_backoff_max < options.store_backoff_initial)
    return Status::InvalidArgument("backoff: need 0 <= initial <= max (store initial >= 1 ms)");
  if (options.requeue_poll_ms < 0) return Status::InvalidArgument("requeue_poll_ms must be >= 0");
  if (Status s = detail::check_lifetime_options(options); !s.ok()) return s;

  store->name_user(name);
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  impl->sessions = &inbox->sessions();
  impl->name = name;
  impl->handler = std::move(handler);
  impl->options = options;
  impl->clock = store->clock();
  impl->log = store->log();
  impl->retry = std::make_unique<detail::StoreRetry>("consumer '" + name + "'", store->location(),
                                                     options, impl->clock, impl->log);
  Impl* self = impl.get();
  out->reset(new Consumer(std::move(impl)));
  if (options.requeue_poll_ms > 0) self->poller = std::thread([self] { self->poll_requeued(); });
  return Status::Ok();
}

const std::string& Consumer::name() const { return impl_->name; }

Outcome Consumer::handle(const Message& message) {
  // From inside a handler of the same inbox: refused (store/reentry.h), nothing recorded.
  // The running handler's message is dead-lettered as handler_reentered.
  if (!detail::refuse_if_in_handler(impl_->store->owner(), "Consumer::handle").ok())
    return Outcome::kRefused;
  // The id for the debug line comes from run()'s own extraction: nothing is parsed twice
  // on the per-message path (an oversized payload, never parsed, shows as "?"). It names
  // which process applied which message when several share a subscription (fleet.h).
  const bool debug = impl_->log->should_log(spdlog::level::debug);
  std::string id = "?";
  // The message's expiry counts from here: the transport handed it over.
  const int64_t received_at = impl_->store->retention_clock();
  const Outcome o = impl_->run(message, std::nullopt, nullptr, debug ? &id : nullptr, received_at);
  if (debug)
    impl_->log->debug("consumer '{}': message '{}' on '{}' (dup flag {}): {}", impl_->name,
                      detail::printable(id), detail::printable(message.topic), message.dup ? 1 : 0,
                      to_string(o));
  return o;
}

Outcome Consumer::reject(const Message& message, const std::string& why) {
  if (!detail::refuse_if_in_handler(impl_->store->owner(), "Consumer::reject").ok())
    return Outcome::kRefused;
  try {
    return impl_->dead_letter(message, std::nullopt, DeadLetterReason::kHandlerFailed, why, 0, 0,
                              std::nullopt);
  } catch (...) {
    std::abort();  // only bad_alloc can get here; never report an unrecorded message as done
  }
}

Status Consumer::replay_dead_letter(int64_t id, Outcome* outcome) {
  if (Status r =
          detail::refuse_if_in_handler(impl_->store->owner(), "Consumer::replay_dead_letter");
      !r.ok())
    return r;
  return impl_->replay(id, outcome, nullptr);
}

Status Consumer::replay_requeued(int64_t* replayed) {
  if (Status r = detail::refuse_if_in_handler(impl_->store->owner(), "Consumer::replay_requeued");
      !r.ok())
    return r;
  return impl_->replay_requeued(replayed);
}

bool Consumer::extract_message_id(const Message& message, std::string* id, DeadLetterReason* reason,
                                  std::string* why) const {
  return detail::extract_message_id(message, impl_->options.message_id, id, reason, why);
}

Health Consumer::health() const {
  Health h = impl_->retry->health();
  {
    // The longest wait for a dependency, if any message is held for one.
    const int64_t now = impl_->store->retention_clock();
    std::lock_guard<std::mutex> lock(impl_->state_mu);
    const Impl::Held* longest = nullptr;
    for (const auto& [slot, held] : impl_->held)
      if (!longest || held.since < longest->since) longest = &held;
    if (longest) {
      h.dependency.waiting = true;
      h.dependency.waited_ms = std::max<int64_t>(0, now - longest->since);
      h.dependency.message_id = detail::printable(longest->message_id);
      h.dependency.attempt = longest->runs;
      h.dependency.reason = longest->reason;
      h.dependency.next_run_in_ms = std::max<int64_t>(0, longest->next_run - now);
    }
  }
  // Corruption found by anyone on this file (the pruner, another consumer) is red here
  // too: the next message will not be taken.
  if (!h.fatal) {
    const Health store = impl_->store->health();
    if (store.fatal) {
      h.fatal = true;
      h.last_error = store.last_error;
    }
  }
  return h;
}

ConsumerCounters Consumer::counters() const {
  ConsumerCounters c;
  {
    std::lock_guard<std::mutex> lock(impl_->state_mu);
    c = impl_->counters;
  }
  c.store_retries = impl_->retry->store_retries();
  return c;
}

const char* to_string(ExpiredPolicy policy) {
  switch (policy) {
    case ExpiredPolicy::kDeadLetter:
      return "dead_letter";
    case ExpiredPolicy::kApply:
      return "apply";
  }
  return "unknown";
}

const char* to_string(RetainedPolicy policy) {
  switch (policy) {
    case RetainedPolicy::kSkip:
      return "skip";
    case RetainedPolicy::kDeadLetter:
      return "dead_letter";
    case RetainedPolicy::kProcess:
      return "process";
  }
  return "unknown";
}

Outcome Consumer::Impl::retained(const Message& m) {
  if (options.retained == RetainedPolicy::kSkip) {
    count(&ConsumerCounters::retained_skipped);
    log->info("consumer '{}': {}", name, detail::retained_skip_text(m.topic));
    return Outcome::kSkipped;
  }
  // kDeadLetter: under its id when it has a usable one, so that the copy the broker sends
  // at the next SUBSCRIBE is recognised (a duplicate, or the same dead letter again). The
  // payload of an oversized message is not parsed for it.
  std::string id;
  DeadLetterReason ignored;
  std::string why;
  if (m.payload.size() > options.max_payload_bytes ||  // not parsed for an id: see run()
      !detail::extract_message_id(m, options.message_id, &id, &ignored, &why))
    return dead_letter(m, std::nullopt, DeadLetterReason::kRetained,
                       detail::retained_dead_letter_text(), 0, 0, std::nullopt);
  MessageState st;
  until_stored("looking up a message", [&] { return store->lookup(name, id, &st); });
  if (st.processed) return duplicate();
  if (st.dead_letter_id) return already_dead_lettered(id);
  return dead_letter(m, id, DeadLetterReason::kRetained, detail::retained_dead_letter_text(), 0, 0,
                     std::nullopt);
}

SessionRecords* Consumer::sessions() const { return impl_->sessions; }

}  // namespace mqtt_inbox

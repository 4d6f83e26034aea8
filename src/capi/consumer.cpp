// The consumer from C: a C handler adapted to the C++ Handler (its return codes become
// what a C++ handler throws, handler.h), creation with sized options, and feeding
// messages that arrive by another route (c.h, "The consumer and its handler").
#include <SQLiteCpp/Database.h>
#include <sqlite3.h>

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "capi/connection_scope.h"
#include "capi/delivery.h"
#include "capi/handles.h"
#include "capi/json_text.h"
#include "capi/sized_struct.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/outbox.h"
#include "mqtt_inbox/sqlite.h"
#include "mqtt_inbox/topic.h"
#include "util/log.h"

using mqtt_inbox::capi::Kind;
using mqtt_inbox::capi::with_handle;

namespace {

constexpr mqtt_inbox_consumer_options_t kDefaults = MQTT_INBOX_CONSUMER_OPTIONS_INIT;

// A handler's return that does not fit: a failed attempt (retried, then handler_failed)
// whose text names the mistake, logged as an error so that it is seen before the dead
// letter is.
[[noreturn]] void misfit(const std::string& consumer, const std::string& text) {
  mqtt_inbox::detail::logger_or_default(nullptr)->error("consumer '{}': {}", consumer, text);
  throw std::runtime_error(text);
}

// Runs the C handler inside the claim transaction and turns its code into what the
// per-message path judges (src/store/verdict.h): a return, a failed attempt, or a
// permanent failure with its dead-letter reason.
void run_c_handler(mqtt_inbox_handler handler, void* ctx, const std::string& consumer,
                   SQLite::Database& db, const mqtt_inbox::Delivery& d) {
  mqtt_inbox_delivery_t view;
  view.delivery = &d;
  view.db = &db;
  mqtt_inbox::capi::ConnectionScope scope(&db);
  int rc;
  {
    mqtt_inbox::capi::InCallback in_callback;
    rc = handler(ctx, db.getHandle(), &view);
  }
  auto text = [&](const char* fallback) { return view.has_reason ? view.reason : fallback; };
  switch (rc) {
    case MQTT_INBOX_HANDLER_OK:
      // An enqueue the outbox refused: the effect must not commit without its outgoing
      // message, so the refusal decides, as the exception does in C++ (outbox.h).
      if (scope.refusal() == mqtt_inbox::capi::ConnectionScope::Refusal::kRefused)
        throw mqtt_inbox::OutboxRefused(mqtt_inbox::Status::InvalidArgument(scope.refusal_text()));
      if (scope.refusal() == mqtt_inbox::capi::ConnectionScope::Refusal::kFull)
        throw mqtt_inbox::OutboxFull(
            mqtt_inbox::Status(mqtt_inbox::Status::Code::kRejected, scope.refusal_text()));
      // A handler that ended (or tried to end) the transaction: the store's fence judges it
      // (store/sqlite/txn_fence.h), whatever the handler returned.
      return;
    case MQTT_INBOX_HANDLER_UNDECODABLE:
      throw mqtt_inbox::UndecodablePayload(text("handler returned MQTT_INBOX_HANDLER_UNDECODABLE"));
    case MQTT_INBOX_HANDLER_REJECT:
      throw mqtt_inbox::RejectMessage(text("handler returned MQTT_INBOX_HANDLER_REJECT"));
    case MQTT_INBOX_HANDLER_OUTBOX_FULL:
      // Parking is for the backpressure an enqueue of this attempt met: without it,
      // nothing would ever make room, and the parked message would be replayed every
      // requeue_poll_ms for ever, logged once.
      if (scope.refusal() != mqtt_inbox::capi::ConnectionScope::Refusal::kFull)
        misfit(consumer,
               "handler returned MQTT_INBOX_HANDLER_OUTBOX_FULL, but no "
               "mqtt_inbox_outbox_enqueue of this attempt returned MQTT_INBOX_OUTBOX_FULL (no "
               "outbox, or no bounded class full): taken as a failed attempt, not parked");
      // Backpressure, not the message's fault: parked, no attempt counted (outbox.h
      // OutboxFull), with the outbox's own words when the handler set none.
      throw mqtt_inbox::OutboxFull(mqtt_inbox::Status(
          mqtt_inbox::Status::Code::kRejected,
          scope.refusal() == mqtt_inbox::capi::ConnectionScope::Refusal::kFull && !view.has_reason
              ? scope.refusal_text()
              : text("handler returned MQTT_INBOX_HANDLER_OUTBOX_FULL")));
    case MQTT_INBOX_HANDLER_RETRY:
      throw std::runtime_error(text("handler returned MQTT_INBOX_HANDLER_RETRY"));
    case MQTT_INBOX_HANDLER_NOT_YET:
      // A dependency is down: not an attempt; the dependency schedule (handler.h).
      throw mqtt_inbox::RetryLater(text("handler returned MQTT_INBOX_HANDLER_NOT_YET"));
    default:
      misfit(consumer, "handler returned " + std::to_string(rc) +
                           ", which is not an MQTT_INBOX_HANDLER_* code: taken as a failed "
                           "attempt (as MQTT_INBOX_HANDLER_RETRY)");
  }
}

// The C id extractor as MessageIdOptions::extractor: it sees the message through a
// delivery view (no id yet, attempt 0) and writes the id into a buffer of cap bytes.
std::function<std::optional<std::string>(const mqtt_inbox::Message&)> adapt_extractor(
    mqtt_inbox_id_extractor fn, void* ctx, size_t max_id_bytes) {
  const size_t cap = max_id_bytes + 1;
  return [fn, ctx, cap](const mqtt_inbox::Message& m) -> std::optional<std::string> {
    static const std::string kNoIdYet;
    const mqtt_inbox::Delivery d{m, kNoIdYet, 0, nullptr};
    mqtt_inbox_delivery_t view;
    view.delivery = &d;
    std::string id(cap, '\0');
    int n;
    {
      mqtt_inbox::capi::InCallback in_callback;
      n = fn(ctx, &view, &id[0], cap);
    }
    if (n == MQTT_INBOX_ID_NONE) return std::nullopt;
    // Thrown from the extractor: undecodable_payload, with this text (message_id.cpp).
    if (n < 0)
      throw std::runtime_error(view.has_reason ? view.reason
                                               : "the C extractor returned " + std::to_string(n));
    // Longer than the buffer: cap bytes, one more than max_id_bytes, refused as invalid_id.
    id.resize(static_cast<size_t>(n) < cap ? static_cast<size_t>(n) : cap);
    return id;
  };
}

int to_outcome(mqtt_inbox::Outcome o) {
  switch (o) {
    case mqtt_inbox::Outcome::kProcessed:
      return MQTT_INBOX_OUTCOME_PROCESSED;
    case mqtt_inbox::Outcome::kDuplicate:
      return MQTT_INBOX_OUTCOME_DUPLICATE;
    case mqtt_inbox::Outcome::kDeadLettered:
      return MQTT_INBOX_OUTCOME_DEAD_LETTERED;
    case mqtt_inbox::Outcome::kAlreadyDeadLettered:
      return MQTT_INBOX_OUTCOME_ALREADY_DEAD_LETTERED;
    case mqtt_inbox::Outcome::kSkipped:
      return MQTT_INBOX_OUTCOME_SKIPPED;
    case mqtt_inbox::Outcome::kRefused:
      break;  // feed returns MQTT_INBOX_INVALID_ARGUMENT instead
  }
  return MQTT_INBOX_OUTCOME_DEAD_LETTERED;
}

}  // namespace

extern "C" {

int mqtt_inbox_consumer_create(mqtt_inbox_t* inbox, const char* name, mqtt_inbox_handler handler,
                               void* ctx, const mqtt_inbox_consumer_options_t* options,
                               mqtt_inbox_consumer_t** out) {
  if (out) *out = nullptr;
  return with_handle(inbox, Kind::kInbox, [&] {
    auto& err = inbox->error;
    if (!name || !handler || !out)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_consumer_create: name, handler and out must not be NULL");
    mqtt_inbox_consumer_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kDefaults, &o, &err)) return r;
    mqtt_inbox::ConsumerOptions co;
    co.max_attempts = o.max_attempts;
    co.retry_backoff_initial = std::chrono::milliseconds(o.retry_backoff_initial_ms);
    co.retry_backoff_max = std::chrono::milliseconds(o.retry_backoff_max_ms);
    switch (o.retained) {
      case MQTT_INBOX_RETAINED_SKIP:
        co.retained = mqtt_inbox::RetainedPolicy::kSkip;
        break;
      case MQTT_INBOX_RETAINED_DEAD_LETTER:
        co.retained = mqtt_inbox::RetainedPolicy::kDeadLetter;
        break;
      case MQTT_INBOX_RETAINED_PROCESS:
        co.retained = mqtt_inbox::RetainedPolicy::kProcess;
        break;
      default:
        return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                       "mqtt_inbox_consumer_options_t.retained is " + std::to_string(o.retained) +
                           ": it must be MQTT_INBOX_RETAINED_SKIP, _DEAD_LETTER or _PROCESS");
    }
    switch (o.expired) {
      case MQTT_INBOX_EXPIRED_DEAD_LETTER:
        co.expired = mqtt_inbox::ExpiredPolicy::kDeadLetter;
        break;
      case MQTT_INBOX_EXPIRED_APPLY:
        co.expired = mqtt_inbox::ExpiredPolicy::kApply;
        break;
      default:
        return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                       "mqtt_inbox_consumer_options_t.expired is " + std::to_string(o.expired) +
                           ": it must be MQTT_INBOX_EXPIRED_DEAD_LETTER or _APPLY");
    }
    co.dependency_immediate_attempts = o.dependency_immediate_attempts;
    co.dependency_backoff_initial = std::chrono::milliseconds(o.dependency_backoff_initial_ms);
    co.dependency_backoff_max = std::chrono::milliseconds(o.dependency_backoff_max_ms);
    co.dependency_wait_max = std::chrono::milliseconds(o.dependency_wait_max_ms);
    co.max_payload_bytes = o.max_payload_bytes;
    co.dead_letter_payload_bytes = o.dead_letter_payload_bytes;
    co.requeue_poll_ms = o.requeue_poll_ms;
    if (o.id_user_property) co.message_id.user_property = o.id_user_property;
    if (o.id_json_field) co.message_id.json_field = o.id_json_field;
    if (o.max_id_bytes < 1)
      return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                     "mqtt_inbox_consumer_options_t.max_id_bytes must be at least 1");
    co.message_id.max_id_bytes = o.max_id_bytes;
    switch (o.id_disagreement) {
      case MQTT_INBOX_ID_DISAGREEMENT_DEAD_LETTER:
        co.message_id.on_disagreement = mqtt_inbox::IdDisagreement::kDeadLetter;
        break;
      case MQTT_INBOX_ID_DISAGREEMENT_USER_PROPERTY_WINS:
        co.message_id.on_disagreement = mqtt_inbox::IdDisagreement::kUserPropertyWins;
        break;
      default:
        return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                       "mqtt_inbox_consumer_options_t.id_disagreement is " +
                           std::to_string(o.id_disagreement) +
                           ": it must be MQTT_INBOX_ID_DISAGREEMENT_DEAD_LETTER or "
                           "_USER_PROPERTY_WINS");
    }
    if (o.id_extractor)
      co.message_id.extractor = adapt_extractor(o.id_extractor, o.id_extractor_ctx, o.max_id_bytes);
    // A C handler has no accessor for Delivery::payload_json: a document nobody reads would
    // cost about a quarter more than reading the id alone (options.h).
    co.message_id.json_document_max_bytes = 0;
    auto h = std::make_unique<mqtt_inbox_consumer_t>();
    h->owner = inbox;
    h->handler = handler;
    h->ctx = ctx;
    mqtt_inbox::Handler adapted = [handler, ctx, consumer = std::string(name)](
                                      SQLite::Database& db, const mqtt_inbox::Delivery& d) {
      run_c_handler(handler, ctx, consumer, db, d);
    };
    if (int r = err.set(mqtt_inbox::Consumer::create(inbox->inbox.get(), name, std::move(adapted),
                                                     co, &h->consumer)))
      return r;
    mqtt_inbox::capi::adopt(h.get(), {inbox});
    *out = h.release();
    return MQTT_INBOX_OK;
  });
}

int mqtt_inbox_consumer_destroy(mqtt_inbox_consumer_t* consumer) {
  if (consumer && mqtt_inbox::capi::InCallback::active()) {
    mqtt_inbox::capi::Use use(consumer, Kind::kConsumer);
    return mqtt_inbox::capi::refused_in_callback(use ? &consumer->error : nullptr,
                                                 "mqtt_inbox_consumer_destroy");
  }
  return mqtt_inbox::capi::release_handle(consumer, Kind::kConsumer, "mqtt_inbox_consumer_destroy",
                                          [](mqtt_inbox_consumer_t*) { return MQTT_INBOX_OK; });
}

const char* mqtt_inbox_consumer_errmsg(const mqtt_inbox_consumer_t* consumer) {
  mqtt_inbox::capi::Use use(consumer, Kind::kConsumer);
  return use ? consumer->error.read() : mqtt_inbox::capi::dead_handle_text(Kind::kConsumer);
}

int mqtt_inbox_consumer_feed(mqtt_inbox_consumer_t* consumer, const mqtt_inbox_message_t* message,
                             int* outcome) {
  return with_handle(consumer, Kind::kConsumer, [&] {
    auto& err = consumer->error;
    if (!message || !outcome)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_consumer_feed: message and outcome must not be NULL");
    const mqtt_inbox_message_t defaults = MQTT_INBOX_MESSAGE_INIT;
    mqtt_inbox_message_t m;
    if (int r = mqtt_inbox::capi::read_sized(message, defaults, &m, &err)) return r;
    if (!m.topic) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_consumer_feed: NULL topic");
    // What a broker would never deliver: refused before anything is recorded.
    if (mqtt_inbox::Status s = mqtt_inbox::check_topic_name(m.topic, "mqtt_inbox_message_t.topic");
        !s.ok())
      return err.set(s);
    if (m.qos < 0 || m.qos > 2)
      return err.set(
          MQTT_INBOX_INVALID_ARGUMENT,
          "mqtt_inbox_message_t.qos is " + std::to_string(m.qos) + ": it must be 0, 1 or 2");
    bool dup = false, retained = false;
    if (int r = mqtt_inbox::capi::read_flag(m.dup, "mqtt_inbox_message_t.dup", &err, &dup))
      return r;
    if (int r = mqtt_inbox::capi::read_flag(m.retained, "mqtt_inbox_message_t.retained", &err,
                                            &retained))
      return r;
    if (!m.payload && m.payload_len > 0)
      return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_consumer_feed: NULL payload with a length");
    if (!m.user_properties && m.user_property_count > 0)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_consumer_feed: NULL user_properties with a count");
    mqtt_inbox::Message msg;
    msg.topic = m.topic;
    if (m.payload_len) msg.payload.assign(static_cast<const char*>(m.payload), m.payload_len);
    msg.qos = m.qos;
    msg.dup = dup;
    msg.retain = retained;
    if (m.content_type) msg.content_type = m.content_type;
    if (m.response_topic) msg.response_topic = m.response_topic;
    if (m.correlation_data)
      msg.correlation_data.emplace(static_cast<const char*>(m.correlation_data),
                                   m.correlation_data_len);
    else if (m.correlation_data_len > 0)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_consumer_feed: NULL correlation_data with a length");
    if (m.payload_format_indicator == 0 || m.payload_format_indicator == 1)
      msg.payload_format_indicator = static_cast<uint8_t>(m.payload_format_indicator);
    else if (m.payload_format_indicator != -1)
      return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                     "mqtt_inbox_message_t.payload_format_indicator must be 0, 1 or -1 (none)");
    if (m.message_expiry_interval_s >= 0 && m.message_expiry_interval_s <= 0xffffffffLL)
      msg.message_expiry_interval_s = static_cast<uint32_t>(m.message_expiry_interval_s);
    else if (m.message_expiry_interval_s != -1)
      return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                     "mqtt_inbox_message_t.message_expiry_interval_s must be 0..4294967295 or -1 "
                     "(none)");
    for (size_t i = 0; i < m.user_property_count; ++i) {
      const mqtt_inbox_user_property_t& p = m.user_properties[i];
      if ((!p.name && p.name_len) || (!p.value && p.value_len))
        return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_consumer_feed: a NULL user property");
      msg.user_properties.emplace_back(std::string(p.name ? p.name : "", p.name_len),
                                       std::string(p.value ? p.value : "", p.value_len));
    }
    const mqtt_inbox::Outcome o = consumer->consumer->handle(msg);
    if (o == mqtt_inbox::Outcome::kRefused)
      return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                     "mqtt_inbox_consumer_feed called from inside a handler of this inbox: "
                     "refused, nothing recorded (it would deadlock); the running handler's "
                     "message is dead-lettered as handler_reentered");
    *outcome = to_outcome(o);
    return MQTT_INBOX_OK;
  });
}

int mqtt_inbox_consumer_counters(mqtt_inbox_consumer_t* consumer,
                                 mqtt_inbox_consumer_counters_t* counters) {
  return with_handle(consumer, Kind::kConsumer, [&] {
    auto& err = consumer->error;
    if (!counters) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_consumer_counters: NULL counters");
    const mqtt_inbox::ConsumerCounters c = consumer->consumer->counters();
    mqtt_inbox_consumer_counters_t v = MQTT_INBOX_CONSUMER_COUNTERS_INIT;
    v.processed = c.processed;
    v.duplicates = c.duplicates;
    v.dead_lettered = c.dead_lettered;
    v.already_dead_lettered = c.already_dead_lettered;
    v.handler_failures = c.handler_failures;
    v.store_retries = c.store_retries;
    v.retained_skipped = c.retained_skipped;
    v.outbox_full_parked = c.outbox_full_parked;
    v.expired = c.expired;
    v.not_yet = c.not_yet;
    return mqtt_inbox::capi::write_sized(v, counters, &err);
  });
}

int mqtt_inbox_consumer_health_json(mqtt_inbox_consumer_t* consumer, char** json) {
  return with_handle(consumer, Kind::kConsumer, [&] {
    auto& err = consumer->error;
    if (!json) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_consumer_health_json: NULL json");
    return mqtt_inbox::capi::hand_out_json(
        mqtt_inbox::capi::health_json(consumer->consumer->health()), &err, json);
  });
}

}  // extern "C"

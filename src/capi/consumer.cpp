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

using mqtt_inbox::capi::guarded;

namespace {

constexpr mqtt_inbox_consumer_options_t kDefaults = MQTT_INBOX_CONSUMER_OPTIONS_INIT;

// Runs the C handler inside the claim transaction and turns its code into what the
// per-message path judges (src/store/verdict.h): a return, a failed attempt, or a
// permanent failure with its dead-letter reason.
void run_c_handler(mqtt_inbox_handler handler, void* ctx, SQLite::Database& db,
                   const mqtt_inbox::Delivery& d) {
  mqtt_inbox_delivery_t view;
  view.delivery = &d;
  view.db = &db;
  mqtt_inbox::capi::ConnectionScope scope(&db);
  const int rc = handler(ctx, db.getHandle(), &view);
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
      // Backpressure, not the message's fault: parked, no attempt counted (outbox.h
      // OutboxFull), with the outbox's own words when an enqueue here was refused as full.
      throw mqtt_inbox::OutboxFull(mqtt_inbox::Status(
          mqtt_inbox::Status::Code::kRejected,
          scope.refusal() == mqtt_inbox::capi::ConnectionScope::Refusal::kFull && !view.has_reason
              ? scope.refusal_text()
              : text("handler returned MQTT_INBOX_HANDLER_OUTBOX_FULL")));
    case MQTT_INBOX_HANDLER_RETRY:
      throw std::runtime_error(text("handler returned MQTT_INBOX_HANDLER_RETRY"));
    default:
      throw std::runtime_error(
          text(("handler returned " + std::to_string(rc) + ", taken as RETRY").c_str()));
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
    const int n = fn(ctx, &view, &id[0], cap);
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
  if (!inbox) return MQTT_INBOX_MISUSE;
  auto& err = inbox->error;
  return guarded(&err, [&] {
    if (!name || !handler || !out)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_consumer_create: name, handler and out must not be NULL");
    mqtt_inbox_consumer_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kDefaults, &o, &err,
                                             "mqtt_inbox_consumer_options_t"))
      return r;
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
                       "mqtt_inbox_consumer_options_t.retained must be MQTT_INBOX_RETAINED_*");
    }
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
                       "mqtt_inbox_consumer_options_t.id_disagreement must be "
                       "MQTT_INBOX_ID_DISAGREEMENT_*");
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
    mqtt_inbox::Handler adapted = [handler, ctx](SQLite::Database& db,
                                                 const mqtt_inbox::Delivery& d) {
      run_c_handler(handler, ctx, db, d);
    };
    if (int r = err.set(mqtt_inbox::Consumer::create(inbox->inbox.get(), name, std::move(adapted),
                                                     co, &h->consumer)))
      return r;
    *out = h.release();
    return MQTT_INBOX_OK;
  });
}

void mqtt_inbox_consumer_destroy(mqtt_inbox_consumer_t* consumer) { delete consumer; }

const char* mqtt_inbox_consumer_errmsg(const mqtt_inbox_consumer_t* consumer) {
  return consumer ? consumer->error.read() : "mqtt_inbox_consumer_errmsg: NULL consumer";
}

int mqtt_inbox_consumer_feed(mqtt_inbox_consumer_t* consumer, const mqtt_inbox_message_t* message,
                             int* outcome) {
  if (!consumer) return MQTT_INBOX_MISUSE;
  auto& err = consumer->error;
  return guarded(&err, [&] {
    if (!message || !outcome)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_consumer_feed: message and outcome must not be NULL");
    const mqtt_inbox_message_t defaults = MQTT_INBOX_MESSAGE_INIT;
    mqtt_inbox_message_t m;
    if (int r = mqtt_inbox::capi::read_sized(message, defaults, &m, &err, "mqtt_inbox_message_t"))
      return r;
    if (!m.topic) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_consumer_feed: NULL topic");
    if (!m.payload && m.payload_len > 0)
      return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_consumer_feed: NULL payload with a length");
    if (!m.user_properties && m.user_property_count > 0)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_consumer_feed: NULL user_properties with a count");
    mqtt_inbox::Message msg;
    msg.topic = m.topic;
    if (m.payload_len) msg.payload.assign(static_cast<const char*>(m.payload), m.payload_len);
    msg.qos = m.qos;
    msg.dup = m.dup != 0;
    msg.retain = m.retained != 0;
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
  if (!consumer) return MQTT_INBOX_MISUSE;
  auto& err = consumer->error;
  return guarded(&err, [&] {
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
    return mqtt_inbox::capi::write_sized(v, counters, &err, "mqtt_inbox_consumer_counters_t");
  });
}

int mqtt_inbox_consumer_health_json(mqtt_inbox_consumer_t* consumer, char** json) {
  if (!consumer) return MQTT_INBOX_MISUSE;
  auto& err = consumer->error;
  return guarded(&err, [&] {
    if (!json) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_consumer_health_json: NULL json");
    return mqtt_inbox::capi::hand_out_json(
        mqtt_inbox::capi::health_json(consumer->consumer->health()), &err, json);
  });
}

}  // extern "C"

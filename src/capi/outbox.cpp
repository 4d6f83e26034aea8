// The transactional outbox from C: its bounded classes, enqueue through the connection the
// library lent to a handler or set-up function (capi/connection_scope.h), derived ids, and
// the relay, with a connection of its own or a subscriber's (c.h, "The transactional
// outbox and its relay").
#include "mqtt_inbox/outbox.h"

#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Exception.h>

#include <string>
#include <utility>

#include "capi/connection.h"
#include "capi/connection_scope.h"
#include "capi/handles.h"
#include "capi/json_text.h"
#include "capi/sized_struct.h"
#include "mqtt_inbox/relay.h"

using mqtt_inbox::capi::ConnectionScope;
using mqtt_inbox::capi::guarded;
using mqtt_inbox::capi::Kind;
using mqtt_inbox::capi::LastError;
using mqtt_inbox::capi::with_handle;

struct mqtt_inbox_outbox_t : mqtt_inbox::capi::Handle {
  mqtt_inbox_outbox_t() noexcept : Handle(Kind::kOutbox) {}
  std::unique_ptr<mqtt_inbox::Outbox> outbox;
};

struct mqtt_inbox_relay_t : mqtt_inbox::capi::Handle {
  mqtt_inbox_relay_t() noexcept : Handle(Kind::kRelay) {}
  std::unique_ptr<mqtt_inbox::Relay> relay;
};

namespace {

constexpr mqtt_inbox_outgoing_t kOutgoingDefaults = MQTT_INBOX_OUTGOING_INIT;
constexpr mqtt_inbox_relay_options_t kRelayDefaults = MQTT_INBOX_RELAY_OPTIONS_INIT;
constexpr mqtt_inbox_outbox_options_t kOutboxDefaults = MQTT_INBOX_OUTBOX_OPTIONS_INIT;
constexpr mqtt_inbox_outbox_class_t kClassDefaults = MQTT_INBOX_OUTBOX_CLASS_INIT;

// The C outbox options as OutboxOptions. The classes are an array whose stride is the
// first element's size, as its header gives it (a program built with an older c.h has
// smaller elements); every element must carry the same header.
int to_outbox_options(const mqtt_inbox_outbox_options_t& o, LastError* err,
                      mqtt_inbox::OutboxOptions* out) {
  if (!o.classes && o.class_count)
    return err->set(MQTT_INBOX_MISUSE, "mqtt_inbox_outbox_options_t: NULL classes with a count");
  out->max_id_bytes = o.max_id_bytes;
  const unsigned char* at = reinterpret_cast<const unsigned char*>(o.classes);
  size_t stride = 0;
  if (o.class_count) {
    if (int r = mqtt_inbox::capi::check_header(o.classes, err,
                                               "mqtt_inbox_outbox_options_t.classes[0]", &stride))
      return r;
  }
  for (size_t i = 0; i < o.class_count; ++i, at += stride) {
    const auto* in = reinterpret_cast<const mqtt_inbox_outbox_class_t*>(at);
    const std::string what = "mqtt_inbox_outbox_options_t.classes[" + std::to_string(i) + "]";
    size_t n = 0;
    if (int r = mqtt_inbox::capi::check_header(in, err, what, &n)) return r;
    if (n != stride)
      return err->set(MQTT_INBOX_MISUSE,
                      what +
                          " has another struct_version than classes[0]: initialise every class "
                          "with MQTT_INBOX_OUTBOX_CLASS_INIT");
    mqtt_inbox_outbox_class_t c;
    if (int r = mqtt_inbox::capi::read_sized(in, kClassDefaults, &c, err)) return r;
    if (!c.topic_prefix)
      return err->set(MQTT_INBOX_INVALID_ARGUMENT, what + ".topic_prefix is required");
    mqtt_inbox::OutboxClass oc;
    oc.topic_prefix = c.topic_prefix;
    oc.max_rows = c.max_rows;
    oc.max_bytes = c.max_bytes;
    oc.max_age_ms = c.max_age_ms;
    switch (c.policy) {
      case MQTT_INBOX_OUTBOX_REJECT:
        oc.policy = mqtt_inbox::OutboxFullPolicy::kReject;
        break;
      case MQTT_INBOX_OUTBOX_DROP_OLDEST:
        oc.policy = mqtt_inbox::OutboxFullPolicy::kDropOldest;
        break;
      default:
        return err->set(MQTT_INBOX_INVALID_ARGUMENT,
                        what + ".policy is " + std::to_string(c.policy) +
                            ": it must be MQTT_INBOX_OUTBOX_REJECT or _DROP_OLDEST");
    }
    out->classes.push_back(std::move(oc));
  }
  return MQTT_INBOX_OK;
}

// The publishing fields of the C relay options (those a lent relay reads too).
int to_publishing(const mqtt_inbox_relay_options_t& o, LastError* err,
                  mqtt_inbox::RelayOptions* ro) {
  if (int r = mqtt_inbox::capi::read_flag(
          o.wake_on_commit, "mqtt_inbox_relay_options_t.wake_on_commit", err, &ro->wake_on_commit))
    return r;
  ro->max_inflight = o.max_inflight;
  ro->poll_interval_ms = o.poll_interval_ms;
  ro->stop_timeout_ms = o.stop_timeout_ms;
  ro->mark_batch = o.mark_batch;
  ro->mark_linger_ms = o.mark_linger_ms;
  ro->metrics_period_ms = o.metrics_period_ms;
  ro->max_packet_size = o.max_packet_size;
  if (o.prometheus_textfile) ro->prometheus_textfile = o.prometheus_textfile;
  ro->reconnect_backoff_initial_ms = o.reconnect_backoff_initial_ms;
  ro->reconnect_backoff_max_ms = o.reconnect_backoff_max_ms;
  return MQTT_INBOX_OK;
}

}  // namespace

extern "C" {

int mqtt_inbox_outbox_create(mqtt_inbox_t* inbox, mqtt_inbox_outbox_t** out) {
  return mqtt_inbox_outbox_create_with_options(inbox, nullptr, out);
}

int mqtt_inbox_outbox_create_with_options(mqtt_inbox_t* inbox,
                                          const mqtt_inbox_outbox_options_t* options,
                                          mqtt_inbox_outbox_t** out) {
  if (out) *out = nullptr;
  return with_handle(inbox, Kind::kInbox, [&] {
    auto& err = inbox->error;
    if (!out) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_outbox_create: NULL out");
    mqtt_inbox_outbox_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kOutboxDefaults, &o, &err)) return r;
    mqtt_inbox::OutboxOptions oo;
    if (int r = to_outbox_options(o, &err, &oo)) return r;
    auto h = std::make_unique<mqtt_inbox_outbox_t>();
    if (int r = err.set(mqtt_inbox::Outbox::create(inbox->inbox.get(), oo, &h->outbox))) return r;
    mqtt_inbox::capi::adopt(h.get(), {inbox});
    *out = h.release();
    return MQTT_INBOX_OK;
  });
}

int mqtt_inbox_outbox_destroy(mqtt_inbox_outbox_t* outbox) {
  return mqtt_inbox::capi::release_handle(outbox, Kind::kOutbox, "mqtt_inbox_outbox_destroy",
                                          [](mqtt_inbox_outbox_t*) { return MQTT_INBOX_OK; });
}

const char* mqtt_inbox_outbox_errmsg(const mqtt_inbox_outbox_t* outbox) {
  mqtt_inbox::capi::Use use(outbox, Kind::kOutbox);
  return use ? outbox->error.read() : mqtt_inbox::capi::dead_handle_text(Kind::kOutbox);
}

int mqtt_inbox_outbox_enqueue(mqtt_inbox_outbox_t* outbox, sqlite3* db,
                              const mqtt_inbox_outgoing_t* message, char** message_id) {
  if (message_id) *message_id = nullptr;
  return with_handle(outbox, Kind::kOutbox, [&] {
    auto& err = outbox->error;
    if (!db || !message)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_outbox_enqueue: db and message must not be NULL");
    ConnectionScope* scope = ConnectionScope::find(db);
    if (!scope)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_outbox_enqueue: db is not a connection the library lent on "
                     "this thread (call it from a handler or a set-up function with its db)");
    mqtt_inbox_outgoing_t m;
    if (int r = mqtt_inbox::capi::read_sized(message, kOutgoingDefaults, &m, &err)) return r;
    if (!m.topic) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_outbox_enqueue: NULL topic");
    if (!m.payload && m.payload_len)
      return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_outbox_enqueue: NULL payload with a length");
    if (!m.user_properties && m.user_property_count)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_outbox_enqueue: NULL user_properties with a count");
    mqtt_inbox::OutgoingMessage o;
    o.topic = m.topic;
    if (m.payload_len) o.payload.assign(static_cast<const char*>(m.payload), m.payload_len);
    if (m.message_id) o.message_id = m.message_id;
    if (m.ordering_key) o.ordering_key = m.ordering_key;
    if (m.content_type) o.content_type = m.content_type;
    for (size_t i = 0; i < m.user_property_count; ++i) {
      const mqtt_inbox_user_property_t& p = m.user_properties[i];
      if ((!p.name && p.name_len) || (!p.value && p.value_len))
        return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_outbox_enqueue: a NULL user property");
      o.user_properties.emplace_back(std::string(p.name ? p.name : "", p.name_len),
                                     std::string(p.value ? p.value : "", p.value_len));
    }
    std::string id;
    const mqtt_inbox::Status s = outbox->outbox->enqueue(scope->db(), o, &id);
    if (s.code() == mqtt_inbox::Status::Code::kInvalidArgument)
      scope->note_refusal(ConnectionScope::Refusal::kRefused, s.message());
    else if (s.code() == mqtt_inbox::Status::Code::kRejected) {
      // Outbox::enqueue's kRejected is "outbox full" only (outbox.h): a code of its own in
      // C, so that a handler can tell backpressure from a store's refusal.
      scope->note_refusal(ConnectionScope::Refusal::kFull, s.message());
      return err.set(MQTT_INBOX_OUTBOX_FULL, s.message());
    }
    if (int r = err.set(s)) return r;
    if (message_id) {
      *message_id = mqtt_inbox::capi::malloc_copy(id);
      if (!*message_id) return err.set(MQTT_INBOX_NOMEM, "out of memory");
    }
    return MQTT_INBOX_OK;
  });
}

int mqtt_inbox_derived_message_id(const char* incoming_id, const char* suffix, char** out) {
  if (out) *out = nullptr;
  return guarded(nullptr, [&] {
    if (!incoming_id || !suffix || !out) return MQTT_INBOX_MISUSE;
    try {
      *out = mqtt_inbox::capi::malloc_copy(mqtt_inbox::derived_message_id(incoming_id, suffix));
    } catch (const mqtt_inbox::OutboxRefused&) {
      return MQTT_INBOX_INVALID_ARGUMENT;
    }
    return *out ? MQTT_INBOX_OK : MQTT_INBOX_NOMEM;
  });
}

int mqtt_inbox_relay_create(mqtt_inbox_outbox_t* outbox, const mqtt_inbox_relay_options_t* options,
                            mqtt_inbox_relay_t** out, char** errmsg) {
  if (out) *out = nullptr;
  if (errmsg) *errmsg = nullptr;
  LastError err;
  mqtt_inbox::capi::Use held(outbox, Kind::kOutbox);
  const int rc = guarded(&err, [&] {
    if (!held || !options || !out)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_relay_create: a live outbox, options and out are needed");
    mqtt_inbox_relay_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kRelayDefaults, &o, &err)) return r;
    const mqtt_inbox::capi::CConnection c = mqtt_inbox::capi::connection_of(o);
    mqtt_inbox::RelayOptions ro;
    if (int r = err.set(mqtt_inbox::capi::to_connection_options(c, &ro))) return r;
    if (int r = to_publishing(o, &err, &ro)) return r;
    auto h = std::make_unique<mqtt_inbox_relay_t>();
    if (int r = err.set(mqtt_inbox::Relay::create(outbox->outbox.get(), ro, &h->relay))) return r;
    mqtt_inbox::capi::adopt(h.get(), {outbox});
    *out = h.release();
    return MQTT_INBOX_OK;
  });
  if (rc != MQTT_INBOX_OK && errmsg) *errmsg = mqtt_inbox::capi::malloc_copy(err.read());
  return rc;
}

int mqtt_inbox_relay_create_on(mqtt_inbox_outbox_t* outbox, mqtt_inbox_subscriber_t* subscriber,
                               const mqtt_inbox_relay_options_t* options, mqtt_inbox_relay_t** out,
                               char** errmsg) {
  if (out) *out = nullptr;
  if (errmsg) *errmsg = nullptr;
  LastError err;
  mqtt_inbox::capi::Use held_outbox(outbox, Kind::kOutbox);
  mqtt_inbox::capi::Use held_subscriber(subscriber, Kind::kSubscriber);
  const int rc = guarded(&err, [&] {
    if (!held_outbox || !held_subscriber || !out)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_relay_create_on: a live outbox and subscriber, and out, are "
                     "needed");
    mqtt_inbox_relay_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kRelayDefaults, &o, &err)) return r;
    const char* field = nullptr;
    if (mqtt_inbox::capi::sets_connection(mqtt_inbox::capi::connection_of(o), &field))
      return err.set(MQTT_INBOX_INVALID_ARGUMENT,
                     std::string("mqtt_inbox_relay_create_on: ") + field +
                         " is set, but the connection is the subscriber's: leave it at its "
                         "default (set it in the subscriber's options)");
    mqtt_inbox::RelayOptions ro;
    if (int r = to_publishing(o, &err, &ro)) return r;
    auto h = std::make_unique<mqtt_inbox_relay_t>();
    if (int r = err.set(mqtt_inbox::Relay::create(
            outbox->outbox.get(), mqtt_inbox::capi::subscriber_of(subscriber), ro, &h->relay)))
      return r;
    mqtt_inbox::capi::adopt(h.get(), {outbox, mqtt_inbox::capi::handle_of(subscriber)});
    *out = h.release();
    return MQTT_INBOX_OK;
  });
  if (rc != MQTT_INBOX_OK && errmsg) *errmsg = mqtt_inbox::capi::malloc_copy(err.read());
  return rc;
}

int mqtt_inbox_relay_destroy(mqtt_inbox_relay_t* relay) {
  if (relay && mqtt_inbox::capi::InCallback::active()) {
    mqtt_inbox::capi::Use use(relay, Kind::kRelay);
    return mqtt_inbox::capi::refused_in_callback(use ? &relay->error : nullptr,
                                                 "mqtt_inbox_relay_destroy");
  }
  return mqtt_inbox::capi::release_handle(
      relay, Kind::kRelay, "mqtt_inbox_relay_destroy",
      [](mqtt_inbox_relay_t* r) { return mqtt_inbox::capi::to_rc(r->relay->stop()); });
}

const char* mqtt_inbox_relay_errmsg(const mqtt_inbox_relay_t* relay) {
  mqtt_inbox::capi::Use use(relay, Kind::kRelay);
  return use ? relay->error.read() : mqtt_inbox::capi::dead_handle_text(Kind::kRelay);
}

int mqtt_inbox_relay_start(mqtt_inbox_relay_t* relay) {
  return with_handle(relay, Kind::kRelay, [&] { return relay->error.set(relay->relay->start()); });
}

int mqtt_inbox_relay_stop(mqtt_inbox_relay_t* relay) {
  return with_handle(relay, Kind::kRelay, [&] {
    if (mqtt_inbox::capi::InCallback::active())
      return mqtt_inbox::capi::refused_in_callback(&relay->error, "mqtt_inbox_relay_stop");
    return relay->error.set(relay->relay->stop());
  });
}

int mqtt_inbox_relay_health(mqtt_inbox_relay_t* relay, mqtt_inbox_connection_health_t* health) {
  return with_handle(relay, Kind::kRelay, [&] {
    if (!health) return relay->error.set(MQTT_INBOX_MISUSE, "mqtt_inbox_relay_health: NULL health");
    return mqtt_inbox::capi::write_connection_health(relay->relay->health(), health, &relay->error);
  });
}

int mqtt_inbox_relay_counters_json(mqtt_inbox_relay_t* relay, char** json) {
  return with_handle(relay, Kind::kRelay, [&] {
    if (!json)
      return relay->error.set(MQTT_INBOX_MISUSE, "mqtt_inbox_relay_counters_json: NULL json");
    const mqtt_inbox::RelayCounters c = relay->relay->counters();
    // Written as text (capi/json_text.h): an allocation failure is MQTT_INBOX_NOMEM.
    return mqtt_inbox::capi::hand_out_json(mqtt_inbox::capi::JsonObject()
                                               .number("published", c.published)
                                               .number("acked", c.acked)
                                               .number("rejected", c.rejected)
                                               .number("connects", c.connects)
                                               .number("max_inflight_seen", c.max_inflight_seen)
                                               .number("receive_maximum", c.receive_maximum)
                                               .number("maximum_packet_size", c.maximum_packet_size)
                                               .number("expired", c.expired)
                                               .number("too_large", c.too_large)
                                               .number("connection_dropped", c.connection_dropped)
                                               .flag("connected", c.connected)
                                               .number("offline_ms", c.offline_ms)
                                               .done(),
                                           &relay->error, json);
  });
}

}  // extern "C"

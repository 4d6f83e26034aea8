// The MQTT subscriber from C: creation from sized options, routing filters to C
// consumers, start, stop from any thread, and the async-signal-safe stop request that
// mqtt_inbox_subscriber_run waits for (c.h, "The MQTT subscriber").
#include "mqtt_inbox/subscriber.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "capi/connection.h"
#include "capi/handles.h"
#include "capi/json_text.h"
#include "capi/sized_struct.h"

using mqtt_inbox::capi::guarded;
using mqtt_inbox::capi::Kind;
using mqtt_inbox::capi::LastError;
using mqtt_inbox::capi::with_handle;

struct mqtt_inbox_subscriber_t : mqtt_inbox::capi::Handle {
  mqtt_inbox_subscriber_t() noexcept : Handle(Kind::kSubscriber) {}
  std::unique_ptr<mqtt_inbox::Subscriber> subscriber;
  // The stop request: a flag and a pipe, both usable from a signal handler.
  std::atomic<bool> stop_requested{false};
  int wake[2] = {-1, -1};
  // stop() runs once; later calls (run() after a stop from another thread) get its code.
  std::mutex stop_mu;
  bool stopped = false;
  int stop_rc = MQTT_INBOX_OK;

  ~mqtt_inbox_subscriber_t() {
    subscriber.reset();
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }

  void request_stop() noexcept {
    static_assert(std::atomic<bool>::is_always_lock_free, "a signal handler may store it");
    stop_requested.store(true);
    const char byte = 1;
    // A full pipe already holds a wake-up; nothing else can be done in a signal handler.
    [[maybe_unused]] ssize_t n = ::write(wake[1], &byte, 1);
  }

  int stop() {
    int rc;
    {
      std::lock_guard<std::mutex> lock(stop_mu);
      if (!stopped) {
        stop_rc = error.set(subscriber->stop());
        stopped = true;
      }
      rc = stop_rc;
    }
    request_stop();  // wakes run()
    return rc;
  }
};

mqtt_inbox::Subscriber* mqtt_inbox::capi::subscriber_of(
    mqtt_inbox_subscriber_t* subscriber) noexcept {
  return subscriber->subscriber.get();
}

mqtt_inbox::capi::Handle* mqtt_inbox::capi::handle_of(
    mqtt_inbox_subscriber_t* subscriber) noexcept {
  return subscriber;
}

namespace {

constexpr mqtt_inbox_subscriber_options_t kDefaults = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;

int to_c_failure(mqtt_inbox::ConnectionHealth::Failure f) {
  using F = mqtt_inbox::ConnectionHealth::Failure;
  switch (f) {
    case F::kNone:
      return MQTT_INBOX_FAILURE_NONE;
    case F::kNetwork:
      return MQTT_INBOX_FAILURE_NETWORK;
    case F::kTls:
      return MQTT_INBOX_FAILURE_TLS;
    case F::kRefused:
      return MQTT_INBOX_FAILURE_REFUSED;
    case F::kCredentials:
      return MQTT_INBOX_FAILURE_CREDENTIALS;
    case F::kSubscribe:
      return MQTT_INBOX_FAILURE_SUBSCRIBE;
    case F::kOther:
      return MQTT_INBOX_FAILURE_OTHER;
  }
  return MQTT_INBOX_FAILURE_OTHER;
}

}  // namespace

int mqtt_inbox::capi::write_connection_health(const mqtt_inbox::ConnectionHealth& h,
                                              mqtt_inbox_connection_health_t* out, LastError* err) {
  mqtt_inbox_connection_health_t v = MQTT_INBOX_CONNECTION_HEALTH_INIT;
  v.connected = h.connected ? 1 : 0;
  v.last_failure = to_c_failure(h.last_failure);
  v.since_ms = h.since_ms;
  v.last_failure_ms = h.last_error_ms;
  v.connect_attempts = h.connect_attempts;
  v.connects = h.connects;
  v.consecutive_failures = h.consecutive_failures;
  v.connack_code = h.connack_code;
  v.sessions_lost = h.sessions_lost;
  return write_sized(v, out, err);
}

extern "C" {

int mqtt_inbox_subscriber_create(const mqtt_inbox_subscriber_options_t* options,
                                 mqtt_inbox_subscriber_t** out, char** errmsg) {
  if (out) *out = nullptr;
  if (errmsg) *errmsg = nullptr;
  LastError err;
  const int rc = guarded(&err, [&] {
    if (!options || !out)
      return err.set(MQTT_INBOX_MISUSE,
                     "mqtt_inbox_subscriber_create: options and out must not be NULL");
    mqtt_inbox_subscriber_options_t o;
    if (int r = mqtt_inbox::capi::read_sized(options, kDefaults, &o, &err)) return r;
    const mqtt_inbox::capi::CConnection c = mqtt_inbox::capi::connection_of(o);
    mqtt_inbox::SubscriberOptions so;
    if (int r = err.set(mqtt_inbox::capi::to_connection_options(c, &so))) return r;
    so.session_expiry_s = o.session_expiry_s;
    if (o.receive_maximum < 1 || o.receive_maximum > 65535)
      return err.set(MQTT_INBOX_INVALID_ARGUMENT, "receive_maximum must be 1..65535");
    so.receive_maximum = static_cast<uint16_t>(o.receive_maximum);
    so.stop_timeout_ms = o.stop_timeout_ms;
    auto h = std::make_unique<mqtt_inbox_subscriber_t>();
    if (::pipe2(h->wake, O_CLOEXEC | O_NONBLOCK) != 0)
      return err.set(MQTT_INBOX_IO_ERROR, std::string("pipe2: ") + std::strerror(errno));
    if (int r = err.set(mqtt_inbox::Subscriber::create(so, &h->subscriber))) return r;
    mqtt_inbox::capi::adopt(h.get(), {});
    *out = h.release();
    return MQTT_INBOX_OK;
  });
  if (rc != MQTT_INBOX_OK && errmsg) *errmsg = mqtt_inbox::capi::malloc_copy(err.read());
  return rc;
}

int mqtt_inbox_subscriber_destroy(mqtt_inbox_subscriber_t* subscriber) {
  if (subscriber && mqtt_inbox::capi::InCallback::active()) {
    mqtt_inbox::capi::Use use(subscriber, Kind::kSubscriber);
    return mqtt_inbox::capi::refused_in_callback(use ? &subscriber->error : nullptr,
                                                 "mqtt_inbox_subscriber_destroy");
  }
  return mqtt_inbox::capi::release_handle(subscriber, Kind::kSubscriber,
                                          "mqtt_inbox_subscriber_destroy",
                                          [](mqtt_inbox_subscriber_t* s) { return s->stop(); });
}

const char* mqtt_inbox_subscriber_errmsg(const mqtt_inbox_subscriber_t* subscriber) {
  mqtt_inbox::capi::Use use(subscriber, Kind::kSubscriber);
  return use ? subscriber->error.read() : mqtt_inbox::capi::dead_handle_text(Kind::kSubscriber);
}

int mqtt_inbox_subscriber_subscribe(mqtt_inbox_subscriber_t* subscriber, const char* topic_filter,
                                    mqtt_inbox_consumer_t* consumer) {
  return with_handle(subscriber, Kind::kSubscriber, [&] {
    if (!topic_filter)
      return subscriber->error.set(MQTT_INBOX_MISUSE,
                                   "mqtt_inbox_subscriber_subscribe: NULL topic_filter");
    // The consumer is held while it is linked: it cannot be destroyed in between.
    mqtt_inbox::capi::Use held(consumer, Kind::kConsumer);
    if (!held)
      return subscriber->error.set(MQTT_INBOX_MISUSE,
                                   std::string("mqtt_inbox_subscriber_subscribe: consumer is ") +
                                       mqtt_inbox::capi::dead_handle_text(Kind::kConsumer));
    if (int r = subscriber->error.set(
            subscriber->subscriber->subscribe(topic_filter, consumer->consumer.get())))
      return r;
    // From now on the subscriber delivers to it: the consumer's destroy waits for the
    // subscriber's (BUSY until then).
    mqtt_inbox::capi::link(subscriber, consumer);
    return MQTT_INBOX_OK;
  });
}

int mqtt_inbox_subscriber_start(mqtt_inbox_subscriber_t* subscriber) {
  return with_handle(subscriber, Kind::kSubscriber,
                     [&] { return subscriber->error.set(subscriber->subscriber->start()); });
}

int mqtt_inbox_subscriber_wait_connected(mqtt_inbox_subscriber_t* subscriber, int timeout_ms) {
  mqtt_inbox::capi::Use use(subscriber, Kind::kSubscriber);
  if (!use) return 0;
  // Returns 1 or 0, not a result code: guarded() would take 1 for a failure.
  try {
    const bool connected = subscriber->subscriber->wait_connected(timeout_ms);
    subscriber->error.clear();
    return connected ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int mqtt_inbox_subscriber_stop(mqtt_inbox_subscriber_t* subscriber) {
  return with_handle(subscriber, Kind::kSubscriber, [&] {
    if (mqtt_inbox::capi::InCallback::active())
      return mqtt_inbox::capi::refused_in_callback(&subscriber->error,
                                                   "mqtt_inbox_subscriber_stop");
    return subscriber->stop();
  });
}

void mqtt_inbox_subscriber_request_stop(mqtt_inbox_subscriber_t* subscriber) {
  // No registry lookup: it takes a lock, which a signal handler may not (c.h).
  if (subscriber) subscriber->request_stop();
}

int mqtt_inbox_subscriber_run(mqtt_inbox_subscriber_t* subscriber) {
  return with_handle(subscriber, Kind::kSubscriber, [&] {
    if (mqtt_inbox::capi::InCallback::active())
      return mqtt_inbox::capi::refused_in_callback(&subscriber->error, "mqtt_inbox_subscriber_run");
    while (!subscriber->stop_requested.load()) {
      pollfd p{subscriber->wake[0], POLLIN, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR)
        return subscriber->error.set(MQTT_INBOX_IO_ERROR,
                                     std::string("poll: ") + std::strerror(errno));
      char buf[64];
      while (::read(subscriber->wake[0], buf, sizeof buf) > 0) {
      }
    }
    return subscriber->stop();
  });
}

int mqtt_inbox_subscriber_health(mqtt_inbox_subscriber_t* subscriber,
                                 mqtt_inbox_connection_health_t* health) {
  return with_handle(subscriber, Kind::kSubscriber, [&] {
    if (!health)
      return subscriber->error.set(MQTT_INBOX_MISUSE, "mqtt_inbox_subscriber_health: NULL health");
    return mqtt_inbox::capi::write_connection_health(subscriber->subscriber->health(), health,
                                                     &subscriber->error);
  });
}

int mqtt_inbox_subscriber_health_json(mqtt_inbox_subscriber_t* subscriber, char** json) {
  return with_handle(subscriber, Kind::kSubscriber, [&] {
    if (!json)
      return subscriber->error.set(MQTT_INBOX_MISUSE,
                                   "mqtt_inbox_subscriber_health_json: NULL json");
    const mqtt_inbox::ConnectionHealth h = subscriber->subscriber->health();
    // Written as text (capi/json_text.h): an allocation failure is MQTT_INBOX_NOMEM.
    return mqtt_inbox::capi::hand_out_json(
        mqtt_inbox::capi::JsonObject()
            .flag("connected", h.connected)
            .number("since_ms", h.since_ms)
            .number("connect_attempts", h.connect_attempts)
            .number("connects", h.connects)
            .number("consecutive_failures", h.consecutive_failures)
            .text("last_failure", mqtt_inbox::to_string(h.last_failure))
            .text("last_error", h.last_error)
            .number("last_error_ms", h.last_error_ms)
            .number("connack_code", h.connack_code)
            .text("connack_reason", h.connack_reason)
            .number("sessions_lost", h.sessions_lost)
            .number("session_lost_ms", h.session_lost_ms)
            .text("session_lost", h.session_lost)
            .number("messages_received", subscriber->subscriber->messages_received())
            .done(),
        &subscriber->error, json);
  });
}

}  // extern "C"

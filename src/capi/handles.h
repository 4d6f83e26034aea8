// The structs behind c.h's opaque handles: each holds the C++ object it stands for and the
// last error message of calls on it. Only src/capi/ sees them.
#pragma once

#include <memory>
#include <string>

#include "capi/errors.h"
#include "mqtt_inbox/consumer.h"
#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/subscriber.h"

struct mqtt_inbox_t {
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  mqtt_inbox::capi::LastError error;
};

struct mqtt_inbox_consumer_t {
  mqtt_inbox_t* owner = nullptr;
  mqtt_inbox_handler handler = nullptr;
  void* ctx = nullptr;
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  mqtt_inbox::capi::LastError error;
};

namespace mqtt_inbox::capi {

// The C++ Subscriber behind a C subscriber handle (capi/subscriber.cpp keeps the handle's
// struct), for a relay lent its connection (mqtt_inbox_relay_create_on).
mqtt_inbox::Subscriber* subscriber_of(mqtt_inbox_subscriber_t* subscriber) noexcept;

}  // namespace mqtt_inbox::capi

// The delivery a C handler reads (c.h, mqtt_inbox_delivery_*): a view of the C++ Delivery
// for the length of one handler call, with the reason text the handler may set.
#pragma once

#include <string>

#include "mqtt_inbox/message.h"

namespace SQLite {
class Database;
}

struct mqtt_inbox_delivery_t {
  const mqtt_inbox::Delivery* delivery = nullptr;
  // The connection the handler was given, inside the claim transaction: what an outbox
  // enqueue from the handler writes through.
  SQLite::Database* db = nullptr;
  mutable std::string reason;
  mutable bool has_reason = false;
};

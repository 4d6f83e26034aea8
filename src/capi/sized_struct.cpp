// Which of c.h's structs a struct_id names (capi/sized_struct.h), for the message that
// says a struct of one kind was passed for another.
#include "capi/sized_struct.h"

namespace mqtt_inbox::capi {

namespace {

template <typename T>
bool is(const char id[4]) {
  return std::memcmp(id, StructInfo<T>::kId, 4) == 0;
}

}  // namespace

const char* struct_name_of(const char id[4]) noexcept {
  if (is<mqtt_inbox_options_t>(id)) return StructInfo<mqtt_inbox_options_t>::kName;
  if (is<mqtt_inbox_consumer_options_t>(id))
    return StructInfo<mqtt_inbox_consumer_options_t>::kName;
  if (is<mqtt_inbox_message_t>(id)) return StructInfo<mqtt_inbox_message_t>::kName;
  if (is<mqtt_inbox_consumer_counters_t>(id))
    return StructInfo<mqtt_inbox_consumer_counters_t>::kName;
  if (is<mqtt_inbox_subscriber_options_t>(id))
    return StructInfo<mqtt_inbox_subscriber_options_t>::kName;
  if (is<mqtt_inbox_connection_health_t>(id))
    return StructInfo<mqtt_inbox_connection_health_t>::kName;
  if (is<mqtt_inbox_outbox_class_t>(id)) return StructInfo<mqtt_inbox_outbox_class_t>::kName;
  if (is<mqtt_inbox_outbox_options_t>(id)) return StructInfo<mqtt_inbox_outbox_options_t>::kName;
  if (is<mqtt_inbox_outgoing_t>(id)) return StructInfo<mqtt_inbox_outgoing_t>::kName;
  if (is<mqtt_inbox_relay_options_t>(id)) return StructInfo<mqtt_inbox_relay_options_t>::kName;
  if (is<mqtt_inbox_pruner_options_t>(id)) return StructInfo<mqtt_inbox_pruner_options_t>::kName;
  return nullptr;
}

}  // namespace mqtt_inbox::capi

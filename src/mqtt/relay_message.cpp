#include "mqtt/relay_message.h"

#include "mqtt/publish_size.h"

namespace mqtt_inbox::detail {

mqtt::message_ptr to_paho_message(const OutboxRow& row, bool mqtt5) {
  auto msg = mqtt::make_message(row.topic, row.payload, 1, false);
  if (!mqtt5) return msg;
  mqtt::properties props;
  props.add({mqtt::property::USER_PROPERTY, "message-id", row.message_id});
  const OutgoingMessage& p = row.properties;
  for (const auto& up : p.user_properties)
    props.add({mqtt::property::USER_PROPERTY, up.first, up.second});
  if (p.content_type) props.add({mqtt::property::CONTENT_TYPE, mqtt::string_ref(*p.content_type)});
  if (p.response_topic)
    props.add({mqtt::property::RESPONSE_TOPIC, mqtt::string_ref(*p.response_topic)});
  if (p.correlation_data)
    props.add({mqtt::property::CORRELATION_DATA, mqtt::string_ref(*p.correlation_data)});
  if (p.payload_format_indicator)
    props.add({mqtt::property::PAYLOAD_FORMAT_INDICATOR,
               static_cast<int32_t>(*p.payload_format_indicator)});
  // What is left of the expiry after the wait in the outbox, as a server forwards it (MQTT
  // 5.0 section 3.3.2.3.3); a row that ran out never gets here (unpublishable).
  if (p.message_expiry_interval_s)
    props.add(
        {mqtt::property::MESSAGE_EXPIRY_INTERVAL, static_cast<int32_t>(remaining_expiry_s(row))});
  msg->set_properties(props);
  return msg;
}

std::optional<OutboxDeadReason> unpublishable(const OutboxRow& row, bool mqtt5,
                                              int64_t broker_limit, int64_t own_limit,
                                              std::string* text) {
  if (expired(row)) {
    *text = "message expiry interval of " +
            std::to_string(*row.properties.message_expiry_interval_s) + " s ran out after " +
            std::to_string(row.waited_ms / 1000) + " s in the outbox";
    return OutboxDeadReason::kExpired;
  }
  const bool own = own_limit > 0 && (broker_limit <= 0 || own_limit < broker_limit);
  const int64_t limit = own ? own_limit : broker_limit;
  if (limit <= 0) return std::nullopt;
  const int64_t size = publish_packet_size(row, mqtt5);
  if (size <= limit) return std::nullopt;
  *text =
      "PUBLISH of " + std::to_string(size) + " bytes is larger than " +
      (own ? "RelayOptions::max_packet_size, " + std::to_string(limit) + " bytes"
           : "the broker's Maximum Packet Size of " + std::to_string(limit) + " bytes (CONNACK)");
  return OutboxDeadReason::kPayloadTooLarge;
}

}  // namespace mqtt_inbox::detail

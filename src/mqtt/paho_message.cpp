// The MQTT layer's message conversion and topic-filter matching (MQTT 3.1.1 section 4.7,
// MQTT 5.0 section 4.8.2 for shared subscriptions): what the message callback needs to
// hand a delivery to its sink.
#include "mqtt/paho_message.h"

#include <string>
#include <string_view>
#include <tuple>

#include "mqtt_inbox/subscriber.h"

namespace mqtt_inbox {

bool topic_matches(const std::string& filter_in, const std::string& topic) {
  // Views, no copies: this runs for every delivery, on Paho's receive thread.
  std::string_view filter(filter_in);
  const std::string_view t(topic);
  if (filter.substr(0, 7) == "$share/") {  // $share/{group}/{filter}, MQTT 5.0 4.8.2
    const size_t slash = filter.find('/', 7);
    if (slash == std::string_view::npos) return false;
    filter.remove_prefix(slash + 1);
  }
  if (!t.empty() && t[0] == '$' && !filter.empty() && (filter[0] == '+' || filter[0] == '#'))
    return false;  // MQTT 3.1.1 section 4.7.2
  size_t f = 0, p = 0;
  for (;;) {
    const size_t fe = filter.find('/', f);
    const std::string_view level = filter.substr(f, fe == std::string_view::npos ? fe : fe - f);
    if (level == "#") return true;  // matches the parent level too ("a/#" matches "a")
    if (p > t.size()) return false;
    const size_t te = t.find('/', p);
    const std::string_view tlevel = t.substr(p, te == std::string_view::npos ? te : te - p);
    if (level != "+" && level != tlevel) return false;
    if (fe == std::string_view::npos) return te == std::string_view::npos;
    if (te == std::string_view::npos) {
      // Topic ended; only a trailing "#" level can still match.
      return filter.substr(fe + 1) == "#";
    }
    f = fe + 1;
    p = te + 1;
  }
}

namespace detail {

Message to_message(const mqtt::message& pm) {
  Message m;
  m.topic = pm.get_topic();
  m.payload = pm.get_payload();
  m.qos = pm.get_qos();
  m.dup = pm.is_duplicate();
  m.retain = pm.is_retained();
  const mqtt::properties& props = pm.get_properties();
  if (props.size() == 0) return m;
  const size_t n = props.count(mqtt::property::USER_PROPERTY);
  for (size_t i = 0; i < n; ++i) {
    auto pair = mqtt::get<mqtt::string_pair>(props, mqtt::property::USER_PROPERTY, i);
    m.user_properties.emplace_back(std::get<0>(pair), std::get<1>(pair));
  }
  if (props.contains(mqtt::property::CONTENT_TYPE))
    m.content_type = mqtt::get<std::string>(props, mqtt::property::CONTENT_TYPE);
  if (props.contains(mqtt::property::RESPONSE_TOPIC))
    m.response_topic = mqtt::get<std::string>(props, mqtt::property::RESPONSE_TOPIC);
  if (props.contains(mqtt::property::CORRELATION_DATA))
    m.correlation_data = mqtt::get<std::string>(props, mqtt::property::CORRELATION_DATA);
  if (props.contains(mqtt::property::PAYLOAD_FORMAT_INDICATOR))
    m.payload_format_indicator =
        mqtt::get<uint8_t>(props, mqtt::property::PAYLOAD_FORMAT_INDICATOR);
  if (props.contains(mqtt::property::MESSAGE_EXPIRY_INTERVAL))
    m.message_expiry_interval_s =
        mqtt::get<uint32_t>(props, mqtt::property::MESSAGE_EXPIRY_INTERVAL);
  return m;
}

}  // namespace detail

}  // namespace mqtt_inbox

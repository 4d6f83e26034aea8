#include "support/publisher.h"

#include <mqtt/async_client.h>

#include <unistd.h>

#include <atomic>

namespace mqtt_inbox::test {

TestPublisher::TestPublisher(const std::string& uri, bool mqtt5) : mqtt5_(mqtt5) {
  static std::atomic<int> n{0};
  client_ = std::make_unique<mqtt::async_client>(
      uri, "test-publisher-" + std::to_string(getpid()) + "-" + std::to_string(n++),
      mqtt::create_options(mqtt5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1), nullptr);
  auto opts = mqtt::connect_options_builder()
                  .mqtt_version(mqtt5 ? MQTTVERSION_5 : MQTTVERSION_3_1_1)
                  .clean_session(!mqtt5)
                  .clean_start(mqtt5)
                  .finalize();
  client_->connect(opts)->wait();
}

TestPublisher::~TestPublisher() {
  try {
    client_->disconnect()->wait();
  } catch (...) {
  }
}

void TestPublisher::publish(const std::string& topic, const std::string& payload,
                            const std::vector<std::pair<std::string, std::string>>& props,
                            bool retain) {
  auto msg = mqtt::make_message(topic, payload, 1, retain);
  if (mqtt5_ && !props.empty()) {
    mqtt::properties p;
    for (const auto& kv : props) p.add({mqtt::property::USER_PROPERTY, kv.first, kv.second});
    msg->set_properties(p);
  }
  client_->publish(msg)->wait();
}

void TestPublisher::credit(const std::string& topic, const std::string& id,
                           const std::string& account, long long amount) {
  const std::string body = "{\"message_id\":\"" + id + "\",\"account\":\"" + account +
                           "\",\"amount\":" + std::to_string(amount) + "}";
  publish(topic, body, {{"message-id", id}});
}

void TestPublisher::credit_expiring(const std::string& topic, const std::string& id,
                                    const std::string& account, long long amount,
                                    uint32_t expiry_s) {
  const std::string body = "{\"message_id\":\"" + id + "\",\"account\":\"" + account +
                           "\",\"amount\":" + std::to_string(amount) + "}";
  auto msg = mqtt::make_message(topic, body, 1, false);
  mqtt::properties p;
  p.add({mqtt::property::USER_PROPERTY, std::string("message-id"), id});
  p.add({mqtt::property::MESSAGE_EXPIRY_INTERVAL, static_cast<int>(expiry_s)});
  msg->set_properties(p);
  client_->publish(msg)->wait();
}

}  // namespace mqtt_inbox::test

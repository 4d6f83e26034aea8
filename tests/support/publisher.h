// Test support: a QoS 1 publisher that waits for the broker's PUBACK of every message, so
// a test knows the broker holds what it published (guarantees.md section 2: do not feed
// tests with mosquitto_pub -l).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mqtt {
class async_client;
}

namespace mqtt_inbox::test {

class TestPublisher {
 public:
  TestPublisher(const std::string& uri, bool mqtt5 = true);
  ~TestPublisher();
  // Publishes at QoS 1 and waits for the PUBACK. `props` become MQTT 5 user properties;
  // `retain` sets the RETAIN flag (the broker keeps the message for later subscribers).
  void publish(const std::string& topic, const std::string& payload,
               const std::vector<std::pair<std::string, std::string>>& props = {},
               bool retain = false);
  // A ledger credit carrying `id` in the JSON body and, with MQTT 5, in the
  // "message-id" user property.
  void credit(const std::string& topic, const std::string& id, const std::string& account,
              long long amount);
  // credit() with an MQTT 5 Message Expiry Interval of `expiry_s` seconds (MQTT 5 only:
  // 3.1.1 has no expiry).
  void credit_expiring(const std::string& topic, const std::string& id, const std::string& account,
                       long long amount, uint32_t expiry_s);

 private:
  std::unique_ptr<mqtt::async_client> client_;
  bool mqtt5_;
};

}  // namespace mqtt_inbox::test

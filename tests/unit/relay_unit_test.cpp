// The outbox relay's decisions that need no broker, member by member (issue 27): what each
// outcome of a publish token means (mqtt/publish_outcome.h), which row a connection's end is
// blamed on and when it becomes a dead letter (mqtt/relay_drops.h), and which packet size limit
// refuses a row before it is sent (mqtt/relay_message.h). The same decisions against a real
// mosquitto, on MQTT 3.1.1 and 5: relay_test.cpp, relay_lent_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "mqtt/publish_outcome.h"
#include "mqtt/publish_size.h"
#include "mqtt/relay_drops.h"
#include "mqtt/relay_message.h"

namespace mqtt_inbox::detail {
namespace {

// Paho C's MQTTASYNC_* return codes (MQTTAsync.h, v1.3.12) the relay's tokens complete with.
constexpr int kSuccess = 0;                // MQTTASYNC_SUCCESS: a PUBACK arrived
constexpr int kSocketError = -1;           // SOCKET_ERROR / MQTTASYNC_FAILURE
constexpr int kDisconnected = -3;          // MQTTASYNC_DISCONNECTED
constexpr int kOperationIncomplete = -11;  // MQTTASYNC_OPERATION_INCOMPLETE
constexpr int kV3Code = 255;               // Paho C++ 1.2.0's MQTTPP_V3_CODE

constexpr bool kV5 = true;
constexpr bool kV3 = false;

// MQTT 5: only a PUBACK with a reason code >= 0x80 is a refusal.
TEST(PublishOutcome, Mqtt5PubackSuccessCodesAreAcks) {
  EXPECT_EQ(classify_publish(false, kV5, kSuccess, 0x00), PublishOutcome::kAcked);
  // 0x10 no matching subscribers: a success (MQTT 5.0 section 3.4.2.1).
  EXPECT_EQ(classify_publish(false, kV5, kSuccess, 0x10), PublishOutcome::kAcked);
}

TEST(PublishOutcome, Mqtt5PubackRefusalsAreRefusals) {
  for (int code : {0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
    EXPECT_EQ(classify_publish(true, kV5, kSuccess, code), PublishOutcome::kRefused) << code;
}

// MQTT 5 failures without a PUBACK, as Paho C 1.3.12 reports them.
TEST(PublishOutcome, Mqtt5FailuresWithoutPubackArePublishedAgain) {
  // Connection lost with a clean session (MQTTAsync_closeSession -> freeResponses), client
  // destroyed (MQTTAsync_destroy), disconnect: the failure data's initializer, reason 0.
  EXPECT_EQ(classify_publish(true, kV5, kOperationIncomplete, 0x00), PublishOutcome::kRepublish);
  // Writing the PUBLISH failed: code -1, and in MQTTAsync_writeComplete the MQTT 5
  // failure data is not initialised, so any reason code may come with it.
  for (int garbage : {0x00, 0x80, 0x87, 0x97, 0xff, 0x12345, -7})
    EXPECT_EQ(classify_publish(true, kV5, kSocketError, garbage), PublishOutcome::kRepublish)
        << garbage;
  // Paho C++ token::on_failure5 without failure data: return code -1, reason unchanged.
  EXPECT_EQ(classify_publish(true, kV5, -1, 0x00), PublishOutcome::kRepublish);
  EXPECT_EQ(classify_publish(true, kV5, kDisconnected, 0x00), PublishOutcome::kRepublish);
  // A failure that says success and no refusal cannot come from Paho; nothing proves the
  // broker has the message, so it goes again.
  EXPECT_EQ(classify_publish(true, kV5, kSuccess, 0x00), PublishOutcome::kRepublish);
  EXPECT_EQ(classify_publish(true, kV5, kSuccess, 0x10), PublishOutcome::kRepublish);
}

// MQTT 3.1.1: no reason codes, no refusal. Paho C++ sets 255 on every failure (the fault
// of issue 27: read as a refusal, every publish in flight at a broker restart was dead).
TEST(PublishOutcome, Mqtt311HasNoRefusal) {
  EXPECT_EQ(classify_publish(false, kV3, kSuccess, 0x00), PublishOutcome::kAcked);
  EXPECT_EQ(classify_publish(true, kV3, kOperationIncomplete, kV3Code), PublishOutcome::kRepublish);
  EXPECT_EQ(classify_publish(true, kV3, kSocketError, kV3Code), PublishOutcome::kRepublish);
  EXPECT_EQ(classify_publish(true, kV3, kDisconnected, kV3Code), PublishOutcome::kRepublish);
  EXPECT_EQ(classify_publish(true, kV3, kSuccess, kV3Code), PublishOutcome::kRepublish);
  EXPECT_EQ(classify_publish(true, kV3, kSuccess, 0x87), PublishOutcome::kRepublish);
}

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(DropCulprit, BlamesTheOldestPublishOnlyWhenNothingWasAckedAfterItAndTheEndCameSoon) {
  const Clock::time_point t0 = Clock::now();
  const auto window = milliseconds(5000);
  // The broker closed the connection as it read the row: no PUBACK since, 10 ms later.
  EXPECT_EQ(drop_culprit(true, 42, t0, Clock::time_point{}, t0 + milliseconds(10), window), 42);
  EXPECT_EQ(drop_culprit(true, 42, t0, t0 - milliseconds(1), t0 + milliseconds(10), window), 42);
  // Nothing in flight: nothing to blame.
  EXPECT_EQ(drop_culprit(false, 42, t0, Clock::time_point{}, t0 + milliseconds(10), window),
            std::nullopt);
  // A PUBACK arrived after it was published: the broker read past it.
  EXPECT_EQ(drop_culprit(true, 42, t0, t0 + milliseconds(1), t0 + milliseconds(10), window),
            std::nullopt);
  // The connection lasted longer than the window after it (a keep-alive timeout, a
  // network outage): not its fault.
  EXPECT_EQ(drop_culprit(true, 42, t0, Clock::time_point{}, t0 + milliseconds(5001), window),
            std::nullopt);
  EXPECT_EQ(drop_culprit(true, 42, t0, Clock::time_point{}, t0 + milliseconds(5000), window), 42);
}

TEST(DropTracker, DeadLettersARowBlamedThreeTimesInARow) {
  DropTracker t(3);
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
  EXPECT_EQ(t.count(), 1);
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
  EXPECT_EQ(t.connection_ended(7), 7);
  EXPECT_EQ(t.count(), 0);  // counts afresh after a verdict
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
}

TEST(DropTracker, OnlyConsecutiveEndsCount) {
  DropTracker t(3);
  // An end blamed on no row (a broker restart after PUBACKs) starts over.
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
  EXPECT_EQ(t.connection_ended(std::nullopt), std::nullopt);
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
  // An end blamed on another row starts over with that row.
  EXPECT_EQ(t.connection_ended(8), std::nullopt);
  EXPECT_EQ(t.suspect(), 8);
  EXPECT_EQ(t.connection_ended(8), std::nullopt);
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
  EXPECT_EQ(t.connection_ended(7), std::nullopt);
  EXPECT_EQ(t.connection_ended(7), 7);
}

OutboxRow row_of(const std::string& payload) {
  OutboxRow r;
  r.seq = 1;
  r.message_id = "evt-1";
  r.topic = "events/k0";
  r.ordering_key = r.topic;
  r.payload = payload;
  return r;
}

// The limit that refuses a row before it is sent: the broker's announced Maximum Packet
// Size (MQTT 5), the user's RelayOptions::max_packet_size, the smaller of both.
TEST(Unpublishable, TheSmallerOfTheAnnouncedAndTheStatedLimitApplies) {
  const OutboxRow r = row_of(std::string(100, 'x'));
  const int64_t v3 = publish_packet_size(r, false), v5 = publish_packet_size(r, true);
  EXPECT_EQ(v3, 1 + 1 + (2 + 9) + 2 + 100);  // MQTT 3.1.1: no properties
  EXPECT_GT(v5, v3);                         // MQTT 5: the "message-id" user property
  std::string why;
  EXPECT_EQ(unpublishable(r, false, 0, 0, &why), std::nullopt);   // no limit at all
  EXPECT_EQ(unpublishable(r, false, 0, v3, &why), std::nullopt);  // exactly the limit
  EXPECT_EQ(unpublishable(r, false, 0, v3 - 1, &why), OutboxDeadReason::kPayloadTooLarge);
  EXPECT_NE(why.find("RelayOptions::max_packet_size"), std::string::npos) << why;
  EXPECT_NE(why.find(std::to_string(v3) + " bytes"), std::string::npos) << why;
  // MQTT 5: the broker's limit, unless the user's is smaller.
  EXPECT_EQ(unpublishable(r, true, v5 - 1, 0, &why), OutboxDeadReason::kPayloadTooLarge);
  EXPECT_NE(why.find("Maximum Packet Size"), std::string::npos) << why;
  EXPECT_EQ(unpublishable(r, true, v5 - 1, v5 + 100, &why), OutboxDeadReason::kPayloadTooLarge);
  EXPECT_NE(why.find("Maximum Packet Size"), std::string::npos) << why;
  EXPECT_EQ(unpublishable(r, true, v5 + 100, v5 - 1, &why), OutboxDeadReason::kPayloadTooLarge);
  EXPECT_NE(why.find("RelayOptions::max_packet_size"), std::string::npos) << why;
  EXPECT_EQ(unpublishable(r, true, v5, v5, &why), std::nullopt);
}

}  // namespace
}  // namespace mqtt_inbox::detail

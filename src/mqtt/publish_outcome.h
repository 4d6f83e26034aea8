// Internal (MQTT layer): what the outcome of a QoS 1 publish token means to the outbox
// relay. A pure function of what the token carries, so that every outcome, on both MQTT
// versions, is decided in one place and tested member by member (publish_outcome_test).
// No Paho header: the caller passes the token's fields.
//
// What Paho C 1.3.12 and Paho C++ 1.2.0 hand a publish's listener (read in their sources:
// MQTTAsyncUtils.c, token.cpp; docs/guarantees.md section 8):
//  - on_success: a PUBACK arrived. MQTT 5: its reason code was < 0x80 (0x00 success, 0x10
//    no matching subscribers). For a QoS 1 publish Paho calls no success without a PUBACK.
//  - on_failure with return code MQTTASYNC_SUCCESS (0) and a reason code >= 0x80: MQTT 5
//    only, a PUBACK that arrived with that reason code (MQTTAsync_receiveThread: the
//    failure data's `code` stays 0 from its initializer, `reasonCode` is the PUBACK's).
//    The one refusal there is.
//  - on_failure with any other return code: no PUBACK arrived.
//      MQTTASYNC_OPERATION_INCOMPLETE (-11): the publish was still waiting for its PUBACK
//        (or not yet sent) when the session was cleaned (connection lost with a clean
//        session, MQTTAsync_closeSession) or the client was destroyed (MQTTAsync_destroy,
//        which the relay and a lending Subscriber do before every reconnect), or a
//        disconnect cleaned it.
//      SOCKET_ERROR (-1): writing the PUBLISH failed (MQTTAsync_processCommand), or a
//        partly written one could not be finished (MQTTAsync_writeComplete; there the
//        MQTT 5 failure data is not initialised, so its reason code is whatever the
//        stack held).
//    Its reason code means nothing: Paho C++ sets 255 (MQTTPP_V3_CODE) for every MQTT
//    3.1.1 failure, MQTT 5 failures carry 0 or an uninitialised value.
//  - MQTT 3.1.1 has no reason codes and no refusal: every PUBACK is a success.
#pragma once

namespace mqtt_inbox::detail {

enum class PublishOutcome {
  kAcked,      // a PUBACK with a success code: mark the row sent
  kRefused,    // an MQTT 5 PUBACK with a reason code >= 0x80: the row is a dead letter
  kRepublish,  // no PUBACK: publish the row again (after the rows before it)
};

// `failed`: the token completed through on_failure. `return_code`: the token's return
// code (mqtt::token::get_return_code(), MQTTASYNC_*). `reason_code`: its reason code
// (get_reason_code()).
constexpr PublishOutcome classify_publish(bool failed, bool mqtt5, int return_code,
                                          int reason_code) {
  if (!failed) return PublishOutcome::kAcked;
  // MQTT 5.0 section 2.4: a reason code >= 0x80 is a failure; only a PUBACK carries one
  // to a publish (return code 0).
  if (mqtt5 && return_code == 0 && reason_code >= 0x80 && reason_code <= 0xff)
    return PublishOutcome::kRefused;
  return PublishOutcome::kRepublish;
}

}  // namespace mqtt_inbox::detail

// Test support: the integration suite's core cases, written once and run against every
// broker the project is tested with: mosquitto (crash_test, subscriber_test) and
// RabbitMQ's MQTT plugin (rabbitmq_test), on SQLite; and on both stores: mosquitto on
// PostgreSQL (tests/postgres/core_pg_test). Real broker, real store (SQLite files, a
// private PostgreSQL cluster), assertions on the ledger's business state. Each case works
// in a fresh folder (and a fresh location of its store) and uses client ids and topics
// under its own prefix, so the cases can share one broker. The store is the last
// parameter (support/store_under_test.h), SQLite unless given.
#pragma once

#include <functional>
#include <string>

#include <mqtt_inbox/subscriber.h>

#include "support/child_consumer.h"
#include "support/store_under_test.h"

namespace mqtt_inbox::test {

struct BrokerUnderTest {
  std::string name;  // for messages: "mosquitto", "rabbitmq"
  std::string uri;
  MqttVersion version = MqttVersion::kV3_1_1;
  // Stop the broker gracefully / start it again with its persistent state.
  std::function<void()> stop, start;
  // How long a restarted broker may take to accept connections again, ms.
  int restart_timeout_ms = 15000;
};

// Exactly-once under SIGKILL: the consumer process is killed after the commit of c-5 and
// before its PUBACK; the broker redelivers c-5 to the restarted consumer, which skips it
// as a duplicate. All ten credits applied once. `children` runs crash_consumer, on the
// store of ChildConsumers::use_store (SQLite unless called).
void core_case_exactly_once_under_sigkill(const ChildConsumers& children);

// Persistent-session redelivery: messages published while the consumer is offline are
// kept in its session and applied, once, when it comes back.
void core_case_offline_messages_are_delivered(const BrokerUnderTest& broker,
                                              const std::string& prefix,
                                              const StoreUnderTest& store = sqlite_store());

// Broker restart: a connected subscriber reconnects by itself and goes on with the
// session it had; messages queued for an offline subscriber survive the restart. One
// restart serves both.
void core_case_broker_restart_keeps_sessions(const BrokerUnderTest& broker,
                                             const std::string& prefix,
                                             const StoreUnderTest& store = sqlite_store());

// A session lost while the consumer is stopped (issue 27 item 4): the consumer applies 2
// credits and stops, 10 more are queued in its session, `destroy(client_id)` ends that
// session at the broker, and the consumer starts again. The loss is counted once (the
// Subscriber, its health, the Inbox's stats) and warned about naming the filter; the
// filter is subscribed again and 3 credits published afterwards are applied; the 10 are
// gone (the broker's doing: the loss being reported).
void core_case_session_lost_while_stopped(
    const BrokerUnderTest& broker, const std::string& prefix,
    const std::function<void(const std::string& client_id)>& destroy,
    const StoreUnderTest& store = sqlite_store());

}  // namespace mqtt_inbox::test

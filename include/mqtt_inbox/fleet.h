// Fleet: several consumer processes, on several hosts, sharing one MQTT shared
// subscription ($share/<group>/<filter>) and one PostgreSQL inbox, so that no dead
// member's share of the stream is left behind (docs/fleet.md).
//
// Why: a broker keeps a durable member's turns of a shared subscription in that member's
// session while it is away, and hands its unacknowledged messages back only to the same
// client id (mosquitto: measured, docs/brokers-and-tls.md#shared-subscriptions; `mqtt-inbox
// probe-broker --shared` asks yours). A member that dies for good strands 1/N of the
// stream. So the fleet works a fixed set of client-id slots instead of one client id per
// process: "<prefix>-0" .. "<prefix>-(slots-1)". Each slot is one MQTT session, durable as
// a Subscriber's always is. A process holds a slot by a lease in PostgreSQL and runs one
// Subscriber per slot it holds; when a process dies its leases run out, a live member
// takes its slots, connects with their client ids, and drains what the broker parked
// there. Slots spread evenly over the live members as members join and leave.
//
// The rules it keeps:
//  - Exactly once rests on the claim table, as for one consumer: a message that reaches
//    two slots (a publisher's resend while the first copy is in flight) is applied once.
//    The leases are for liveness: every slot is served by one live member.
//  - A slot is connected by at most one process at a time (one window aside: a lease
//    connection the server sees break frees the slots at once, and the broker may take a
//    client id over once before the old Subscriber stopped; docs/fleet.md#leases). A
//    member serves a slot only while its lease is fresh: less than half a lease since the
//    start of its last successful renewal. The server ends a member's lease one lease
//    after its last renewal (the PostgreSQL session's idle_session_timeout), so the next
//    holder connects only after the last one stopped. A member that cannot renew
//    (PostgreSQL is down, or the network to it) stops its Subscribers, and never
//    reconnects a slot without a fresh lease (SubscriberOptions::may_connect), so two
//    processes never take a client id from each other in turn.
//  - The session expiry (SubscriberOptions::session_expiry_s) is the window for the
//    whole fleet: messages parked in a slot whose session expired are deleted by the
//    broker. It must outlast the longest time a slot can go unserved, which is when
//    every member is down; create() refuses less than 10 leases.
//  - Order: messages of one topic reach different slots, so arrival order at the inbox is
//    not publish order across slots (docs/fleet.md#order).
//
// A Fleet needs an Inbox on PostgreSQL 14 or later (postgres.h; idle_session_timeout),
// reached directly or through session pooling (not transaction pooling): every member must
// reach the leases. The leases live on a connection of their own, in the inbox's schema's
// name space. docs/fleet.md lists what every member must agree on.
//
//   FleetOptions o;
//   o.group = "ledger";         // $share/ledger/credits/#, client ids ledger-0 .. ledger-7
//   o.slots = 8;
//   o.subscriber.broker_uri = "tcp://broker:1883";
//   std::unique_ptr<Fleet> fleet;
//   Status s = Fleet::create(inbox.get(), o, &fleet);
//   s = fleet->subscribe("credits/#", consumer.get());
//   s = fleet->start();
//
// Thread safety: as Subscriber's: subscribe() before start(); the rest from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mqtt_inbox/message.h"
#include "mqtt_inbox/service_notifier.h"
#include "mqtt_inbox/status.h"
#include "mqtt_inbox/subscriber.h"

namespace mqtt_inbox {

class Inbox;

struct FleetOptions {
  // The shared subscription's group: every filter is subscribed as
  // "$share/<group>/<filter>", and the leases are the group's. 1..64 characters of
  // [A-Za-z0-9_-]. Required.
  std::string group;
  // How many client-id slots the group has; caps how many sessions, and so processes,
  // share the stream. Every member must use the same number. 1..1024. Default 8.
  int slots = 8;
  // Every slot's Subscriber is made from this. client_id is the slots' prefix:
  // "<client_id>-<slot>"; empty (the default) means the group. clean_session must stay
  // false, and session_expiry_s must be at least 10 leases (see above). may_connect is
  // the fleet's own and must be left empty. The logger is also the fleet's.
  SubscriberOptions subscriber;
  // The lease, ms: how long after a member last renewed PostgreSQL frees its slots, and
  // so about how long a dead member's slots wait for a new holder. Shorter takes over
  // faster; it must cover a member's pauses (a long GC-like stall, a slow server), or its
  // slots move back and forth. 1000..3600000. Default 10000.
  int lease_ms = 10000;
  // How often a member renews its lease and rebalances, ms. 0 (default) = lease_ms / 5.
  // 10 .. lease_ms / 3.
  int renew_interval_ms = 0;
};

// A snapshot of one member (Fleet::health()). Times are steady-clock ms ago; -1 = never.
struct FleetHealth {
  std::vector<int> slots;        // slots this member holds, ascending
  std::vector<int> serving;      // slots whose Subscriber runs now, ascending
  std::vector<int> connected;    // slots whose Subscriber is connected, ascending
  int members = 0;               // live members at the last renewal
  int target = 0;                // this member's share at the last renewal
  int64_t renewed_ms_ago = -1;   // since the start of the last successful renewal
  int64_t slots_taken = 0;       // slots taken, this process
  int64_t slots_given_back = 0;  // slots given back to spread them, this process
  int64_t leases_lost = 0;       // times every slot was lost (renewal failed)
  std::string last_error;        // the last failed renewal, "" if none
  int lease_ms = 0;              // FleetOptions::lease_ms
  int slot_count = 0;            // FleetOptions::slots
  // Subscriber::health() of each slot in `serving`, in the same order: why a slot's
  // connection attempts fail (a refusal, TLS), as for one Subscriber.
  std::vector<ConnectionHealth> serving_health;
};

class Fleet {
 public:
  // Validates the options (kInvalidArgument with the reason) and checks that the inbox's
  // store can hold leases (kInvalidArgument for an SQLite inbox). `inbox` must outlive
  // the Fleet.
  static Status create(Inbox* inbox, const FleetOptions& options, std::unique_ptr<Fleet>* out);
  // Stops (see stop()).
  ~Fleet();

  // Routes messages matching `topic_filter` (no "$share/" prefix: the fleet adds it) to
  // `sink`, as Subscriber::subscribe, on every slot's Subscriber. Call before start().
  // Errors: kInvalidArgument as Subscriber::subscribe, or after start().
  Status subscribe(const std::string& topic_filter, MessageSink* sink);

  // Starts the lease thread (join the group, renew, take and give back slots) and the
  // slot thread (a Subscriber for each slot held with a fresh lease); returns at once.
  // Errors: kInvalidArgument if nothing was subscribed, or a second call.
  Status start();

  // Waits up to `timeout_ms` until this member serves `slots` slots, each connected.
  // false on timeout (not an error).
  bool wait_serving(int slots, int timeout_ms);

  // Stops every slot's Subscriber (Subscriber::stop(), in parallel), then leaves the
  // group, giving its slots back at once. kBusy as Subscriber::stop when a message was
  // still waiting for the store: the group is not left (the server frees the slots when
  // the process exits), and the process should exit; nothing unacked is lost. A lease
  // round that a server which stopped answering still holds after a lease is not waited
  // for: its connection is broken (the server frees the slots when it sees that), so a
  // stop takes at most SubscriberOptions::stop_timeout_ms plus a lease. A second stop()
  // does nothing more and returns OK.
  Status stop();

  // A snapshot; never waits for the store, the lease thread or Paho's lock.
  FleetHealth health() const;

 private:
  struct Impl;
  explicit Fleet(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A ServiceNotifier source (service_notifier.h) for a fleet member, name "fleet":
// connected while the lease is fresh and every slot this member holds is connected (a
// member holding no slot, in a fleet with more members than slots, is connected once its
// lease is); a note with the slots held and the members, and while not connected why
// (the lease's age and last failed renewal, or a slot's last failed attempt). Keeps a
// reference: the fleet must outlive the notifier.
HealthSource health_source(const Fleet& fleet);

}  // namespace mqtt_inbox

// SlotLeases: one fleet member's hold on a group's client-id slots (fleet.h), kept by the
// store that all members share. The store layer owns how a slot is held and how members
// are counted; the Fleet (src/fleet/) owns what a held slot does (its Subscriber).
//
// The PostgreSQL store (store/postgres/slot_leases.cpp) holds them on a connection of its
// own: a shared advisory lock per member, an exclusive one per slot, and a server-side
// idle_session_timeout of one lease, so that the server ends the session, and with it
// every lock, one lease after the member last renewed (a crash, a frozen process, a
// partition alike). docs/fleet.md says why.
//
// Thread safety: one thread at a time (the Fleet's lease thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

// What a round found (SlotLeases::round).
struct SlotLeaseRound {
  std::vector<int> held;  // slots this member holds after the round, ascending
  int target = 0;         // this member's share of the slots now
  int members = 0;        // live members of the group, this one included
};

// A slot as the store sees it (SlotLeases::list, `mqtt-inbox fleet`).
struct SlotHolder {
  int slot = -1;       // -1: a member's row, holding no particular slot
  int pid = 0;         // the holder's server process (backend pid); 0: free
  std::string holder;  // the holder's application_name ("mqtt-inbox fleet <group> <pid>@<host>")
  int64_t renewed_ms_ago = -1;  // since the holder's last renewal, ms; -1 when free
};

struct SlotLeaseOptions {
  std::string group;        // the fleet's group name (fleet.h)
  int slots = 0;            // how many slots the group has: 0 .. slots-1
  int lease_ms = 0;         // the lease: the server frees a silent member's slots after it
  std::string member_name;  // shown as the holder (application_name)
};

class SlotLeases {
 public:
  virtual ~SlotLeases() = default;
  // One renewal round: connects and joins the group first if this member is not joined
  // (a new connection holds no slot), gives back the slots in `release` (their
  // Subscribers must already be stopped), counts the live members, sets this member's
  // target share (the slots spread evenly over the members, ranked by their server
  // process ids) and takes free slots up to it. Errors: the store's. After an error the
  // caller must treat every slot as lost: the connection is closed, and the server frees
  // its slots at once, or a lease after the last round if it cannot see the close.
  virtual Status round(const std::vector<int>& release, SlotLeaseRound* out) = 0;
  // Every member and slot of the group now: the members first (slot -1), then each slot
  // 0 .. slots-1 (pid 0 when free). Used without round() (the admin tool), it connects
  // without joining, so it changes nobody's share. Errors: the store's.
  virtual Status list(std::vector<SlotHolder>* out) = 0;
  // Leaves the group: gives back every slot and closes the connection.
  virtual void leave() = 0;
  // From any thread, for a stop: breaks the connection's socket, so a round() or list()
  // blocked on a server that stopped answering (hung, or a proxy in between frozen; TCP's
  // own timeouts never fire while something still acknowledges the bytes) fails at once,
  // also while it is still setting the connection up. The server frees the slots as after
  // any broken connection. Sticky: every connection opened later is broken at once too.
  virtual void interrupt() = 0;
};

}  // namespace mqtt_inbox::detail

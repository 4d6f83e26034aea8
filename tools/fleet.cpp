// `mqtt-inbox fleet DB --group G [--slots K]`: a fleet's members and slots as the store's
// leases show them (docs/fleet.md, docs/admin-tool.md (fleet)): who holds each slot, and how
// long ago each holder last renewed its lease. It watches without joining, so it changes
// nobody's share. PostgreSQL only: a fleet's leases live there.
#include <iostream>
#include <map>
#include <string>

#include "commands.h"
#include "database.h"
#include "format.h"
#include "pg_admin.h"
#include "store/inbox.h"
#include "store/slot_leases.h"
#include "store/store.h"
#include "tool.h"

namespace mqtt_inbox::cli {

#if MQTT_INBOX_WITH_POSTGRES

int cmd_fleet(const std::string& db, const FleetArgs& a) {
  if (!is_postgres(db))
    fail(kUnsupported, "fleet: " + db +
                           " is an SQLite file; a fleet's leases live in a PostgreSQL inbox "
                           "(docs/fleet.md)");
  auto inbox = pg_open_inbox(db);
  detail::SlotLeaseOptions o;
  o.group = a.group;
  o.slots = a.slots;
  o.lease_ms = 60000;  // the observer's own session; it holds nothing
  o.member_name = "mqtt-inbox fleet (admin tool)";
  std::unique_ptr<detail::SlotLeases> leases;
  check_status(detail::InboxImpl::store_of(inbox.get())->open_slot_leases(o, &leases), "fleet");
  std::vector<detail::SlotHolder> rows;
  check_status(leases->list(&rows), "fleet");
  leases->leave();

  int members = 0, held = 0, slots = 0;
  std::map<int, int> held_by;  // pid -> slots
  for (const auto& r : rows) {
    if (r.slot < 0) {
      ++members;
    } else {
      ++slots;
      if (r.pid != 0) {
        ++held;
        ++held_by[r.pid];
      }
    }
  }
  if (g.json) {
    json j;
    j["group"] = a.group;
    j["members"] = json::array();
    j["slots"] = json::array();
    for (const auto& r : rows) {
      json x;
      x["pid"] = r.pid;
      x["holder"] = r.holder;
      x["renewed_ms_ago"] = r.renewed_ms_ago;
      if (r.slot < 0) {
        x["slots_held"] = held_by[r.pid];
        j["members"].push_back(x);
      } else {
        x["slot"] = r.slot;
        x["client_id"] = a.prefix.empty() ? a.group + "-" + std::to_string(r.slot)
                                          : a.prefix + "-" + std::to_string(r.slot);
        j["slots"].push_back(x);
      }
    }
    emit(j);
    return kOk;
  }
  std::cout << "fleet '" << a.group << "': " << members << " member(s), " << held << " of " << slots
            << " slot(s) held\n\n";
  std::vector<std::vector<std::string>> m, s;
  for (const auto& r : rows) {
    const std::string renewed = r.renewed_ms_ago < 0 ? "-" : human_ms(r.renewed_ms_ago) + " ago";
    if (r.slot < 0) {
      m.push_back({std::to_string(r.pid), r.holder, std::to_string(held_by[r.pid]), renewed});
    } else {
      const std::string client =
          (a.prefix.empty() ? a.group : a.prefix) + "-" + std::to_string(r.slot);
      s.push_back({std::to_string(r.slot), client, r.pid ? std::to_string(r.pid) : "free",
                   r.pid ? renewed : "-"});
    }
  }
  if (!m.empty()) {
    print_table({"member pid", "member", "slots", "renewed"}, m);
    std::cout << "\n";
  }
  print_table({"slot", "client id", "holder pid", "renewed"}, s);
  if (slots > held && members > 0)
    std::cout << "\n"
              << slots - held
              << " slot(s) free: the members take them at their next renewal; what the "
                 "broker parked there waits in those sessions until then\n";
  if (members == 0)
    std::cout << "\nno member is running: every slot's messages wait in the broker's "
                 "sessions, until their session expiry\n";
  return kOk;
}

#else

int cmd_fleet(const std::string&, const FleetArgs&) {
  fail(kUnsupported, "fleet: this build of mqtt-inbox has no PostgreSQL store");
}

#endif  // MQTT_INBOX_WITH_POSTGRES

}  // namespace mqtt_inbox::cli

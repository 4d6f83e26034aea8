// PgSlotLeases: a fleet member's slots (store/slot_leases.h), held by session-level
// advisory locks on a connection of their own (docs/fleet.md#leases).
//
// The group's locks are two-key advisory locks (pg_advisory_lock(int4, int4)): the first
// key is hashtext("mqtt_inbox fleet <schema> <group>"), the second the slot number, or
// kMemberKey for membership, which every member holds shared. pg_locks then shows the
// group whole: the members (and so each one's share) and every slot's holder, with
// pg_stat_activity's application_name and state_change (when the holder last renewed).
//
// The lease is the session's: the connection sets idle_session_timeout to one lease, so
// the server ends a session that ran no statement for a lease, and its locks go with it.
// A member renews by running a round at least every lease / 3 (the Fleet's default is
// every lease / 5). That one rule frees the slots of a crashed process (its socket
// closes at once), of a frozen one (its kernel still answers TCP, so only a timeout on
// the server frees them) and of one cut off by the network alike. The member's side
// (fleet.cpp) stops serving its slots once half a lease has passed since the start of its
// last successful round, before the server can have freed them.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "store/postgres/backend.h"
#include "store/postgres/errors.h"

namespace mqtt_inbox::detail {

namespace {

// The second key of the membership lock: above any slot number.
constexpr int kMemberKey = 2147483647;

class PgSlotLeases final : public SlotLeases {
 public:
  PgSlotLeases(PgBackend& store, SlotLeaseOptions options)
      : store_(store), options_(std::move(options)) {}
  ~PgSlotLeases() override { leave(); }

  Status round(const std::vector<int>& release, SlotLeaseRound* out) override {
    *out = SlotLeaseRound{};
    if (!conn_ || !joined_) {
      if (Status s = join(); !s.ok()) return s;
    }
    try {
      pqxx::nontransaction n(*conn_);
      for (int slot : release) {
        if (!held_.count(slot)) continue;
        n.exec_params("SELECT pg_advisory_unlock($1, $2)", key_, slot);
        held_.erase(slot);
      }
      std::vector<int> members;
      std::map<int, int> holders;  // slot -> pid
      read_group(n, &members, &holders);
      const int me = conn_->backendpid();
      // What the server says this member holds is the truth: a slot held_ believes in but
      // the server does not show is not held.
      held_.clear();
      for (const auto& [slot, pid] : holders)
        if (pid == me) held_.insert(slot);
      if (std::find(members.begin(), members.end(), me) == members.end())
        throw std::runtime_error("this member's membership lock is gone");
      const int m = static_cast<int>(members.size());
      const int rank =
          static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
      const int target = options_.slots / m + (rank < options_.slots % m ? 1 : 0);
      for (int slot = 0; slot < options_.slots && static_cast<int>(held_.size()) < target; ++slot) {
        if (holders.count(slot)) continue;
        if (n.exec_params1("SELECT pg_try_advisory_lock($1, $2)", key_, slot)[0].as<bool>())
          held_.insert(slot);
      }
      out->held.assign(held_.begin(), held_.end());
      out->target = target;
      out->members = m;
      return Status::Ok();
    } catch (const std::exception& e) {
      // Closed whatever failed: the server frees the locks (at once, or a lease after the
      // last round if it cannot see the close), as "every slot lost" means; a connection
      // kept after a failed statement would keep slots nobody serves.
      drop();
      return pg_to_status(e, "renewing the slot leases of fleet '" + options_.group + "'");
    }
  }

  Status list(std::vector<SlotHolder>* out) override {
    out->clear();
    if (!conn_) {
      // An observer (the admin tool): connected, not a member, so it changes no share.
      if (Status s = connect(); !s.ok()) return s;
    }
    try {
      pqxx::nontransaction n(*conn_);
      const pqxx::result r = n.exec_params(
          "SELECT l.objid::int8, l.pid, coalesce(a.application_name, ''), "
          "       CASE WHEN a.state = 'active' THEN 0 ELSE "
          "       (extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::int8 END "
          "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
          "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
          "  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
          "  AND l.classid = ($1::int4::int8 & 4294967295)::oid "
          "ORDER BY l.objid, l.pid",
          key_);
      std::map<int, SlotHolder> slots;
      for (int i = 0; i < options_.slots; ++i) slots[i].slot = i;
      for (const auto& row : r) {
        SlotHolder h;
        const int64_t objid = row[0].as<int64_t>();
        h.slot = objid == kMemberKey ? -1 : static_cast<int>(objid);
        h.pid = row[1].as<int>();
        h.holder = row[2].as<std::string>();
        h.renewed_ms_ago = row[3].is_null() ? -1 : row[3].as<int64_t>();
        if (h.slot < 0)
          out->push_back(h);
        else
          slots[h.slot] = h;
      }
      for (auto& [slot, h] : slots) out->push_back(h);
      return Status::Ok();
    } catch (const std::exception& e) {
      drop();
      return pg_to_status(e, "listing fleet '" + options_.group + "'");
    }
  }

  void interrupt() override {
    std::lock_guard<std::mutex> lock(sock_mu_);
    interrupted_ = true;
    if (sock_ >= 0) (void)::shutdown(sock_, SHUT_RDWR);
  }

  void leave() override {
    // Closing is enough: the server frees a session's advisory locks when it ends, at
    // once on the Terminate message libpq sends, which waits for no answer, so a server
    // that stopped answering cannot hold up a stop here (it ends the session one lease
    // later, idle_session_timeout).
    drop();
  }

 private:
  // Connects and sets the lease on the session.
  Status connect() {
    drop();
    std::unique_ptr<PgConnection> c;
    // An unreachable server (a partition, a host gone) fails the attempt within about
    // a lease, not TCP's connect retries (about two minutes), so Fleet::stop and the
    // relay's stop are not held up by it. libpq counts whole seconds, at least 2.
    const int connect_s = std::max(2, static_cast<int>((options_.lease_ms + 999) / 1000));
    const PgBackend::Role role =
        options_.group == "outbox relay" ? PgBackend::Role::kRelayTurn : PgBackend::Role::kLease;
    Status s = store_.open_connection(
        &c, role, options_.group, connect_s, [this](pqxx::connection_base& opened) {
          // The member's own side of the lease: a round on a connection the network dropped
          // fails within one lease instead of waiting for TCP's retransmissions (about 15
          // minutes). A Unix-domain socket refuses the option and needs none.
          const unsigned int timeout_ms = static_cast<unsigned int>(options_.lease_ms);
          (void)::setsockopt(opened.sock(), IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms,
                             sizeof timeout_ms);
          // From here on interrupt() reaches this connection, the statements that set it up
          // included. A descriptor of our own (a dup) for it: never closed under libpq, so
          // its number is never another file's while interrupt() may use it.
          std::lock_guard<std::mutex> lock(sock_mu_);
          close_sock_locked();
          sock_ = ::fcntl(opened.sock(), F_DUPFD_CLOEXEC, 0);
          if (interrupted_ && sock_ >= 0) (void)::shutdown(sock_, SHUT_RDWR);
        });
    if (s.ok()) {
      try {
        pqxx::nontransaction n(*c);
        // idle_session_timeout is PostgreSQL 14's; an older server refuses it here.
        n.exec_params("SELECT set_config('idle_session_timeout', $1, false)",
                      std::to_string(options_.lease_ms));
        n.exec_params("SELECT set_config('application_name', $1, false)", options_.member_name);
        key_ = n.exec_params1("SELECT hashtext($1)",
                              "mqtt_inbox fleet " + store_.schema + " " + options_.group)[0]
                   .as<int>();
      } catch (const std::exception& e) {
        s = pg_to_status(e, "connecting for fleet '" + options_.group + "'");
      }
    }
    if (!s.ok()) {
      c.reset();
      drop();  // our descriptor too: the server sees the connection close
      return s;
    }
    conn_ = std::move(c);
    return Status::Ok();
  }

  // Connects (if not connected) and joins the group: the membership lock, shared.
  Status join() {
    if (!conn_) {
      if (Status s = connect(); !s.ok()) return s;
    }
    try {
      pqxx::nontransaction n(*conn_);
      n.exec_params("SELECT pg_advisory_lock_shared($1, $2)", key_, kMemberKey);
    } catch (const std::exception& e) {
      drop();
      return pg_to_status(e, "joining fleet '" + options_.group + "'");
    }
    joined_ = true;
    held_.clear();
    return Status::Ok();
  }

  // The group's members (ascending backend pid) and slot holders now.
  void read_group(pqxx::nontransaction& n, std::vector<int>* members, std::map<int, int>* holders) {
    const pqxx::result r = n.exec_params(
        "SELECT l.objid::int8, l.pid FROM pg_locks l "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
        "  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "  AND l.classid = ($1::int4::int8 & 4294967295)::oid "
        "ORDER BY l.pid",
        key_);
    for (const auto& row : r) {
      const int64_t objid = row[0].as<int64_t>();
      const int pid = row[1].as<int>();
      if (objid == kMemberKey)
        members->push_back(pid);
      else if (objid >= 0 && objid < options_.slots)
        (*holders)[static_cast<int>(objid)] = pid;
    }
  }

  // Closes the connection: the server frees its locks (at once if it is alive and
  // reachable; else one lease after the last renewal).
  void drop() {
    conn_.reset();
    {
      std::lock_guard<std::mutex> lock(sock_mu_);
      close_sock_locked();
    }
    joined_ = false;
    held_.clear();
  }

  PgBackend& store_;
  const SlotLeaseOptions options_;
  std::unique_ptr<PgConnection> conn_;
  void close_sock_locked() {
    if (sock_ >= 0) ::close(sock_);
    sock_ = -1;
  }
  std::mutex sock_mu_;        // sock_ and interrupted_, for interrupt() from another thread
  int sock_ = -1;             // a dup of conn_'s socket (ours to close); -1 when none
  bool interrupted_ = false;  // interrupt() was called: every later connection is broken too
  int key_ = 0;
  bool joined_ = false;  // conn_ holds the membership lock
  std::set<int> held_;
};

}  // namespace

Status PgBackend::open_slot_leases(const SlotLeaseOptions& lease_options,
                                   std::unique_ptr<SlotLeases>* out) {
  *out = std::make_unique<PgSlotLeases>(*this, lease_options);
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

// RelaySource: the relay side of an Outbox (outbox.h), the narrow port through which the
// MQTT layer's Relay (relay.h, mqtt/relay.cpp) reaches the outbox: the relay turn, the
// read of pending rows, the marks, and the wake-up on commit. The public Outbox keeps the
// producer's, the inspector's and the operator's calls; Relay::create(Outbox*, ...) stays
// the public entry and takes this port from the Outbox it is given (RelaySource::of).
// Implemented by the outbox's policy (detail::OutboxImpl, outbox/outbox_impl.h), over the
// store's rows (store/outbox_rows.h). The one header of src/outbox/ the MQTT layer
// includes: it names only public types, no store type and no SQL.
//
// Errors: every call that returns a Status never throws; a call from inside a handler of
// the outbox's Inbox is refused (kInvalidArgument, store/reentry.h), as every Outbox call
// is. Thread safety: the store calls run on the Inbox's connection, serialised on the
// Inbox's mutex; renew_relay_turn and give_back_relay_turn from one thread at a time (the
// relay's); the commit wakers from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "mqtt_inbox/outbox.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::detail {

class RelaySource {
 public:
  // The relay side of `outbox`; null for a null outbox or an Outbox that Outbox::create
  // did not make (a class of the application's derived from Outbox). Not owned: it lives
  // as long as the Outbox. Never fails otherwise; any thread.
  static RelaySource* of(Outbox* outbox);

  virtual ~RelaySource() = default;

  // The relay turn: at most one relay of this outbox, in any process, publishes at a time
  // (docs/outbox.md#several-relays). A Relay calls this before it connects and then at
  // least every lease_ms / 3 while it publishes; *held says whether it holds the turn now,
  // and it may publish until half a lease after the call began. On PostgreSQL the turn is
  // a lease like a fleet's slot (fleet.h): an advisory lock on a connection of its own
  // whose server session ends lease_ms after the holder's last call, so a dead or frozen
  // relay's turn passes to a live one; a holder keeps it as long as it renews (no
  // hand-over when another relay starts). On SQLite, whose file one process holds, always
  // held. PostgreSQL 14 or later (idle_session_timeout). lease_ms: 1000..3600000. Errors:
  // kInvalidArgument for lease_ms; the store's (then *held is false, and the turn's
  // connection is closed, so the server frees it). Thread safety: one caller at a time.
  virtual Status renew_relay_turn(int lease_ms, bool* held) = 0;
  // Gives the turn back at once, if held (Relay::stop). Never fails.
  virtual void give_back_relay_turn() = 0;
  // True when relays in several processes may share this outbox and take turns
  // (PostgreSQL); false when one process holds the store (SQLite), whose relay always
  // holds the turn. A Relay on a connection of its own then takes its client-id lock
  // (RelayOptions::client_id_lock_dir) only while it holds the turn, so a relay standing
  // by on the same host waits for it instead of failing start(). Never fails.
  virtual bool relays_take_turns() const = 0;

  // Up to `limit` (> 0) pending rows with seq > after_seq, in seq order, into *out
  // (cleared first), as one consistent read: it takes no write lock (it proceeds while
  // another connection writes) and writes nothing. Errors: kInvalidArgument for limit;
  // the store's codes.
  virtual Status fetch_pending(int64_t after_seq, int limit, std::vector<OutboxRow>* out) = 0;
  // Marks these rows sent (state 'sent', sent_at) and adds each one's publishes to its
  // attempts, in one transaction committed without fsync: a lost mark only means a resend
  // with the same id. Rows no longer pending (dropped, dead, already sent) are skipped;
  // the marked ones are counted (OutboxCounters::sent). Errors: the store's codes.
  virtual Status mark_sent(const std::vector<OutboxMark>& rows) = 0;
  // Makes a pending row an outbox dead letter with `reason`, the PUBACK reason code (0 if
  // none) and a text, and adds its publishes to its attempts. Committed with fsync;
  // counted (OutboxCounters::dead) and logged at warn. A row no longer pending is left as
  // it is. Errors: the store's codes.
  virtual Status mark_dead(const OutboxMark& row, OutboxDeadReason reason, int reason_code,
                           const std::string& text) = 0;

  // Calls `wake` after each commit whose transaction enqueued a row (through this or any
  // other Outbox of the file) or replayed one (Outbox::replay_dead), on any connection the
  // library opened to the Inbox's database file in this process: the Inbox's own, a
  // StoreThenProcess worker's, another Inbox's on the same file. Commits on a connection
  // the application opened itself, or by another process, call nothing
  // (docs/outbox.md#limits). On the PostgreSQL store, every commit that enqueued or
  // replayed a row in the Inbox's schema calls it, from any connection and any process: a
  // thread of the Inbox LISTENs on a connection of its own while a waker is added
  // (docs/postgres.md#the-outbox), and `wake` then also runs on that thread. A Relay
  // subscribes with it (RelayOptions::wake_on_commit) so that a row goes out as soon as it
  // is visible, not at the next poll. `wake` runs on the committing thread, with a lock
  // held that every commit's wake-up takes: it must only signal (set a flag, notify a
  // condition variable), never block, throw or call into the library. Kept until
  // remove_commit_waker(). Returns the id for that call (never 0). Thread-safe.
  virtual uint64_t add_commit_waker(std::function<void()> wake) = 0;
  // Ends the subscription `id`: after it returns, its `wake` is not running and is never
  // called again. An unknown id is ignored. Thread-safe; not from inside a `wake`.
  virtual void remove_commit_waker(uint64_t id) = 0;
};

}  // namespace mqtt_inbox::detail

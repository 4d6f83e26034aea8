// The PostgreSQL store's outbox (store/outbox_rows.h): <schema>.outbox_messages and
// <schema>.outbox_usage (kept by the trigger outbox_usage_track, open.cpp step 2). The
// enqueue's statements run in the caller's libpqxx transaction (a PgHandler's, on the
// store's connection, or one the application opened on its own connection); the relay's
// fetch and marks, inspection and repair on the store's connection under its mutex
// (PgBackend::with_txn). docs/postgres.md#the-outbox says why each step is the way it is.
//
// Commit order is seq order. The relay reads pending rows past the last seq it took, so a
// row whose seq is below one already read must never become visible later. On SQLite one
// writer makes that so; here two transactions could take seqs 10 and 11 and commit 11
// first. So every transaction that takes a seq or changes a class's usage (enqueue, the
// relay's marks, replay_dead) first takes one transaction-scoped advisory lock per schema
// (kOutboxLock): enqueuing transactions queue up from their first enqueue to their
// commit, and a seq is only taken once every transaction that took a lower one has
// ended. Taking that lock first, everywhere, also orders the usage rows' locks: no
// deadlock between an enqueue that drops a class's oldest row and a relay marking it.
//
// Wake-up: an enqueue or a replay runs pg_notify(<channel>, '') in its transaction,
// delivered only if it commits. With a commit waker added, a thread of this store LISTENs
// on a connection of its own and calls the wakers on each notification, from any process
// (the relay of another gateway, an application's own connection). A commit on the
// store's connection also wakes them in process right after it (PgBackend::outbox_committed),
// without the round trip.
#include "store/outbox_rows.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mqtt_inbox/outbox.h"
#include "store/postgres/backend.h"
#include "store/postgres/errors.h"
#include "store/reentry.h"
#include "util/log.h"

namespace mqtt_inbox::detail {

namespace {

// The columns read_row() reads, in its order.
constexpr const char* kRowColumns =
    "seq, message_id, ordering_key, topic, payload, properties, size_bytes, enqueued_at, state, "
    "attempts, sent_at, dead_reason, reason_code, reason_text, enqueued_clock";

StoredOutboxRow read_row(const pqxx::row& q, int64_t clock_now) {
  StoredOutboxRow s;
  OutboxRow& r = s.row;
  r.seq = q[0].as<int64_t>();
  r.message_id = q[1].as<std::string>();
  r.ordering_key = q[2].as<std::string>();
  r.topic = q[3].as<std::string>();
  r.payload = pqxx::binarystring(q[4]).str();
  s.properties_json = q[5].as<std::string>();
  r.size_bytes = q[6].as<int64_t>();
  r.enqueued_at_ms = q[7].as<int64_t>();
  const std::string state = q[8].as<std::string>();
  r.state = state == "sent"   ? OutboxState::kSent
            : state == "dead" ? OutboxState::kDead
                              : OutboxState::kPending;
  r.attempts = q[9].as<int>();
  r.sent_at_ms = q[10].is_null() ? 0 : q[10].as<int64_t>();
  if (!q[11].is_null()) {
    const std::string reason = q[11].as<std::string>();
    for (auto c : {OutboxDeadReason::kRejectedByBroker, OutboxDeadReason::kExpired,
                   OutboxDeadReason::kPayloadTooLarge, OutboxDeadReason::kConnectionDropped})
      if (reason == to_string(c)) r.dead_reason = c;
  }
  r.reason_code = q[12].is_null() ? 0 : q[12].as<int>();
  r.reason_text = q[13].is_null() ? "" : q[13].as<std::string>();
  r.waited_ms = std::max<int64_t>(0, clock_now - q[14].as<int64_t>());
  return s;
}

// The libpqxx transaction `txn` names: a handler's (pqxx::transaction_base), or one the
// application opened of a type libpqxx 6.4 has (Outbox::enqueue takes its own type).
pqxx::transaction_base& txn_of(const TxnRef& txn) {
  const std::type_info& t = txn.type ? *txn.type : typeid(void);
  if (t == typeid(pqxx::transaction_base*))
    return *static_cast<pqxx::transaction_base*>(txn.handle);
  if (t == typeid(pqxx::dbtransaction*)) return *static_cast<pqxx::dbtransaction*>(txn.handle);
  if (t == typeid(pqxx::work*)) return *static_cast<pqxx::work*>(txn.handle);
  if (t == typeid(pqxx::transaction<pqxx::repeatable_read>*))
    return *static_cast<pqxx::transaction<pqxx::repeatable_read>*>(txn.handle);
  if (t == typeid(pqxx::transaction<pqxx::serializable>*))
    return *static_cast<pqxx::transaction<pqxx::serializable>*>(txn.handle);
  if (t == typeid(pqxx::subtransaction*)) return *static_cast<pqxx::subtransaction*>(txn.handle);
  if (t == typeid(pqxx::nontransaction*)) return *static_cast<pqxx::nontransaction*>(txn.handle);
  if (t == typeid(PgWork*)) return *static_cast<PgWork*>(txn.handle);
  throw std::invalid_argument(
      "outbox enqueue: the transaction is not a libpqxx transaction of this inbox's store "
      "(pass the handler's pqxx::transaction_base&, or a pqxx::work)");
}

// The notification channel of the schema (a channel name is at most 63 bytes; two
// schemas whose names share the first 45 characters wake each other's relays for
// nothing, which costs those relays one read).
std::string channel_of(const std::string& quoted_schema) {
  const std::string name =
      quoted_schema.size() >= 2 ? quoted_schema.substr(1, quoted_schema.size() - 2) : "";
  return "mqtt_inbox_outbox." + name.substr(0, 45);
}

class PgOutbox final : public OutboxStore {
 public:
  // Made with the PgBackend, before open_postgres_store sets its schema: nothing here reads
  // it yet.
  explicit PgOutbox(PgBackend& store) : s_(store) {}
  ~PgOutbox() override {
    stopping_for_good_ = true;
    stop_listener();
  }

  bool in_transaction(const TxnRef& txn) override {
    // A libpqxx transaction object is open from its construction to its commit or abort;
    // but a nontransaction commits each statement: the row would be visible before the
    // caller's change, the lock that keeps seq order would not hold, and a refused row
    // would be seen before it is taken out again.
    return dynamic_cast<const pqxx::nontransaction*>(&txn_of(txn)) == nullptr;
  }

  bool insert(const TxnRef& txn, const NewOutboxRow& row, int64_t* seq) override {
    pqxx::transaction_base& w = txn_of(txn);
    lock_outbox(w);
    // The class's usage row, made if new and read FOR UPDATE: the bounds are checked
    // against a count no other transaction changes before this one ends.
    w.exec_params0("INSERT INTO " + s_.t("outbox_usage") +
                       " (class) VALUES ($1) ON CONFLICT (class) DO NOTHING",
                   *row.class_prefix);
    w.exec_params("SELECT rows FROM " + s_.t("outbox_usage") + " WHERE class = $1 FOR UPDATE",
                  *row.class_prefix);
    const pqxx::result r = w.exec_params(
        "INSERT INTO " + s_.t("outbox_messages") +
            " (message_id, ordering_key, class, topic, payload, properties, qos, size_bytes,"
            " enqueued_at, enqueued_clock) VALUES ($1, $2, $3, $4, $5::bytea, $6, 1, $7, $8, $9)"
            " ON CONFLICT (message_id) DO NOTHING RETURNING seq",
        *row.message_id, *row.ordering_key, *row.class_prefix, *row.topic, w.esc_raw(*row.payload),
        *row.properties_json, row.size_bytes, row.enqueued_at_ms, row.enqueued_clock);
    if (r.empty()) return false;
    *seq = r[0][0].as<int64_t>();
    // Delivered to the listeners only if this transaction commits.
    w.exec_params("SELECT pg_notify($1, '')", channel());
    return true;
  }

  void remove(const TxnRef& txn, int64_t seq) override {
    txn_of(txn).exec_params0("DELETE FROM " + s_.t("outbox_messages") + " WHERE seq = $1", seq);
  }

  void class_usage(const TxnRef& txn, const std::string& class_prefix, int64_t* rows,
                   int64_t* bytes) override {
    const pqxx::result r = txn_of(txn).exec_params(
        "SELECT rows, bytes FROM " + s_.t("outbox_usage") + " WHERE class = $1", class_prefix);
    *rows = r.empty() ? 0 : r[0][0].as<int64_t>();
    *bytes = r.empty() ? 0 : r[0][1].as<int64_t>();
  }

  bool oldest_pending(const TxnRef& txn, const std::string& class_prefix, int64_t except_seq,
                      OldestPending* out) override {
    const pqxx::result r = txn_of(txn).exec_params(
        "SELECT seq, size_bytes, message_id, enqueued_clock FROM " + s_.t("outbox_messages") +
            " WHERE class = $1 AND state = 'pending' AND seq <> $2 ORDER BY seq LIMIT 1",
        class_prefix, except_seq);
    if (r.empty()) return false;
    out->seq = r[0][0].as<int64_t>();
    out->size_bytes = r[0][1].as<int64_t>();
    out->message_id = r[0][2].as<std::string>();
    out->enqueued_clock = r[0][3].as<int64_t>();
    return true;
  }

  int64_t remove_pending_before(const TxnRef& txn, const std::string& class_prefix,
                                int64_t except_seq, int64_t cutoff) override {
    return static_cast<int64_t>(
        txn_of(txn)
            .exec_params("DELETE FROM " + s_.t("outbox_messages") +
                             " WHERE class = $1 AND state = 'pending' AND seq <> $2"
                             " AND enqueued_clock < $3",
                         class_prefix, except_seq, cutoff)
            .affected_rows());
  }

  void count_drops(const TxnRef& txn, const std::string& class_prefix, int64_t n) override {
    txn_of(txn).exec_params0(
        "UPDATE " + s_.t("outbox_usage") + " SET dropped = dropped + $1 WHERE class = $2", n,
        class_prefix);
  }

  void wake_after_commit(const TxnRef& txn) override {
    (void)txn;
    // A handler of this inbox runs in the store's transaction, under its mutex: its commit
    // wakes the relays in process (PgBackend::outbox_committed). Any other transaction's
    // commit reaches them through NOTIFY.
    if (in_handler_of(s_.owner())) s_.outbox_wake_armed = true;
  }

  bool store_error(const std::exception& e, const char* what, Status* out) override {
    Status s;
    bool message_fault = false;
    if (!classify_pg_exception(e, &s, &message_fault)) return false;
    *out = pg_to_status(e, what);
    return true;
  }

  Status fetch_pending(int64_t after_seq, int limit, std::vector<StoredOutboxRow>* out) override {
    // A connection lost since the store's last call (a server restart, which also wakes the
    // relay through the listener's new LISTEN) is found here: read once more on a new one,
    // rather than leave the rows to the relay's next poll.
    Status s = fetch_once(after_seq, limit, out);
    if (s.code() == Status::Code::kIoError) s = fetch_once(after_seq, limit, out);
    return s;
  }

  Status fetch_once(int64_t after_seq, int limit, std::vector<StoredOutboxRow>* out) {
    // One statement at READ COMMITTED: one snapshot, no lock but the table's share lock.
    return s_.with_txn("Outbox::fetch_pending", [&](PgWork& w) {
      out->clear();
      const int64_t clock_now = s_.retention_clock();
      for (const pqxx::row& r :
           w.exec_params(std::string("SELECT ") + kRowColumns + " FROM " + s_.t("outbox_messages") +
                             " WHERE state = 'pending' AND seq > $1 ORDER BY seq LIMIT $2",
                         after_seq, limit))
        out->push_back(read_row(r, clock_now));
    });
  }

  Status mark_sent(const std::vector<OutboxMark>& rows, int64_t* changed) override {
    *changed = 0;
    return s_.with_txn("Outbox::mark_sent", [&](PgWork& w) {
      *changed = 0;
      // A lost mark only means a resend with the same id (store/outbox_rows.h).
      w.exec0("SET LOCAL synchronous_commit = off");
      lock_outbox(w);
      const int64_t now = s_.clock->wall_ms();
      const int64_t retention_now = s_.retention_clock();
      for (const OutboxMark& r : rows)
        *changed += static_cast<int64_t>(
            w.exec_params("UPDATE " + s_.t("outbox_messages") +
                              " SET state = 'sent', sent_at = $1, retention_at = $2,"
                              " attempts = attempts + $3 WHERE seq = $4 AND state = 'pending'",
                          now, retention_now, std::max(0, r.publishes), r.seq)
                .affected_rows());
    });
  }

  Status mark_dead(const OutboxMark& row, OutboxDeadReason reason, int reason_code,
                   const std::string& text, bool* changed) override {
    *changed = false;
    return s_.with_txn("Outbox::mark_dead", [&](PgWork& w) {
      lock_outbox(w);
      *changed =
          w.exec_params("UPDATE " + s_.t("outbox_messages") +
                            " SET state = 'dead', dead_reason = $1, reason_code = $2,"
                            " reason_text = $3, dead_at = $4, retention_at = $5,"
                            " attempts = attempts + $6 WHERE seq = $7 AND state = 'pending'",
                        std::string(to_string(reason)), reason_code, text, s_.clock->wall_ms(),
                        s_.retention_clock(), std::max(0, row.publishes), row.seq)
              .affected_rows() > 0;
    });
  }

  Status list(OutboxState state, int limit, std::vector<StoredOutboxRow>* out) override {
    return s_.with_txn("Outbox::list", [&](PgWork& w) {
      out->clear();
      const int64_t clock_now = s_.retention_clock();
      // The state as a literal, so the query can use that state's partial index.
      for (const pqxx::row& r :
           w.exec_params(std::string("SELECT ") + kRowColumns + " FROM " + s_.t("outbox_messages") +
                             " WHERE state = '" + to_string(state) + "' ORDER BY seq LIMIT $1",
                         limit))
        out->push_back(read_row(r, clock_now));
    });
  }

  Status usage(std::vector<OutboxClassUsage>* out) override {
    return s_.with_txn("Outbox::usage", [&](PgWork& w) { read_usage(w, out); });
  }

  Status summary(OutboxSummary* out) override {
    return s_.with_txn("Outbox::summary", [&](PgWork& w) {
      read_usage(w, &out->classes);
      const std::string m = s_.t("outbox_messages");
      const pqxx::row r =
          w.exec1("SELECT (SELECT count(*) FROM " + m +
                  " WHERE state = 'pending'), (SELECT count(*) FROM " + m +
                  " WHERE state = 'sent'), (SELECT count(*) FROM " + m +
                  " WHERE state = 'dead'), (SELECT enqueued_at FROM " + m +
                  " WHERE state = 'pending' ORDER BY seq LIMIT 1), (SELECT enqueued_clock FROM " +
                  m + " WHERE state = 'pending' ORDER BY seq LIMIT 1)");
      out->pending_rows = r[0].as<int64_t>();
      out->sent_rows = r[1].as<int64_t>();
      out->dead_rows = r[2].as<int64_t>();
      out->oldest_pending_enqueued_at_ms = r[3].is_null() ? 0 : r[3].as<int64_t>();
      out->oldest_pending_waited_ms =
          r[4].is_null() ? 0 : std::max<int64_t>(0, s_.retention_clock() - r[4].as<int64_t>());
      out->pending_bytes = 0;
      for (const auto& c : out->classes) out->pending_bytes += c.bytes;
    });
  }

  Status get(const std::string& message_id, StoredOutboxRow* out, bool* found) override {
    *found = false;
    return s_.with_txn("Outbox::get", [&](PgWork& w) {
      const pqxx::result r = w.exec_params(std::string("SELECT ") + kRowColumns + " FROM " +
                                               s_.t("outbox_messages") + " WHERE message_id = $1",
                                           message_id);
      *found = !r.empty();
      if (*found) *out = read_row(r[0], s_.retention_clock());
    });
  }

  Status replay_dead(const std::string& message_id, std::optional<OutboxState>* state,
                     int64_t* new_seq) override {
    return s_.with_txn("Outbox::replay_dead", [&](PgWork& w) {
      state->reset();
      lock_outbox(w);
      const pqxx::result r = w.exec_params(
          "SELECT state FROM " + s_.t("outbox_messages") + " WHERE message_id = $1 FOR UPDATE",
          message_id);
      if (r.empty()) return;
      const std::string st = r[0][0].as<std::string>();
      *state = st == "sent"   ? OutboxState::kSent
               : st == "dead" ? OutboxState::kDead
                              : OutboxState::kPending;
      if (*state != OutboxState::kDead) return;
      // A new seq (the identity's next value, never handed out before), so a running relay,
      // which reads past the last seq it took, sends it; the trigger counts it in its class
      // again. Its age restarts; enqueued_at is kept.
      *new_seq = w.exec_params1("UPDATE " + s_.t("outbox_messages") +
                                    " SET seq = DEFAULT, state = 'pending', attempts = 0,"
                                    " sent_at = NULL, dead_reason = NULL, reason_code = NULL,"
                                    " reason_text = NULL, dead_at = NULL, retention_at = NULL,"
                                    " enqueued_clock = $2 WHERE message_id = $1 RETURNING seq",
                                message_id, s_.retention_clock())[0]
                     .as<int64_t>();
      w.exec_params("SELECT pg_notify($1, '')", channel());
      s_.outbox_wake_armed = true;  // with_txn's commit wakes the relays in process
    });
  }

  Status purge(const OutboxPurgeFilter& f, int64_t* removed) override {
    *removed = 0;
    return s_.with_txn("Outbox::purge", [&](PgWork& w) {
      const bool dead = f.state == OutboxState::kDead;
      // Sent and dead rows only: no class's usage changes, so no outbox lock.
      std::string sql = "DELETE FROM " + s_.t("outbox_messages") + " WHERE state = '" +
                        (dead ? "dead" : "sent") + "'";
      if (f.message_id) sql += " AND message_id = " + w.quote(*f.message_id);
      if (f.before_ms)
        sql += std::string(dead ? " AND dead_at < " : " AND sent_at < ") +
               std::to_string(*f.before_ms);
      *removed = static_cast<int64_t>(w.exec(sql).affected_rows());
    });
  }

  uint64_t add_commit_waker(std::function<void()> wake) override {
    bool start = false;
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      wakers_.emplace_back(++next_id_, std::move(wake));
      id = next_id_;
      start = wakers_.size() == 1;
    }
    if (start) start_listener();
    return id;
  }

  void remove_commit_waker(uint64_t id) override {
    bool stop = false;
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      for (auto it = wakers_.begin(); it != wakers_.end(); ++it)
        if (it->first == id) {
          wakers_.erase(it);
          stop = wakers_.empty();
          break;
        }
    }
    if (stop) stop_listener();
  }

  // Calls every waker (each only signals).
  void wake() {
    std::lock_guard<std::mutex> lock(wake_mu_);
    for (auto& w : wakers_) w.second();
  }

 private:
  // The outbox's lock of this schema, held to the end of `w` (the file comment says why).
  void lock_outbox(pqxx::transaction_base& w) {
    w.exec_params("SELECT pg_advisory_xact_lock(hashtext($1))", "mqtt_inbox outbox " + s_.schema);
  }

  void read_usage(PgWork& w, std::vector<OutboxClassUsage>* out) {
    out->clear();
    for (const pqxx::row& r : w.exec("SELECT class, rows, bytes, dropped FROM " +
                                     s_.t("outbox_usage") + " ORDER BY class"))
      out->push_back(
          {r[0].as<std::string>(), r[1].as<int64_t>(), r[2].as<int64_t>(), r[3].as<int64_t>()});
  }

  // --- the listener: LISTEN on a connection of its own, while a waker is registered ---

  class Receiver final : public pqxx::notification_receiver {
   public:
    Receiver(pqxx::connection_base& c, const std::string& channel, std::atomic<bool>* got)
        : pqxx::notification_receiver(c, channel), got_(got) {}
    void operator()(const std::string&, int) override { got_->store(true); }

   private:
    std::atomic<bool>* got_;
  };

  void start_listener() {
    std::lock_guard<std::mutex> lock(thread_mu_);
    if (thread_.joinable()) return;
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    thread_ = std::thread([this] { listen_loop(); });
  }

  void stop_listener() {
    std::lock_guard<std::mutex> lock(thread_mu_);
    if (!thread_.joinable()) return;
    const uint64_t one = 1;
    if (::write(stop_fd_, &one, sizeof one) < 0) {
    }
    thread_.join();
    ::close(stop_fd_);
    stop_fd_ = -1;
    // A waker added while this one was stopping the thread needs it again.
    std::lock_guard<std::mutex> wl(wake_mu_);
    if (!wakers_.empty() && !stopping_for_good_) {
      stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      thread_ = std::thread([this] { listen_loop(); });
    }
  }

  // Waits up to `ms` for the stop signal; true if it came.
  bool wait_stop(int ms) {
    pollfd p{stop_fd_, POLLIN, 0};
    return ::poll(&p, 1, ms) > 0;
  }

  void listen_loop() {
    int backoff_ms = 100;
    while (true) {
      std::unique_ptr<PgConnection> c;
      std::unique_ptr<Receiver> receiver;
      std::atomic<bool> got{false};
      std::string error;
      try {
        if (Status s = s_.open_connection(&c, PgBackend::Role::kListen); !s.ok())
          error = s.to_string();
        else
          receiver = std::make_unique<Receiver>(*c, channel(), &got);  // runs LISTEN
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (!error.empty()) {
        receiver.reset();
        c.reset();
        s_.log->warn("outbox: listening for enqueues on {} failed, retrying in {} ms: {}", s_.uri,
                     backoff_ms, printable(error));
        if (wait_stop(backoff_ms)) return;
        backoff_ms = std::min(backoff_ms * 2, 5000);
        continue;
      }
      backoff_ms = 100;
      // Rows committed while no one listened (before the first LISTEN, or while the
      // connection was down) are read now: one wake, one read.
      wake();
      bool lost = false;
      while (!lost) {
        pollfd p[2] = {{stop_fd_, POLLIN, 0}, {c->sock(), POLLIN, 0}};
        const int n = ::poll(p, 2, 10000);
        if (n > 0 && (p[0].revents & POLLIN)) {
          receiver.reset();
          return;
        }
        try {
          c->get_notifs();
          if (!c->is_open()) lost = true;
        } catch (const std::exception& e) {
          s_.log->warn("outbox: the connection listening for enqueues on {} was lost: {}", s_.uri,
                       printable(e.what()));
          lost = true;
        }
        if (got.exchange(false)) wake();
      }
      try {
        receiver.reset();
      } catch (...) {
      }
      c.reset();
      wake();  // what was committed while the connection was going down
      if (wait_stop(backoff_ms)) return;
    }
  }

  PgBackend& s_;
  // The notification channel (the schema is set once, before any call).
  std::string channel() const { return channel_of(s_.schema); }
  std::mutex wake_mu_;
  std::vector<std::pair<uint64_t, std::function<void()>>> wakers_;
  uint64_t next_id_ = 0;
  std::mutex thread_mu_;
  std::thread thread_;
  int stop_fd_ = -1;
  std::atomic<bool> stopping_for_good_{false};
};

}  // namespace

std::unique_ptr<OutboxStore> make_pg_outbox(PgBackend& store) {
  return std::make_unique<PgOutbox>(store);
}

void PgBackend::outbox_committed() {
  if (!outbox_wake_armed) return;
  outbox_wake_armed = false;
  static_cast<PgOutbox&>(*outbox_store).wake();
}

}  // namespace mqtt_inbox::detail

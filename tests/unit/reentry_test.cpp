// Handler re-entry (issue 18 section 2): a handler that calls back into its own inbox,
// which used to wait forever for the connection its own thread holds, gets a refusal at
// once, its message is dead-lettered as handler_reentered naming the call, and the next
// message is processed. One case per kind of call: the Inbox's reads, dead-letter
// administration, session records and plain connection, the store's interfaces behind it
// (claims, dead letters, the retention clock); a Consumer, a Pruner and a StoreThenProcess
// on the same inbox. Every handle() runs under a watchdog: a hang fails the test instead
// of stalling the suite.
#include <mqtt_inbox/outbox.h>
#include <mqtt_inbox/retention.h>
#include <mqtt_inbox/store_then_process.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <thread>

#include "store/claims.h"
#include "store/store.h"
#include "support/ledger_fixture.h"
#include "support/relay_side.h"
#include "support/store_access.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

// Runs `fn` on another thread and gives it 20 s; a hang aborts the test binary (a
// deadlocked thread cannot be unwound) with the case's name.
template <typename Fn>
auto within_deadline(const std::string& what, Fn fn) {
  auto f = std::async(std::launch::async, std::move(fn));
  if (f.wait_for(20s) != std::future_status::ready) {
    std::fprintf(stderr, "HANG: %s did not return within 20 s\n", what.c_str());
    std::abort();
  }
  return f.get();
}

struct Case {
  const char* call;  // the name the refusal and the dead letter carry
  std::function<Status()> reenter;
};

class ReentryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("inbox.db");
    inbox_ = open_ledger_inbox(db_path_);
    ASSERT_TRUE(inbox_);
    ConsumerOptions o;
    o.retry_backoff_initial = 1ms;
    o.retry_backoff_max = 1ms;
    ASSERT_TRUE(Consumer::create(
                    inbox_.get(), "ledger",
                    [this](SQLite::Database& db, const Delivery& d) {
                      if (reenter_ && d.message_id.rfind("reenter-", 0) == 0) {
                        last_status_ = reenter_();
                      }
                      // The handler ignores the refusal and goes on: the library still
                      // dead-letters its message.
                      ledger::apply_credit(db, d);
                    },
                    o, &consumer_)
                    .ok());
    ASSERT_TRUE(Consumer::create(inbox_.get(), "audit", ledger::apply_credit, o, &other_).ok());
    RetentionOptions r;
    ASSERT_TRUE(Pruner::create(inbox_.get(), r, &pruner_).ok());
    StoreThenProcessOptions so;
    so.workers = 0;
    ASSERT_TRUE(Outbox::create(inbox_.get(), {}, &outbox_).ok());
    ASSERT_TRUE(StoreThenProcess::create(inbox_.get(), "stored",
                                         stored_handler(ledger::apply_credit), so, &stp_)
                    .ok());
  }

  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }

  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_, other_;
  std::unique_ptr<Pruner> pruner_;
  std::unique_ptr<StoreThenProcess> stp_;
  std::unique_ptr<Outbox> outbox_;
  std::function<Status()> reenter_;
  Status last_status_;
};

TEST_F(ReentryTest, EveryKindOfCallIsRefusedAndTheMessageDeadLetteredNamingIt) {
  detail::MessageState state;
  std::vector<int64_t> ids;
  detail::Store& store = store_of(*inbox_);
  const TransactionHandler bound(Handler(ledger::apply_credit));
  DeadLetter dl;
  std::vector<DeadLetter> dls;
  int64_t n = 0;
  Outcome outcome = Outcome::kProcessed;
  PruneResult pr;
  StoreThenProcessStats ss;
  ReplayResult rr;
  std::unique_ptr<Pruner> pruner2;
  std::unique_ptr<StoreThenProcess> stp2;
  Message other_msg = credit_message("audit-1", "zed", 1);
  detail::ProcessReport report;
  std::vector<OutboxRow> outbox_rows;
  std::vector<OutboxClassUsage> outbox_usage;
  OutboxSummary outbox_summary;
  OutboxRow outbox_row;
  const std::vector<Case> cases = {
      // Inbox: reads and inspection
      {"Inbox::refresh_row_stats", [&] { return inbox_->refresh_row_stats(); }},
      {"looking up message", [&] { return store.lookup("ledger", "x", &state); }},
      {"Store::persist_retention_clock", [&] { return store.persist_retention_clock(); }},
      // The store's per-message path
      {"Store::process",
       [&] {
         return store.process("audit", other_msg, "audit-1", bound, 5, std::nullopt, nullptr,
                              nullptr, &report);
       }},
      // Inbox: dead-letter administration, and the store's dead letters behind it
      {"Inbox::list_dead_letters", [&] { return inbox_->list_dead_letters({}, &dls); }},
      {"Inbox::get_dead_letter", [&] { return inbox_->get_dead_letter(1, &dl); }},
      {"Inbox::purge_dead_letters", [&] { return inbox_->purge_dead_letters({}, &n); }},
      {"Inbox::requeue_dead_letter", [&] { return inbox_->requeue_dead_letter(1); }},
      {"writing dead letter",
       [&] { return store.add_dead_letter(DeadLetter{}, std::nullopt, &n); }},
      {"listing requeued dead letters",
       [&] { return store.requeued_dead_letters("ledger", 10, &ids); }},
      // Inbox: set-up and the transport's session records (main's calls on the connection)
      {"Inbox::setup", [&] { return inbox_->setup([](SQLite::Database&) {}); }},
      {"SessionRecords::record", [&] { return inbox_->sessions().record(SessionRecord{}); }},
      {"SessionRecords::load",
       [&] {
         SessionRecord r;
         return inbox_->sessions().load("c", &r);
       }},
      {"SessionRecords::list",
       [&] {
         std::vector<SessionRecord> v;
         return inbox_->sessions().list(&v);
       }},
      {"SessionRecords::forget",
       [&] {
         bool gone = false;
         return inbox_->sessions().forget("c", &gone);
       }},
      // Inbox: the plain connection (throws instead of returning a Status)
      {"Inbox::with_connection",
       [&] {
         try {
           inbox_->with_connection([](SQLite::Database&) {});
         } catch (const std::logic_error& e) {
           return Status::InvalidArgument(e.what());
         }
         return Status::Ok();
       }},
      // Another Consumer on the same inbox
      {"Consumer::handle",
       [&] {
         outcome = other_->handle(other_msg);
         return outcome == Outcome::kRefused ? Status::InvalidArgument("Consumer::handle")
                                             : Status::Ok();
       }},
      {"Consumer::replay_dead_letter", [&] { return other_->replay_dead_letter(1, &outcome); }},
      // The Pruner
      {"Pruner::prune_once", [&] { return pruner_->prune_once(&pr); }},
      {"Pruner::create", [&] { return Pruner::create(inbox_.get(), {}, &pruner2); }},
      // A StoreThenProcess on the same inbox
      {"StoreThenProcess::stats", [&] { return stp_->stats(&ss); }},
      {"StoreThenProcess::replay", [&] { return stp_->replay({}, &rr); }},
      {"StoreThenProcess::handle",
       [&] {
         return stp_->handle(other_msg) == Outcome::kRefused
                    ? Status::InvalidArgument("StoreThenProcess::handle")
                    : Status::Ok();
       }},
      {"StoreThenProcess::create",
       [&] {
         return StoreThenProcess::create(inbox_.get(), "s2", stored_handler(ledger::apply_credit),
                                         {}, &stp2);
       }},
      // The Outbox on the same inbox: every call but enqueue takes the inbox's connection
      {"Outbox::fetch_pending",
       [&] { return relay_side(*outbox_).fetch_pending(0, 10, &outbox_rows); }},
      {"Outbox::mark_sent",
       [&] {
         return relay_side(*outbox_).mark_sent({{1, 1}});
       }},
      {"Outbox::mark_dead",
       [&] {
         return relay_side(*outbox_).mark_dead({1, 1}, OutboxDeadReason::kRejectedByBroker, 0x87,
                                               "x");
       }},
      {"Outbox::list", [&] { return outbox_->list(OutboxState::kPending, 10, &outbox_rows); }},
      {"Outbox::usage", [&] { return outbox_->usage(&outbox_usage); }},
      {"Outbox::summary", [&] { return outbox_->summary(&outbox_summary); }},
      {"Outbox::get", [&] { return outbox_->get("x", &outbox_row); }},
      {"Outbox::replay_dead", [&] { return outbox_->replay_dead("x"); }},
      {"Outbox::purge", [&] { return outbox_->purge(OutboxPurgeFilter{}); }},
  };
  int64_t expected_balance = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.call);
    const std::string id = "reenter-" + std::to_string(i);
    reenter_ = c.reenter;
    last_status_ = Status::Ok();
    const Outcome o =
        within_deadline(c.call, [&] { return consumer_->handle(credit_message(id, "ann", 100)); });
    EXPECT_EQ(o, Outcome::kDeadLettered);
    EXPECT_EQ(last_status_.code(), Status::Code::kInvalidArgument) << last_status_.to_string();
    EXPECT_NE(last_status_.message().find(c.call), std::string::npos) << last_status_.to_string();
    EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE consumer_name = 'ledger' AND "
                "message_id = '" +
                id +
                "' AND reason = 'handler_reentered' AND attempts = 1"
                " AND instr(reason_text, '" +
                c.call + "') > 0"),
              1);
    // The next message goes through, and nothing of the refused one was applied.
    reenter_ = nullptr;
    EXPECT_EQ(within_deadline("next message",
                              [&] {
                                return consumer_->handle(
                                    credit_message("next-" + std::to_string(i), "ann", 1));
                              }),
              Outcome::kProcessed);
    ++expected_balance;
    EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'ann'"), expected_balance);
  }
  // Nothing the refused calls would have done happened.
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE consumer_name = 'audit'"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'handler_reentered'"),
            static_cast<int64_t>(cases.size()));
  EXPECT_FALSE(pruner2);
  EXPECT_FALSE(stp2);
  // Outside a handler the same calls work again.
  EXPECT_TRUE(store.lookup("ledger", "next-0", &state).ok());
  EXPECT_TRUE(state.processed);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE consumer_name = 'ledger'"),
            static_cast<int64_t>(cases.size()));
  EXPECT_EQ(other_->handle(other_msg), Outcome::kProcessed);
}

// Calls that never wait for the connection stay allowed from a handler.
TEST_F(ReentryTest, CallsThatNeverWaitStayAllowed) {
  reenter_ = [&] {
    (void)inbox_->stats();
    (void)inbox_->retention_clock_ms();
    (void)inbox_->path();
    (void)inbox_->options();
    (void)inbox_->health();
    inbox_->sessions().note_lost("gw-reentry");
    (void)consumer_->health();
    (void)consumer_->counters();
    (void)other_->name();
    (void)stp_->health();
    (void)stp_->counters();
    (void)outbox_->counters();
    return Status::Ok();
  };
  EXPECT_EQ(
      within_deadline("allowed calls",
                      [&] { return consumer_->handle(credit_message("reenter-ok", "bo", 4)); }),
      Outcome::kProcessed);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'bo'"), 4);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
}

// Pruner::stop from a handler, with its thread started: the thread is asked to stop and
// the join is left to ~Pruner, so nothing waits for the handler's own connection.
TEST_F(ReentryTest, PrunerStopFromAHandlerDoesNotJoinAndTheMessageIsDeadLettered) {
  RetentionOptions r;
  r.period = 1ms;  // the thread is pruning (taking the connection) all the time
  std::unique_ptr<Pruner> busy;
  ASSERT_TRUE(Pruner::create(inbox_.get(), r, &busy).ok());
  ASSERT_TRUE(busy->start().ok());
  std::this_thread::sleep_for(20ms);
  reenter_ = [&] {
    busy->stop();
    return Status::InvalidArgument("Pruner::stop");
  };
  EXPECT_EQ(
      within_deadline("Pruner::stop",
                      [&] { return consumer_->handle(credit_message("reenter-stop", "cy", 2)); }),
      Outcome::kDeadLettered);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'reenter-stop'"
              " AND reason = 'handler_reentered' AND instr(reason_text, 'Pruner::stop') > 0"),
            1);
  within_deadline("~Pruner", [&] {
    busy.reset();
    return 0;
  });
  reenter_ = nullptr;
  EXPECT_EQ(consumer_->handle(credit_message("after-stop", "cy", 2)), Outcome::kProcessed);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'cy'"), 2);
}

// A store-then-process worker's handler holds SQLite's write lock on its own connection:
// a call into the inbox from it is refused the same way, the row is dead-lettered as
// handler_reentered, and the worker goes on with the next row.
TEST_F(ReentryTest, StoreThenProcessWorkerHandlerIsRefusedAndTheRowDeadLettered) {
  StoreThenProcessOptions so;
  so.workers = 1;
  so.poll_interval_ms = 10;
  std::atomic<int> refused{0};
  std::unique_ptr<StoreThenProcess> stp;
  ASSERT_TRUE(StoreThenProcess::create(
                  inbox_.get(), "worker",
                  [&](SQLite::Database& db, const StoredDelivery& d) {
                    if (d.message_id == "w-reenter") {
                      int64_t n = 0;
                      DeadLetter dl;
                      dl.consumer_name = "worker";
                      dl.topic = "t";
                      if (!store_of(*inbox_).add_dead_letter(dl, std::nullopt, &n).ok()) ++refused;
                    }
                    Delivery del{d.message, d.message_id, d.attempt};
                    ledger::apply_credit(db, del);
                  },
                  so, &stp)
                  .ok());
  ASSERT_EQ(stp->handle(credit_message("w-1", "dee", 1)), Outcome::kProcessed);
  ASSERT_EQ(stp->handle(credit_message("w-reenter", "dee", 10)), Outcome::kProcessed);
  ASSERT_EQ(stp->handle(credit_message("w-2", "dee", 2)), Outcome::kProcessed);
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until(
      [&] {
        return q("SELECT count(*) FROM inbox_messages WHERE consumer_name = 'worker'"
                 " AND status IN ('done', 'dead')") == 3;
      },
      10s));
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'dee'"), 3);
  EXPECT_EQ(
      q("SELECT count(*) FROM inbox_messages WHERE message_id = 'w-reenter' AND status = 'dead'"),
      1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'w-reenter'"
              " AND reason = 'handler_reentered'"
              " AND instr(reason_text, 'writing dead letter') > 0"),
            1);
}

}  // namespace
}  // namespace mqtt_inbox::test

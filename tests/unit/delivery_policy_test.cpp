// What the consumer does with deliveries that must not simply be processed: retained
// messages (ConsumerOptions::retained) and messages carrying two different ids
// (MessageIdOptions::on_disagreement), for Consumer and for store-then-process receipt.
// Real SQLite files; assertions on the ledger's balances and the dead letters.
#include <mqtt_inbox/store_then_process.h>

#include "support/ledger_fixture.h"

namespace mqtt_inbox::test {
namespace {

Message retained_credit(const std::string& id, long long amount) {
  Message m = credit_message(id, "acct", amount);
  m.retain = true;
  return m;
}

class DeliveryPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_path_ = dir_.file("ledger.db");
    inbox_ = open_ledger_inbox(db_path_);
    ASSERT_TRUE(inbox_);
  }
  std::unique_ptr<Consumer> consumer(ConsumerOptions o = {}) {
    std::unique_ptr<Consumer> c;
    EXPECT_TRUE(Consumer::create(inbox_.get(), "ledger", ledger::apply_credit, o, &c).ok());
    return c;
  }
  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }
  int64_t balance() { return q("SELECT coalesce(sum(balance), 0) FROM accounts"); }

  TempDir dir_;
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
};

// Default: a retained delivery is acked unprocessed, however often it comes and whether
// or not its id is still remembered; the same credit published live is applied.
TEST_F(DeliveryPolicyTest, RetainedIsSkippedByDefault) {
  auto c = consumer();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c->handle(retained_credit("r-1", 40)), Outcome::kSkipped);
  EXPECT_EQ(balance(), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters"), 0);
  EXPECT_EQ(c->counters().retained_skipped, 3);
  EXPECT_EQ(c->handle(credit_message("r-1", "acct", 40)), Outcome::kProcessed);
  EXPECT_EQ(c->handle(retained_credit("r-1", 40)), Outcome::kSkipped);
  EXPECT_EQ(balance(), 40);
}

TEST_F(DeliveryPolicyTest, RetainedDeadLetterPolicyKeepsOneRowPerIdAndReplayApplies) {
  ConsumerOptions o;
  o.retained = RetainedPolicy::kDeadLetter;
  auto c = consumer(o);
  EXPECT_EQ(c->handle(retained_credit("r-2", 7)), Outcome::kDeadLettered);
  EXPECT_EQ(c->handle(retained_credit("r-2", 7)), Outcome::kAlreadyDeadLettered);
  Message no_id;
  no_id.topic = "credits/test";
  no_id.payload = R"({"account":"acct","amount":1})";
  no_id.retain = true;
  EXPECT_EQ(c->handle(no_id), Outcome::kDeadLettered);
  EXPECT_EQ(balance(), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'retained'"), 2);
  EXPECT_EQ(q("SELECT redeliveries FROM inbox_dead_letters WHERE message_id = 'r-2'"), 1);

  DeadLetterFilter f;
  f.message_id = "r-2";
  std::vector<DeadLetter> rows;
  ASSERT_TRUE(inbox_->list_dead_letters(f, &rows).ok());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].reason, DeadLetterReason::kRetained);
  Outcome replayed{};
  ASSERT_TRUE(c->replay_dead_letter(rows[0].id, &replayed).ok());
  EXPECT_EQ(replayed, Outcome::kProcessed);
  EXPECT_EQ(balance(), 7);
  // A retained copy of an id already processed is a duplicate, not a new dead letter.
  EXPECT_EQ(c->handle(retained_credit("r-2", 7)), Outcome::kDuplicate);
  EXPECT_EQ(balance(), 7);
}

TEST_F(DeliveryPolicyTest, RetainedProcessPolicyIsExactlyOnceWhileTheIdIsKept) {
  ConsumerOptions o;
  o.retained = RetainedPolicy::kProcess;
  auto c = consumer(o);
  EXPECT_EQ(c->handle(retained_credit("r-3", 5)), Outcome::kProcessed);
  EXPECT_EQ(c->handle(retained_credit("r-3", 5)), Outcome::kDuplicate);
  EXPECT_EQ(balance(), 5);
}

TEST_F(DeliveryPolicyTest, StoreThenProcessReceiptFollowsTheSamePolicy) {
  auto make = [&](const std::string& name, RetainedPolicy policy) {
    StoreThenProcessOptions o;
    o.consumer.retained = policy;
    o.workers = 0;  // receipt only: what was stored is what counts here
    std::unique_ptr<StoreThenProcess> s;
    EXPECT_TRUE(
        StoreThenProcess::create(inbox_.get(), name, stored_handler(ledger::apply_credit), o, &s)
            .ok());
    return s;
  };
  auto skip = make("stp-skip", RetainedPolicy::kSkip);
  EXPECT_EQ(skip->handle(retained_credit("s-1", 3)), Outcome::kSkipped);
  EXPECT_EQ(skip->counters().retained_skipped, 1);
  auto dead = make("stp-dead", RetainedPolicy::kDeadLetter);
  EXPECT_EQ(dead->handle(retained_credit("s-1", 3)), Outcome::kDeadLettered);
  auto process = make("stp-process", RetainedPolicy::kProcess);
  EXPECT_EQ(process->handle(retained_credit("s-1", 3)), Outcome::kProcessed);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_messages WHERE consumer_name = 'stp-process'"), 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE consumer_name = 'stp-dead'"
              " AND reason = 'retained' AND message_id = 's-1'"),
            1);
}

// Issue 12: one message, two ids (user property and JSON field differ). Applied under the
// property's id here, it would be applied again under the JSON id behind a 3.1.1 bridge.
// It is dead-lettered instead, with both ids in the reason, and applied by neither.
TEST_F(DeliveryPolicyTest, DisagreeingIdsAreDeadLetteredAndNotApplied) {
  auto c = consumer();
  Message m = credit_message("json-id", "acct", 9);
  m.user_properties = {{"message-id", "prop-id"}};
  EXPECT_EQ(c->handle(m), Outcome::kDeadLettered);
  EXPECT_EQ(c->handle(m), Outcome::kDeadLettered);         // no id: every delivery is its own row
  Message bridged = credit_message("json-id", "acct", 9);  // what the bridge passes on
  EXPECT_EQ(balance(), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE reason = 'invalid_id'"
              " AND message_id IS NULL AND reason_text LIKE '%''prop-id''%'"
              " AND reason_text LIKE '%''json-id''%'"),
            2);
  EXPECT_EQ(c->handle(bridged), Outcome::kProcessed);  // the single id behind the bridge
  EXPECT_EQ(balance(), 9);

  // The old precedence, only when asked for: the property's id wins.
  ConsumerOptions o;
  o.message_id.on_disagreement = IdDisagreement::kUserPropertyWins;
  std::unique_ptr<Consumer> legacy;
  ASSERT_TRUE(Consumer::create(inbox_.get(), "legacy", ledger::apply_credit, o, &legacy).ok());
  EXPECT_EQ(legacy->handle(m), Outcome::kProcessed);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_processed WHERE consumer_name = 'legacy'"
              " AND message_id = 'prop-id'"),
            1);
}

}  // namespace
}  // namespace mqtt_inbox::test

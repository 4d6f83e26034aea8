// Requeued dead letters (issue 18 section 6), in one process: the service's Inbox (exclusive)
// with a running Consumer, and a second, non-exclusive Inbox on the same file standing in
// for the admin tool. A row marked 'requeued' from the second connection is replayed by
// the Consumer's own thread: 'replayed' with its effect applied once, or 'dead' again.
// admin_tool_test has the same with a real consumer process and the real tool.
#include <atomic>
#include <chrono>

#include "support/ledger_fixture.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

TEST(Requeue, RunningConsumerReplaysRowsRequeuedFromAnotherConnection) {
  TempDir dir;
  const std::string db = dir.file("ledger.db");
  auto service = open_ledger_inbox(db);
  ASSERT_TRUE(service);
  std::atomic<bool> fixed{false};
  ConsumerOptions o;
  o.max_attempts = 2;
  o.retry_backoff_initial = 1ms;
  o.retry_backoff_max = 1ms;
  o.requeue_poll_ms = 20;
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(
                  service.get(), "ledger",
                  [&](SQLite::Database& db_, const Delivery& d) {
                    if (d.message_id == "fix-me" && !fixed) throw std::runtime_error("bug");
                    ledger::apply_credit(db_, d);
                  },
                  o, &c)
                  .ok());
  ASSERT_EQ(c->handle(credit_message("fix-me", "acct", 5)), Outcome::kDeadLettered);
  Message bad = credit_message("still-bad", "acct", 0);
  bad.payload = R"({"message_id":"still-bad","account":"acct","amount":"x"})";
  ASSERT_EQ(c->handle(bad), Outcome::kDeadLettered);
  const int64_t fix_id =
      query_int(db, "SELECT id FROM inbox_dead_letters WHERE message_id = 'fix-me'");
  const int64_t bad_id =
      query_int(db, "SELECT id FROM inbox_dead_letters WHERE message_id = 'still-bad'");

  // The "tool": a second connection without the exclusive lock file.
  InboxOptions tool_options;
  tool_options.exclusive = false;
  std::unique_ptr<Inbox> tool;
  ASSERT_TRUE(Inbox::open(db, tool_options, &tool).ok());
  fixed = true;
  ASSERT_TRUE(tool->requeue_dead_letter(fix_id).ok());
  ASSERT_TRUE(tool->requeue_dead_letter(bad_id).ok());
  // Refusals: twice, unknown.
  EXPECT_EQ(tool->requeue_dead_letter(fix_id).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(tool->requeue_dead_letter(999).code(), Status::Code::kNotFound);
  // A redelivery while requeued is counted on the row, not processed.
  EXPECT_EQ(c->handle(bad), Outcome::kAlreadyDeadLettered);

  ASSERT_TRUE(wait_until(
      [&] {
        return query_int(db, "SELECT count(*) FROM inbox_dead_letters WHERE status = 'requeued'") ==
               0;
      },
      10s));
  EXPECT_EQ(query_int(db, "SELECT status = 'replayed' FROM inbox_dead_letters WHERE id = " +
                              std::to_string(fix_id)),
            1);
  EXPECT_EQ(query_int(db, "SELECT balance FROM accounts WHERE account = 'acct'"), 5);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ledger_entries WHERE message_id = 'fix-me'"), 1);
  EXPECT_EQ(
      query_int(db,
                "SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'still-bad'"
                " AND status = 'dead' AND reason = 'undecodable_payload' AND redeliveries = 1"),
      1);
  // A replayed row cannot be requeued; the stream goes on.
  EXPECT_EQ(tool->requeue_dead_letter(fix_id).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(c->handle(credit_message("c-1", "acct", 1)), Outcome::kProcessed);
  EXPECT_EQ(query_int(db, "SELECT balance FROM accounts WHERE account = 'acct'"), 6);
}

}  // namespace
}  // namespace mqtt_inbox::test

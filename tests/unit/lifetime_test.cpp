// A message's lifetime (src/store/lifetime.h), the rules the Consumer and
// store-then-process share: when an MQTT 5 message expiry has run out, and the dependency
// schedule of a handler that says "not yet". The rules alone, on numbers; the stores and
// brokers that use them are in tests/contract, tests/broker and tests/postgres.
#include <gtest/gtest.h>

#include <vector>

#include "store/lifetime.h"

namespace mqtt_inbox::detail {
namespace {

using std::chrono::milliseconds;

TEST(LifetimeTest, AMessageExpiresStrictlyAfterItsIntervalFromReceipt) {
  Message m;
  EXPECT_FALSE(expiry_of(m, ExpiredPolicy::kDeadLetter, 1000)) << "no property: MQTT 3.1.1";
  m.message_expiry_interval_s = 5;
  EXPECT_FALSE(expiry_of(m, ExpiredPolicy::kApply, 1000)) << "applied anyway: no expiry";
  const std::optional<Expiry> e = expiry_of(m, ExpiredPolicy::kDeadLetter, 1000);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->expires_at(), 6000);
  EXPECT_FALSE(e->ran_out(6000));
  EXPECT_TRUE(e->ran_out(6001));
  EXPECT_EQ(expired_text(*e, 8412, "before its handler ran"),
            "message expiry interval 5 s ran out before it could be applied: waited 7412 ms "
            "since it was received (before its handler ran)");
  m.message_expiry_interval_s = 0;  // forwarded in its last second
  const std::optional<Expiry> last = expiry_of(m, ExpiredPolicy::kDeadLetter, 1000);
  ASSERT_TRUE(last);
  EXPECT_FALSE(last->ran_out(1000));
  EXPECT_TRUE(last->ran_out(1001));
}

// The runs after a first "not yet" at t=0, with the defaults: 3 immediate runs at the
// retry backoff's pace (100, 200, 400 ms), then 1 s doubling to 60 s, the last run when
// the 10 minutes are over, then the dead letter.
TEST(LifetimeTest, TheDefaultScheduleRunsImmediatelyThenDelayedForTenMinutes) {
  const ConsumerOptions o;
  std::vector<int64_t> delays;
  int64_t now = 0;
  int runs = 1;
  for (;;) {
    const int64_t d = not_yet_delay_ms(o, runs, 0, now);
    if (d < 0) break;
    delays.push_back(d);
    now += d;
    ++runs;
    ASSERT_LT(runs, 100);
  }
  ASSERT_GE(delays.size(), 10u);
  EXPECT_EQ(std::vector<int64_t>(delays.begin(), delays.begin() + 10),
            (std::vector<int64_t>{100, 200, 400, 1000, 2000, 4000, 8000, 16000, 32000, 60000}));
  EXPECT_EQ(now, 600000) << "the last run is when the wait is over";
  EXPECT_EQ(runs, 19) << "19 runs said \"not yet\" before the dead letter";
}

TEST(LifetimeTest, TheScheduleIsOverOnlyOnceTheWaitHasPassed) {
  ConsumerOptions o;
  o.dependency_immediate_attempts = 0;
  o.dependency_backoff_initial = milliseconds(30);
  o.dependency_backoff_max = milliseconds(80);
  o.dependency_wait_max = milliseconds(400);
  EXPECT_EQ(not_yet_delay_ms(o, 1, 1000, 1000), 30);
  EXPECT_EQ(not_yet_delay_ms(o, 2, 1000, 1030), 60);
  EXPECT_EQ(not_yet_delay_ms(o, 3, 1000, 1090), 80);
  EXPECT_EQ(not_yet_delay_ms(o, 9, 1000, 1350), 50) << "cut to the end of the wait";
  EXPECT_EQ(not_yet_delay_ms(o, 10, 1000, 1400), -1);
  o.dependency_wait_max = milliseconds(0);
  EXPECT_EQ(not_yet_delay_ms(o, 1, 1000, 1000), -1) << "0: the first \"not yet\" ends it";
}

TEST(LifetimeTest, OptionsOutsideTheirRangesAreRefused) {
  EXPECT_TRUE(check_lifetime_options(ConsumerOptions{}).ok());
  ConsumerOptions o;
  o.dependency_immediate_attempts = -1;
  EXPECT_FALSE(check_lifetime_options(o).ok());
  o = ConsumerOptions{};
  o.dependency_backoff_initial = milliseconds(0);
  EXPECT_FALSE(check_lifetime_options(o).ok());
  o = ConsumerOptions{};
  o.dependency_backoff_max = milliseconds(10);
  EXPECT_FALSE(check_lifetime_options(o).ok());
  o = ConsumerOptions{};
  o.dependency_wait_max = milliseconds(-1);
  EXPECT_FALSE(check_lifetime_options(o).ok());
  o = ConsumerOptions{};
  o.expired = static_cast<ExpiredPolicy>(7);
  EXPECT_EQ(check_lifetime_options(o).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace mqtt_inbox::detail

// sensor_gateway --db postgresql://... (store-then-process with a PgStoredHandler) against
// a real mosquitto on MQTT 3.1.1 and 5 and a real private PostgreSQL cluster
// (support/postgres.h, fsync on), the PostgreSQL peer of the SQLite gateway's tests
// (tests/broker/service_e2e_test.cpp, stop_while_stuck_test.cpp):
// - readings of several devices, each published twice, the gateway SIGKILLed twice
//   mid-stream while it held claims and restarted (--lease-ms short: the readings the killed one
//   had claimed come back after it), old ids sent again after: every reading applied once, each
//   device's readings applied in the order they were published, and the latest reading and
//   the count per device in PostgreSQL. The order is read from what the database saw: a
//   trigger the test puts on the gateway's table records every change, in commit order per
//   device (a device's readings are applied one at a time);
// - the runtime role of docs/postgres.md#privileges (no CREATE anywhere) starts on the
//   tables the owner's first run made, and applies each reading once;
// - what the program refuses at start-up on PostgreSQL: a password in the URI (exit 1).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/postgres.h"
#include "support/process.h"
#include "support/publisher.h"

namespace mqtt_inbox::test {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::string reading(const std::string& id, int64_t value) {
  return R"({"message_id":")" + id + R"(","value":)" + std::to_string(value) + "}";
}

class SensorPgCrashTest : public ::testing::TestWithParam<const char*> {
 protected:
  // The readings a killed gateway had claimed come back after a lease without progress
  // (docs/store-then-process.md#postgresql): short here, so that a kill costs seconds.
  static constexpr int64_t kLeaseMs = 4000;

  SensorPgCrashTest() {
    pg_.create_database("sensors");
    uri_ = pg_.uri("sensors");
  }
  bool mqtt5() const { return std::string(GetParam()) == "5"; }
  std::string log() const { return dir_.file("gateway.log"); }
  std::string log_text() const { return read_file(log()); }

  // The gateway on PostgreSQL, connected (the library logs "consuming: " once subscribed),
  // unless `wait_for_subscription` is false (a run to be cut mid-stream by a queued stream).
  std::unique_ptr<Child> start_gateway(bool wait_for_subscription = true) {
    const size_t before = occurrences(log_text(), "consuming: ");
    auto child = std::make_unique<Child>(
        with_emulator({built_program("sensor_gateway"), "--broker", broker_.uri(), "--client-id",
                       "pg-sensors", "--client-id-lock-dir", dir_.path(), "--db", uri_, "--workers",
                       "3", "--lease-ms", std::to_string(kLeaseMs), "--mqtt-version", GetParam()}),
        log());
    if (!wait_for_subscription) return child;
    EXPECT_TRUE(wait_until(
        [&] { return occurrences(log_text(), "consuming: ") > before || !child->running(); },
        std::chrono::seconds(15)))
        << log_text();
    return child;
  }
  int64_t q(const std::string& sql) const {
    const std::string v = pg_.query_value(sql, "sensors");
    return v.empty() ? 0 : std::stoll(v);
  }
  std::string text(const std::string& sql) const { return pg_.query_value(sql, "sensors"); }
  int64_t applied() const { return q("SELECT coalesce(sum(readings), 0) FROM devices"); }
  // Rows 'processing' under a claim of a gateway that was not killed yet (a killed one's
  // stay so until a successor's reaper returns them).
  int64_t claimed() const {
    std::string sql = "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'processing'";
    for (const auto& c : killed_claimants_) sql += " AND claimant <> '" + c + "'";
    return q(sql);
  }
  // Kills the gateway once `at_least` readings are applied, while it holds claims. A kill
  // that falls between two claims leaves none: then it starts the gateway again and kills
  // that one (up to five times). Returns how many rows the kill left claimed, which the
  // successor gets back only after a lease.
  int64_t kill_holding_claims(std::unique_ptr<Child>& child, int64_t at_least) {
    int64_t left = 0;
    for (int tries = 0; left == 0 && tries < 5; ++tries) {
      if (tries > 0) child = start_gateway(false);
      EXPECT_TRUE(wait_until([&] { return applied() >= at_least && claimed() > 0; },
                             std::chrono::seconds(60)))
          << applied() << "\n"
          << log_text();
      child->signal(SIGKILL);
      EXPECT_NE(child->wait(std::chrono::seconds(10)), -1);
      left = claimed();
    }
    const std::string claimants = text(
        "SELECT string_agg(DISTINCT claimant, ' ') FROM mqtt_inbox.inbox_messages"
        " WHERE status = 'processing'");
    std::istringstream words(claimants);
    for (std::string c; words >> c;) killed_claimants_.push_back(c);
    return left;
  }
  void term(Child& child) {
    child.signal(SIGTERM);
    const int st = child.wait(std::chrono::seconds(20));
    EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << log_text();
  }
  void publish(TestPublisher& pub, int device, const std::string& id, int64_t value) {
    pub.publish("sensors/dev-" + std::to_string(device) + "/reading", reading(id, value),
                {{"message-id", id}});
  }

  Postgres pg_;
  Broker broker_;
  TempDir dir_;
  std::string uri_;
  std::vector<std::string> killed_claimants_;
};

TEST_P(SensorPgCrashTest, SigkillsMidStreamApplyEveryReadingOnceInOrderPerDevice) {
  constexpr int kDevices = 6, kPerDevice = 100, kReadings = kDevices * kPerDevice;
  // The session exists before anything is published; the first run also creates the
  // business table and the inbox's schema.
  {
    auto first = start_gateway();
    term(*first);
  }
  // The test's witness, not the program's: every change to a device's row, as committed.
  pg_.execute(
      "CREATE TABLE device_history (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
      "  device text NOT NULL, value double precision NOT NULL, message_id text NOT NULL,"
      "  readings bigint NOT NULL);"
      "CREATE FUNCTION record_device() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
      "  INSERT INTO device_history (device, value, message_id, readings)"
      "    VALUES (NEW.device, NEW.latest_value, NEW.latest_message_id, NEW.readings);"
      "  RETURN NULL; END $$;"
      "CREATE TRIGGER record_device AFTER INSERT OR UPDATE ON devices"
      "  FOR EACH ROW EXECUTE FUNCTION record_device()",
      "sensors");
  {
    // Reading n of a device has the value n; the devices interleave, each reading twice
    // (a producer's retry).
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < kReadings; ++i) {
      const std::string id = "r-" + std::to_string(i);
      publish(pub, i % kDevices, id, i / kDevices);
      publish(pub, i % kDevices, id, i / kDevices);
    }
  }
  // The queued stream, cut twice by SIGKILL wherever the gateway is (storing, applying,
  // between the two).
  auto run = start_gateway(false);
  const int64_t left_first = kill_holding_claims(run, 100);
  const int64_t at_first_kill = applied();
  run = start_gateway(false);
  const int64_t left_second = kill_holding_claims(run, at_first_kill + 150);
  const int64_t at_second_kill = applied();
  ASSERT_FALSE(HasFailure());
  EXPECT_LT(at_second_kill, kReadings) << "the kills came after the stream: nothing was cut";
  EXPECT_GT(left_first, 0) << "five kills in a row between two claims";
  EXPECT_GT(left_second, 0) << "five kills in a row between two claims";

  run = start_gateway();
  {
    // Old ids again (older values: applied again, they would move a device back), then a
    // last reading per device behind them on the same topic.
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 60; ++i) publish(pub, i % kDevices, "r-" + std::to_string(i), i / kDevices);
    for (int d = 0; d < kDevices; ++d) publish(pub, d, "last-" + std::to_string(d), kPerDevice);
  }
  ASSERT_TRUE(wait_until(
      [&] {
        return q("SELECT count(*) FROM devices WHERE latest_message_id LIKE 'last-%'") == kDevices;
      },
      std::chrono::seconds(60)))
      << applied() << "\n"
      << log_text();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // room for a late extra
  term(*run);

  // Each reading applied once: the counts, the changes the database saw, and the rows.
  const int64_t total = kReadings + kDevices;
  EXPECT_EQ(applied(), total);
  EXPECT_EQ(q("SELECT count(*) FROM device_history"), total);
  EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM device_history"), total);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_messages"
              " WHERE consumer_name = 'sensors' AND status = 'done'"),
            total);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_messages"), total);
  // The latest reading and the count per device.
  for (int d = 0; d < kDevices; ++d) {
    const std::string where = " FROM devices WHERE device = 'dev-" + std::to_string(d) + "'";
    EXPECT_EQ(text("SELECT latest_message_id" + where), "last-" + std::to_string(d));
    EXPECT_EQ(q("SELECT latest_value::bigint" + where), kPerDevice);
    EXPECT_EQ(q("SELECT readings" + where), kPerDevice + 1);
  }
  // In order per device: each change's value is the previous one's plus one (0, 1, ...,
  // kPerDevice), and its count the value plus one, with nothing skipped, repeated or
  // moved back.
  EXPECT_EQ(q("SELECT count(*) FROM device_history WHERE readings <> value + 1"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM (SELECT value, lag(value) OVER w AS prev,"
              "   row_number() OVER w AS n FROM device_history"
              "   WINDOW w AS (PARTITION BY device ORDER BY id)) h"
              " WHERE value <> n - 1 OR (prev IS NOT NULL AND value <> prev + 1)"),
            0)
      << pg_.query_value(
             "SELECT string_agg(device || ':' || value, ' ' ORDER BY id) FROM device_history",
             "sensors");
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  EXPECT_EQ(q("SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'dead'"), 0);
  std::printf(
      "sensor_gateway on PostgreSQL killed at %lld and %lld of %d readings applied, leaving "
      "%lld and %lld claimed\n",
      static_cast<long long>(at_first_kill), static_cast<long long>(at_second_kill), kReadings,
      static_cast<long long>(left_first), static_cast<long long>(left_second));
}

// The runtime role of docs/postgres.md#privileges: the owner's first run created the
// inbox's schema and the devices table; a role that may only use them starts (the table is
// looked for before it is created, so no CREATE is issued) and applies each reading once.
TEST_P(SensorPgCrashTest, RuntimeRoleWithoutCreateStartsAndAppliesOnce) {
  {
    auto owner_run = start_gateway();
    term(*owner_run);
  }
  pg_.execute(
      "CREATE ROLE runtime LOGIN;"
      "GRANT USAGE ON SCHEMA mqtt_inbox TO runtime;"
      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mqtt_inbox TO runtime;"
      "GRANT USAGE ON ALL SEQUENCES IN SCHEMA mqtt_inbox TO runtime;"
      "GRANT SELECT, INSERT, UPDATE ON devices TO runtime",
      "sensors");
  ASSERT_EQ(pg_.query_value("SELECT has_schema_privilege('runtime', 'public', 'CREATE') OR "
                            "has_database_privilege('runtime', 'sensors', 'CREATE')",
                            "sensors"),
            "f");
  uri_.replace(uri_.find("user=postgres"), std::string("user=postgres").size(), "user=runtime");
  auto run = start_gateway();
  ASSERT_TRUE(run->running()) << log_text();
  {
    TestPublisher pub(broker_.uri(), mqtt5());
    for (int i = 0; i < 20; ++i) {
      publish(pub, i % 2, "r-" + std::to_string(i), i);
      publish(pub, i % 2, "r-" + std::to_string(i), i);  // a retry
    }
  }
  ASSERT_TRUE(wait_until([&] { return applied() >= 20; }, std::chrono::seconds(30))) << log_text();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // room for a late double
  term(*run);
  EXPECT_EQ(applied(), 20);
  EXPECT_EQ(q("SELECT latest_value::bigint FROM devices WHERE device = 'dev-0'"), 18);
  EXPECT_EQ(q("SELECT latest_value::bigint FROM devices WHERE device = 'dev-1'"), 19);
}

INSTANTIATE_TEST_SUITE_P(Mqtt, SensorPgCrashTest, ::testing::Values("3.1.1", "5"),
                         [](const auto& p) {
                           return std::string(p.param) == "5" ? "V5" : "V3_1_1";
                         });

// What sensor_gateway refuses on PostgreSQL before anything connects: exit 1, the bad
// configuration code of examples/exit_codes.h, without repeating the password.
TEST(SensorPgStartup, APasswordInTheUriIsRefusedWithExit1) {
  TempDir dir;
  const std::string log = dir.file("password.log");
  Child child(with_emulator({built_program("sensor_gateway"), "--broker", "tcp://127.0.0.1:1",
                             "--client-id", "pg-refused", "--db",
                             "postgresql://alice:hunter2@db.invalid/sensors"}),
              log);
  const int st = child.wait(std::chrono::seconds(20));
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1) << st;
  EXPECT_NE(read_file(log).find("holds a password"), std::string::npos) << read_file(log);
  EXPECT_EQ(read_file(log).find("hunter2"), std::string::npos) << read_file(log);
}

}  // namespace
}  // namespace mqtt_inbox::test

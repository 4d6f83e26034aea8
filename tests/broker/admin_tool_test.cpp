// The mqtt-inbox admin tool (tools/mqtt_inbox_cli.cpp), run as a child process against
// real SQLite files, a running ledger_consumer and real mosquitto brokers. Assertions are
// on exit codes, the tool's JSON and the business state in the file.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <mqtt_inbox/clock.h>
#include <mqtt_inbox/outbox.h>
#include <mqtt_inbox/retention.h>
#include <mqtt_inbox/store_then_process.h>

#include "support/ledger_fixture.h"
#include "support/process.h"
#include "support/publisher.h"
#include "support/relay_side.h"

namespace mqtt_inbox::test {
namespace {

using nlohmann::json;

struct ToolRun {
  int code = -1;
  std::string out, err;
  json j() const {
    json v = json::parse(out, nullptr, false);
    EXPECT_FALSE(v.is_discarded()) << "not JSON: " << out << "\nstderr: " << err;
    return v;
  }
};

std::string slurp_fd(int fd) {
  std::string s;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
  return s;
}

// Runs the tool with stdin from a pipe (so never a terminal), stdout and stderr captured.
ToolRun tool(std::vector<std::string> args, const std::string& input = "") {
  args.insert(args.begin(), built_program("mqtt-inbox"));
  args = with_emulator(std::move(args));
  const std::string out_path =
      std::filesystem::temp_directory_path() /
      ("mqtt-inbox-out-" + std::to_string(getpid()) + "-" + std::to_string(rand()));
  int in[2];
  EXPECT_EQ(pipe(in), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    close(in[1]);
    const int o = open((out_path + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open((out_path + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(in[0]);
  if (!input.empty()) (void)!write(in[1], input.data(), input.size());
  close(in[1]);
  int st = 0;
  waitpid(pid, &st, 0);
  ToolRun r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  for (auto [suffix, dest] :
       {std::pair<const char*, std::string*>{".out", &r.out}, {".err", &r.err}}) {
    const int fd = open((out_path + suffix).c_str(), O_RDONLY);
    *dest = slurp_fd(fd);
    close(fd);
    unlink((out_path + suffix).c_str());
  }
  return r;
}

// System time, plus an offset the test moves: lets a test age rows on the retention clock.
class ShiftClock : public Clock {
 public:
  int64_t wall_ms() override { return Clock::system()->wall_ms() + shift.load(); }
  int64_t steady_ms() override { return Clock::system()->steady_ms() + shift.load(); }
  void sleep_ms(int64_t ms) override { Clock::system()->sleep_ms(ms); }
  std::atomic<int64_t> shift{0};
};

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

constexpr int64_t kHour = 3600 * 1000;

// 20 credits (10 of them "2 hours old" on the retention clock) and 3 dead letters.
void make_ledger_db(const std::string& path) {
  ShiftClock clock;
  InboxOptions o;
  o.clock = &clock;
  auto inbox = open_ledger_inbox(path, o);
  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", ledger::apply_credit, {}, &c).ok());
  for (int i = 0; i < 20; ++i) {
    if (i == 10) clock.shift += 2 * kHour;
    ASSERT_EQ(c->handle(credit_message("c-" + std::to_string(i), "acct-" + std::to_string(i % 3),
                                       10 + i)),
              Outcome::kProcessed);
  }
  Message no_id;
  no_id.topic = "credits/x";
  no_id.payload = R"({"account":"a","amount":1})";
  EXPECT_EQ(c->handle(no_id), Outcome::kDeadLettered);
  Message bad = credit_message("bad-1", "acct-0", 1);
  bad.payload = "{\"message_id\":\"bad-1\",\"account\":\"acct-0\",\"amount\":\"x\"}";
  EXPECT_EQ(c->handle(bad), Outcome::kDeadLettered);
  Message binary;
  binary.topic = "credits/bin";
  binary.payload = std::string("\x00\xff\x01", 3);
  EXPECT_EQ(c->handle(binary), Outcome::kDeadLettered);
}

const int64_t kLedgerSum = 20 * 10 + 190;  // sum of 10 + i for i < 20

TEST(AdminTool, StatsCheckDeadLettersExportOnALedgerDatabase) {
  TempDir dir;
  const std::string db = dir.file("ledger.db");
  make_ledger_db(db);

  ToolRun r = tool({"stats", db, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  json s = r.j();
  EXPECT_EQ(s["schema_version"], kSchemaVersion);
  ASSERT_EQ(s["consumers"].size(), 1u);
  const json& c = s["consumers"][0];
  EXPECT_EQ(c["name"], "ledger");
  EXPECT_EQ(c["processed_rows"], 20);
  EXPECT_GE(c["oldest_age_ms"].get<int64_t>(), 2 * kHour);
  EXPECT_EQ(c["dead_letters"]["dead"], 3);
  EXPECT_EQ(c["dead_letters"]["by_reason"]["missing_id"], 1);
  EXPECT_EQ(c["dead_letters"]["by_reason"]["undecodable_payload"], 2);
  EXPECT_TRUE(c["store_then_process"].is_null());
  EXPECT_GT(s["db_bytes"].get<int64_t>(), 0);
  r = tool({"stats", db});  // the table
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("ledger"), std::string::npos);

  r = tool({"check", db, "--json"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  json ck = r.j();
  EXPECT_TRUE(ck["ok"].get<bool>());
  EXPECT_EQ(ck["journal_mode"], "wal");
  EXPECT_TRUE(ck["integrity_check"]["ok"].get<bool>());
  EXPECT_TRUE(ck["quick_check"]["ok"].get<bool>());

  // Dead letters: filters, show, replay (Consumer mode: requeued), purge.
  r = tool({"dead-letters", "list", db, "--json", "--reason", "undecodable_payload"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["count"], 2);
  r = tool({"dead-letters", "list", db, "--json", "--message-id", "bad-1"});
  ASSERT_EQ(r.j()["count"], 1);
  const int64_t bad_id = r.j()["dead_letters"][0]["id"];
  r = tool({"dead-letters", "list", db, "--json", "--since", "1h", "--consumer", "ledger"});
  EXPECT_EQ(r.j()["count"], 3);
  r = tool({"dead-letters", "list", db, "--json", "--before", "2000-01-01"});
  EXPECT_EQ(r.j()["count"], 0);
  EXPECT_EQ(tool({"dead-letters", "list", db, "--reason", "nonsense"}).code, 1);

  r = tool({"dead-letters", "show", db, "--id", std::to_string(bad_id), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["payload_text"],
            "{\"message_id\":\"bad-1\",\"account\":\"acct-0\",\"amount\":\"x\"}");
  EXPECT_EQ(r.j()["reason"], "undecodable_payload");
  EXPECT_EQ(tool({"dead-letters", "show", db, "--id", "99999"}).code, 8);
  // A payload that is not UTF-8 shows as hex in the table (docs/admin-tool.md); the tool
  // used to stop with "unexpected error" (exit 3) on it.
  r = tool({"dead-letters", "list", db, "--json"});
  int64_t binary_id = 0;
  const json all = r.j();
  for (const json& d : all["dead_letters"])
    if (d["topic"] == "credits/bin") binary_id = d["id"];
  ASSERT_GT(binary_id, 0) << r.out;
  r = tool({"dead-letters", "show", db, "--id", std::to_string(binary_id)});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("payload:\nhex 00ff01\n"), std::string::npos) << r.out;

  // The table shows the reason text next to the reason (issue 18).
  r = tool({"dead-letters", "list", db});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("reason text"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'amount' is missing or not an integer"), std::string::npos) << r.out;

  // Consumer mode: replay marks the row 'requeued' for the running consumer (none runs
  // here, so it stays so: requeue_test has the running one); not twice.
  r = tool({"dead-letters", "replay", db, "--id", std::to_string(bad_id), "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["status"], "requeued");
  EXPECT_EQ(tool({"dead-letters", "replay", db, "--id", std::to_string(bad_id)}).code, 4);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_dead_letters WHERE status = 'dead'"), 2);
  EXPECT_EQ(query_int(db, "SELECT status = 'requeued' FROM inbox_dead_letters WHERE id = " +
                              std::to_string(bad_id)),
            1);

  // export: JSON Lines, every line parses; the binary payload survives as base64.
  r = tool({"export", db});
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  std::map<std::string, int> types;
  bool binary_seen = false;
  while (std::getline(lines, line)) {
    json l = json::parse(line, nullptr, false);
    ASSERT_FALSE(l.is_discarded()) << line;
    ++types[l["type"].get<std::string>()];
    if (l["type"] == "dead_letter" && l["topic"] == "credits/bin")
      binary_seen = l["payload"] == "AP8B";
  }
  EXPECT_EQ(types["header"], 1);
  EXPECT_EQ(types["processed"], 20);
  EXPECT_EQ(types["dead_letter"], 3);
  EXPECT_EQ(types["footer"], 1);
  EXPECT_TRUE(binary_seen);
  r = tool({"export", db, "--since", "1h"});  // only the 10 newest ids (retention clock)
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1 + 10 + 3 + 1);

  // purge: refused without a terminal or --yes, then done with --yes.
  r = tool({"dead-letters", "purge", db, "--reason", "missing_id"}, "y\n");
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_dead_letters"), 3);
  EXPECT_EQ(tool({"dead-letters", "purge", db, "--yes"}).code, 1);  // no filter, no --all
  r = tool({"dead-letters", "purge", db, "--reason", "missing_id", "--yes", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["removed"], 1);
  r = tool({"dead-letters", "purge", db, "--id", std::to_string(bad_id), "--yes", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["removed"], 1);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_dead_letters"), 1);
  // The business state was never touched.
  EXPECT_EQ(query_int(db, "SELECT sum(balance) FROM accounts"), kLedgerSum);
}

// outbox stats|list|show|replay|purge on a file with pending, sent and dead outbox rows:
// the JSON matches the table's state, replay makes the dead row pending again under its
// id, purge deletes finished rows only and refuses pending ones.
TEST(AdminTool, OutboxCommandsInspectReplayAndPurge) {
  TempDir dir;
  const std::string db = dir.file("outbox.db");
  {
    auto inbox = open_ledger_inbox(db);
    std::unique_ptr<Outbox> o;
    OutboxOptions options;
    options.classes.push_back({"events/", 100, 0, OutboxFullPolicy::kReject});
    ASSERT_TRUE(Outbox::create(inbox.get(), options, &o).ok());
    inbox->with_connection([&](SQLite::Database& c) {
      c.exec("BEGIN IMMEDIATE");
      for (const char* id : {"e-1", "e-2", "e-3", "e-4"}) {
        OutgoingMessage m;
        m.topic = "events/acct";
        m.payload = std::string("{\"id\":\"") + id + "\"}";
        m.message_id = id;
        m.content_type = "application/json";
        ASSERT_TRUE(o->enqueue(c, m).ok());
      }
      c.exec("COMMIT");
    });
    std::vector<OutboxRow> rows;
    ASSERT_TRUE(relay_side(*o).fetch_pending(0, 10, &rows).ok());
    ASSERT_TRUE(relay_side(*o).mark_sent({{rows[0].seq, 1}}).ok());
    ASSERT_TRUE(relay_side(*o)
                    .mark_dead({rows[1].seq, 1}, OutboxDeadReason::kRejectedByBroker, 0x87,
                               "not authorized")
                    .ok());
  }
  ToolRun r = tool({"--json", "outbox", "stats", db});
  ASSERT_EQ(r.code, 0) << r.err;
  json s = r.j();
  EXPECT_EQ(s["pending_rows"], 2);
  EXPECT_EQ(s["sent_rows"], 1);
  EXPECT_EQ(s["dead_rows"], 1);
  ASSERT_EQ(s["classes"].size(), 1u);
  EXPECT_EQ(s["classes"][0]["class"], "events/");
  EXPECT_EQ(s["classes"][0]["pending_rows"], 2);
  EXPECT_GE(s["oldest_pending_age_ms"].get<int64_t>(), 0);
  r = tool({"outbox", "stats", db});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("events/"), std::string::npos) << r.out;

  r = tool({"--json", "outbox", "list", db});  // default: dead letters
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(r.j()["count"], 1);
  EXPECT_EQ(r.j()["rows"][0]["message_id"], "e-2");
  EXPECT_EQ(r.j()["rows"][0]["dead_reason"], "rejected_by_broker");
  EXPECT_EQ(r.j()["rows"][0]["reason_code"], 0x87);
  r = tool({"--json", "outbox", "list", db, "--state", "pending"});
  EXPECT_EQ(r.j()["count"], 2);
  r = tool({"outbox", "list", db, "--state", "sent"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("e-1"), std::string::npos) << r.out;

  r = tool({"--json", "outbox", "show", db, "--message-id", "e-2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["payload_text"], "{\"id\":\"e-2\"}");
  EXPECT_EQ(r.j()["properties"]["content_type"], "application/json");
  EXPECT_EQ(tool({"outbox", "show", db, "--message-id", "nope"}).code, 8);

  // Replay: only a dead row; it is pending again under the same id, past every seq.
  EXPECT_EQ(tool({"outbox", "replay", db, "--message-id", "e-3"}).code, 4);  // pending
  EXPECT_EQ(tool({"outbox", "replay", db, "--message-id", "nope"}).code, 8);
  const int64_t max_seq = query_int(db, "SELECT max(seq) FROM outbox_messages");
  r = tool({"--json", "outbox", "replay", db, "--message-id", "e-2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["state"], "pending");
  EXPECT_GT(r.j()["seq"].get<int64_t>(), max_seq);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM outbox_messages WHERE state = 'pending'"), 3);
  EXPECT_EQ(query_int(db, "SELECT rows FROM outbox_usage WHERE class = 'events/'"), 3);

  // Purge: a filter or --all; --yes without a terminal; never pending rows.
  EXPECT_EQ(tool({"outbox", "purge", db, "--state", "sent"}).code, 1);           // no filter
  EXPECT_EQ(tool({"outbox", "purge", db, "--state", "sent", "--all"}).code, 4);  // not confirmed
  EXPECT_EQ(tool({"outbox", "purge", db, "--state", "pending", "--all", "--yes"}).code, 1);
  EXPECT_EQ(tool({"outbox", "purge", db, "--message-id", "e-3", "--yes"}).code, 8);  // pending
  EXPECT_EQ(tool({"outbox", "purge", db, "--message-id", "nope", "--yes"}).code, 8);
  r = tool({"--json", "outbox", "purge", db, "--state", "sent", "--all", "--yes"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["removed"], 1);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM outbox_messages"), 3);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM outbox_messages WHERE state = 'pending'"), 3);
}

// Only a broker's refusal carries a reason code (a PUBACK's). Every other outbox dead
// letter (expired, payload_too_large, connection_dropped: the relay marks them with code
// 0) shows none, in the table and in JSON, instead of "0x00", which reads as Success.
TEST(AdminTool, OutboxDeadLettersWithoutAPubackShowNoReasonCode) {
  TempDir dir;
  const std::string db = dir.file("outbox.db");
  const std::vector<std::pair<OutboxDeadReason, int>> dead = {
      {OutboxDeadReason::kExpired, 0},
      {OutboxDeadReason::kPayloadTooLarge, 0},
      {OutboxDeadReason::kConnectionDropped, 0},
      {OutboxDeadReason::kRejectedByBroker, 0x97}};
  {
    auto inbox = open_ledger_inbox(db);
    std::unique_ptr<Outbox> o;
    ASSERT_TRUE(Outbox::create(inbox.get(), {}, &o).ok());
    inbox->with_connection([&](SQLite::Database& c) {
      c.exec("BEGIN IMMEDIATE");
      for (size_t i = 0; i < dead.size(); ++i) {
        OutgoingMessage m;
        m.topic = "events/acct";
        m.payload = "{}";
        m.message_id = "d-" + std::to_string(i);
        ASSERT_TRUE(o->enqueue(c, m).ok());
      }
      c.exec("COMMIT");
    });
    std::vector<OutboxRow> rows;
    ASSERT_TRUE(relay_side(*o).fetch_pending(0, 10, &rows).ok());
    ASSERT_EQ(rows.size(), dead.size());
    for (size_t i = 0; i < dead.size(); ++i)
      ASSERT_TRUE(
          relay_side(*o).mark_dead({rows[i].seq, 1}, dead[i].first, dead[i].second, "why").ok());
  }
  ToolRun r = tool({"outbox", "list", db});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("0x00"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rejected_by_broker (0x97)"), std::string::npos) << r.out;
  for (const char* reason : {"expired why", "payload_too_large why", "connection_dropped why"})
    EXPECT_NE(r.out.find(reason), std::string::npos) << reason << " in\n" << r.out;
  r = tool({"--json", "outbox", "list", db});
  ASSERT_EQ(r.code, 0) << r.err;
  const json listed = r.j();  // the rows below refer into it: not into a temporary
  ASSERT_EQ(listed["count"], 4);
  for (const auto& row : listed["rows"]) {
    if (row["dead_reason"] == "rejected_by_broker")
      EXPECT_EQ(row["reason_code"], 0x97);
    else
      EXPECT_TRUE(row["reason_code"].is_null()) << row.dump();
  }
  for (int i = 0; i < 3; ++i) {
    r = tool({"outbox", "show", db, "--message-id", "d-" + std::to_string(i)});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("0x00"), std::string::npos) << r.out;
  }
}

// A consumer persists the retention clock at each Pruner pass and at a clean stop. One
// that dies without either (kill -9, power loss) leaves the file's clock behind the time it
// ran: `stats` must say that its ages come from that clock and are lower bounds.
TEST(AdminTool, StatsSaysItsAgesComeFromTheRecordedRetentionClock) {
  TempDir dir;
  const std::string db = dir.file("ledger.db");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the consumer process
    ShiftClock clock;
    InboxOptions o;
    o.clock = &clock;
    auto inbox = open_ledger_inbox(db, o);
    std::unique_ptr<Consumer> c;
    std::unique_ptr<Pruner> pruner;
    if (!inbox || !Consumer::create(inbox.get(), "ledger", ledger::apply_credit, {}, &c).ok() ||
        !Pruner::create(inbox.get(), {}, &pruner).ok())
      _exit(2);
    PruneResult pass;
    bool ok = c->handle(credit_message("c-0", "a", 1)) == Outcome::kProcessed &&
              pruner->prune_once(&pass).ok();  // a Pruner pass persists the clock
    clock.shift += kHour;                      // an hour of running time, then one more credit
    ok = ok && c->handle(credit_message("c-1", "a", 1)) == Outcome::kProcessed;
    clock.shift += kHour;  // another hour, never persisted
    _exit(ok ? 0 : 3);     // dies as under kill -9: no destructor persists the clock
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;

  ToolRun r = tool({"stats", db, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  json s = r.j();
  // The clock stands at the newest row (c-1), an hour after the persisted value; the hour
  // the consumer ran after c-1 is lost, so c-0 shows about 1 h, not the 2 h it ran since.
  EXPECT_TRUE(s["ages_are_lower_bounds"].get<bool>());
  EXPECT_NE(s["ages_note"].get<std::string>().find("kill -9"), std::string::npos);
  EXPECT_GE(
      s["retention_clock_ms"].get<int64_t>() - s["persisted_retention_clock_ms"].get<int64_t>(),
      kHour);
  ASSERT_EQ(s["consumers"].size(), 1u);
  const int64_t oldest_age = s["consumers"][0]["oldest_age_ms"].get<int64_t>();
  EXPECT_GE(oldest_age, kHour);
  EXPECT_LT(oldest_age, 2 * kHour);
  r = tool({"stats", db});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Note: ages are on the retention clock as this file last recorded it"),
            std::string::npos)
      << r.out;
}

TEST(AdminTool, PruneRespectsTheHorizonAndUsesThePruner) {
  TempDir dir;
  const std::string db = dir.file("ledger.db");
  make_ledger_db(db);

  // Below the library's default horizon (7 d session expiry + 1 h): refused.
  ToolRun r = tool({"prune", db, "--older-than", "1h"});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos);
  EXPECT_EQ(tool({"prune", db, "--older-than", "1x"}).code, 1);

  r = tool({"prune", db, "--older-than", "1h", "--force", "--dry-run", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["would_delete_processed"], 10);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_processed"), 20);

  r = tool({"prune", db, "--older-than", "1h", "--force", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["processed_deleted"], 10);
  EXPECT_EQ(r.j()["dead_letters_deleted"], 0);  // dead letters are kept unless asked
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_processed"), 10);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_dead_letters"), 3);
  EXPECT_EQ(query_int(db, "SELECT sum(balance) FROM accounts"), kLedgerSum);
  // The horizon the tool enforced is recorded, never lowered by a forced prune.
  EXPECT_EQ(query_int(db, "SELECT value FROM inbox_meta WHERE key = 'required_window_ms'"),
            (7 * 24 + 1) * kHour);

  // A horizon recorded by the application's Pruner (here 10 d) is enforced.
  {
    auto inbox = open_ledger_inbox(db);
    RetentionOptions ro;
    ro.window = std::chrono::hours(11 * 24);
    ro.broker_session_expiry = std::chrono::hours(10 * 24);
    std::unique_ptr<Pruner> p;
    ASSERT_TRUE(Pruner::create(inbox.get(), ro, &p).ok());
  }
  r = tool({"prune", db, "--older-than", "8d"});
  EXPECT_EQ(r.code, 4);
  r = tool({"prune", db, "--json"});  // default window = the recorded horizon
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["window_ms"], (10 * 24 + 1) * kHour);
  EXPECT_EQ(r.j()["processed_deleted"], 0);

  // A 30-day session recorded by a subscriber raises it (+ the 1 h margin), named.
  {
    auto inbox = open_ledger_inbox(db);
    SessionRecord rec;
    rec.client_id = "gw-30d";
    rec.session_expiry_ms = 30 * 24 * kHour;
    rec.expiry_source = SessionExpirySource::kDeclared;
    ASSERT_TRUE(inbox->sessions().record(rec).ok());
  }
  r = tool({"prune", db, "--older-than", "11d"});
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.err.find("gw-30d"), std::string::npos) << r.err;
  r = tool({"prune", db, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["window_ms"], (30 * 24 + 1) * kHour);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_processed"), 10);
}

TEST(AdminTool, SchemaVersionsMigrateAndSettingsThatVoidTheGuarantee) {
  TempDir dir;
  // A database of schema version 1, as an older release wrote it.
  const std::string old_db = dir.file("old.db");
  {
    const std::string sql = schema_sql();
    const std::string v1 = sql.substr(0, sql.find("-- @version 2"));
    SQLite::Database d(old_db, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    d.exec("PRAGMA journal_mode = WAL");
    d.exec(v1);
  }
  ToolRun r = tool({"stats", old_db});
  EXPECT_EQ(r.code, 5);
  EXPECT_NE(r.err.find("migrate"), std::string::npos) << r.err;
  EXPECT_EQ(query_int(old_db, "PRAGMA user_version"), 1);  // nothing changed
  r = tool({"check", old_db, "--json"});
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(r.j()["ok"].get<bool>());
  r = tool({"migrate", old_db, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["from_version"], 1);
  EXPECT_EQ(r.j()["to_version"], kSchemaVersion);
  EXPECT_EQ(tool({"check", old_db}).code, 0);
  EXPECT_EQ(tool({"stats", old_db}).code, 0);

  // journal_mode other than WAL.
  const std::string del_db = dir.file("delete.db");
  make_ledger_db(del_db);
  {
    SQLite::Database d(del_db, SQLite::OPEN_READWRITE);
    d.exec("PRAGMA journal_mode = DELETE");
  }
  r = tool({"check", del_db, "--json"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.j()["problems"].dump().find("journal_mode"), std::string::npos);

  // Inbox::open records the owner's synchronous setting; FULL passes.
  const std::string sync_db = dir.file("sync.db");
  make_ledger_db(sync_db);
  EXPECT_EQ(query_int(sync_db,
                      "SELECT count(*) FROM inbox_meta WHERE key = 'synchronous'"
                      " AND value = 'full'"),
            1);
  EXPECT_EQ(tool({"check", sync_db}).code, 0);
  // synchronous below FULL recorded without an opt-in.
  {
    SQLite::Database d(sync_db, SQLite::OPEN_READWRITE);
    d.exec(
        "INSERT OR REPLACE INTO inbox_meta (key, value) VALUES ('synchronous', 'normal'),"
        " ('synchronous_opt_in', 'false')");
  }
  r = tool({"check", sync_db, "--json"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.j()["problems"].dump().find("synchronous"), std::string::npos);
  {
    SQLite::Database d(sync_db, SQLite::OPEN_READWRITE);
    d.exec("INSERT OR REPLACE INTO inbox_meta (key, value) VALUES ('synchronous_opt_in', 'true')");
  }
  EXPECT_EQ(tool({"check", sync_db}).code, 0);

  // A missing file is an error and is not created; bad usage is 1.
  EXPECT_EQ(tool({"stats", dir.file("nope.db")}).code, 3);
  EXPECT_FALSE(std::filesystem::exists(dir.file("nope.db")));
  EXPECT_EQ(tool({"stats"}).code, 1);
  EXPECT_EQ(tool({"frobnicate"}).code, 1);
}

TEST(AdminTool, StoreThenProcessReplayAndDeadLetterRequeue) {
  TempDir dir;
  const std::string db = dir.file("stp.db");
  std::atomic<bool> poison_fails{true};
  auto run_workers = [&](auto until) {
    auto inbox = open_ledger_inbox(db);
    StoreThenProcessOptions o;
    o.workers = 1;
    o.poll_interval_ms = 10;
    o.consumer.max_attempts = 1;
    o.aggregate_key = aggregate_key_from_json_field("account");
    std::unique_ptr<StoreThenProcess> stp;
    ASSERT_TRUE(StoreThenProcess::create(
                    inbox.get(), "stp",
                    [&](SQLite::Database& d, const StoredDelivery& sd) {
                      if (sd.message_id == "poison" && poison_fails)
                        throw std::runtime_error("bug");
                      ledger::apply_credit(d, Delivery{sd.message, sd.message_id, sd.attempt});
                    },
                    o, &stp)
                    .ok());
    until(*stp);
    ASSERT_TRUE(stp->start().ok());
    ASSERT_TRUE(wait_until(
        [&] {
          StoreThenProcessStats st;
          return stp->stats(&st).ok() && st.pending == 0 && st.processing == 0;
        },
        std::chrono::seconds(10)));
    ASSERT_TRUE(stp->stop().ok());
  };
  run_workers([](StoreThenProcess& stp) {
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(
          stp.handle(credit_message("s-" + std::to_string(i), i % 2 ? "acct-1" : "acct-2", 100)),
          Outcome::kProcessed);
    EXPECT_EQ(stp.handle(credit_message("poison", "acct-3", 7)), Outcome::kProcessed);
  });
  EXPECT_EQ(query_int(db, "SELECT sum(balance) FROM accounts"), 400);

  ToolRun r = tool({"stats", db, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  json stp_stats;
  const json all = r.j();
  for (const auto& c : all["consumers"])
    if (c["name"] == "stp") stp_stats = c["store_then_process"];
  EXPECT_EQ(stp_stats["done"], 4);
  EXPECT_EQ(stp_stats["dead"], 1);
  EXPECT_EQ(stp_stats["pending"], 0);

  // A claim left by a crashed worker (simulated: a done row put back to 'processing'
  // with an old claim time) is returned to pending by `reap`.
  {
    SQLite::Database d(db, SQLite::OPEN_READWRITE);
    d.exec(
        "UPDATE inbox_messages SET status = 'processing', claimed_at = 1, claimant = 'dead-worker'"
        " WHERE message_id = 's-0'");
  }
  r = tool({"reap", db, "--consumer", "stp", "--lease-ms", "1000", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["reaped"], 1);
  EXPECT_EQ(query_int(db,
                      "SELECT count(*) FROM inbox_messages WHERE message_id = 's-0'"
                      " AND status = 'pending'"),
            1);
  EXPECT_EQ(tool({"reap", db, "--consumer", "nobody"}).code, 8);
  {
    SQLite::Database d(db, SQLite::OPEN_READWRITE);  // back as it was for the rest
    d.exec("UPDATE inbox_messages SET status = 'done', attempts = 1 WHERE message_id = 's-0'");
  }

  EXPECT_EQ(tool({"replay", db, "--consumer", "stp"}).code, 1);  // no selector
  EXPECT_EQ(tool({"replay", db, "--consumer", "nobody", "--all"}).code, 8);
  r = tool({"replay", db, "--consumer", "stp", "--aggregate", "acct-1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["reset"], 2);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_messages WHERE status = 'pending'"), 2);

  // The worker's dead letter goes back to pending through StoreThenProcess::replay.
  r = tool({"dead-letters", "list", db, "--json", "--consumer", "stp"});
  ASSERT_EQ(r.j()["count"], 1);
  const std::string dl_id = std::to_string(r.j()["dead_letters"][0]["id"].get<int64_t>());
  r = tool({"dead-letters", "replay", db, "--id", dl_id, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["reset"], 1);
  EXPECT_EQ(
      query_int(
          db,
          "SELECT count(*) FROM inbox_messages WHERE message_id = 'poison' AND status = 'pending'"),
      1);
  EXPECT_EQ(tool({"dead-letters", "replay", db, "--id", dl_id}).code, 4);  // not twice

  // The application (bug fixed) processes what the tool re-queued: the poison credit once,
  // the replayed acct-1 credits a second time (a replay re-runs effects on purpose).
  poison_fails = false;
  run_workers([](StoreThenProcess&) {});
  EXPECT_EQ(query_int(db, "SELECT balance FROM accounts WHERE account = 'acct-3'"), 7);
  EXPECT_EQ(query_int(db, "SELECT balance FROM accounts WHERE account = 'acct-1'"), 400);
  EXPECT_EQ(query_int(db, "SELECT balance FROM accounts WHERE account = 'acct-2'"), 200);
}

TEST(AdminTool, EveryReadCommandAndPruneWhileALedgerConsumerIsWriting) {
  Broker broker;
  TempDir dir;
  const std::string db = dir.file("ledger.db");
  const std::string consumer_log = dir.file("consumer.log");
  Child consumer({built_program("ledger_consumer"), "--broker", broker.uri(), "--client-id",
                  "tool-live", "--topic", "credits/#", "--db", db, "--mqtt-version", "5"},
                 consumer_log);
  ASSERT_TRUE(
      wait_until([&] { return file_text(consumer_log).find("consuming: ") != std::string::npos; },
                 std::chrono::seconds(10)));
  const std::string pub_log = dir.file("publisher.log");
  Child publisher(
      {built_program("publisher"), "--broker", broker.uri(), "--topic", "credits/live", "--count",
       "1200", "--duplicates", "0.2", "--malformed", "4", "--rate", "150", "--seed", "3"},
      pub_log);
  int rounds = 0;
  int64_t rows_seen_while_running = 0;
  while (publisher.running() && rounds < 40) {
    ToolRun r = tool({"stats", db, "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    const json st = r.j();
    for (const auto& c : st["consumers"])
      rows_seen_while_running = c["processed_rows"].get<int64_t>();
    ASSERT_EQ(tool({"check", db, "--json"}).code, 0);
    ASSERT_EQ(tool({"dead-letters", "list", db, "--json"}).code, 0);
    ASSERT_EQ(tool({"export", db}).code, 0);
    ASSERT_EQ(tool({"prune", db, "--dry-run", "--json"}).code, 0);
    r = tool({"prune", db, "--json"});  // the default horizon: nothing is old enough
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.j()["processed_deleted"], 0);
    ++rounds;
  }
  EXPECT_GE(rounds, 2);
  EXPECT_GT(rows_seen_while_running, 0);
  ASSERT_NE(publisher.wait(std::chrono::seconds(30)), -1);
  std::smatch m;
  const std::string pub_out = file_text(pub_log);
  ASSERT_TRUE(std::regex_search(pub_out, m, std::regex("total_amount=(\\d+)"))) << pub_out;
  const int64_t total = std::stoll(m[1]);
  ASSERT_TRUE(
      wait_until([&] { return query_int(db, "SELECT count(*) FROM ledger_entries") == 1200; },
                 std::chrono::seconds(20)));
  ASSERT_TRUE(
      wait_until([&] { return query_int(db, "SELECT count(*) FROM inbox_dead_letters") == 4; },
                 std::chrono::seconds(10)));
  ToolRun r = tool({"stats", db, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j()["consumers"][0]["processed_rows"], 1200);
  EXPECT_EQ(r.j()["consumers"][0]["dead_letters"]["dead"], 4);
  consumer.signal(SIGTERM);
  ASSERT_NE(consumer.wait(std::chrono::seconds(20)), -1);
  // Exactly once, with the tool running alongside.
  EXPECT_EQ(query_int(db, "SELECT sum(balance) FROM accounts"), total);
  EXPECT_EQ(query_int(db, "SELECT count(DISTINCT message_id) FROM ledger_entries"), 1200);
  EXPECT_EQ(tool({"check", db}).code, 0);
}

// Issue 18 section 6: replaying a Consumer-mode dead letter while the service runs. The
// service holds the inbox's exclusive lock file; the tool opens the file without it and
// marks rows 'requeued' in one short write; the running consumer replays them on its own
// thread through its (now fixed) handler: one ends 'replayed' with its effect applied
// once, one that is still bad ends 'dead' again in the same row; the stream goes on.
TEST(AdminTool, RequeuedDeadLettersAreReplayedByTheRunningConsumer) {
  Broker broker;
  TempDir dir;
  const std::string db = dir.file("ledger.db");
  auto consumer_args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {built_program("crash_consumer"),
                                  broker.uri(),
                                  "requeue-client",
                                  "credits/#",
                                  db,
                                  "--mqtt-version",
                                  "5",
                                  "--max-attempts",
                                  "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  // The first release has a bug: every attempt at "fix-me" throws.
  {
    const std::string log = dir.file("first.log");
    Child first(consumer_args({"--fail-handler", "fix-me"}), log);
    ASSERT_TRUE(wait_until([&] { return file_text(log).find("consuming: ") != std::string::npos; },
                           std::chrono::seconds(10)));
    TestPublisher pub(broker.uri());
    pub.credit("credits/r", "c-1", "acct", 10);
    pub.credit("credits/r", "fix-me", "acct", 5);
    pub.publish("credits/r", R"({"message_id":"still-bad","account":"acct","amount":"x"})");
    pub.credit("credits/r", "c-2", "acct", 1);
    ASSERT_TRUE(wait_until(
        [&] {
          return query_int(db, "SELECT count(*) FROM inbox_dead_letters") == 2 &&
                 query_int(db, "SELECT count(*) FROM ledger_entries") == 2;
        },
        std::chrono::seconds(20)));
    first.signal(SIGTERM);
    ASSERT_NE(first.wait(std::chrono::seconds(20)), -1);
  }
  const std::string fix_id = std::to_string(
      query_int(db, "SELECT id FROM inbox_dead_letters WHERE message_id = 'fix-me'"));
  const std::string bad_id = std::to_string(
      query_int(db, "SELECT id FROM inbox_dead_letters WHERE message_id = 'still-bad'"));
  EXPECT_EQ(query_int(db,
                      "SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'fix-me'"
                      " AND reason = 'handler_failed' AND status = 'dead'"),
            1);
  EXPECT_EQ(query_int(db, "SELECT balance FROM accounts WHERE account = 'acct'"), 11);

  // The fixed release runs; it holds the exclusive lock file while the tool works.
  const std::string log = dir.file("fixed.log");
  Child fixed(consumer_args({"--requeue-poll-ms", "100"}), log);
  ASSERT_TRUE(wait_until([&] { return file_text(log).find("consuming: ") != std::string::npos; },
                         std::chrono::seconds(10)))
      << file_text(log);
  ToolRun r = tool({"dead-letters", "replay", db, "--id", fix_id, "--json"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.j()["status"], "requeued");
  r = tool({"dead-letters", "requeue", db, "--id", bad_id});  // the alias
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("requeued"), std::string::npos) << r.out;

  ASSERT_TRUE(wait_until(
      [&] {
        return query_int(db, "SELECT count(*) FROM inbox_dead_letters WHERE id = " + fix_id +
                                 " AND status = 'replayed' AND replayed_at IS NOT NULL") == 1 &&
               query_int(db, "SELECT count(*) FROM inbox_dead_letters WHERE id = " + bad_id +
                                 " AND status = 'dead'") == 1;
      },
      std::chrono::seconds(15)))
      << file_text(log);
  // fix-me's effect, once; still-bad dead again in its own row with the handler's reason.
  EXPECT_EQ(query_int(db, "SELECT balance FROM accounts WHERE account = 'acct'"), 16);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM ledger_entries WHERE message_id = 'fix-me'"), 1);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_processed WHERE message_id = 'fix-me'"), 1);
  EXPECT_EQ(query_int(db,
                      "SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'still-bad'"
                      " AND reason = 'undecodable_payload'"),
            1);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_processed WHERE message_id = 'still-bad'"),
            0);
  EXPECT_NE(file_text(log).find("requeued dead letter " + fix_id + " replayed: processed"),
            std::string::npos);
  EXPECT_NE(file_text(log).find("requeued dead letter " + bad_id + " replayed: dead_lettered"),
            std::string::npos);
  // Not twice; and the stream still flows.
  EXPECT_EQ(tool({"dead-letters", "replay", db, "--id", fix_id}).code, 4);
  {
    TestPublisher pub(broker.uri());
    pub.credit("credits/r", "c-3", "acct", 100);
  }
  ASSERT_TRUE(wait_until([&] { return query_int(db, "SELECT count(*) FROM ledger_entries") == 4; },
                         std::chrono::seconds(10)));
  fixed.signal(SIGTERM);
  ASSERT_NE(fixed.wait(std::chrono::seconds(20)), -1);
  EXPECT_EQ(query_int(db, "SELECT balance FROM accounts WHERE account = 'acct'"), 116);
  EXPECT_EQ(query_int(db, "SELECT count(*) FROM inbox_dead_letters WHERE status = 'requeued'"), 0);
}

// probe-broker runs as a Child so the test can restart the broker while it is offline.
// Without its in-flight check (about 10 s each run; probe_broker_test has it).
json probe(Broker& broker, const std::vector<std::string>& extra, bool restart, int* code,
           const TempDir& dir) {
  const std::string log = dir.file("probe-" + std::to_string(rand()) + ".log");
  std::vector<std::string> argv = {built_program("mqtt-inbox"),
                                   "probe-broker",
                                   "--broker",
                                   broker.uri(),
                                   "--json",
                                   "--timeout-ms",
                                   "3000",
                                   "--no-in-flight"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (restart) argv.insert(argv.end(), {"--pause-offline-ms", "2500"});
  Child child(argv, log);
  if (restart) {
    EXPECT_TRUE(
        wait_until([&] { return file_text(log).find("probe: offline") != std::string::npos; },
                   std::chrono::seconds(10)));
    broker.stop();
    broker.start();
  }
  const int st = child.wait(std::chrono::seconds(30));
  *code = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  const std::string text = file_text(log);
  json j = json::parse(text.substr(std::min(text.find('{'), text.size())), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << text;
  return j;
}

TEST(AdminTool, ProbeBrokerTellsAKeptSessionFromADroppedOne) {
  TempDir dir;
  int code = -1;
  {
    Broker good;  // persistence on, no queue limit
    json j = probe(good, {"--count", "5"}, /*restart=*/true, &code, dir);
    EXPECT_EQ(code, 0) << j.dump(2);
    EXPECT_EQ(j["verdict"], "ok");
    EXPECT_TRUE(j["session_present"].get<bool>());
    EXPECT_EQ(j["sent"], 5);
    EXPECT_EQ(j["distinct_received"], 5);
    EXPECT_EQ(j["effective_session_expiry_s"], 300);
    EXPECT_TRUE(j["cleaned_up"].get<bool>());
    // The broker's own limits from its CONNACK: mosquitto 2.0 announces its Receive
    // Maximum (max_inflight_messages, 20) and leaves Maximum QoS out (2 by the spec).
    EXPECT_EQ(j["broker_limits"]["receive_maximum"]["value"], 20) << j.dump(2);
    EXPECT_TRUE(j["broker_limits"]["receive_maximum"]["sent"].get<bool>());
    EXPECT_EQ(j["broker_limits"]["maximum_qos"]["value"], 2);
    EXPECT_FALSE(j["broker_limits"]["maximum_qos"]["sent"].get<bool>());
    EXPECT_TRUE(j["broker_limits"]["maximum_packet_size"]["value"].is_null());
    j = probe(good, {"--count", "3", "--mqtt-version", "3.1.1"}, false, &code, dir);
    EXPECT_EQ(code, 0) << j.dump(2);
    EXPECT_EQ(j["verdict"], "ok");
    EXPECT_FALSE(j.contains("broker_limits"));  // MQTT 3.1.1's CONNACK has none
  }
  {
    Broker forgetful(Broker::Config{/*persistence=*/false, 0});
    json j = probe(forgetful, {"--count", "5"}, /*restart=*/true, &code, dir);
    EXPECT_EQ(code, 2) << j.dump(2);
    EXPECT_EQ(j["verdict"], "session_lost");
    EXPECT_FALSE(j["session_present"].get<bool>());
    EXPECT_EQ(j["distinct_received"], 0);
  }
  {
    Broker limited(Broker::Config{true, /*max_queued_messages=*/3});
    json j = probe(limited, {"--count", "10"}, false, &code, dir);
    EXPECT_EQ(code, 2) << j.dump(2);
    EXPECT_EQ(j["verdict"], "messages_dropped");
    EXPECT_TRUE(j["session_present"].get<bool>());
    EXPECT_LT(j["distinct_received"].get<int>(), 10);
    EXPECT_NE(j["warnings"].dump().find("max_queued_messages"), std::string::npos);
  }
  ToolRun r = tool({"probe-broker", "--broker", "tcp://127.0.0.1:" + std::to_string(free_port()),
                    "--timeout-ms", "500", "--json"});
  EXPECT_EQ(r.code, 7) << r.out << r.err;
}

// probe-broker --shared (issue 31): mosquitto keeps an absent durable member's turns of a
// shared subscription in its session (parked), on MQTT 5 and 3.1.1; with a queue limit
// smaller than that share, some of them reach no member (dropped).
TEST(AdminTool, ProbeBrokerSharedTellsWhereAnAbsentMembersTurnsGo) {
  TempDir dir;
  int code = -1;
  {
    Broker good;
    for (const char* v : {"5", "3.1.1"}) {
      json j = probe(good, {"--count", "10", "--shared", "--mqtt-version", v}, false, &code, dir);
      const json& sh = j["shared_subscription"];
      EXPECT_EQ(code, 0) << v << ": " << j.dump(2);
      EXPECT_EQ(sh["verdict"], "parked") << v << ": " << j.dump(2);
      EXPECT_GT(sh["both_live"]["to_a"].get<int>(), 0) << j.dump(2);
      EXPECT_GT(sh["both_live"]["to_b"].get<int>(), 0) << j.dump(2);
      EXPECT_EQ(sh["both_live"]["to_a"].get<int>() + sh["both_live"]["to_b"].get<int>(), 10);
      const int to_b = sh["member_away"]["to_b_while_a_away"].get<int>();
      const int to_a = sh["member_away"]["to_a_on_return"].get<int>();
      EXPECT_LT(to_b, 10) << j.dump(2);
      EXPECT_EQ(to_a + to_b, 10) << j.dump(2);
      EXPECT_TRUE(sh["cleaned_up"].get<bool>());
      EXPECT_NE(j["warnings"].dump().find("stays dead"), std::string::npos) << j.dump(2);
    }
  }
  {
    Broker limited(Broker::Config{true, /*max_queued_messages=*/2});
    json j = probe(limited, {"--count", "10", "--shared"}, false, &code, dir);
    EXPECT_EQ(code, 2) << j.dump(2);
    EXPECT_EQ(j["shared_subscription"]["verdict"], "dropped") << j.dump(2);
  }
}

}  // namespace
}  // namespace mqtt_inbox::test

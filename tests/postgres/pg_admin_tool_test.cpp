// The mqtt-inbox admin tool on the PostgreSQL store (docs/admin-tool.md#postgresql): the
// real binary run as a child process with a postgresql:// location, against a private
// cluster (support/postgres.h) that a Consumer filled with credits, duplicates and poison.
// Assertions are on exit codes, the tool's output and the rows in PostgreSQL afterwards.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <pqxx/pqxx>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <mqtt_inbox/consumer.h>
#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/outbox.h>
#include <mqtt_inbox/postgres.h>
#include <mqtt_inbox/retention.h>
#include <mqtt_inbox/store_then_process.h>
#include <nlohmann/json.hpp>

#include "store/postgres/admin.h"
#include "support/postgres.h"
#include "support/process.h"
#include "support/relay_side.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// The role that must log in with a password (scram-sha-256 on the socket); every other
// role is trusted there, as in every test cluster.
constexpr const char* kPwRole = "inbox_pw";

// The store lives in mqtt_inbox::postgres: registered before any Inbox::open here.
const bool kPostgresEnabled = (enable_postgres_store(), true);

// fsync on: `check` reports a server without it as a problem. The server reads its
// pg_hba file at start (it is not restarted here), so the file goes once it runs.
Postgres& server() {
  static const std::string hba = [] {
    const std::string path = std::filesystem::temp_directory_path() /
                             ("mqtt-inbox-pg-hba-" + std::to_string(getpid()) + ".conf");
    std::ofstream(path) << "local all " << kPwRole << " scram-sha-256\nlocal all all trust\n";
    ::chmod(path.c_str(), 0644);  // the server may run as the postgres user
    return path;
  }();
  static Postgres pg([] {
    Postgres::Options o;
    o.settings.push_back("hba_file=" + hba);
    return o;
  }());
  static const bool removed = std::filesystem::remove(hba);
  (void)removed;
  return pg;
}

std::string uri_of(const std::string& db) { return server().uri(db); }

int64_t q(const std::string& db, const std::string& sql) {
  return std::stoll(server().query_value(sql, db));
}

struct ToolRun {
  int code = -1;
  std::string out, err;
  json j() const {
    json v = json::parse(out, nullptr, false);
    EXPECT_FALSE(v.is_discarded()) << "not JSON: " << out << "\nstderr: " << err;
    return v;
  }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Runs the real tool with stdin from an empty pipe (never a terminal), output captured.
ToolRun tool(std::vector<std::string> args,
             const std::vector<std::pair<std::string, std::string>>& env = {}) {
  args.insert(args.begin(), built_program("mqtt-inbox"));
  args = with_emulator(std::move(args));
  const std::string base =
      std::filesystem::temp_directory_path() /
      ("mqtt-inbox-pg-" + std::to_string(getpid()) + "-" + std::to_string(rand()));
  int in[2];
  EXPECT_EQ(pipe(in), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    close(in[1]);
    const int o = open((base + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open((base + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(in[0]);
  close(in[1]);
  int st = 0;
  waitpid(pid, &st, 0);
  ToolRun r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  unlink((base + ".out").c_str());
  unlink((base + ".err").c_str());
  return r;
}

Message credit(const std::string& id, const std::string& account, int64_t amount,
               bool dup = false) {
  Message m;
  m.topic = "credits/" + account;
  m.payload = "{\"message_id\":\"" + id + "\",\"account\":\"" + account +
              "\",\"amount\":" + std::to_string(amount) + "}";
  m.qos = 1;
  m.dup = dup;
  return m;
}

ConsumerOptions fast_options() {
  ConsumerOptions o;
  o.retry_backoff_initial = 1ms;
  o.retry_backoff_max = 2ms;
  o.store_backoff_initial = 5ms;
  o.store_backoff_max = 50ms;
  o.requeue_poll_ms = 0;
  o.max_attempts = 3;
  return o;
}

// A ledger database and its inbox: 6 credits (one delivered three times), a poison credit
// whose handler throws at every attempt (dead letter handler_failed), and a payload that
// is not JSON (dead letter, at once), through a real Consumer on the PostgreSQL store.
// `accept_poison` later lets the poison's account in, so a replay of it succeeds.
struct Ledger {
  std::string db;
  std::unique_ptr<Inbox> inbox;
  std::unique_ptr<Consumer> consumer;
  std::shared_ptr<std::atomic<bool>> accept_poison = std::make_shared<std::atomic<bool>>(false);

  explicit Ledger(const std::string& name) : db(name) {
    server().create_database(db);
    server().execute(
        "CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);"
        "CREATE TABLE ledger_entries (message_id text PRIMARY KEY, account text NOT NULL,"
        " amount bigint NOT NULL)",
        db);
    const Status s = Inbox::open(uri_of(db), InboxOptions{}, &inbox);
    EXPECT_TRUE(s.ok()) << s.to_string();
    auto accept = accept_poison;
    EXPECT_TRUE(Consumer::create(
                    inbox.get(), "ledger",
                    [accept](pqxx::transaction_base& t, const Delivery& d) {
                      const json& j = *d.payload_json;
                      const std::string account = j.at("account").get<std::string>();
                      if (account == "closed" && !accept->load())
                        throw std::runtime_error("account closed");
                      t.exec_params0(
                          "INSERT INTO ledger_entries (message_id, account, amount)"
                          " VALUES ($1, $2, $3)",
                          d.message_id, account, j.at("amount").get<int64_t>());
                      t.exec_params0(
                          "INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id)"
                          " DO UPDATE SET balance = accounts.balance + excluded.balance",
                          account, j.at("amount").get<int64_t>());
                    },
                    fast_options(), &consumer)
                    .ok());
  }

  void fill() {
    for (int i = 1; i <= 6; ++i)
      EXPECT_EQ(consumer->handle(credit("m-" + std::to_string(i), "alice", i)),
                Outcome::kProcessed);
    EXPECT_EQ(consumer->handle(credit("m-1", "alice", 1, true)), Outcome::kDuplicate);
    EXPECT_EQ(consumer->handle(credit("m-1", "alice", 1, true)), Outcome::kDuplicate);
    EXPECT_EQ(consumer->handle(credit("poison", "closed", 50)), Outcome::kDeadLettered);
    Message bad;
    bad.topic = "credits/x";
    bad.payload = "not json";
    bad.qos = 1;
    EXPECT_EQ(consumer->handle(bad), Outcome::kDeadLettered);
    EXPECT_EQ(q(db, "SELECT balance FROM accounts WHERE id = 'alice'"), 21);
    EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 6);
    EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 2);
  }
};

TEST(PgAdminTool, CheckReportsSchemaTablesIsolationAndRowsWithoutWriting) {
  Ledger l("chk");
  l.fill();
  const ToolRun r = tool({"--json", "check", uri_of(l.db)});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const json j = r.j();
  EXPECT_EQ(j["store"], "postgresql");
  EXPECT_EQ(j["schema_version"], detail::postgres_schema_version());
  EXPECT_EQ(j["library_schema_version"], detail::postgres_schema_version());
  EXPECT_EQ(j["isolation"], "read committed");
  EXPECT_TRUE(j["missing_tables"].empty());
  for (const char* t :
       {"inbox_meta", "inbox_processed", "inbox_attempts", "inbox_dead_letters", "inbox_sessions",
        "inbox_session_filters", "outbox_messages", "outbox_usage", "inbox_messages"})
    EXPECT_NE(std::find(j["tables"].begin(), j["tables"].end(), t), j["tables"].end()) << t;
  EXPECT_EQ(j["row_counts"]["inbox_processed"], 6);
  EXPECT_EQ(j["row_counts"]["inbox_dead_letters"], 2);
  EXPECT_EQ(j["row_counts"]["inbox_attempts"],
            q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_attempts"));
  EXPECT_FALSE(j["not_applicable"].empty());  // WAL, integrity_check, ...: said, not faked
  EXPECT_TRUE(j["ok"]);
  const ToolRun text = tool({"check", uri_of(l.db)});
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("check: OK"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("read committed"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("not checked (SQLite only)"), std::string::npos) << text.out;

  // The role gets REPEATABLE READ: a problem (exit 2), as Inbox::open would refuse it.
  server().execute("ALTER DATABASE chk SET default_transaction_isolation = 'repeatable read'");
  const ToolRun rr = tool({"--json", "check", uri_of(l.db)});
  EXPECT_EQ(rr.code, 2) << rr.out << rr.err;
  EXPECT_EQ(rr.j()["isolation"], "repeatable read");
  EXPECT_NE(rr.out.find("READ COMMITTED"), std::string::npos) << rr.out;
  server().execute("ALTER DATABASE chk RESET default_transaction_isolation");
  // synchronous_commit off: commits acked to the broker could be lost in a server crash.
  server().execute("ALTER DATABASE chk SET synchronous_commit = off");
  const ToolRun sc = tool({"check", uri_of(l.db)});
  EXPECT_EQ(sc.code, 2) << sc.out << sc.err;
  EXPECT_NE(sc.out.find("PROBLEM: synchronous_commit is 'off'"), std::string::npos) << sc.out;
  server().execute("ALTER DATABASE chk RESET synchronous_commit");
  EXPECT_EQ(tool({"check", uri_of(l.db)}).code, 0);

  // A database without the inbox's schema: a problem, and check creates nothing.
  server().create_database("empty");
  const ToolRun e = tool({"--json", "check", uri_of("empty")});
  EXPECT_EQ(e.code, 2) << e.out << e.err;
  EXPECT_FALSE(e.j()["schema_exists"].get<bool>());
  EXPECT_EQ(q("empty", "SELECT count(*) FROM pg_namespace WHERE nspname = 'mqtt_inbox'"), 0);
  // stats and dead-letters refuse it as a schema mismatch (exit 5), creating nothing either.
  EXPECT_EQ(tool({"stats", uri_of("empty")}).code, 5);
  EXPECT_EQ(tool({"dead-letters", "list", uri_of("empty")}).code, 5);
  EXPECT_EQ(q("empty", "SELECT count(*) FROM pg_namespace WHERE nspname = 'mqtt_inbox'"), 0);
  // migrate creates it; check is then OK.
  const ToolRun m = tool({"--json", "migrate", uri_of("empty")});
  ASSERT_EQ(m.code, 0) << m.out << m.err;
  EXPECT_EQ(m.j()["to_version"], detail::postgres_schema_version());
  EXPECT_EQ(tool({"check", uri_of("empty")}).code, 0);

  // An inbox in a schema of the application's naming: --pg-schema.
  InboxOptions o;
  o.postgres_schema = "site7";
  std::unique_ptr<Inbox> site7;
  ASSERT_TRUE(Inbox::open(uri_of(l.db), o, &site7).ok());
  const ToolRun s7 = tool({"--pg-schema", "site7", "--json", "check", uri_of(l.db)});
  ASSERT_EQ(s7.code, 0) << s7.out << s7.err;
  EXPECT_EQ(s7.j()["schema"], "site7");
  EXPECT_EQ(s7.j()["row_counts"]["inbox_processed"], 0);  // the ledger's claims are elsewhere
}

TEST(PgAdminTool, StatsCountsClaimsDeadLettersAndSessions) {
  Ledger l("stats");
  l.fill();
  SessionRecord rec;
  rec.client_id = "gw-1";
  rec.topic_filters = {"credits/#"};
  rec.session_expiry_ms = 3600000;
  ASSERT_TRUE(l.inbox->sessions().record(rec).ok());
  l.inbox->sessions().note_lost("gw-1");
  const ToolRun r = tool({"--json", "stats", uri_of(l.db)});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const json j = r.j();
  EXPECT_EQ(j["store"], "postgresql");
  ASSERT_EQ(j["consumers"].size(), 1u) << j.dump();
  const json& c = j["consumers"][0];
  EXPECT_EQ(c["name"], "ledger");
  EXPECT_EQ(c["processed_rows"], 6);
  EXPECT_EQ(c["dead_letters"]["dead"], 2);
  EXPECT_EQ(c["dead_letters"]["by_reason"]["handler_failed"], 1) << c.dump();
  EXPECT_EQ(c["attempts_in_progress"], q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_attempts"));
  ASSERT_EQ(j["sessions"].size(), 1u);
  EXPECT_EQ(j["sessions"][0]["client_id"], "gw-1");
  EXPECT_EQ(j["sessions_lost"], 1);
  // The retention clock is the server's.
  const int64_t server_ms =
      q(l.db, "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint");
  EXPECT_LT(std::llabs(j["retention_clock_ms"].get<int64_t>() - server_ms), 10000);
  EXPECT_TRUE(j.find("wal_bytes") == j.end());  // not reported as a fake 0
  const ToolRun text = tool({"stats", uri_of(l.db)});
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("ledger"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("handler_failed=1"), std::string::npos) << text.out;
}

TEST(PgAdminTool, DeadLettersListShowRequeueAndTheConsumerReplaysIt) {
  Ledger l("deadletters");
  l.fill();
  const ToolRun list = tool({"--json", "dead-letters", "list", uri_of(l.db)});
  ASSERT_EQ(list.code, 0) << list.out << list.err;
  ASSERT_EQ(list.j()["count"], 2);
  int64_t poison = 0;
  const json rows = list.j();
  for (const auto& d : rows["dead_letters"])
    if (d["message_id"] == "poison") poison = d["id"].get<int64_t>();
  ASSERT_GT(poison, 0);
  const ToolRun show =
      tool({"--json", "dead-letters", "show", uri_of(l.db), "--id", std::to_string(poison)});
  ASSERT_EQ(show.code, 0) << show.err;
  EXPECT_EQ(show.j()["reason"], "handler_failed");
  EXPECT_EQ(show.j()["attempts"], 3);
  EXPECT_NE(show.j()["payload_text"].get<std::string>().find("\"closed\""), std::string::npos);
  EXPECT_EQ(tool({"dead-letters", "show", uri_of(l.db), "--id", "999999"}).code, 8);

  // requeue marks the row; the running consumer replays it once the handler can take it.
  const ToolRun rq =
      tool({"--json", "dead-letters", "requeue", uri_of(l.db), "--id", std::to_string(poison)});
  ASSERT_EQ(rq.code, 0) << rq.out << rq.err;
  EXPECT_EQ(rq.j()["status"], "requeued");
  EXPECT_EQ(server().query_value("SELECT status FROM mqtt_inbox.inbox_dead_letters WHERE id = " +
                                     std::to_string(poison),
                                 l.db),
            "requeued");
  const ToolRun again =
      tool({"dead-letters", "requeue", uri_of(l.db), "--id", std::to_string(poison)});
  EXPECT_EQ(again.code, 4) << again.out << again.err;  // refused: already requeued
  *l.accept_poison = true;
  int64_t replayed = 0;
  ASSERT_TRUE(l.consumer->replay_requeued(&replayed).ok());
  EXPECT_EQ(replayed, 1);
  EXPECT_EQ(q(l.db, "SELECT balance FROM accounts WHERE id = 'closed'"), 50);
  EXPECT_EQ(server().query_value("SELECT status FROM mqtt_inbox.inbox_dead_letters WHERE id = " +
                                     std::to_string(poison),
                                 l.db),
            "replayed");
  const ToolRun after =
      tool({"--json", "dead-letters", "show", uri_of(l.db), "--id", std::to_string(poison)});
  EXPECT_EQ(after.j()["status"], "replayed");
  // A replayed row is never requeued again.
  EXPECT_EQ(tool({"dead-letters", "requeue", uri_of(l.db), "--id", std::to_string(poison)}).code,
            4);

  // purge asks; with --yes it deletes the one that is still dead.
  const ToolRun purge_no = tool({"dead-letters", "purge", uri_of(l.db), "--all"});
  EXPECT_EQ(purge_no.code, 4);  // stdin is not a terminal: refused without --yes
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 2);
  const ToolRun purge = tool({"dead-letters", "purge", uri_of(l.db), "--all", "--yes"});
  EXPECT_EQ(purge.code, 0) << purge.out << purge.err;
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters WHERE status = 'dead'"), 0);
}

TEST(PgAdminTool, PruneDeletesOldClaimsByTheServerClockAndRefusesBelowTheHorizon) {
  Ledger l("prune");
  l.fill();
  RetentionOptions ro;
  ro.broker_session_expiry = std::chrono::hours(24);
  ro.max_offline = std::chrono::hours(24);
  ro.replay_window = std::chrono::hours(24);
  ro.margin = std::chrono::hours(1);
  ro.window = std::chrono::hours(24 * 4);
  {
    // The application's Pruner records the horizon it validated (inbox_meta).
    std::unique_ptr<Pruner> p;
    ASSERT_TRUE(Pruner::create(l.inbox.get(), ro, &p).ok());
  }
  const int64_t required = Pruner::required_window_ms(ro);  // 3 d 1 h
  ASSERT_EQ(std::to_string(required),
            server().query_value(
                "SELECT value FROM mqtt_inbox.inbox_meta WHERE key = 'required_window_ms'", l.db));
  // Two ids received 5 days ago on the server's clock.
  server().execute(
      "UPDATE mqtt_inbox.inbox_processed SET received_at = now() - interval '5 days'"
      " WHERE message_id IN ('m-1', 'm-2')",
      l.db);

  // Outbox rows: one sent and one dead long ago (retention_at 0 on the server's clock),
  // one pending, which no window deletes.
  server().execute(
      "INSERT INTO mqtt_inbox.outbox_messages (message_id, ordering_key, class, topic, payload,"
      " properties, size_bytes, enqueued_at, state, sent_at, dead_at, retention_at) VALUES"
      " ('o-sent', 'k', '', 'events/x', '', '{}', 1, 0, 'sent', 0, NULL, 0),"
      " ('o-dead', 'k', '', 'events/x', '', '{}', 1, 0, 'dead', NULL, 0, 0),"
      " ('o-pending', 'k', '', 'events/x', '', '{}', 1, 0, 'pending', NULL, NULL, NULL)",
      l.db);

  // Below the recorded horizon: refused (exit 4), nothing deleted.
  const ToolRun below = tool({"prune", uri_of(l.db), "--older-than", "2d"});
  EXPECT_EQ(below.code, 4) << below.out << below.err;
  EXPECT_NE(below.err.find("redelivery horizon"), std::string::npos) << below.err;
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 6);

  const ToolRun dry = tool({"--json", "prune", uri_of(l.db), "--older-than", "4d", "--dry-run"});
  ASSERT_EQ(dry.code, 0) << dry.out << dry.err;
  EXPECT_EQ(dry.j()["would_delete_processed"], 2);
  EXPECT_EQ(dry.j()["would_delete_outbox_sent"], 1);
  EXPECT_EQ(dry.j()["would_delete_outbox_dead"], 0);  // dead rows only with their own window
  EXPECT_EQ(dry.j()["required_window_ms"], required);
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 6);

  const ToolRun run = tool({"--json", "prune", uri_of(l.db), "--older-than", "4d"});
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  EXPECT_EQ(run.j()["processed_deleted"], 2);
  EXPECT_EQ(run.j()["outbox_sent_deleted"], 1);
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM mqtt_inbox.outbox_messages"), 2);
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_processed"), 4);
  EXPECT_EQ(
      q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_processed WHERE message_id IN ('m-1','m-2')"),
      0);
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM ledger_entries"), 6);  // business rows untouched
  // The tool never lowered the recorded horizon.
  EXPECT_EQ(std::to_string(required),
            server().query_value(
                "SELECT value FROM mqtt_inbox.inbox_meta WHERE key = 'required_window_ms'", l.db));
  // Dead letters go only when asked for, by their own window.
  EXPECT_EQ(run.j()["dead_letters_deleted"], 0);
  const ToolRun dl_dry = tool({"--json", "prune", uri_of(l.db), "--older-than", "4d",
                               "--dead-letters-older-than", "1ms", "--dry-run"});
  ASSERT_EQ(dl_dry.code, 0) << dl_dry.err;
  EXPECT_EQ(dl_dry.j()["would_delete_dead_letters"], 2);
  EXPECT_EQ(dl_dry.j()["would_delete_outbox_dead"], 1);
  EXPECT_EQ(dl_dry.j()["would_delete_processed"], 0);
  const ToolRun dl_run = tool(
      {"--json", "prune", uri_of(l.db), "--older-than", "4d", "--dead-letters-older-than", "1ms"});
  ASSERT_EQ(dl_run.code, 0) << dl_run.err;
  EXPECT_EQ(dl_run.j()["dead_letters_deleted"], 2);
  EXPECT_EQ(dl_run.j()["outbox_dead_deleted"], 1);
  EXPECT_EQ(server().query_value("SELECT string_agg(message_id, ',') FROM "
                                 "mqtt_inbox.outbox_messages",
                                 l.db),
            "o-pending");
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters"), 0);
  // With --force a window below the horizon is accepted (and said so).
  const ToolRun forced = tool({"--json", "prune", uri_of(l.db), "--older-than", "2d", "--force"});
  EXPECT_EQ(forced.code, 0) << forced.err;
  EXPECT_TRUE(forced.j()["forced_below_horizon"].get<bool>());
}

// mqtt-inbox outbox ... on the PostgreSQL store: the library's Outbox calls, as on SQLite.
TEST(PgAdminTool, OutboxStatsListShowReplayPurge) {
  Ledger l("obx");
  std::unique_ptr<Outbox> outbox;
  ASSERT_TRUE(Outbox::create(l.inbox.get(), OutboxOptions{}, &outbox).ok());
  {
    pqxx::connection c(uri_of(l.db));
    pqxx::work w(c);
    for (const char* id : {"e-1", "e-2", "e-3"}) {
      OutgoingMessage m;
      m.topic = "events/x";
      m.message_id = id;
      m.payload = "payload of " + std::string(id);
      ASSERT_TRUE(outbox->enqueue(w, m).ok());
    }
    w.commit();
  }
  std::vector<OutboxRow> rows;
  ASSERT_TRUE(relay_side(*outbox).fetch_pending(0, 10, &rows).ok());
  ASSERT_EQ(rows.size(), 3u);
  ASSERT_TRUE(relay_side(*outbox).mark_sent({{rows[0].seq, 1}}).ok());
  ASSERT_TRUE(relay_side(*outbox)
                  .mark_dead({rows[1].seq, 1}, OutboxDeadReason::kRejectedByBroker, 0x87, "no")
                  .ok());

  const ToolRun st = tool({"--json", "outbox", "stats", uri_of(l.db)});
  ASSERT_EQ(st.code, 0) << st.out << st.err;
  EXPECT_EQ(st.j()["pending_rows"], 1);
  EXPECT_EQ(st.j()["sent_rows"], 1);
  EXPECT_EQ(st.j()["dead_rows"], 1);
  const ToolRun ls = tool({"--json", "outbox", "list", uri_of(l.db), "--state", "dead"});
  ASSERT_EQ(ls.code, 0) << ls.out << ls.err;
  EXPECT_EQ(ls.j()["count"], 1);
  const ToolRun show = tool({"--json", "outbox", "show", uri_of(l.db), "--message-id", "e-2"});
  ASSERT_EQ(show.code, 0) << show.out << show.err;
  EXPECT_NE(show.out.find("e-2"), std::string::npos) << show.out;
  EXPECT_EQ(tool({"outbox", "show", uri_of(l.db), "--message-id", "nope"}).code, 8);
  const ToolRun rp = tool({"--json", "outbox", "replay", uri_of(l.db), "--message-id", "e-2"});
  ASSERT_EQ(rp.code, 0) << rp.out << rp.err;
  EXPECT_EQ(rp.j()["state"], "pending");
  EXPECT_GT(rp.j()["seq"].get<int64_t>(), rows[2].seq);
  const ToolRun pg =
      tool({"--json", "outbox", "purge", uri_of(l.db), "--state", "sent", "--all", "--yes"});
  ASSERT_EQ(pg.code, 0) << pg.out << pg.err;
  EXPECT_EQ(pg.j()["removed"], 1);
  EXPECT_EQ(server().query_value("SELECT string_agg(message_id || ':' || state, ',' ORDER BY seq)"
                                 " FROM mqtt_inbox.outbox_messages",
                                 l.db),
            "e-3:pending,e-2:pending");
}

// replay and reap on a store-then-process consumer in PostgreSQL: a dead row and a done
// row made pending again by `replay`; a claim left 'processing' by a worker that is gone
// returned by `reap` after one lease, its attempt charged; then the consumer's workers
// finish them, each once.
TEST(PgAdminTool, ReplayAndReapStoreThenProcessRows) {
  const std::string db = "stp_repair";
  server().create_database(db);
  server().execute("CREATE TABLE seen (message_id text NOT NULL, n int NOT NULL)", db);
  std::unique_ptr<Inbox> inbox;
  ASSERT_TRUE(Inbox::open(uri_of(db), InboxOptions{}, &inbox).ok());
  auto fail_bad = std::make_shared<std::atomic<bool>>(true);
  StoreThenProcessOptions o;
  o.workers = 1;
  o.consumer.max_attempts = 1;
  o.aggregate_key = aggregate_key_from_topic_level(1);
  std::unique_ptr<StoreThenProcess> stp;
  ASSERT_TRUE(StoreThenProcess::create(
                  inbox.get(), "sensors",
                  [fail_bad](pqxx::transaction_base& t, const StoredDelivery& d) {
                    if (d.message_id == "r-bad" && fail_bad->load())
                      throw std::runtime_error("bad reading");
                    t.exec_params0("INSERT INTO seen VALUES ($1, 1)", d.message_id);
                  },
                  o, &stp)
                  .ok());
  for (const char* id : {"r-1", "r-bad"}) {
    Message m = credit(id, "dev-1", 1);
    m.topic = "sensors/dev-1";
    EXPECT_EQ(stp->handle(m), Outcome::kProcessed) << id;
  }
  ASSERT_TRUE(stp->start().ok());
  ASSERT_TRUE(wait_until(
      [&] {
        return q(db,
                 "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status IN"
                 " ('done', 'dead')") == 2;
      },
      20s));
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(q(db, "SELECT count(*) FROM mqtt_inbox.inbox_messages WHERE status = 'dead'"), 1);

  // replay --id r-bad --include-dead: the dead row is pending again.
  const ToolRun rp = tool(
      {"--json", "replay", uri_of(db), "--consumer", "sensors", "--id", "r-bad", "--include-dead"});
  ASSERT_EQ(rp.code, 0) << rp.out << rp.err;
  EXPECT_EQ(rp.j()["reset"], 1) << rp.out;
  EXPECT_EQ(server().query_value(
                "SELECT status FROM mqtt_inbox.inbox_messages WHERE message_id = 'r-bad'", db),
            "pending");
  // A claim of a worker that is gone: the row 'processing', its claimant nowhere.
  server().execute(
      "UPDATE mqtt_inbox.inbox_messages SET status = 'processing', claimant = 'gone-1',"
      " claim_token = claim_token + 1 WHERE message_id = 'r-bad'",
      db);
  const ToolRun rc =
      tool({"--json", "reap", uri_of(db), "--consumer", "sensors", "--lease-ms", "500"});
  ASSERT_EQ(rc.code, 0) << rc.out << rc.err;
  EXPECT_EQ(rc.j()["reaped"], 1) << rc.out;
  EXPECT_EQ(server().query_value(
                "SELECT status FROM mqtt_inbox.inbox_messages WHERE message_id = 'r-bad'", db),
            "pending");
  // The reaped claim was charged an attempt (the replay had set them to 0).
  EXPECT_EQ(q(db, "SELECT attempts FROM mqtt_inbox.inbox_messages WHERE message_id = 'r-bad'"), 1);
  // The consumer's workers finish it once, now that it succeeds (with attempts to spare).
  fail_bad->store(false);
  o.consumer.max_attempts = 3;
  ASSERT_TRUE(StoreThenProcess::create(
                  inbox.get(), "sensors",
                  [](pqxx::transaction_base& t, const StoredDelivery& d) {
                    t.exec_params0("INSERT INTO seen VALUES ($1, 1)", d.message_id);
                  },
                  o, &stp)
                  .ok());
  ASSERT_TRUE(stp->start().ok());
  EXPECT_TRUE(wait_until([&] { return q(db, "SELECT count(*) FROM seen") == 2; }, 20s));
  ASSERT_TRUE(stp->stop().ok());
  EXPECT_EQ(q(db, "SELECT count(*) FROM seen WHERE message_id = 'r-bad'"), 1);
  EXPECT_EQ(q(db, "SELECT count(*) FROM seen WHERE message_id = 'r-1'"), 1);
}

TEST(PgAdminTool, PasswordsOnlyFromAFileAndSqliteOnlyCommandsSaySo) {
  Ledger l("secrets");
  l.fill();
  const std::string secret = "Sup3rSecretPw";
  const std::string host_part = uri_of(l.db).substr(std::string("postgresql://").size());
  const std::vector<std::string> with_password = {
      "postgresql://postgres:" + secret + "@" + host_part, uri_of(l.db) + "&password=" + secret};
  for (const std::string& loc : with_password) {
    for (const std::vector<std::string>& cmd : {std::vector<std::string>{"stats", loc},
                                                {"check", loc},
                                                {"--json", "check", loc},
                                                {"dead-letters", "list", loc},
                                                {"prune", loc, "--dry-run"},
                                                {"migrate", loc}}) {
      const ToolRun r = tool(cmd);
      EXPECT_EQ(r.code, 1) << cmd[0] << " " << r.out << r.err;
      EXPECT_EQ(r.out.find(secret), std::string::npos) << r.out;
      EXPECT_EQ(r.err.find(secret), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("password file"), std::string::npos) << r.err;
    }
  }
  // A role that must give its password (scram-sha-256): from --password-file or
  // PGPASSFILE it logs in; without one the server refuses it (exit 3); the password is
  // never printed.
  server().execute(std::string("CREATE ROLE ") + kPwRole + " LOGIN PASSWORD '" + secret + "'");
  server().execute(std::string("GRANT USAGE ON SCHEMA mqtt_inbox TO ") + kPwRole +
                       "; GRANT SELECT ON ALL TABLES IN SCHEMA mqtt_inbox TO " + kPwRole,
                   l.db);
  std::string pw_uri = uri_of(l.db);
  pw_uri.replace(pw_uri.find("user=postgres"), std::string("user=postgres").size(),
                 std::string("user=") + kPwRole);
  const std::string passfile =
      std::filesystem::temp_directory_path() / ("pgpass-" + std::to_string(getpid()));
  std::ofstream(passfile) << "*:*:*:" << kPwRole << ":" << secret << "\n";
  ::chmod(passfile.c_str(), 0600);  // libpq ignores a password file others can read
  const std::vector<std::pair<std::string, std::string>> no_default = {
      {"PGPASSFILE", "/nonexistent/pgpass"}};
  const ToolRun ok = tool({"--password-file", passfile, "--json", "check", pw_uri}, no_default);
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_EQ(ok.j()["row_counts"]["inbox_processed"], 6);
  // A role with SELECT only can check and read the inbox: on a schema at the library's
  // version Inbox::open creates nothing (docs/postgres.md#privileges). It used to run
  // CREATE ... IF NOT EXISTS at every open, which PostgreSQL refuses such a role (42501).
  EXPECT_TRUE(ok.j()["role_can_open"].get<bool>());
  const auto t0 = std::chrono::steady_clock::now();
  const ToolRun st = tool({"--password-file", passfile, "--json", "stats", pw_uri}, no_default);
  EXPECT_EQ(st.code, 0) << st.out << st.err;
  int64_t processed_rows = 0;
  const auto stats = st.j();
  for (const auto& c : stats["consumers"]) processed_rows += c["processed_rows"].get<int64_t>();
  EXPECT_EQ(processed_rows, 6) << st.out << st.err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  const ToolRun env = tool({"--json", "check", pw_uri}, {{"PGPASSFILE", passfile}});
  EXPECT_EQ(env.code, 0) << env.out << env.err;
  const ToolRun none = tool({"check", pw_uri}, no_default);
  EXPECT_EQ(none.code, 3) << none.out << none.err;
  EXPECT_NE(none.err.find("password"), std::string::npos) << none.err;
  for (const ToolRun* r : {&ok, &env, &none, &st}) {
    EXPECT_EQ(r->out.find(secret), std::string::npos) << r->out;
    EXPECT_EQ(r->err.find(secret), std::string::npos) << r->err;
  }
  std::filesystem::remove(passfile);

  // What is SQLite's alone says so (exit 6), naming no file.
  const ToolRun ex = tool({"export", uri_of(l.db)});
  EXPECT_EQ(ex.code, 6) << ex.out << ex.err;
  EXPECT_NE(ex.err.find("SQLite files only"), std::string::npos) << ex.err;
  // A consumer without store-then-process rows: nothing to replay or reap (exit 8).
  EXPECT_EQ(tool({"replay", uri_of(l.db), "--consumer", "ledger", "--all"}).code, 8);
  EXPECT_EQ(tool({"reap", uri_of(l.db), "--consumer", "ledger"}).code, 8);
  // A wrong schema name is refused before anything is created.
  EXPECT_EQ(tool({"--pg-schema", "other", "stats", uri_of(l.db)}).code, 5);
  EXPECT_EQ(q(l.db, "SELECT count(*) FROM pg_namespace WHERE nspname = 'other'"), 0);
}

}  // namespace
}  // namespace mqtt_inbox::test

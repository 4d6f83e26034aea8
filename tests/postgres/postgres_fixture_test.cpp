// Self-test of the PostgreSQL test support: the private cluster (support/postgres.h) and
// the cut proxy (support/cut_proxy.h), with libpqxx 6.4 as the PostgreSQL store will use
// it (issue 30). Then the PostgreSQL facts that store builds on (docs/guarantees.md §8),
// checked here on the installed server and libpqxx rather than taken on trust: the claim
// under concurrent duplicates at each isolation level, stepped deterministically (the
// second INSERT blocks: pg_stat_activity shows it waiting on a Lock), and the libpqxx
// exception class of each SQLSTATE the store must classify.
//
// Each case prints what it observed as "[fact] ..." or "[timing] ..." lines
// (ctest -V or --output-on-failure shows them).
#include <arpa/inet.h>
#include <cxxabi.h>
#include <gtest/gtest.h>
#include <mqtt/async_client.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <pqxx/pqxx>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/cut_proxy.h"
#include "support/postgres.h"
#include "support/process.h"

namespace mqtt_inbox::test {
namespace {

using namespace std::chrono_literals;

std::string type_name(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : typeid(e).name();
  std::free(name);
  return out;
}

// What a call threw: the exception's dynamic type, its SQLSTATE if it is an sql_error.
struct Thrown {
  std::string type, sqlstate, what;
  bool is_sql_error = false;
};

template <class F>
Thrown thrown_by(F&& f) {
  try {
    f();
  } catch (const pqxx::sql_error& e) {
    return {type_name(e), e.sqlstate(), e.what(), true};
  } catch (const std::exception& e) {
    return {type_name(e), "", e.what()};
  }
  return {"(nothing thrown)", "", ""};
}

void print_fact(const std::string& what, const Thrown& t) {
  std::printf("[fact] %s: %s%s\n", what.c_str(), t.type.c_str(),
              t.is_sql_error ? (" (sql_error, sqlstate() " + t.sqlstate + ")").c_str()
                             : " (not an sql_error: no sqlstate())");
}

int count_rows(const Postgres& pg, const std::string& where) {
  return std::stoi(pg.query_value("SELECT count(*) FROM claims WHERE " + where));
}

// The claim table of the inbox: one row per (consumer, message id).
constexpr const char* kClaimsTable =
    "CREATE TABLE claims (consumer_name text NOT NULL, message_id text NOT NULL, "
    "received_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer_name, message_id))";
constexpr const char* kClaim =
    "INSERT INTO claims (consumer_name, message_id) VALUES ('c', 'm1') ON CONFLICT DO NOTHING";

// libpqxx over the proxy's unix socket.
std::string via_proxy(const CutProxy& proxy,
                      const std::string& application_name = "through_proxy") {
  return "host=" + proxy.socket_dir() + " port=" + std::to_string(proxy.port()) +
         " user=postgres dbname=postgres application_name=" + application_name;
}

std::string read_file_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// True if the server logged an ERROR with `sqlstate` for a client named `application_name`:
// the SQLSTATE behind a libpqxx exception that carries none.
bool server_logged_error(const Postgres& pg, const std::string& sqlstate,
                         const std::string& application_name) {
  return pg.log_tail(1 << 20).find(" " + sqlstate + " " + application_name + ": ERROR:") !=
         std::string::npos;
}

bool backend_gone(const Postgres& pg, const std::string& application_name) {
  return wait_until(
      [&] {
        return pg.query_value("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" +
                              application_name + "'") == "0";
      },
      10s);
}

// ---------------------------------------------------------------- the cluster itself --

TEST(PostgresFixture, PrivateClusterWithTheSettingsAskedForAndItsTimings) {
  // A template made from scratch in a folder of its own: measures initdb every run and
  // exercises the path a fresh machine takes. (As root, the postgres user must enter it.)
  TempDir fresh;
  chmod(fresh.path().c_str(), 0755);
  Postgres::Options own;
  own.template_dir = fresh.path();
  std::string first_dir;
  pid_t first_pid = -1;
  {
    Postgres first(own);
    first_dir = first.socket_dir();
    first_pid = first.postmaster_pid();
    EXPECT_GT(first.timings().template_s, 0.0);
    std::printf("[timing] template made (initdb): %.2f s\n", first.timings().template_s);
  }
  EXPECT_FALSE(std::filesystem::exists(first_dir)) << "the cluster's folder outlives it";
  EXPECT_TRUE(kill(first_pid, 0) != 0 && errno == ESRCH) << "the postmaster outlives it";

  Postgres pg;  // from the shared template
  std::printf("[timing] shared template: %s; copy %.2f s, start %.2f s\n",
              pg.timings().template_s > 0 ? "made now" : "reused", pg.timings().copy_s,
              pg.timings().start_s);
  EXPECT_EQ(pg.query_value("SHOW fsync"), "on");
  EXPECT_EQ(pg.query_value("SHOW synchronous_commit"), "on");
  EXPECT_EQ(pg.query_value("SHOW listen_addresses"), "");
  EXPECT_EQ(pg.query_value("SHOW unix_socket_directories"), pg.socket_dir());
  EXPECT_EQ(pg.query_value("SHOW data_directory"), pg.data_dir());
  EXPECT_EQ(pg.query_value("SELECT current_user"), "postgres");
  EXPECT_EQ(pg.query_value("SELECT current_setting('server_version_num')::int / 10000"), "15");
  EXPECT_EQ(pg.query(" SELECT inet_server_port()")[0][0], std::nullopt) << "not on a unix socket";
  // Its files belong to the user it runs as, never root.
  struct stat st {};
  ASSERT_EQ(stat(pg.data_dir().c_str(), &st), 0);
  EXPECT_NE(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  const auto t0 = std::chrono::steady_clock::now();
  pg.restart();
  std::printf("[timing] restart %.2f s (stop %.2f s, start %.2f s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              pg.timings().stop_s, pg.timings().start_s);
  pg.crash();
  EXPECT_FALSE(pg.running());
  pg.start();
  std::printf("[timing] start after crash() (crash recovery) %.2f s\n", pg.timings().start_s);
  EXPECT_EQ(pg.query_value("SELECT 1"), "1");

  Postgres::Options no_fsync;
  no_fsync.fsync = false;
  no_fsync.settings = {"max_connections=20"};
  Postgres fast(no_fsync);
  EXPECT_EQ(fast.query_value("SHOW fsync"), "off");
  EXPECT_EQ(fast.query_value("SHOW max_connections"), "20");
}

TEST(PostgresFixture, ParallelMakersOfOneTemplateRunInitdbOnce) {
  TempDir fresh;
  chmod(fresh.path().c_str(), 0755);
  std::vector<std::future<double>> makers;
  for (int i = 0; i < 3; ++i)
    makers.push_back(
        std::async(std::launch::async, [&] { return Postgres::make_template(fresh.path()); }));
  int made = 0;
  for (auto& m : makers) made += m.get() > 0 ? 1 : 0;
  EXPECT_EQ(made, 1);
  EXPECT_EQ(Postgres::make_template(fresh.path()), 0.0);
}

TEST(PostgresFixture, TwoClustersSideBySideDoNotShareAnything) {
  Postgres a, b;
  EXPECT_NE(a.socket_dir(), b.socket_dir());
  EXPECT_EQ(a.port(), b.port()) << "same number, two sockets: no clash without TCP";
  a.execute("CREATE TABLE only_in_a (x int)");
  EXPECT_EQ(a.query_value("SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'"), "1");
  EXPECT_EQ(b.query_value("SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'"), "0");
  b.stop();
  EXPECT_EQ(a.query_value("SELECT 1"), "1");
}

TEST(PostgresFixture, RestartKeepsCommittedDataAndBreaksOpenConnections) {
  Postgres pg;
  pqxx::connection c(pg.conninfo()), in_transaction(pg.conninfo());
  {
    pqxx::work w(c);
    w.exec0(kClaimsTable);
    w.exec0(kClaim);
    w.commit();
  }
  pqxx::work open(in_transaction);
  open.exec0("INSERT INTO claims (consumer_name, message_id) VALUES ('c', 'open')");
  pg.restart();
  const Thrown t = thrown_by([&] { pqxx::nontransaction(c).exec1("SELECT 1"); });
  print_fact("a connection's next query after the server restarted", t);
  EXPECT_EQ(t.type, "pqxx::broken_connection");
  const Thrown in_doubt = thrown_by([&] { open.commit(); });
  print_fact("commit() of a transaction open across a fast shutdown and restart", in_doubt);
  EXPECT_EQ(in_doubt.type, "pqxx::in_doubt_error");
  pqxx::connection again(pg.conninfo());
  EXPECT_EQ(pqxx::nontransaction(again).exec1("SELECT count(*) FROM claims")[0].as<int>(), 1);
  EXPECT_EQ(count_rows(pg, "message_id = 'open'"), 0);
}

TEST(PostgresFixture, CrashKeepsCommittedAndLosesUncommitted) {
  Postgres pg;
  pg.execute(kClaimsTable);
  pg.execute("INSERT INTO claims (consumer_name, message_id) VALUES ('c', 'committed')");
  pqxx::connection c(pg.conninfo());
  pqxx::work open(c);
  open.exec0("INSERT INTO claims (consumer_name, message_id) VALUES ('c', 'uncommitted')");
  pg.crash();
  pg.start();
  std::printf("[timing] start after crash(), crash recovery: %.2f s\n", pg.timings().start_s);
  EXPECT_NE(pg.log_tail(100000).find("automatic recovery in progress"), std::string::npos)
      << "crash() did not make the server recover; log:\n"
      << pg.log_tail();
  EXPECT_EQ(count_rows(pg, "message_id = 'committed'"), 1);
  EXPECT_EQ(count_rows(pg, "message_id = 'uncommitted'"), 0);
  const Thrown t = thrown_by([&] { open.commit(); });
  print_fact("commit() on a connection whose server crashed mid-transaction", t);
  EXPECT_EQ(t.type, "pqxx::in_doubt_error");
}

TEST(PostgresFixture, TerminatedBackendRaisesBrokenConnection) {
  Postgres pg;
  pqxx::connection victim(pg.conninfo("postgres", "victim"));
  pqxx::connection other(pg.conninfo("postgres", "other"));
  EXPECT_EQ(pg.terminate_backends("victim"), 1);
  const Thrown t = thrown_by([&] { pqxx::nontransaction(victim).exec1("SELECT 1"); });
  print_fact("next query on a terminated backend (57P01 admin_shutdown)", t);
  EXPECT_EQ(t.type, "pqxx::broken_connection");
  EXPECT_EQ(pqxx::nontransaction(other).exec1("SELECT 1")[0].as<int>(), 1);
  EXPECT_TRUE(pg.terminate_backend(other.backendpid()));
  EXPECT_EQ(thrown_by([&] { pqxx::nontransaction(other).exec1("SELECT 1"); }).type,
            "pqxx::broken_connection");
  EXPECT_EQ(pg.terminate_backends("victim"), 0);
}

TEST(PostgresFixture, TerminatedBackendBeforeCommitIsInDoubtAndRolledBack) {
  Postgres pg;
  pg.execute(kClaimsTable);
  pqxx::connection c(pg.conninfo("postgres", "victim"));
  pqxx::work w(c);
  w.exec0(kClaim);
  ASSERT_EQ(pg.terminate_backends("victim"), 1);
  const Thrown t = thrown_by([&] { w.commit(); });
  print_fact("commit() after the backend was terminated mid-transaction", t);
  EXPECT_EQ(t.type, "pqxx::in_doubt_error");
  EXPECT_EQ(count_rows(pg, "true"), 0) << "in doubt, yet certainly rolled back";
}

TEST(PostgresFixture, CreateDatabaseAndTheUriForm) {
  Postgres pg;
  pg.create_database("ledger");
  pqxx::connection c(pg.uri("ledger"));
  EXPECT_EQ(pqxx::nontransaction(c).exec1("SELECT current_database()")[0].as<std::string>(),
            "ledger");
  EXPECT_EQ(pg.query_value("SELECT current_database()", "ledger"), "ledger");
}

// ---------------------------------------------------- the cut proxy, in front of PostgreSQL --

class CutProxyPostgres : public ::testing::Test {
 protected:
  void SetUp() override { pg_.execute(kClaimsTable); }
  // A transaction through the proxy that claims m1; the proxy cuts the connection at its
  // COMMIT as `when` says. Returns what commit() threw.
  Thrown commit_cut(CutProxy::When when) {
    pqxx::connection c(via_proxy(proxy_, "cut_at_commit"));
    pqxx::work w(c);
    w.exec0(kClaim);
    // libpqxx sends COMMIT as a simple query: 'Q', length, "COMMIT\0".
    proxy_.cut_when(CutProxy::Direction::kClientToServer, "COMMIT", when);
    const Thrown t = thrown_by([&] { w.commit(); });
    EXPECT_EQ(proxy_.triggers_fired(), 1);
    EXPECT_FALSE(c.is_open());
    // The server's side of the cut connection ends too: what it did is final.
    EXPECT_TRUE(backend_gone(pg_, "cut_at_commit"));
    return t;
  }

  Postgres pg_;
  CutProxy proxy_{{pg_.socket_path(), 0}};
};

TEST_F(CutProxyPostgres, CommitCutBeforeItIsForwardedIsInDoubtAndNeverHappened) {
  const Thrown t = commit_cut(CutProxy::When::kBeforeForwarding);
  print_fact("commit() cut before COMMIT reached the server", t);
  EXPECT_EQ(t.type, "pqxx::in_doubt_error");
  EXPECT_EQ(count_rows(pg_, "message_id = 'm1'"), 0);
}

TEST_F(CutProxyPostgres, CommitCutAfterItIsForwardedIsInDoubtAndHappened) {
  const Thrown t = commit_cut(CutProxy::When::kAfterForwarding);
  print_fact("commit() cut after COMMIT reached the server, before its reply", t);
  EXPECT_EQ(t.type, "pqxx::in_doubt_error");
  EXPECT_EQ(count_rows(pg_, "message_id = 'm1'"), 1);
}

TEST_F(CutProxyPostgres, CutAllRefuseAndCount) {
  pqxx::connection c(via_proxy(proxy_));
  EXPECT_EQ(pqxx::nontransaction(c).exec1("SELECT 1")[0].as<int>(), 1);
  EXPECT_EQ(proxy_.open_connections(), 1);
  EXPECT_EQ(proxy_.cut_all(), 1);
  EXPECT_EQ(proxy_.open_connections(), 0);
  const Thrown cut = thrown_by([&] { pqxx::nontransaction(c).exec1("SELECT 1"); });
  print_fact("next query after the proxy cut the connection", cut);
  EXPECT_EQ(cut.type, "pqxx::broken_connection");

  proxy_.refuse(true);
  const Thrown refused = thrown_by([&] { pqxx::connection r(via_proxy(proxy_)); });
  print_fact("connecting while the proxy refuses", refused);
  EXPECT_EQ(refused.type, "pqxx::broken_connection");
  EXPECT_NE(refused.what.find("Connection refused"), std::string::npos) << refused.what;
  EXPECT_EQ(proxy_.connections_accepted(), 1);

  proxy_.refuse(false);
  pqxx::connection back(via_proxy(proxy_));
  EXPECT_EQ(pqxx::nontransaction(back).exec1("SELECT 2")[0].as<int>(), 2);
  EXPECT_EQ(proxy_.connections_accepted(), 2);
}

TEST_F(CutProxyPostgres, FreezeHoldsAQueryUntilThawed) {
  pqxx::connection c(via_proxy(proxy_));
  proxy_.freeze(true);
  auto answer = std::async(std::launch::async,
                           [&] { return pqxx::nontransaction(c).exec1("SELECT 42")[0].as<int>(); });
  EXPECT_EQ(answer.wait_for(500ms), std::future_status::timeout) << "forwarded while frozen";
  EXPECT_EQ(proxy_.open_connections(), 1) << "a freeze closes nothing";
  proxy_.freeze(false);
  ASSERT_EQ(answer.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(answer.get(), 42);
}

// ------------------------------------------------------ the cut proxy, in front of mosquitto --

TEST(CutProxyMqtt, CutOverTcpDropsRawAndPahoClients) {
  Broker broker;
  CutProxy proxy({"", broker.port()});

  // A raw MQTT 3.1.1 CONNECT through the proxy, its CONNACK back, then the cut: RST.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(proxy.port()));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const unsigned char connect_packet[] = {0x10, 18, 0, 4, 'M', 'Q', 'T', 'T', 4,   2,
                                          0,    60, 0, 6, 'c', 'u', 't', 'r', 'a', 'w'};
  ASSERT_EQ(send(fd, connect_packet, sizeof connect_packet, 0),
            static_cast<ssize_t>(sizeof connect_packet));
  unsigned char connack[4] = {};
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ASSERT_EQ(recv(fd, connack, sizeof connack, MSG_WAITALL), 4);
  EXPECT_EQ(connack[0], 0x20);
  EXPECT_EQ(connack[3], 0) << "CONNACK return code";
  EXPECT_EQ(proxy.cut_all(), 1);
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  const int err = errno;
  std::printf("[fact] raw TCP client after cut_all: recv = %zd (%s)\n", n,
              n < 0 ? std::strerror(err) : "EOF");
  EXPECT_EQ(n, -1);
  EXPECT_EQ(err, ECONNRESET) << "a cut is an RST, not a FIN";
  close(fd);

  // Paho: the cut is a lost connection; reconnecting fails while the proxy refuses.
  mqtt::async_client client(proxy.tcp_uri(), "cut-paho-" + std::to_string(getpid()),
                            mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
  std::atomic<int> lost{0};
  client.set_connection_lost_handler([&](const std::string&) { ++lost; });
  auto opts = mqtt::connect_options_builder()
                  .mqtt_version(MQTTVERSION_3_1_1)
                  .clean_session(true)
                  .connect_timeout(5s)
                  .finalize();
  client.connect(opts)->wait();
  client.publish(mqtt::make_message("cut/test", "through the proxy", 1, false))->wait();
  EXPECT_EQ(proxy.cut_all(), 1);
  EXPECT_TRUE(wait_until([&] { return lost.load() == 1; }, 5s)) << "Paho saw no lost connection";
  proxy.refuse(true);
  EXPECT_THROW(client.connect(opts)->wait(), mqtt::exception);
  proxy.refuse(false);
  client.connect(opts)->wait();
  EXPECT_TRUE(client.is_connected());
  EXPECT_EQ(proxy.connections_accepted(), 3);  // raw, Paho, Paho again; not the refused one
  client.disconnect()->wait();
}

TEST(CutProxyMqtt, PatternCutFromServerToClientBeforeForwarding) {
  // The other direction: the broker's CONNACK (0x20 0x02) never reaches the client.
  Broker broker;
  CutProxy proxy({"", broker.port()});
  proxy.cut_when(CutProxy::Direction::kServerToClient, std::string("\x20\x02", 2),
                 CutProxy::When::kBeforeForwarding);
  const auto opts = mqtt::connect_options_builder()
                        .mqtt_version(MQTTVERSION_3_1_1)
                        .clean_session(true)
                        .connect_timeout(5s)
                        .finalize();
  {
    mqtt::async_client client(proxy.tcp_uri(), "cut-connack-" + std::to_string(getpid()),
                              mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
    EXPECT_THROW(client.connect(opts)->wait(), mqtt::exception);
  }
  EXPECT_EQ(proxy.triggers_fired(), 1);
  // One-shot: the next connection goes through. Only after the first client is gone:
  // Paho C 1.3.12 (one background thread for all clients) may still be tearing the failed
  // attempt down when connect() is called again at once, and then closes the new socket
  // before its CONNECT (1 run in 8 under load; the proxy saw the client's EOF).
  mqtt::async_client again(proxy.tcp_uri(), "cut-connack-" + std::to_string(getpid()),
                           mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
  again.connect(opts)->wait();
  EXPECT_TRUE(again.is_connected());
  EXPECT_EQ(proxy.connections_accepted(), 2);
  again.disconnect()->wait();
}

TEST(CutProxyMqtt, PatternSplitOverTwoWritesIsFoundAndNeverForwarded) {
  // The client writes its CONNECT in two pieces, split inside "MQTT"; the proxy finds the
  // pattern across its reads and cuts before the second piece reaches mosquitto.
  Broker broker;
  CutProxy proxy({"", broker.port()});
  proxy.cut_when(CutProxy::Direction::kClientToServer, "MQTT", CutProxy::When::kBeforeForwarding);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(proxy.port()));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const unsigned char connect_packet[] = {0x10, 18, 0, 4, 'M', 'Q', 'T', 'T', 4,   2,
                                          0,    60, 0, 6, 's', 'p', 'l', 'i', 't', '!'};
  ASSERT_EQ(send(fd, connect_packet, 6, 0), 6);  // up to "MQ"
  std::this_thread::sleep_for(200ms);            // a read of its own in the proxy
  EXPECT_EQ(proxy.triggers_fired(), 0) << "fired on half the pattern";
  ASSERT_EQ(send(fd, connect_packet + 6, sizeof connect_packet - 6, 0),
            static_cast<ssize_t>(sizeof connect_packet - 6));
  EXPECT_TRUE(proxy.wait_triggers_fired(1, 5s));
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char byte;
  EXPECT_EQ(recv(fd, &byte, 1, 0), -1) << "a CONNACK came back: the CONNECT was forwarded";
  EXPECT_EQ(errno, ECONNRESET);
  close(fd);
  EXPECT_EQ(read_file_text(broker.log_path()).find("split!"), std::string::npos)
      << "mosquitto saw the client id";
}

// ------------------------------------------- facts the PostgreSQL store builds on (§8) --

class PostgresFacts : public ::testing::Test {
 protected:
  static Postgres::Options options() {
    Postgres::Options o;
    o.fsync = false;  // what is checked here does not depend on durability
    return o;
  }
  void SetUp() override { pg_.execute(kClaimsTable); }

  // Connection A claims m1 and keeps its transaction open; connection B (at `isolation`)
  // claims m1 too and blocks on A's lock; then A commits or rolls back. Returns the rows
  // B inserted, or what it threw.
  struct Outcome {
    int rows = -1;
    Thrown thrown;
  };
  Outcome concurrent_duplicate(const std::string& isolation, bool first_commits,
                               const std::string& b_name = "second_claim") {
    pqxx::connection a(pg_.conninfo()), b(pg_.conninfo("postgres", b_name));
    pqxx::work wa(a);
    wa.exec0(kClaim);
    const int b_pid = b.backendpid();
    Outcome out;
    auto second = std::async(std::launch::async, [&] {
      out.thrown = thrown_by([&] {
        pqxx::work wb(b);
        wb.exec0("SET TRANSACTION ISOLATION LEVEL " + isolation);
        out.rows = static_cast<int>(wb.exec0(kClaim).affected_rows());
        wb.commit();
      });
    });
    const bool waited = pg_.wait_for_lock_wait(b_pid, 10s);
    EXPECT_TRUE(waited) << "the second claim did not wait for the first's lock";
    EXPECT_EQ(second.wait_for(0s), std::future_status::timeout);
    if (first_commits)
      wa.commit();
    else
      wa.abort();
    EXPECT_EQ(second.wait_for(10s), std::future_status::ready);
    second.get();
    return out;
  }

  Postgres pg_{options()};
};

TEST_F(PostgresFacts, ReadCommittedDuplicateClaimWaitsThenSkipsWhenTheFirstCommits) {
  const Outcome o = concurrent_duplicate("READ COMMITTED", true);
  std::printf(
      "[fact] READ COMMITTED, first claim commits: second waited, then inserted %d "
      "row(s), threw %s\n",
      o.rows, o.thrown.type.c_str());
  EXPECT_EQ(o.thrown.type, "(nothing thrown)");
  EXPECT_EQ(o.rows, 0);
  EXPECT_EQ(count_rows(pg_, "message_id = 'm1'"), 1);
}

TEST_F(PostgresFacts, ReadCommittedDuplicateClaimWaitsThenInsertsWhenTheFirstRollsBack) {
  const Outcome o = concurrent_duplicate("READ COMMITTED", false);
  std::printf(
      "[fact] READ COMMITTED, first claim rolls back: second waited, then inserted %d "
      "row(s), threw %s\n",
      o.rows, o.thrown.type.c_str());
  EXPECT_EQ(o.thrown.type, "(nothing thrown)");
  EXPECT_EQ(o.rows, 1);
  EXPECT_EQ(count_rows(pg_, "message_id = 'm1'"), 1);
}

TEST_F(PostgresFacts, AboveReadCommittedAWaitingDuplicateClaimRaises40001) {
  for (const std::string isolation : {"REPEATABLE READ", "SERIALIZABLE"}) {
    pg_.execute("TRUNCATE claims");
    const std::string name = isolation == "SERIALIZABLE" ? "waiting_ser" : "waiting_rr";
    const Outcome o = concurrent_duplicate(isolation, true, name);
    print_fact(isolation + ", first claim commits while the second waits", o.thrown);
    EXPECT_EQ(o.thrown.type, "pqxx::serialization_failure") << isolation;
    EXPECT_FALSE(o.thrown.is_sql_error) << isolation;
    EXPECT_TRUE(server_logged_error(pg_, "40001", name)) << pg_.log_tail();
    pg_.execute("TRUNCATE claims");
    const Outcome r = concurrent_duplicate(isolation, false);
    EXPECT_EQ(r.thrown.type, "(nothing thrown)") << isolation << ": first rolled back";
    EXPECT_EQ(r.rows, 1) << isolation;
  }
}

TEST_F(PostgresFacts, AboveReadCommittedAClaimOfARowCommittedAfterTheSnapshotRaises40001) {
  for (const std::string isolation : {"REPEATABLE READ", "SERIALIZABLE"}) {
    pg_.execute("TRUNCATE claims");
    const std::string name = isolation == "SERIALIZABLE" ? "snapshot_ser" : "snapshot_rr";
    pqxx::connection b(pg_.conninfo("postgres", name));
    pqxx::work wb(b);
    wb.exec0("SET TRANSACTION ISOLATION LEVEL " + isolation);
    wb.exec1("SELECT count(*) FROM claims");  // takes the snapshot
    pg_.execute(kClaim);                      // another consumer's claim commits
    const Thrown t = thrown_by([&] { wb.exec0(kClaim); });
    print_fact(isolation + ", claim of a row committed after the snapshot", t);
    // 40001. libpqxx 6.4 maps it to serialization_failure, a transaction_rollback, which
    // derives from pqxx::failure and not from sql_error: it carries no sqlstate(), and a
    // `catch (const pqxx::sql_error&)` does not see it. Classify by type first.
    EXPECT_EQ(t.type, "pqxx::serialization_failure") << isolation;
    EXPECT_FALSE(t.is_sql_error) << isolation;
    EXPECT_NE(t.what.find("could not serialize access"), std::string::npos) << t.what;
    EXPECT_TRUE(server_logged_error(pg_, "40001", name)) << pg_.log_tail();
  }
  // The same at READ COMMITTED: skipped silently.
  pqxx::connection c(pg_.conninfo());
  pqxx::work w(c);
  w.exec1("SELECT count(*) FROM claims");
  EXPECT_EQ(w.exec0(kClaim).affected_rows(), 0u);
}

TEST_F(PostgresFacts, DeadlockIs40P01DeadlockDetected) {
  pg_.execute("INSERT INTO claims (consumer_name, message_id) VALUES ('c', 'x'), ('c', 'y')");
  pqxx::connection a(pg_.conninfo("postgres", "deadlock_a")),
      b(pg_.conninfo("postgres", "deadlock_b"));
  pqxx::work wa(a), wb(b);
  wa.exec0("SET LOCAL deadlock_timeout = '100ms'");
  wb.exec0("SET LOCAL deadlock_timeout = '100ms'");
  wa.exec("SELECT 1 FROM claims WHERE message_id = 'x' FOR UPDATE");
  wb.exec("SELECT 1 FROM claims WHERE message_id = 'y' FOR UPDATE");
  const int a_pid = a.backendpid();
  Thrown ta;
  auto first = std::async(std::launch::async, [&] {
    ta = thrown_by([&] { wa.exec("SELECT 1 FROM claims WHERE message_id = 'y' FOR UPDATE"); });
  });
  ASSERT_TRUE(pg_.wait_for_lock_wait(a_pid, 10s));
  const Thrown tb =
      thrown_by([&] { wb.exec("SELECT 1 FROM claims WHERE message_id = 'x' FOR UPDATE"); });
  first.get();
  // One of the two is chosen as the victim; the other gets its lock.
  const Thrown& victim = tb.type != "(nothing thrown)" ? tb : ta;
  print_fact("deadlock", victim);
  EXPECT_EQ(victim.type, "pqxx::deadlock_detected");  // 40P01; no sqlstate(), as for 40001
  EXPECT_FALSE(victim.is_sql_error);
  EXPECT_NE(victim.what.find("deadlock detected"), std::string::npos) << victim.what;
  EXPECT_TRUE(server_logged_error(pg_, "40P01", &victim == &tb ? "deadlock_b" : "deadlock_a"))
      << pg_.log_tail();
  EXPECT_TRUE(ta.type == "(nothing thrown)" || tb.type == "(nothing thrown)");
}

TEST_F(PostgresFacts, LockTimeoutIs55P03APlainSqlError) {
  pqxx::connection a(pg_.conninfo()), b(pg_.conninfo());
  pqxx::work wa(a), wb(b);
  wa.exec0(kClaim);  // holds m1's lock
  wb.exec0("SET LOCAL lock_timeout = '100ms'");
  const Thrown t = thrown_by([&] { wb.exec0(kClaim); });
  print_fact("lock_timeout expired", t);
  EXPECT_EQ(t.type, "pqxx::sql_error");  // the exact type: no subclass of its own in 6.4
  EXPECT_EQ(t.sqlstate, "55P03");
}

TEST_F(PostgresFacts, StatementTimeoutIs57014APlainSqlError) {
  pqxx::connection c(pg_.conninfo());
  pqxx::work w(c);
  w.exec0("SET LOCAL statement_timeout = '100ms'");
  const Thrown t = thrown_by([&] { w.exec0("SELECT pg_sleep(5)"); });
  print_fact("statement_timeout expired", t);
  EXPECT_EQ(t.type, "pqxx::sql_error");
  EXPECT_EQ(t.sqlstate, "57014");
}

TEST_F(PostgresFacts, DuplicateWithoutOnConflictIs23505UniqueViolation) {
  pg_.execute(kClaim);
  pqxx::connection c(pg_.conninfo());
  pqxx::work w(c);
  const Thrown t = thrown_by(
      [&] { w.exec0("INSERT INTO claims (consumer_name, message_id) VALUES ('c', 'm1')"); });
  print_fact("duplicate key without ON CONFLICT", t);
  EXPECT_EQ(t.type, "pqxx::unique_violation");
  EXPECT_EQ(t.sqlstate, "23505");
}

}  // namespace
}  // namespace mqtt_inbox::test

// TLS and authentication against a real mosquitto with TLS listeners, certificates made
// with the openssl command line (support/tls_pki.h), and real SQLite files. The consumer
// is either an in-process Subscriber (to read health()) or examples/ledger_consumer with
// the shared connection flags (examples/connection_flags.h).
//
// Every test ends by checking that no password (the MQTT password, the key password)
// reached any log: the subscriber's, the child programs', the broker's.
#include <atomic>
#include <optional>
#include <regex>
#include <thread>

#include "support/tls_fixture.h"

namespace mqtt_inbox::test {
namespace {

// Every way a TLS setting can be wrong is refused by create(), naming the file, before
// Paho ever sees it.
TEST_F(TlsTest, CreateRefusesBadSettingsNamingTheFile) {
  TempDir empty;
  struct Case {
    const char* what;
    std::function<void(SubscriberOptions&)> change;
    std::vector<std::string> expect;
  };
  const std::string missing = dir_.file("no-such-ca.crt");
  const std::vector<Case> cases = {
      {"missing CA file",
       [&](SubscriberOptions& o) { o.tls.ca_file = missing; },
       {missing, "No such file"}},
      {"CA file without a certificate",
       [&](SubscriberOptions& o) { o.tls.ca_file = pki_->client_key(); },
       {pki_->client_key(), "no CA certificate"}},
      {"CA folder without hashed names",
       [&](SubscriberOptions& o) { o.tls.ca_dir = empty.path(); },
       {empty.path(), "openssl rehash"}},
      {"missing client certificate",
       [&](SubscriberOptions& o) { o.tls.cert_file = missing; },
       {missing}},
      {"key of another certificate",
       [&](SubscriberOptions& o) {
         o.tls.cert_file = pki_->client_cert();
         o.tls.key_file = pki_->server_key();
       },
       {pki_->server_key(), "does not match", pki_->client_cert()}},
      {"encrypted key without password",
       [&](SubscriberOptions& o) {
         o.tls.cert_file = pki_->client_cert();
         o.tls.key_file = pki_->client_key_encrypted();
       },
       {pki_->client_key_encrypted(), "encrypted"}},
      {"wrong key password",
       [&](SubscriberOptions& o) {
         o.tls.cert_file = pki_->client_cert();
         o.tls.key_file = pki_->client_key_encrypted();
         o.tls.key_password = "not-the-key-password";
       },
       {pki_->client_key_encrypted(), "password is wrong"}},
      {"key without certificate",
       [&](SubscriberOptions& o) { o.tls.key_file = pki_->client_key(); },
       {"without tls.cert_file"}},
      {"cipher list selecting nothing",
       [&](SubscriberOptions& o) { o.tls.ciphers = "NO-SUCH-CIPHER"; },
       {"NO-SUCH-CIPHER", "selects no cipher"}},
      {"empty ALPN name", [&](SubscriberOptions& o) { o.tls.alpn = {""}; }, {"1..255"}},
      {"TLS settings with a plaintext URI",
       [&](SubscriberOptions& o) { o.broker_uri = "tcp://localhost:1883"; },
       {"plaintext", "tcp://"}},
      {"unknown scheme",
       [&](SubscriberOptions& o) { o.broker_uri = "http://localhost:80"; },
       {"unknown scheme"}},
      {"password without user name on 3.1.1",
       [&](SubscriberOptions& o) {
         o.mqtt_version = MqttVersion::kV3_1_1;
         o.password = kPassword;
       },
       {"3.1.2.9"}},
      {"password and provider",
       [&](SubscriberOptions& o) {
         o.username = "alice";
         o.password = kPassword;
         o.password_provider = password_from_file(pki_->path("alice.password"));
       },
       {"both"}},
  };
  for (const Case& c : cases) {
    SubscriberOptions o = options(uri(kTlsPassword));
    c.change(o);
    std::unique_ptr<Subscriber> s;
    const Status st = Subscriber::create(o, &s);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << c.what << ": " << st.to_string();
    for (const auto& e : c.expect)
      EXPECT_NE(st.message().find(e), std::string::npos) << c.what << ": " << st.message();
    EXPECT_EQ(st.message().find(kPassword), std::string::npos) << c.what;
    EXPECT_EQ(st.message().find("not-the-key-password"), std::string::npos) << c.what;
  }
  // And what is right is accepted: the encrypted key with its password, every scheme.
  SubscriberOptions o = options(uri(kMutualIdentity));
  o.tls.cert_file = pki_->client_cert();
  o.tls.key_file = pki_->client_key_encrypted();
  o.tls.key_password = TestPki::key_password();
  std::unique_ptr<Subscriber> s;
  EXPECT_TRUE(Subscriber::create(o, &s).ok());
  for (const char* u : {"mqtts://localhost:8883", "wss://localhost:443/mqtt"}) {
    o.broker_uri = u;
    EXPECT_TRUE(Subscriber::create(o, &s).ok()) << u;
  }
  SubscriberOptions plain = options("ws://localhost:80/mqtt");
  plain.tls = TlsOptions{};
  EXPECT_TRUE(Subscriber::create(plain, &s).ok());
}

// Issue 12 section 5: server-authenticated TLS with a password file, a stream applied
// exactly once although the consumer is SIGKILLed in the middle of it.
TEST_F(TlsTest, PasswordOverTlsAppliesStreamExactlyOnceAcrossSigkill) {
  const std::vector<std::string> flags = {"--broker",        uri(kTlsPassword),
                                          "--cafile",        pki_->ca_cert(),
                                          "--username",      "alice",
                                          "--password-file", pki_->path("alice.password"),
                                          "--mqtt-version",  "5"};
  {  // the persistent session, with its subscription, before anything is published
    auto first = ledger_consumer(flags);
    ASSERT_TRUE(
        wait_until([&] { return read_file(child_log()).find("consuming: ") != std::string::npos; },
                   std::chrono::seconds(20)))
        << read_file(child_log());
    first->signal(SIGTERM);
    ASSERT_EQ(first->wait(std::chrono::seconds(20)), 0);
  }
  constexpr int kCredits = 400;
  publish_credits(0, kCredits);
  auto victim = ledger_consumer(flags);
  ASSERT_TRUE(wait_until([&] { return ledger_rows() >= 60; }, std::chrono::seconds(30)));
  victim->signal(SIGKILL);
  const int st = victim->wait(std::chrono::seconds(10));
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  const int64_t at_kill = ledger_rows();
  EXPECT_LT(at_kill, kCredits) << "killed too late to be mid-stream";

  auto restarted = ledger_consumer(flags);
  ASSERT_TRUE(wait_until([&] { return ledger_rows() == kCredits; }, std::chrono::seconds(60)));
  restarted->signal(SIGTERM);
  ASSERT_EQ(restarted->wait(std::chrono::seconds(20)), 0);
  EXPECT_EQ(ledger_rows(), kCredits);
  EXPECT_EQ(total_balance(), expected_total(kCredits));
  EXPECT_EQ(query_int(db_path_, "SELECT count(DISTINCT message_id) FROM ledger_entries"), kCredits);
  EXPECT_EQ(query_int(db_path_, "SELECT count(*) FROM inbox_processed"), kCredits);
  const std::string log = read_file(child_log());
  EXPECT_NE(log.find("host name checked"), std::string::npos);
  EXPECT_NE(log.find("connected to " + uri(kTlsPassword)), std::string::npos);
}

// Untrusted CA, host name or IP address not in the certificate, expired certificate:
// each refused, with OpenSSL's precise reason in the log and in health(), never Paho's
// bare "TCP/TLS connect failure".
struct CertCase {
  const char* name;
  Listener listener;
  const char* host;
  bool untrusted_ca;
  std::vector<std::string> expect;
};

void PrintTo(const CertCase& c, std::ostream* os) { *os << c.name; }

class TlsCertificateTest : public TlsTest, public ::testing::WithParamInterface<CertCase> {};

TEST_P(TlsCertificateTest, IsRefusedWithTheReason) {
  const CertCase& c = GetParam();
  SubscriberOptions o = options(uri(c.listener, c.host));
  if (c.untrusted_ca) o.tls.ca_file = pki_->untrusted_ca_cert();
  if (c.listener == kTlsPassword) {
    o.username = "alice";
    o.password_provider = password_from_file(pki_->path("alice.password"));
  }
  auto sub = start(o);
  const ConnectionHealth h = wait_failure(*sub);
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kTls) << h.last_error;
  EXPECT_FALSE(h.connected);
  EXPECT_EQ(h.connects, 0);
  EXPECT_GE(h.connect_attempts, 1);
  EXPECT_GT(h.last_error_ms, 0);
  for (const auto& e : c.expect) EXPECT_NE(h.last_error.find(e), std::string::npos) << h.last_error;
  EXPECT_TRUE(sub->stop().ok());
  const std::string log = read_file(log_path());
  for (const auto& e : c.expect) EXPECT_NE(log.find(e), std::string::npos) << log;
  // Paho's generic text may appear, but only next to the reason.
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("TCP/TLS connect failure") != std::string::npos) {
      EXPECT_NE(line.find(c.expect.front()), std::string::npos) << line;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TlsCertificateTest,
    ::testing::Values(
        CertCase{"untrusted_ca",
                 kTlsPassword,
                 "localhost",
                 true,
                 // "unable to get local issuer certificate" if the broker sends only its
                 // own certificate; mosquitto sends the CA too.
                 {"certificate verify failed", "mqtt-inbox test CA", "did not sign"}},
        CertCase{"hostname_mismatch",
                 kOtherName,
                 "localhost",
                 false,
                 {"hostname mismatch", "DNS:broker.invalid", "--insecure"}},
        CertCase{"ip_mismatch",
                 kOtherName,
                 "127.0.0.1",
                 false,
                 {"IP address mismatch", "DNS:broker.invalid"}},
        CertCase{
            "expired", kExpired, "localhost", false, {"certificate has expired", "2020", "clock"}}),
    [](const ::testing::TestParamInfo<CertCase>& p) { return p.param.name; });

// Mutual TLS (require_certificate, use_identity_as_username): refused without a client
// certificate, with the reason; accepted with one, and messages are applied.
TEST_F(TlsTest, MutualTlsIsRefusedWithoutClientCertificate) {
  auto sub = start(options(uri(kMutualIdentity)));
  const ConnectionHealth h = wait_failure(*sub);
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kTls) << h.last_error;
  EXPECT_NE(h.last_error.find("certificate required"), std::string::npos) << h.last_error;
  EXPECT_NE(h.last_error.find("--cert"), std::string::npos) << h.last_error;
  EXPECT_EQ(h.connects, 0);
  EXPECT_TRUE(sub->stop().ok());
  EXPECT_NE(read_file(log_path()).find("certificate required"), std::string::npos);
}

TEST_F(TlsTest, MutualTlsWorksWithClientCertificate) {
  SubscriberOptions o = options(uri(kMutualIdentity, "127.0.0.1"), MqttVersion::kV3_1_1);
  o.tls.cert_file = pki_->client_cert();
  o.tls.key_file = pki_->client_key_encrypted();
  o.tls.key_password = TestPki::key_password();
  auto sub = start(o);
  ASSERT_TRUE(sub->wait_connected(20000)) << sub->health().last_error;
  publish_credits(0, 20);
  ASSERT_TRUE(wait_until([&] { return ledger_rows() == 20; }, std::chrono::seconds(20)));
  EXPECT_EQ(total_balance(), expected_total(20));
  const ConnectionHealth h = sub->health();
  EXPECT_TRUE(h.connected);
  EXPECT_EQ(h.connects, 1);
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kNone);
  EXPECT_TRUE(sub->stop().ok());
  // The broker took the identity from the certificate.
  EXPECT_NE(read_file(broker_.log_path()).find("u'device-1'"), std::string::npos);
}

// Issue 12's "done when": ledger_consumer with --cafile/--cert/--key/--username/
// --password-file consumes over mutual TLS from a mosquitto that requires a client
// certificate (here also a password, and the key is encrypted).
TEST_F(TlsTest, LedgerConsumerConsumesOverMutualTlsWithPasswordFile) {
  auto consumer = ledger_consumer(
      {"--broker", uri(kMutualPassword), "--cafile", pki_->ca_cert(), "--cert", pki_->client_cert(),
       "--key", pki_->client_key_encrypted(), "--key-password-file", pki_->path("key.password"),
       "--username", "alice", "--password-file", pki_->path("alice.password")});
  ASSERT_TRUE(
      wait_until([&] { return read_file(child_log()).find("consuming: ") != std::string::npos; },
                 std::chrono::seconds(20)))
      << read_file(child_log());
  publish_credits(0, 50);
  ASSERT_TRUE(wait_until([&] { return ledger_rows() == 50; }, std::chrono::seconds(20)));
  consumer->signal(SIGTERM);
  ASSERT_EQ(consumer->wait(std::chrono::seconds(20)), 0);
  EXPECT_EQ(total_balance(), expected_total(50));
  EXPECT_NE(read_file(child_log()).find("ledger_consumer: processed=50 "), std::string::npos);
  EXPECT_NE(read_file(broker_.log_path()).find("u'alice'"), std::string::npos);
}

// A wrong password: refused with "not authorized" (mosquitto's answer to a bad password)
// in the log and in health(), and retried only every reconnect_backoff_max_ms. The
// broker's log counts the attempts: with the initial backoff of 10 ms doubling up to
// 1500 ms, an unrefused retry loop would make about 10 attempts in the 4.5 s watched;
// waiting the maximum after each refusal makes 3 or 4.
class TlsRefusalTest : public TlsTest, public ::testing::WithParamInterface<MqttVersion> {};

TEST_P(TlsRefusalTest, WrongPasswordIsRefusedAndBacksOff) {
  const bool v5 = GetParam() == MqttVersion::kV5;
  const std::string wrong = "wrong-Pa55-a9b8c7";
  SubscriberOptions o = options(uri(kTlsPassword), GetParam());
  o.username = "alice";
  o.password = wrong;
  o.reconnect_backoff_initial_ms = 10;
  o.reconnect_backoff_max_ms = 1500;
  auto sub = start(o);
  std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  EXPECT_TRUE(sub->stop().ok());  // ends any attempt in flight: health and broker log agree
  const ConnectionHealth h = sub->health();

  const std::string broker_log = read_file(broker_.log_path());
  const std::regex refusal(std::string("Sending CONNACK to \\S+ \\(0, ") + (v5 ? "135" : "5") +
                           "\\)");
  const auto refusals = std::distance(
      std::sregex_iterator(broker_log.begin(), broker_log.end(), refusal), std::sregex_iterator());
  EXPECT_GE(refusals, 3);
  EXPECT_LE(refusals, 4);
  EXPECT_EQ(h.connect_attempts, refusals);
  EXPECT_FALSE(h.connected);
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kRefused);
  EXPECT_EQ(h.connack_code, v5 ? 0x87 : 5);
  EXPECT_NE(h.connack_reason.find("not authorized"), std::string::npos) << h.connack_reason;
  EXPECT_NE(h.last_error.find("not authorized"), std::string::npos) << h.last_error;
  const std::string log = read_file(log_path());
  EXPECT_NE(log.find("not authorized"), std::string::npos);
  EXPECT_NE(log.find("next connection attempt in 1500 ms"), std::string::npos);
  EXPECT_EQ(log.find(wrong), std::string::npos) << "the wrong password is a secret too";
  EXPECT_EQ(h.last_error.find(wrong), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Versions, TlsRefusalTest,
                         ::testing::Values(MqttVersion::kV3_1_1, MqttVersion::kV5),
                         [](const ::testing::TestParamInfo<MqttVersion>& p) {
                           return p.param == MqttVersion::kV5 ? "mqtt5" : "mqtt311";
                         });

// --insecure connects to a broker whose certificate names another host, and says so at
// every connect (here: two, around a broker restart).
TEST_F(TlsTest, InsecureConnectsToMismatchingHostAndWarnsAtEveryConnect) {
  auto consumer =
      ledger_consumer({"--broker", uri(kOtherName), "--cafile", pki_->ca_cert(), "--insecure"});
  auto connected = [&](size_t n) {  // "has no session ..." first, "connected to ..." after
    const std::string log = read_file(child_log());
    return count(log, "has no session for client") + count(log, "connected to ") >= n;
  };
  ASSERT_TRUE(wait_until([&] { return connected(1); }, std::chrono::seconds(20)))
      << read_file(child_log());
  broker_.stop();
  broker_.start();
  ASSERT_TRUE(wait_until([&] { return connected(2); }, std::chrono::seconds(30)))
      << read_file(child_log());
  publish_credits(0, 10);
  ASSERT_TRUE(wait_until([&] { return ledger_rows() == 10; }, std::chrono::seconds(20)));
  consumer->signal(SIGTERM);
  ASSERT_EQ(consumer->wait(std::chrono::seconds(20)), 0);
  const std::string log = read_file(child_log());
  EXPECT_GE(count(log, "INSECURE: the host name"), 2u) << log;
  EXPECT_NE(log.find("host name NOT checked"), std::string::npos);
  EXPECT_EQ(total_balance(), expected_total(10));
}

// The CA given only as a hashed folder (tls.ca_dir, --capath) verifies the broker: the
// setting Paho C++ 1.2.0 loses when its ssl_options are copied (bug #337). The password
// comes from a provider.
TEST_F(TlsTest, CaDirectoryAloneVerifiesTheBroker) {
  SubscriberOptions o = options(uri(kTlsPassword));
  o.tls.ca_file.clear();
  o.tls.ca_dir = pki_->ca_dir();
  o.username = "alice";
  o.password_provider = password_from_file(pki_->path("alice.password"));
  auto sub = start(o);
  ASSERT_TRUE(sub->wait_connected(20000)) << sub->health().last_error;
  publish_credits(0, 5);
  ASSERT_TRUE(wait_until([&] { return ledger_rows() == 5; }, std::chrono::seconds(20)));
  EXPECT_TRUE(sub->stop().ok());
  EXPECT_NE(read_file(log_path()).find("CA folder '" + pki_->ca_dir() + "'"), std::string::npos);
}

// The password provider runs before every CONNECT: a rotated password is picked up at the
// next attempt, and again after a reconnect.
TEST_F(TlsTest, PasswordProviderRunsBeforeEveryConnect) {
  std::atomic<int> calls{0};
  SubscriberOptions o = options(uri(kTlsPassword), MqttVersion::kV3_1_1);
  o.username = "alice";
  o.reconnect_backoff_max_ms = 300;
  o.password_provider = [&calls](std::string* pw) {
    *pw = ++calls == 1 ? "expired-token-0001" : kPassword;
    return Status::Ok();
  };
  auto sub = start(o);
  ASSERT_TRUE(sub->wait_connected(20000)) << sub->health().last_error;
  EXPECT_EQ(calls.load(), 2);
  ConnectionHealth h = sub->health();
  EXPECT_EQ(h.connack_code, 5);  // the first attempt's refusal stays visible
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kRefused);
  EXPECT_EQ(h.connects, 1);
  EXPECT_EQ(h.consecutive_failures, 0);
  EXPECT_EQ(h.connect_attempts, 2);
  broker_.stop();
  ASSERT_TRUE(wait_until([&] { return !sub->is_connected(); }, std::chrono::seconds(10)));
  broker_.start();
  ASSERT_TRUE(wait_until([&] { return sub->health().connects == 2; }, std::chrono::seconds(30)));
  EXPECT_GE(calls.load(), 3);
  EXPECT_TRUE(sub->stop().ok());
  EXPECT_EQ(read_file(log_path()).find("expired-token-0001"), std::string::npos);

  // A provider that fails: the attempt fails with its message, and nothing connects.
  SubscriberOptions bad = options(uri(kTlsPassword));
  bad.client_id = "tls-sub-2";
  bad.username = "alice";
  bad.password_provider = password_from_file(dir_.file("no-such-password-file"));
  auto sub2 = start(bad);
  h = wait_failure(*sub2);
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kCredentials);
  EXPECT_NE(h.last_error.find("no-such-password-file"), std::string::npos) << h.last_error;
  EXPECT_TRUE(sub2->stop().ok());
}

// tls.version: checked before connecting, since Paho cannot set it. TLS 1.3 against
// mosquitto (which speaks it) connects; against a TLS 1.2-only server (openssl s_server)
// it is refused with the reason.
TEST_F(TlsTest, TlsVersionIsCheckedBeforeConnecting) {
  SubscriberOptions o = options(uri(kOtherName, "localhost"));
  o.tls.version = TlsVersion::kTls1_3;
  o.tls.insecure_skip_hostname_check = true;
  auto sub = start(o);
  ASSERT_TRUE(sub->wait_connected(20000)) << sub->health().last_error;
  EXPECT_TRUE(sub->stop().ok());
  EXPECT_NE(read_file(log_path()).find("negotiated TLSv1.3"), std::string::npos);

  const int port = free_port();
  Child server({"/usr/bin/openssl", "s_server", "-accept", std::to_string(port), "-cert",
                pki_->server_cert(), "-key", pki_->server_key(), "-tls1_2", "-quiet"},
               dir_.file("s_server.log"));
  SubscriberOptions old = options(tls_uri("localhost", port));
  old.client_id = "tls-sub-old";
  old.tls.version = TlsVersion::kTls1_3;
  auto sub2 = start(old);  // until s_server listens, attempts fail with kNetwork
  const ConnectionHealth h = wait_failure(*sub2, ConnectionHealth::Failure::kTls);
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kTls);
  EXPECT_NE(h.last_error.find("TLS 1.3"), std::string::npos) << h.last_error;
  EXPECT_NE(h.last_error.find("tls.version"), std::string::npos) << h.last_error;
  EXPECT_EQ(h.connects, 0);
  EXPECT_TRUE(sub2->stop().ok());
}

// A plaintext port given as ssl://: refused with what is wrong, never a fallback.
TEST_F(TlsTest, TlsUriToPlaintextPortIsRefusedWithTheReason) {
  auto sub = start(options(tls_uri("127.0.0.1", broker_.port())));
  const ConnectionHealth h = wait_failure(*sub);
  EXPECT_EQ(h.last_failure, ConnectionHealth::Failure::kTls) << h.last_error;
  EXPECT_NE(h.last_error.find("closed the connection during the TLS handshake"), std::string::npos)
      << h.last_error;
  EXPECT_NE(h.last_error.find("plaintext"), std::string::npos) << h.last_error;
  EXPECT_EQ(h.connects, 0);
  EXPECT_TRUE(sub->stop().ok());

  const int closed = free_port();  // nothing listens there
  SubscriberOptions o = options(tls_uri("127.0.0.1", closed));
  o.client_id = "tls-sub-closed";
  auto sub2 = start(o);
  const ConnectionHealth h2 = wait_failure(*sub2);
  EXPECT_EQ(h2.last_failure, ConnectionHealth::Failure::kNetwork) << h2.last_error;
  EXPECT_NE(h2.last_error.find("Connection refused"), std::string::npos) << h2.last_error;
  EXPECT_TRUE(sub2->stop().ok());
}

// mqtt-inbox probe-broker takes the same connection flags: it checks a broker behind TLS
// and a password, and explains a TLS failure instead of Paho's bare text.
TEST_F(TlsTest, ProbeBrokerUsesTheConnectionFlags) {
  auto probe = [&](const std::vector<std::string>& flags, const std::string& log) {
    std::vector<std::string> argv = {built_program("mqtt-inbox"), "probe-broker", "--json",
                                     "--timeout-ms", "5000"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    Child tool(argv, log);
    const int st = tool.wait(std::chrono::seconds(60));
    return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
  };
  const std::string ok_log = dir_.file("probe-ok.log");
  EXPECT_EQ(probe({"--broker", uri(kTlsPassword), "--cafile", pki_->ca_cert(), "--username",
                   "alice", "--password-file", pki_->path("alice.password")},
                  ok_log),
            0)
      << read_file(ok_log);
  EXPECT_NE(read_file(ok_log).find("\"verdict\": \"ok\""), std::string::npos) << read_file(ok_log);

  const std::string bad_log = dir_.file("probe-mismatch.log");
  EXPECT_EQ(probe({"--broker", uri(kOtherName), "--cafile", pki_->ca_cert()}, bad_log), 7)
      << read_file(bad_log);
  EXPECT_NE(read_file(bad_log).find("hostname mismatch"), std::string::npos) << read_file(bad_log);
  for (const std::string& log : {ok_log, bad_log})
    EXPECT_EQ(read_file(log).find(kPassword), std::string::npos) << log;
}

}  // namespace
}  // namespace mqtt_inbox::test

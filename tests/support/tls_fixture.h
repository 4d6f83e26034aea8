// Test support: the TLS and authentication fixture (tls_test, relay_tls_test): a real
// mosquitto with TLS listeners (a password file, another host name, an expired
// certificate, mutual TLS), a private PKI (tls_pki.h), a debug log of the test's own, and
// the check at the end of every test that no password reached any log.
#pragma once

#include <mqtt_inbox/subscriber.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <string>
#include <vector>

#include "support/ledger_fixture.h"
#include "support/publisher.h"
#include "support/tls_pki.h"

namespace mqtt_inbox::test {

// alice's MQTT password on the broker; it must never appear in a log.
inline constexpr char kPassword[] = "mqtt-Pa55-7c1d2e9f";

inline size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The broker's extra listeners (Broker::listener_port(i)).
enum Listener : size_t {
  kTlsPassword,     // server certificate for localhost/127.0.0.1, password file
  kOtherName,       // certificate for broker.invalid only, anonymous
  kExpired,         // expired certificate for localhost, anonymous
  kMutualIdentity,  // client certificate required, its CN is the user name
  kMutualPassword,  // client certificate required, and a password file
};

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TestPki();
    write_file(pki_->path("alice.password"), std::string(kPassword) + "\n");
    write_file(pki_->path("key.password"), TestPki::key_password() + "\n");
    Child passwd({"/usr/bin/mosquitto_passwd", "-c", "-b", pki_->path("mosquitto.passwd"), "alice",
                  kPassword},
                 pki_->path("mosquitto_passwd.log"));
    ASSERT_EQ(passwd.wait(std::chrono::seconds(20)), 0)
        << read_file(pki_->path("mosquitto_passwd.log"));
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  static std::vector<std::string> tls_listeners() {
    const TestPki& p = *pki_;
    auto tls = [&](const std::string& cert, const std::string& key) {
      return "cafile " + p.ca_cert() + "\ncertfile " + cert + "\nkeyfile " + key + "\n";
    };
    const std::string passwords =
        "allow_anonymous false\npassword_file " + p.path("mosquitto.passwd") + "\n";
    return {
        tls(p.server_cert(), p.server_key()) + passwords,
        tls(p.other_name_cert(), p.other_name_key()) + "allow_anonymous true\n",
        tls(p.expired_cert(), p.expired_key()) + "allow_anonymous true\n",
        tls(p.server_cert(), p.server_key()) +
            "require_certificate true\nuse_identity_as_username true\nallow_anonymous false\n",
        tls(p.server_cert(), p.server_key()) + "require_certificate true\n" + passwords,
    };
  }

  void SetUp() override {
    db_path_ = dir_.file("ledger.db");
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_path());
    log_ = std::make_shared<spdlog::logger>("tls_test", sink);
    log_->set_level(spdlog::level::debug);
    log_->flush_on(spdlog::level::debug);
  }

  void TearDown() override {
    // Secrets never reach a log: ours, the child programs', the broker's.
    for (const std::string& file : {log_path(), child_log(), broker_.log_path()}) {
      const std::string text = read_file(file);
      EXPECT_EQ(text.find(kPassword), std::string::npos) << "the MQTT password is in " << file;
      EXPECT_EQ(text.find(TestPki::key_password()), std::string::npos)
          << "the key password is in " << file;
    }
  }

  static std::string tls_uri(const std::string& host, int port) {
    return "ssl://" + host + ":" + std::to_string(port);
  }
  std::string uri(Listener l, const std::string& host = "localhost") const {
    return tls_uri(host, broker_.listener_port(l));
  }

  SubscriberOptions options(const std::string& broker_uri, MqttVersion v = MqttVersion::kV5) {
    SubscriberOptions o;
    o.broker_uri = broker_uri;
    o.client_id = "tls-sub";
    o.client_id_lock_dir = dir_.path();
    o.mqtt_version = v;
    o.reconnect_backoff_initial_ms = 50;
    o.reconnect_backoff_max_ms = 400;
    o.connect_timeout_ms = 5000;
    o.tls.ca_file = pki_->ca_cert();
    o.logger = log_;
    return o;
  }

  // An in-process Subscriber feeding the ledger in db_path_ (the tests that run
  // ledger_consumer on that file instead never call this).
  std::unique_ptr<Subscriber> start(const SubscriberOptions& o) {
    if (!consumer_) {
      inbox_ = open_ledger_inbox(db_path_);
      ConsumerOptions co;
      co.retry_backoff_initial = std::chrono::milliseconds(1);
      co.retry_backoff_max = std::chrono::milliseconds(2);
      EXPECT_TRUE(
          Consumer::create(inbox_.get(), "ledger", ledger::apply_credit, co, &consumer_).ok());
    }
    std::unique_ptr<Subscriber> s;
    const Status st = Subscriber::create(o, &s);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!s) return s;
    EXPECT_TRUE(s->subscribe("credits/#", consumer_.get()).ok());
    EXPECT_TRUE(s->start().ok());
    return s;
  }

  // Waits until the subscriber's last attempt failed (with `kind`, if given); returns its
  // health then.
  static ConnectionHealth wait_failure(Subscriber& s,
                                       std::optional<ConnectionHealth::Failure> kind = {}) {
    EXPECT_TRUE(wait_until(
        [&] {
          const ConnectionHealth h = s.health();
          return kind ? h.last_failure == *kind
                      : h.last_failure != ConnectionHealth::Failure::kNone;
        },
        std::chrono::seconds(20)))
        << s.health().last_error;
    return s.health();
  }

  // examples/ledger_consumer with the given connection flags, logging to child_log().
  std::unique_ptr<Child> ledger_consumer(const std::vector<std::string>& connection_flags) {
    std::vector<std::string> argv = {built_program("ledger_consumer"),
                                     "--client-id",
                                     "tls-ledger",
                                     "--client-id-lock-dir",
                                     dir_.path(),
                                     "--topic",
                                     "credits/#",
                                     "--db",
                                     db_path_,
                                     "--log-level",
                                     "debug"};
    argv.insert(argv.end(), connection_flags.begin(), connection_flags.end());
    return std::make_unique<Child>(argv, child_log());
  }
  std::string child_log() const { return dir_.file("ledger_consumer.log"); }

  void publish_credits(int from, int to) {
    TestPublisher pub(broker_.uri(), true);  // the broker's anonymous plaintext listener
    for (int i = from; i < to; ++i)
      pub.credit("credits/t", "t-" + std::to_string(i), "acct-" + std::to_string(i % 4), i + 1);
  }
  static int64_t expected_total(int n) { return static_cast<int64_t>(n) * (n + 1) / 2; }
  int64_t ledger_rows() { return query_int(db_path_, "SELECT count(*) FROM ledger_entries"); }
  int64_t total_balance() { return query_int(db_path_, "SELECT sum(balance) FROM accounts"); }
  std::string log_path() const { return dir_.file("subscriber.log"); }

  static inline TestPki* pki_ = nullptr;
  TempDir dir_;
  Broker broker_{Broker::Config{}, tls_listeners()};
  std::string db_path_;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Consumer> consumer_;
  std::shared_ptr<spdlog::logger> log_;
};

}  // namespace mqtt_inbox::test

// bench_pg_consumer: the library on PostgreSQL (issue 30), as bench_consumer --mode inbox
// is on SQLite. enable_postgres_store(), Inbox::open("postgresql://...") +
// Consumer::create with a PgHandler doing the ledger's credit (the accounts upsert and the
// ledger entry, prepared once per connection) in the claim transaction + Subscriber (the
// PUBACK after the commit) + the Pruner as ledger_consumer runs it: library defaults.
//   --phase setup   connect once with the persistent session, subscribe, disconnect.
//   --phase run     consume until --count messages are committed, then print one JSON
//                   line (the bench_util Drain figures; txn_p50_us: the claim transaction
//                   from before_claim_hook to after_commit_hook, the claim, the handler
//                   and COMMIT; wal_bytes_per_msg over the same span as msgs_per_s) and a summary.
//
//   bench_pg_consumer --broker URI --topic T --client-id C --uri PGURI --count N
#include <mqtt/async_client.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <pqxx/pqxx>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <mqtt_inbox/mqtt_inbox.h>
#include <mqtt_inbox/postgres.h>

#include "bench_pg_util.h"
#include "bench_util.h"
#include "ledger.h"

int main(int argc, char** argv) {
  CLI::App app{"mqtt-inbox consumer on PostgreSQL (benchmark)"};
  std::string phase = "run", broker, topic, client_id, uri, label = "inbox_pg", ready_file;
  int count = 5000, timeout_s = 600;
  app.add_option("--phase", phase)->check(CLI::IsMember({"setup", "run"}));
  app.add_option("--broker", broker)->required();
  app.add_option("--topic", topic)->required();
  app.add_option("--client-id", client_id)->required();
  app.add_option("--uri", uri, "libpq connection URI of the database");
  app.add_option("--count", count, "Messages to wait for");
  app.add_option("--timeout", timeout_s, "Give up after this many seconds");
  app.add_option("--label", label, "Name in the JSON line");
  app.add_option("--ready-file", ready_file, "Touched once connected");
  CLI11_PARSE(app, argc, argv);

  if (phase == "setup") {
    mqtt::async_client cli(broker, client_id, mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
    try {
      cli.connect(mqtt::connect_options_builder()
                      .mqtt_version(MQTTVERSION_3_1_1)
                      .clean_session(false)
                      .finalize())
          ->wait();
      cli.subscribe(topic, 1)->wait();
      cli.disconnect()->wait();
    } catch (const mqtt::exception& e) {
      std::fprintf(stderr, "bench_pg_consumer setup: %s\n", e.what());
      return 1;
    }
    return 0;
  }

  try {
    pqxx::connection c(uri);
    bench::pg_create_ledger_tables(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pg_consumer: %s\n", e.what());
    return 1;
  }

  bench::Drain done(count);
  bench::PgWalSpan wal(uri, count);
  bench::PgTxnTimes times;  // the Consumer's thread only (one message at a time)
  auto log =
      std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
  mqtt_inbox::InboxOptions io;
  io.logger = log;
  io.before_claim_hook = [&](const std::string&, const std::string&) { times.begin_txn(); };
  io.after_commit_hook = [&](const std::string&, const std::string&) {
    times.end_txn();
    wal.before_one(done.done());
    done.one();
  };
  mqtt_inbox::enable_postgres_store();
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  if (auto s = mqtt_inbox::Inbox::open(uri, io, &inbox); !s.ok()) {
    std::fprintf(stderr, "open: %s\n", s.to_string().c_str());
    return 1;
  }
  // The ledger's credit; its statements prepared once for the connection it is given (the
  // store makes a new one after a failure).
  const pqxx::connection_base* prepared_for = nullptr;
  mqtt_inbox::PgHandler credit = [&prepared_for](pqxx::transaction_base& txn,
                                                 const mqtt_inbox::Delivery& d) {
    const ledger::Credit c = ledger::decode_credit(d);
    if (prepared_for != &txn.conn()) {
      txn.conn().prepare("bench_credit", bench::kPgCreditSql);
      txn.conn().prepare("bench_entry", bench::kPgEntrySql);
      prepared_for = &txn.conn();
    }
    txn.exec_prepared0("bench_credit", c.account, c.amount);
    txn.exec_prepared0("bench_entry", d.message_id, c.account, c.amount);
  };
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
  if (auto s = mqtt_inbox::Consumer::create(inbox.get(), "ledger", credit,
                                            mqtt_inbox::ConsumerOptions{}, &consumer);
      !s.ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.to_string().c_str());
    return 1;
  }
  mqtt_inbox::SubscriberOptions so;
  so.broker_uri = broker;
  so.client_id = client_id;
  so.logger = log;
  mqtt_inbox::RetentionOptions retention;  // as ledger_consumer: a window over the session
  retention.broker_session_expiry = std::chrono::seconds(so.session_expiry_s);
  retention.window = retention.broker_session_expiry + std::chrono::hours(24);
  std::unique_ptr<mqtt_inbox::Pruner> pruner;
  if (auto s = mqtt_inbox::Pruner::create(inbox.get(), retention, &pruner); !s.ok()) {
    std::fprintf(stderr, "pruner: %s\n", s.to_string().c_str());
    return 1;
  }
  (void)pruner->start();
  std::unique_ptr<mqtt_inbox::Subscriber> sub;
  if (auto s = mqtt_inbox::Subscriber::create(so, &sub); !s.ok()) {
    std::fprintf(stderr, "subscriber: %s\n", s.to_string().c_str());
    return 1;
  }
  (void)sub->subscribe(topic, consumer.get());
  (void)sub->start();
  if (!sub->wait_connected(30000)) {
    std::fprintf(stderr, "inbox_pg: not connected after 30 s\n");
    return 1;
  }
  if (!ready_file.empty()) std::ofstream(ready_file) << "ready\n";
  if (!done.wait(timeout_s)) {
    std::fprintf(stderr, "inbox_pg: timeout after %lld of %d\n",
                 static_cast<long long>(done.done()), count);
    std::_Exit(1);
  }
  wal.at_end();
  (void)sub->stop();
  pruner->stop();
  const auto c = consumer->counters();
  if (c.processed != count || c.dead_lettered != 0)
    std::fprintf(stderr, "inbox_pg: WARNING processed=%lld dead_lettered=%lld duplicates=%lld\n",
                 static_cast<long long>(c.processed), static_cast<long long>(c.dead_lettered),
                 static_cast<long long>(c.duplicates));
  bench::Json j;
  j.add("bench", "consumer")
      .add("label", label)
      .add("mode", "inbox_pg")
      .add("sync", bench::pg_synchronous_commit(uri));
  j.add("count", count)
      .add("msgs_per_s", done.rate())
      .add("seconds", done.seconds())
      .add("measured", done.measured())
      .add("wal_bytes_per_msg", wal.bytes_per_msg());
  bench::add_us(j, "txn", times.txn_us);
  bench::add_us(j, "between", times.between_us);
  j.print();
  std::fprintf(stderr, "inbox_pg[%s]: %.0f msgs in %.2f s = %.0f msg/s; txn p50 %.0f us\n",
               label.c_str(), done.measured(), done.seconds(), done.rate(),
               bench::percentile(times.txn_us, 50));
  return 0;
}

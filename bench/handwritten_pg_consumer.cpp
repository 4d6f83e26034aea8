// handwritten_pg_consumer: the PostgreSQL peer mqtt-inbox is measured against (issue 30),
// as handwritten_consumer.cpp is on SQLite. What a competent user writes without the
// library: Paho C++ async_client and libpqxx, and per message, inside Paho's message
// callback (so the PUBACK follows the commit):
//   BEGIN;
//   INSERT INTO processed ... ON CONFLICT DO NOTHING;              -- the claim
//   INSERT INTO accounts ... ON CONFLICT DO UPDATE balance += $2;  -- the credit
//   INSERT INTO ledger_entries ...;                                -- the append
//   COMMIT;
// Statements are prepared once; the payload is parsed once with nlohmann-json. No dead
// letters, no attempt counting, no retention, no reconnection: a payload it cannot read
// is logged and acked, a database error (an unknown commit outcome included) aborts the
// process before the callback returns, so there is no PUBACK and the broker redelivers to
// the next run, whose claim decides. Its claim table is bench_raw_pg's.
//
//   handwritten_pg_consumer --broker URI --topic T --client-id C --uri PGURI --count N
//                           [--phase setup|run] [--label L] [--ready-file F]
// --phase setup: connect with a persistent session, subscribe, disconnect.
// --phase run: consume until --count messages are committed (or seen as duplicates), then
//   print one JSON line (the bench_util Drain figures, txn_p50_us: BEGIN to COMMIT
//   returned, wal_bytes_per_msg over the same span as msgs_per_s) and a summary.
#include <mqtt/async_client.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "bench_pg_util.h"
#include "bench_util.h"

int main(int argc, char** argv) {
  CLI::App app{"Hand-written exactly-once ledger consumer on PostgreSQL (benchmark peer)"};
  std::string phase = "run", broker, topic, client_id, uri, label = "hand_pg", ready_file;
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

  const auto connect_opts = mqtt::connect_options_builder()
                                .mqtt_version(MQTTVERSION_3_1_1)
                                .clean_session(false)
                                .finalize();
  mqtt::async_client cli(broker, client_id, mqtt::create_options(MQTTVERSION_3_1_1), nullptr);
  if (phase == "setup") {
    try {
      cli.connect(connect_opts)->wait();
      cli.subscribe(topic, 1)->wait();
      cli.disconnect()->wait();
    } catch (const mqtt::exception& e) {
      std::fprintf(stderr, "handwritten_pg setup: %s\n", e.what());
      return 1;
    }
    return 0;
  }

  std::unique_ptr<pqxx::connection> db;
  try {
    db = std::make_unique<pqxx::connection>(uri);
    bench::pg_create_ledger_tables(*db);
    pqxx::nontransaction(*db).exec0(
        "CREATE TABLE IF NOT EXISTS processed (consumer TEXT NOT NULL, message_id TEXT NOT NULL,"
        "  PRIMARY KEY (consumer, message_id))");
    db->prepare("claim",
                "INSERT INTO processed (consumer, message_id) VALUES ('ledger', $1)"
                " ON CONFLICT (consumer, message_id) DO NOTHING");
    db->prepare("credit", bench::kPgCreditSql);
    db->prepare("entry", bench::kPgEntrySql);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "handwritten_pg: %s\n", e.what());
    return 1;
  }

  bench::Drain drain(count);
  bench::PgWalSpan wal(uri, count);
  int64_t processed = 0, duplicates = 0, undecodable = 0;
  bench::PgTxnTimes times;
  cli.set_message_callback([&](mqtt::const_message_ptr m) {
    std::string id, account;
    int64_t amount = 0;
    try {
      const auto j = nlohmann::json::parse(m->get_payload());
      id = j.at("message_id").get<std::string>();
      account = j.at("account").get<std::string>();
      amount = j.at("amount").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      std::fprintf(stderr, "handwritten_pg: skipping an unreadable payload: %s\n", e.what());
      ++undecodable;
      return;  // acked: nothing to store
    }
    try {
      times.begin_txn();
      pqxx::work w(*db);
      if (w.exec_prepared("claim", id).affected_rows() == 0) {
        w.abort();
        ++duplicates;
      } else {
        w.exec_prepared0("credit", account, amount);
        w.exec_prepared0("entry", id, account, amount);
        w.commit();
        times.end_txn();
        ++processed;
      }
    } catch (const std::exception& e) {
      // Returning would ack a message whose commit is not known: die, the broker redelivers.
      std::fprintf(stderr, "handwritten_pg: database error on %s: %s\n", id.c_str(), e.what());
      std::abort();
    }
    wal.before_one(drain.done());
    drain.one();
  });
  try {
    auto tok = cli.connect(connect_opts);
    tok->wait();
    if (!tok->get_connect_response().is_session_present()) cli.subscribe(topic, 1)->wait();
  } catch (const mqtt::exception& e) {
    std::fprintf(stderr, "handwritten_pg: %s\n", e.what());
    return 1;
  }
  if (!ready_file.empty()) std::ofstream(ready_file) << "ready\n";
  if (!drain.wait(timeout_s)) {
    std::fprintf(stderr, "handwritten_pg: timeout after %lld of %d\n",
                 static_cast<long long>(drain.done()), count);
    std::_Exit(1);
  }
  try {
    cli.disconnect()->wait();
  } catch (const mqtt::exception&) {
  }
  wal.at_end();
  if (processed != count)
    std::fprintf(stderr,
                 "handwritten_pg: WARNING processed=%lld duplicates=%lld undecodable=%lld\n",
                 static_cast<long long>(processed), static_cast<long long>(duplicates),
                 static_cast<long long>(undecodable));
  bench::Json j;
  j.add("bench", "consumer")
      .add("label", label)
      .add("mode", "handwritten_pg")
      .add("sync", bench::pg_synchronous_commit(uri));
  j.add("count", count)
      .add("msgs_per_s", drain.rate())
      .add("seconds", drain.seconds())
      .add("measured", drain.measured())
      .add("wal_bytes_per_msg", wal.bytes_per_msg());
  bench::add_us(j, "txn", times.txn_us);
  bench::add_us(j, "between", times.between_us);
  j.print();
  std::fprintf(stderr, "handwritten_pg[%s]: %.0f msgs in %.2f s = %.0f msg/s; txn p50 %.0f us\n",
               label.c_str(), drain.measured(), drain.seconds(), drain.rate(),
               bench::percentile(times.txn_us, 50));
  return 0;
}

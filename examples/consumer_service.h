// consumer_service: what the example consumers share (ledger_consumer, event_consumer):
// their command-line flags, the store with the program's business tables, the Consumer,
// retention, the Subscriber, and, through service_frame.h (which sensor_gateway uses
// too), the log, systemd notifications from before the store is opened, and the stop on
// SIGINT/SIGTERM with the exit codes of exit_codes.h. A program supplies its tables and
// its handler; everything else behaves the same in every example.
//
//   Flags (besides connection_flags.h's):
//   --topic FILTER            topic filter to consume (required)
//   --db LOCATION             SQLite database file, or a PostgreSQL URI
//                             (postgresql://..., without a password) (required)
//   --db-password-file PATH   PostgreSQL: a libpq password file (else PGPASSFILE,
//                             ~/.pgpass); the password is never on the command line
//   --consumer NAME           consumer name recorded with each message id
//   --log-level LEVEL         trace|debug|info|warn|error (default info)
//   --stuck-limit-ms MS       under systemd: stop watchdog pings once stuck this long
//   --synchronous-normal      PRAGMA synchronous=NORMAL
//   --startup-deadline-ms MS  give up (exit 4) if the store is not ready; 0 = wait
//   --stop-timeout-ms MS      on SIGTERM, how long a message may still wait for the store
//   --refused-limit-ms MS     exit 7 once the broker has refused this client this long
//   --prometheus-textfile PATH  the Pruner writes InboxStats there after every pass
//                             (node_exporter's textfile collector; sessions lost included)
//   --fleet-group NAME        run as one member of a fleet (PostgreSQL --db only,
//                             fleet.h): $share/NAME/<topic> on client-id slots
//                             <client-id>-0 .. <client-id>-(K-1), held by leases
//   --fleet-slots K           the fleet's slot count (default 8; the same on every member)
//   --fleet-lease-ms MS       the fleet's lease (default 10000)
#pragma once

#include <mqtt_inbox/mqtt_inbox.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "command_line.h"
#include "connection_flags.h"
#include "exit_codes.h"
#include "service_frame.h"

namespace consumer_service {

struct Flags {
  connection_flags::Flags connection;
  std::string topic, db_path, consumer_name, log_level = "info", prometheus_textfile;
  std::string db_password_file;  // PostgreSQL: InboxOptions::postgres_password_file
  bool normal_sync = false;
  int64_t startup_deadline_ms = 0;
  int stop_timeout_ms = mqtt_inbox::SubscriberOptions{}.stop_timeout_ms;
  int64_t stuck_limit_ms = mqtt_inbox::ServiceNotifierOptions{}.stuck_limit_ms;
  int64_t refused_limit_ms = service_frame::Options{}.refused_limit_ms;
  std::string fleet_group;  // non-empty: a fleet member (fleet.h)
  int fleet_slots = mqtt_inbox::FleetOptions{}.slots;
  int fleet_lease_ms = mqtt_inbox::FleetOptions{}.lease_ms;
};

// The frame options these flags give.
inline service_frame::Options frame_options(const Flags& f, const std::string& log_name) {
  service_frame::Options o;
  o.log_name = log_name;
  o.log_level = f.log_level;
  o.stuck_limit_ms = f.stuck_limit_ms;
  o.refused_limit_ms = f.refused_limit_ms;
  return o;
}

// Adds --refused-limit-ms to `app`, parsed into `*ms`.
inline void add_refused_limit(CLI::App& app, int64_t* ms) {
  app.add_option("--refused-limit-ms", *ms,
                 "Exit 7 once the broker has refused this client (credentials, CA, client "
                 "id) this long without a success (ms); 0 = retry for ever");
}

// Adds the connection flags and the flags above to `app`, parsed into `*f` (which must
// outlive app.parse()). f->consumer_name's initial value is the default of --consumer.
inline void add(CLI::App& app, Flags* f) {
  connection_flags::add(app, &f->connection, connection_flags::Role::kSubscriber);
  app.add_option("--topic", f->topic, "Topic filter to consume")
      ->required()
      ->check(command_line::topic_filter());
  app.add_option("--db", f->db_path,
                 "SQLite database file, or a PostgreSQL URI (postgresql://..., no password)")
      ->required();
  app.add_option("--db-password-file", f->db_password_file,
                 "PostgreSQL: libpq password file (default: PGPASSFILE, ~/.pgpass)");
  app.add_option("--consumer", f->consumer_name, "Consumer name recorded with each message id");
  app.add_option("--log-level", f->log_level, "trace|debug|info|warn|error");
  app.add_option("--stuck-limit-ms", f->stuck_limit_ms,
                 "Under systemd: stop watchdog pings once the store is stuck this long (ms)");
  app.add_flag("--synchronous-normal", f->normal_sync,
               "Use PRAGMA synchronous=NORMAL (faster; loses the last commits on power loss)");
  app.add_option("--startup-deadline-ms", f->startup_deadline_ms,
                 "Give up (exit 4) if the store is not ready after this long; 0 = wait");
  app.add_option("--stop-timeout-ms", f->stop_timeout_ms,
                 "On SIGTERM, how long a message may still wait for the store (then exit 3)");
  add_refused_limit(app, &f->refused_limit_ms);
  app.add_option("--prometheus-textfile", f->prometheus_textfile,
                 "Write the inbox's stats in Prometheus text format to this file after every "
                 "prune pass (node_exporter's textfile collector)");
  app.add_option("--fleet-group", f->fleet_group,
                 "Run as one member of a fleet sharing $share/<group>/<topic> on client-id "
                 "slots <client-id>-0..K-1 held by leases in PostgreSQL (--db postgresql:// "
                 "only; docs/fleet.md); empty = one consumer");
  app.add_option("--fleet-slots", f->fleet_slots,
                 "With --fleet-group: the fleet's slot count, the same on every member")
      ->check(CLI::Range(1, 1024));
  app.add_option("--fleet-lease-ms", f->fleet_lease_ms,
                 "With --fleet-group: the lease; a dead member's slots move after about this "
                 "long (ms)")
      ->check(CLI::Range(1000, 3600000));
}

class Service {
 public:
  // `program` prefixes the counters line printed at stop; `log_name` names the logger.
  Service(std::string program, std::string log_name)
      : program_(std::move(program)), log_name_(std::move(log_name)) {}

  // The log, the stop signals, systemd's notifier in its start-up phase (service_frame.h),
  // the subscriber options, then the store with the business tables, before anything
  // connects. While the store is locked or full (up to --startup-deadline-ms) STATUS=
  // says so and the start timeout is extended. Returns kExitOk, or the exit code for
  // main() to return (STATUS= says why).
  int open(const Flags& f, const std::function<void(SQLite::Database&)>& create_tables) {
    if (int rc = open_store(f); rc != examples::kExitOk) return rc;
    if (auto s = inbox_->setup(create_tables); !s.ok())
      return frame_.fail(examples::startup_exit_code(s), s);
    return examples::kExitOk;
  }
  // The same with the business tables as SQL text (Inbox::setup_sql): how a program on
  // the PostgreSQL store creates them.
  int open(const Flags& f, const std::string& create_tables_sql) {
    if (int rc = open_store(f); rc != examples::kExitOk) return rc;
    if (auto s = inbox_->setup_sql(create_tables_sql); !s.ok())
      return frame_.fail(examples::startup_exit_code(s), s);
    return examples::kExitOk;
  }

  // A start-up step of the program itself failed: STATUS= says why; returns `code`.
  int fail(int code, const mqtt_inbox::Status& s) { return frame_.fail(code, s); }

  // After open(): the store, the subscriber options the flags gave, and the log.
  mqtt_inbox::Inbox* inbox() const { return inbox_.get(); }
  const mqtt_inbox::SubscriberOptions& subscriber_options() const { return mqtt_; }
  const std::shared_ptr<spdlog::logger>& log() const { return log_; }

  // Runs the service until SIGINT/SIGTERM, or until the broker has refused this client
  // for --refused-limit-ms: the Consumer (`handler` runs inside the claim transaction),
  // the Pruner, the Subscriber, then `started` (e.g. an outbox relay's start; an error
  // ends the run as a subscriber's start does: exit 4 for a client-id lock held by another
  // process, else 2) and systemd's READY=1. At the
  // stop, `stopping` (e.g. the relay's stop, bounded by the same
  // --stop-timeout-ms) runs on a thread of its own beside the subscriber's stop, so that
  // both together take at most --stop-timeout-ms: in turn, a stuck store would cost each
  // its whole timeout. Prints "<program>: processed=N duplicates=N ..." and returns the
  // exit code: 0, 7 (refused), or 3 (std::_Exit) when a message was still waiting for the
  // store, or `stopping` failed (the relay was still waiting for the store). `relay`, if
  // given, is a health source of STATUS and is watched for refusals (--refused-limit-ms)
  // like the subscriber; it must outlive run(). `handler` is a Handler (SQLite) or a
  // PgHandler (PostgreSQL), as the store opened by open() takes.
  template <typename AnyHandler>
  int run(AnyHandler handler, const std::function<mqtt_inbox::Status()>& started = {},
          const std::function<mqtt_inbox::Status()>& stopping = {},
          const mqtt_inbox::Relay* relay = nullptr) {
    std::unique_ptr<mqtt_inbox::Consumer> consumer;
    if (auto s = mqtt_inbox::Consumer::create(inbox_.get(), flags_.consumer_name,
                                              std::move(handler), {}, &consumer);
        !s.ok())
      return frame_.fail(examples::kExitFailed, s);
    return run_consumer(consumer.get(), started, stopping, relay);
  }

 private:
  // open(), up to the business tables: the log, the signals, the notifier, the subscriber
  // options, and the store (SQLite or PostgreSQL, chosen by --db).
  int open_store(const Flags& f) {
    flags_ = f;
    if (int rc = frame_.begin(frame_options(f, log_name_)); rc != examples::kExitOk) return rc;
    log_ = frame_.log();
    if (auto s = connection_flags::to_subscriber_options(f.connection, &mqtt_); !s.ok())
      return frame_.fail(examples::kExitSubscriber, s);
    mqtt_.logger = log_;
    mqtt_.stop_timeout_ms = f.stop_timeout_ms;

    mqtt_inbox::InboxOptions store;
    store.startup_deadline_ms = f.startup_deadline_ms;
    return frame_.open_inbox(f.db_path, store, f.db_password_file, f.normal_sync, &inbox_);
  }

  // run(), from the Consumer on.
  int run_consumer(mqtt_inbox::Consumer* consumer,
                   const std::function<mqtt_inbox::Status()>& started,
                   const std::function<mqtt_inbox::Status()>& stopping,
                   const mqtt_inbox::Relay* relay) {
    // Retention: forget ids once the broker can no longer redeliver them. The window
    // must cover the session expiry the subscriber asks for. The subscriber records that
    // expiry in the inbox when it connects (SessionRecords::record), and the Pruner checks
    // the window against it at create (the record of the last run) and again before
    // every pass (this run's): a window that does not cover it deletes nothing.
    mqtt_inbox::RetentionOptions retention;
    retention.broker_session_expiry = std::chrono::seconds(mqtt_.session_expiry_s);
    retention.window = retention.broker_session_expiry + std::chrono::hours(24);
    retention.prometheus_textfile = flags_.prometheus_textfile;
    std::unique_ptr<mqtt_inbox::Pruner> pruner;
    if (auto s = mqtt_inbox::Pruner::create(inbox_.get(), retention, &pruner); !s.ok())
      return frame_.fail(examples::startup_exit_code(s), s);
    (void)pruner->start();

    // The subscriber (or, with --fleet-group, the fleet's one subscriber per slot it
    // holds): redeliveries can arrive as soon as it connects.
    std::unique_ptr<mqtt_inbox::Subscriber> subscriber;
    std::unique_ptr<mqtt_inbox::Fleet> fleet;
    if (!flags_.fleet_group.empty()) {
      mqtt_inbox::FleetOptions fo;
      fo.group = flags_.fleet_group;
      fo.slots = flags_.fleet_slots;
      fo.lease_ms = flags_.fleet_lease_ms;
      fo.subscriber = mqtt_;
      if (auto s = mqtt_inbox::Fleet::create(inbox_.get(), fo, &fleet); !s.ok())
        return frame_.fail(examples::subscriber_exit_code(s), s);
      if (auto s = fleet->subscribe(flags_.topic, consumer); !s.ok())
        return frame_.fail(examples::subscriber_exit_code(s), s);
      if (auto s = fleet->start(); !s.ok())
        return frame_.fail(examples::subscriber_exit_code(s), s);
    } else {
      if (auto s = mqtt_inbox::Subscriber::create(mqtt_, &subscriber); !s.ok())
        return frame_.fail(examples::subscriber_exit_code(s), s);
      if (auto s = subscriber->subscribe(flags_.topic, consumer); !s.ok())
        return frame_.fail(examples::subscriber_exit_code(s), s);
      if (auto s = subscriber->start(); !s.ok())
        return frame_.fail(examples::subscriber_exit_code(s), s);
    }
    if (started) {
      if (auto s = started(); !s.ok()) return frame_.fail(examples::subscriber_exit_code(s), s);
    }

    // READY=1 now (not after CONNACK: the network may come later), then watchdog pings
    // while healthy and a STATUS line; no-ops without systemd. The notifier reads the
    // subscriber and the consumer until frame_.end(), which comes before they go.
    if (subscriber) (void)frame_.notifier().add_source(mqtt_inbox::health_source(*subscriber));
    if (fleet) (void)frame_.notifier().add_source(mqtt_inbox::health_source(*fleet));
    (void)frame_.notifier().add_source(mqtt_inbox::health_source(*consumer));
    if (relay) (void)frame_.notifier().add_source(mqtt_inbox::health_source(*relay));
    struct EndFrame {
      service_frame::Frame& f;
      ~EndFrame() { f.end(); }
    } end_frame{frame_};
    frame_.ready(subscriber.get(), relay, fleet.get());

    const int why = frame_.wait();  // a stop signal, or the broker refusing us too long
    frame_.stopping();
    std::future<mqtt_inbox::Status> other;
    if (stopping) other = std::async(std::launch::async, stopping);
    const mqtt_inbox::Status subscriber_stopped = fleet ? fleet->stop() : subscriber->stop();
    const mqtt_inbox::Status other_stopped = other.valid() ? other.get() : mqtt_inbox::Status();
    const mqtt_inbox::Status& stopped =
        !subscriber_stopped.ok() ? subscriber_stopped : other_stopped;
    if (stopped.ok()) pruner->stop();  // else exit now: the pruner may be waiting for the store
    const auto c = consumer->counters();
    std::printf(
        "%s: processed=%lld duplicates=%lld dead_lettered=%lld "
        "already_dead_lettered=%lld handler_failures=%lld store_retries=%lld\n",
        program_.c_str(), static_cast<long long>(c.processed), static_cast<long long>(c.duplicates),
        static_cast<long long>(c.dead_lettered), static_cast<long long>(c.already_dead_lettered),
        static_cast<long long>(c.handler_failures), static_cast<long long>(c.store_retries));
    std::fflush(stdout);
    if (!stopped.ok()) {
      log_->error("{}", stopped.to_string());
      log_->flush();
      std::_Exit(examples::kExitStoppedWhileStuck);  // the unacked message is redelivered
    }
    if (why == examples::kExitRefused) return frame_.refused_exit();
    return examples::kExitOk;
  }

  std::string program_, log_name_;
  Flags flags_;
  // Declared before the inbox: destroyed after it (the notifier stops first, in end()).
  service_frame::Frame frame_;
  std::shared_ptr<spdlog::logger> log_;
  mqtt_inbox::SubscriberOptions mqtt_;
  std::unique_ptr<mqtt_inbox::Inbox> inbox_;
};

}  // namespace consumer_service

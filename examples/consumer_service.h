// consumer_service: the service frame the example consumers share (ledger_consumer,
// event_consumer): their command-line flags, the log, the store with the program's
// business tables, the Consumer, retention, the Subscriber, systemd notifications, and
// the stop on SIGINT/SIGTERM with the exit codes of exit_codes.h. A program supplies its
// tables and its handler; everything else behaves the same in every example.
//
//   Flags (besides connection_flags.h's):
//   --topic FILTER            topic filter to consume (required)
//   --db PATH                 SQLite database file (required)
//   --consumer NAME           consumer name recorded with each message id
//   --log-level LEVEL         trace|debug|info|warn|error (default info)
//   --stuck-limit-ms MS       under systemd: stop watchdog pings once stuck this long
//   --synchronous-normal      PRAGMA synchronous=NORMAL
//   --startup-deadline-ms MS  give up (exit 4) if the store is not ready; 0 = wait
//   --stop-timeout-ms MS      on SIGTERM, how long a message may still wait for the store
#pragma once

#include <mqtt_inbox/mqtt_inbox.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "connection_flags.h"
#include "exit_codes.h"

namespace consumer_service {

struct Flags {
  connection_flags::Flags connection;
  std::string topic, db_path, consumer_name, log_level = "info";
  bool normal_sync = false;
  int64_t startup_deadline_ms = 0;
  int stop_timeout_ms = mqtt_inbox::SubscriberOptions{}.stop_timeout_ms;
  int64_t stuck_limit_ms = mqtt_inbox::ServiceNotifierOptions{}.stuck_limit_ms;
};

// Adds the connection flags and the flags above to `app`, parsed into `*f` (which must
// outlive app.parse()). f->consumer_name's initial value is the default of --consumer.
inline void add(CLI::App& app, Flags* f) {
  connection_flags::add(app, &f->connection, connection_flags::Role::kSubscriber);
  app.add_option("--topic", f->topic, "Topic filter to consume")->required();
  app.add_option("--db", f->db_path, "SQLite database file")->required();
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
}

class Service {
 public:
  // `program` prefixes the counters line printed at stop; `log_name` names the logger.
  Service(std::string program, std::string log_name)
      : program_(std::move(program)), log_name_(std::move(log_name)) {}

  // The log, the subscriber options, the stop signals blocked (before any thread starts,
  // so only run()'s sigwait() sees them), then the store with the business tables, before
  // anything connects. The store calls wait while it is locked or full (up to
  // --startup-deadline-ms). Returns kExitOk, or the exit code for main() to return.
  int open(const Flags& f, const std::function<void(SQLite::Database&)>& create_tables) {
    flags_ = f;
    // To the journal (with priorities and CONSUMER=/INBOX_MESSAGE_ID=) under systemd,
    // else to stderr.
    if (auto s = mqtt_inbox::make_service_logger(log_name_, {f.log_level, ""}, &log_); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return examples::kExitFailed;
    }
    if (auto s = connection_flags::to_subscriber_options(f.connection, &mqtt_); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::kExitSubscriber;
    }
    mqtt_.logger = log_;
    mqtt_.stop_timeout_ms = f.stop_timeout_ms;

    sigemptyset(&stop_signals_);
    sigaddset(&stop_signals_, SIGINT);
    sigaddset(&stop_signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals_, nullptr);

    mqtt_inbox::InboxOptions store;
    store.logger = log_;
    store.startup_deadline_ms = f.startup_deadline_ms;
    if (f.normal_sync) store.synchronous = mqtt_inbox::Synchronous::kNormal;
    if (auto s = mqtt_inbox::Inbox::open(f.db_path, store, &inbox_); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::startup_exit_code(s);
    }
    if (auto s = inbox_->setup(create_tables); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::startup_exit_code(s);
    }
    return examples::kExitOk;
  }

  // After open(): the store, the subscriber options the flags gave, and the log.
  mqtt_inbox::Inbox* inbox() const { return inbox_.get(); }
  const mqtt_inbox::SubscriberOptions& subscriber_options() const { return mqtt_; }
  const std::shared_ptr<spdlog::logger>& log() const { return log_; }

  // Runs the service until SIGINT/SIGTERM: the Consumer (`handler` runs inside the claim
  // transaction), the Pruner, the Subscriber, then `started` (e.g. an outbox relay's
  // start) and systemd's READY=1. At the stop, `stopping` (e.g. the relay's stop, bounded
  // by the same --stop-timeout-ms) runs on a thread of its own beside the subscriber's
  // stop, so that both together take at most --stop-timeout-ms: in turn, a stuck store
  // would cost each its whole timeout. Prints "<program>: processed=N duplicates=N ..."
  // and returns the exit code: 0, or 3 (std::_Exit) when a message was still waiting for
  // the store, or `stopping` failed (the relay was still waiting for the store).
  int run(mqtt_inbox::Handler handler, const std::function<void()>& started = {},
          const std::function<mqtt_inbox::Status()>& stopping = {}) {
    std::unique_ptr<mqtt_inbox::Consumer> consumer;
    if (auto s = mqtt_inbox::Consumer::create(inbox_.get(), flags_.consumer_name,
                                              std::move(handler), {}, &consumer);
        !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::kExitFailed;
    }

    // Retention: forget ids once the broker can no longer redeliver them. The window
    // must cover the session expiry the subscriber asks for. The subscriber records that
    // expiry in the inbox when it connects (Inbox::record_session), and the Pruner checks
    // the window against it at create (the record of the last run) and again before
    // every pass (this run's): a window that does not cover it deletes nothing.
    mqtt_inbox::RetentionOptions retention;
    retention.broker_session_expiry = std::chrono::seconds(mqtt_.session_expiry_s);
    retention.window = retention.broker_session_expiry + std::chrono::hours(24);
    std::unique_ptr<mqtt_inbox::Pruner> pruner;
    if (auto s = mqtt_inbox::Pruner::create(inbox_.get(), retention, &pruner); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::startup_exit_code(s);
    }
    (void)pruner->start();

    // The subscriber: redeliveries can arrive as soon as it connects.
    std::unique_ptr<mqtt_inbox::Subscriber> subscriber;
    if (auto s = mqtt_inbox::Subscriber::create(mqtt_, &subscriber); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::kExitSubscriber;
    }
    if (auto s = subscriber->subscribe(flags_.topic, consumer.get()); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::kExitSubscriber;
    }
    if (auto s = subscriber->start(); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::kExitSubscriber;
    }
    if (started) started();

    // Under systemd (Type=notify): READY=1 now (not after CONNACK: the network may come
    // later), then watchdog pings while healthy and a STATUS line; a no-op otherwise.
    mqtt_inbox::ServiceNotifierOptions service;
    service.stuck_limit_ms = flags_.stuck_limit_ms;
    service.logger = log_;
    std::unique_ptr<mqtt_inbox::ServiceNotifier> notifier;
    if (auto s = mqtt_inbox::ServiceNotifier::create(service, &notifier); !s.ok()) {
      log_->error("{}", s.to_string());
      return examples::kExitSubscriber;
    }
    (void)notifier->add_source(mqtt_inbox::health_source(*subscriber));
    (void)notifier->add_source(mqtt_inbox::health_source(*consumer));
    (void)notifier->ready();

    int sig = 0;
    sigwait(&stop_signals_, &sig);
    log_->info("signal {}: stopping", sig);
    (void)notifier->stopping();
    std::future<mqtt_inbox::Status> other;
    if (stopping) other = std::async(std::launch::async, stopping);
    const mqtt_inbox::Status subscriber_stopped = subscriber->stop();
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
    return examples::kExitOk;
  }

 private:
  std::string program_, log_name_;
  Flags flags_;
  std::shared_ptr<spdlog::logger> log_;
  mqtt_inbox::SubscriberOptions mqtt_;
  sigset_t stop_signals_{};
  std::unique_ptr<mqtt_inbox::Inbox> inbox_;
};

}  // namespace consumer_service

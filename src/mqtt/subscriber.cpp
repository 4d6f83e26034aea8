// The MQTT layer: the session, the connection loop and the message callback. Paho C++ is
// included only in the MQTT layer (src/subscriber*.cpp, mqtt/connect.cpp, mqtt/relay.cpp):
// how a client connects (connect options, TLS, the password provider, the CONNECT),
// shared with the outbox relay, in mqtt/connect.cpp; TLS settings in
// mqtt/tls.cpp, the probe
// handshake in mqtt/probe.cpp, health() and failure reports in
// mqtt/connection_health.cpp, refusals and passwords in mqtt/auth.cpp, the session
// record and (un)subscribing in mqtt/session_keeper.cpp, message conversion and topic
// matching in mqtt/paho_message.cpp, the client-id lock in mqtt/client_lock.cpp.
// What stays here (about 650 lines) is one piece on purpose: the Paho client, the
// connection loop, the message callback and stop() share Impl's state under one mutex,
// and the rules that keep the guarantee (the PUBACK leaves when on_message returns;
// stop() never destroys a client whose callback is still waiting for the store) are
// checked by reading them side by side.
#include "mqtt_inbox/subscriber.h"
#include "mqtt_inbox/topic.h"

#include <mqtt/async_client.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "mqtt/client_lock.h"
#include "mqtt/connect.h"
#include "mqtt/connection_health.h"
#include "mqtt/lent_connection.h"
#include "mqtt/paho_message.h"
#include "mqtt/probe.h"
#include "mqtt/session_keeper.h"
#include "mqtt/tls.h"
#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/session_record.h"
#include "util/log.h"

namespace mqtt_inbox {

struct Subscriber::Impl {
  SubscriberOptions options;
  detail::BrokerAddress address;  // parsed broker_uri
  std::shared_ptr<spdlog::logger> log;
  std::vector<std::pair<std::string, MessageSink*>> routes;
  // Every watcher ever attached (mqtt/lent_connection.h), kept until after the client is
  // destroyed (declared before it): a PUBACK of a Relay's publish may come after detach().
  std::vector<std::shared_ptr<detail::ConnectionWatcher>> lent;
  // Replaced (under mu, by the supervisor only) before each reconnect once the connection
  // has been lent to a Relay (renew_client()); a Relay holds a copy for one publish. The
  // supervisor reads it without the mutex: it is the only writer.
  std::shared_ptr<mqtt::async_client> client;

  std::mutex mu;  // guards the fields below and pairs with cv; never held across Paho calls
  std::condition_variable cv;
  bool started = false;
  bool stopping = false;
  bool connection_lost = false;
  // The reason code of the DISCONNECT the broker sent on the current connection (MQTT 5
  // only), or -1: none came. Reset before each connection attempt.
  int disconnect_reason = -1;
  detail::ConnectionWatcher* watcher = nullptr;  // the Relay sharing the connection, if any
  mqtt::properties last_connack;                 // of the current connection (MQTT 5)
  std::thread supervisor;
  bool supervisor_done = false;      // set when supervise() returned
  bool supervisor_detached = false;  // stop() gave up waiting for it (see stop())
  bool stop_reported_busy = false;   // stop() logged a message stuck in the callback

  int client_lock_fd = -1;
  std::string client_lock_path;  // removed on a clean stop
  std::atomic<bool> connected{false};
  std::atomic<int> in_callback{0};
  std::atomic<int64_t> received{0}, connect_count{0}, lost_sessions{0};
  bool said_waiting = false;  // this connection's SUBACK wait was logged (wait_acknowledged)
  // The session's record in the sinks' Inboxes; made by start(), used by connect_once().
  std::unique_ptr<detail::SessionKeeper> session;

  // health() and the reports of failed attempts (mqtt/connection_health.h).
  std::unique_ptr<detail::HealthRecorder> conn;

  // Paho's message callback: runs on Paho's receive thread with Paho's lock held, and the
  // PUBACK leaves when it returns. So: return only after the consumer has a durable outcome.
  void on_message(const mqtt::const_message_ptr& pm) {
    in_callback.fetch_add(1);
    try {
      ++received;
      const Message m = detail::to_message(*pm);
      MessageSink* target = nullptr;
      for (const auto& r : routes)
        if (topic_matches(r.first, m.topic)) {
          target = r.second;
          break;
        }
      if (target) {
        target->handle(m);
      } else {
        // The persistent session can hold subscriptions from an earlier configuration.
        // Neither drop it silently nor run a handler meant for another topic: record it
        // as a dead letter of the first sink, then ack.
        const std::string why = "topic '" + detail::printable(m.topic) +
                                "' matches no subscription of this client (a stale "
                                "subscription kept by the persistent session?); not processed";
        log->error("{}", why);
        routes.front().second->reject(m, why);
      }
    } catch (const std::exception& e) {
      // Consumer::handle never throws; reaching here means the library itself failed (e.g.
      // out of memory) before the message had a durable outcome. Returning would send the
      // PUBACK for an unrecorded message, so end the process: the broker redelivers.
      log->critical(
          "internal failure in the message callback: {}; aborting so the message "
          "is not acked",
          e.what());
      log->flush();
      std::abort();
    } catch (...) {
      log->critical(
          "internal failure in the message callback; aborting so the message is "
          "not acked");
      log->flush();
      std::abort();
    }
    in_callback.fetch_sub(1);
  }

  // The Paho client (mqtt/connect.h make_paho_client), made by create() and, once the
  // connection has been lent, again before each reconnect (renew_client()). The
  // subscriber publishes nothing itself; a Relay sharing the connection keeps its own
  // window (RelayOptions::max_inflight), so Paho's buffer is not what limits it.
  // Throws mqtt::exception.
  std::shared_ptr<mqtt::async_client> make_client() const {
    return detail::make_paho_client(options, 65535);
  }

  // Everything that handles messages, set before the first CONNECT of a client, because
  // redeliveries arrive right after CONNACK.
  void install_callbacks(mqtt::async_client& c) {
    c.set_message_callback([this](mqtt::const_message_ptr pm) { on_message(pm); });
    c.set_connection_lost_handler([this](const std::string& cause) {
      log->warn("connection to {} lost: {}", options.broker_uri,
                cause.empty() ? "no reason given" : cause);
      std::lock_guard<std::mutex> lock(mu);
      connection_lost = true;
      cv.notify_all();
    });
    // MQTT 5 only: the broker's DISCONNECT, with its reason code. Paho C calls it before
    // it closes the connection, so the code is recorded before the supervisor wakes.
    c.set_disconnected_handler([this](const mqtt::properties&, mqtt::ReasonCode rc) {
      if (rc == mqtt::ReasonCode::SESSION_TAKEN_OVER)
        log->error(
            "broker {} disconnected us: session taken over by another client with "
            "client id '{}' (MQTT 5 reason code 0x8E)",
            options.broker_uri, detail::printable(options.client_id));
      else
        log->warn("broker {} disconnected us: {}", options.broker_uri, reason_text(rc));
      std::lock_guard<std::mutex> lock(mu);
      disconnect_reason = static_cast<int>(rc);
      connection_lost = true;
      cv.notify_all();
    });
  }

  // "0x87 (Not authorized)": an MQTT 5 reason code as the broker's log names it.
  static std::string reason_text(mqtt::ReasonCode rc) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(rc) & 0xFFu);
    const char* name = MQTTReasonCode_toString(static_cast<MQTTReasonCodes>(rc));
    return std::string("MQTT 5 reason code ") + hex + (name ? std::string(" (") + name + ")" : "");
  }

  // Why a connection ended `lived_ms` after it was made, as far as the broker said: only an
  // MQTT 5 DISCONNECT carries a reason (`reason`, -1 when none came). A takeover by another
  // client with this client id is named only when the broker said so (0x8E); a reload, a
  // restart, a credential or ACL change, a network cut or another client all look the
  // same otherwise, so nothing is guessed.
  std::string short_connection_text(int64_t lived_ms, int reason) const {
    const std::string head =
        "connection ended " + std::to_string(lived_ms) + " ms after it was made";
    if (reason == static_cast<int>(mqtt::ReasonCode::SESSION_TAKEN_OVER))
      return head + ": the broker says another client connected with client id '" +
             detail::printable(options.client_id) +
             "' (MQTT 5 DISCONNECT reason code 0x8E, session taken over)";
    if (reason >= 0)
      return head + ": the broker disconnected this client with " +
             reason_text(static_cast<mqtt::ReasonCode>(reason));
    if (options.mqtt_version == MqttVersion::kV5)
      return head + " without a DISCONNECT from the broker, so without a reason (its log says why)";
    return head + " (MQTT 3.1.1 carries no reason; the broker's log says why)";
  }

  // Before a reconnect of a connection lent to a Relay: a new Paho client, so that nothing
  // Paho kept of the Relay's publishes on the last connection is sent again. Paho C 1.3.12
  // resends its in-flight publishes at the next CONNECT with a session present, and after
  // a broker restart with a full window one of those resends was seen malformed (mosquitto:
  // "malformed packet"), at every reconnect, so the Subscriber never got back on line. The
  // Relay publishes every pending row again from the first on each connection anyway
  // (relay.h), and it was Paho's queued sends, not the Relay's, that broke per-key order
  // across a lost session. Safe for the inbox: a QoS 1 message's state is on the broker
  // until its PUBACK (MQTT 5.0 section 4.4). Destroying a client waits for Paho's
  // process-wide mutex, which every callback holds (docs/guarantees.md section 1), so it
  // never runs beside one, and it waits while another client's callback waits for a
  // store, as any Paho call does. The old client is destroyed here or, if a Relay is in a
  // publish() on it, when that returns (it fails: not connected); either way under none
  // of our mutexes: Paho calls the on_failure of its pending publishes, which take the
  // Relay's. false: Paho could not make the client (logged; the old one is kept).
  bool renew_client() {
    std::shared_ptr<mqtt::async_client> fresh;
    try {
      fresh = make_client();
      install_callbacks(*fresh);
    } catch (const mqtt::exception& e) {
      log->error("cannot make a new MQTT client for the reconnect: {}; reusing the old one",
                 e.what());
      return false;
    }
    std::shared_ptr<mqtt::async_client> old;
    {
      std::lock_guard<std::mutex> lock(mu);
      old = std::move(client);
      client = std::move(fresh);
    }
    old.reset();
    return true;
  }

  // Paho's TLS settings, set once in start() and kept for the client's lifetime: the CA
  // folder of every copy points here (Paho C++ 1.2.0 bug #337, see to_paho_ssl_options).
  mqtt::ssl_options paho_ssl;

  // Built once and kept for the client's lifetime. Paho C++ 1.2.0 copies connect_options
  // without re-pointing the C struct at the copy's properties, so the copy passed to
  // connect() points at *these* properties, which must outlive every connect().
  mqtt::connect_options conn_opts;

  // The Session Expiry Interval of an MQTT 5 CONNACK, in ms: present only when the broker
  // uses another value than the one asked for (MQTT 5.0 section 3.2.2.3.2).
  bool granted_session_expiry(const mqtt::properties& connack, int64_t* ms) const {
    if (options.mqtt_version != MqttVersion::kV5 ||
        !connack.contains(mqtt::property::SESSION_EXPIRY_INTERVAL))
      return false;
    *ms = 1000LL * mqtt::get<uint32_t>(connack, mqtt::property::SESSION_EXPIRY_INTERVAL);
    return true;
  }

  // Waits for the broker to acknowledge a SUBSCRIBE or UNSUBSCRIBE (`t`). Paho C hands
  // over each acknowledgement on the thread that runs the message callback, and a broker
  // sends a kept session's queued messages before it answers the SUBSCRIBE that follows
  // CONNECT: behind a backlog the SUBACK comes only once the messages ahead of it are
  // handled. So the wait lasts while the callback is busy (a message in it, or new ones
  // arriving), and ends (false) after connect_timeout_ms of neither, when the connection
  // is lost, or on stop(). A message held in the callback ends by its own bounds (the
  // store's busy and retry limits, ConsumerOptions::dependency_wait_max); giving up on the
  // SUBACK meanwhile would only disconnect behind it and get the message again. A fixed
  // connect_timeout_ms gave up on a session still being drained (a slow store, a long
  // backlog): it disconnected, the in-flight messages came again, and the next connection
  // met the same backlog. A wait past 5 s is logged once per connection.
  bool wait_acknowledged(const mqtt::token_ptr& t, const char* what, const std::string& filter) {
    using SteadyClock = std::chrono::steady_clock;
    const auto timeout = std::chrono::milliseconds(options.connect_timeout_ms);
    const auto slice = std::min<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(250));
    const auto began = SteadyClock::now();
    auto last_activity = began;
    int64_t seen = received.load();
    const int64_t at_start = seen;
    while (!t->wait_for(slice)) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping || connection_lost) return false;
      }
      const auto now = SteadyClock::now();
      const int64_t r = received.load();
      if (r != seen || in_callback.load() > 0) {
        seen = r;
        last_activity = now;
      } else if (now - last_activity >= timeout) {
        log->warn(
            "{} '{}' timed out: no acknowledgement and no message from the broker for {} ms "
            "(connect_timeout_ms)",
            what, detail::printable(filter), options.connect_timeout_ms);
        return false;
      }
      if (!said_waiting && now - began >= std::chrono::seconds(5)) {
        said_waiting = true;
        log->info(
            "{} '{}': waiting {} s for the broker's answer, which comes after the "
            "session's queued messages ({} arrived meanwhile)",
            what, detail::printable(filter),
            std::chrono::duration_cast<std::chrono::seconds>(now - began).count(), seen - at_start);
      }
    }
    return true;
  }

  // After CONNACK: UNSUBSCRIBEs what the session holds beyond the configured filters, and
  // SUBSCRIBEs the configured ones unless the session already holds exactly them (MQTT
  // 3.1.1: each SUBSCRIBE would resend the retained messages, section 3.3.1.3). MQTT 5
  // SUBSCRIBEs every time, with Retain Handling 1 ("send retained messages only for a new
  // subscription", MQTT 5.0 section 3.8.3.1): a SUBSCRIBE for an existing filter replaces
  // it and keeps its queue (MQTT 3.1.1 section 3.8.4). false: a SUBSCRIBE failed.
  bool subscribe_to_configuration() {
    const bool v5 = options.mqtt_version == MqttVersion::kV5;
    const detail::SessionKeeper::Plan plan = session->plan(v5);
    for (const std::string& stale : plan.unsubscribe) {
      mqtt::token_ptr ut = client->unsubscribe(stale);
      if (!wait_acknowledged(ut, "unsubscribe from stale topic filter", stale)) {
        log->warn("unsubscribe from stale topic filter '{}': trying again at the next connection",
                  detail::printable(stale));
        continue;
      }
      // MQTT 5 UNSUBACK: 0x00 success, 0x11 no subscription existed; >= 0x80 a refusal.
      const auto codes =
          v5 ? ut->get_unsubscribe_response().get_reason_codes() : std::vector<mqtt::ReasonCode>{};
      if (!codes.empty() && codes.front() >= 0x80) {
        log->warn(
            "broker refused to unsubscribe stale topic filter '{}' (reason code {}); "
            "trying again at the next connection",
            detail::printable(stale), static_cast<int>(codes.front()));
        continue;
      }
      session->unsubscribed(stale);
      log->warn(
          "unsubscribed topic filter '{}': the persistent session of client '{}' still "
          "held it, but it is no longer configured",
          detail::printable(stale), detail::printable(options.client_id));
    }
    if (!plan.subscribe) {
      log->info(
          "session of client '{}' holds the configured topic filters: not subscribing "
          "again (a SUBSCRIBE would resend retained messages)",
          detail::printable(options.client_id));
      return true;
    }
    const mqtt::subscribe_options sub_opts =
        v5 ? mqtt::subscribe_options(false, false, mqtt::subscribe_options::SEND_RETAINED_ON_NEW)
           : mqtt::subscribe_options();
    for (const auto& r : routes) {
      mqtt::token_ptr st = client->subscribe(r.first, 1, sub_opts);
      if (!wait_acknowledged(st, "subscribe to", r.first)) return false;
      const auto codes = st->get_subscribe_response().get_reason_codes();
      // The granted QoS (or a failure code >= 0x80). QoS 0 means no redelivery: as
      // bad as a refusal for an inbox (e.g. a broker max_qos or an ACL).
      if (!codes.empty() && (codes.front() >= 0x80 || codes.front() < 1)) {
        log->error(
            "broker did not grant QoS 1 for subscription '{}' (reason code {}); "
            "without QoS 1 nothing is redelivered",
            r.first, static_cast<int>(codes.front()));
        if (codes.front() < 0x80) session->subscribed(r.first);  // held, at QoS 0
        return false;
      }
      session->subscribed(r.first);
    }
    return true;
  }

  // One connection attempt: record the session expiry, CONNECT, then bring the session's
  // subscriptions to the configured filters (subscribe_to_configuration()).
  bool connect_once() {
    try {
      if (!detail::prepare_attempt(options, address, conn.get(), *log, &conn_opts)) return false;
      if (const Status s = session->before_connect(); !s.ok()) {
        conn->fail(ConnectionHealth::Failure::kOther,
                   "not connecting: cannot record the session of client '" +
                       detail::printable(options.client_id) + "' in the inbox (" + s.to_string() +
                       "); a session the Pruner does not know about could outlive the "
                       "retention window");
        return false;
      }
      // Asked again right before the CONNECT: the attempt's preparation (the TLS check,
      // the session record above) can take long enough for a lease to lapse meanwhile.
      if (options.may_connect && !options.may_connect()) return false;
      const detail::ConnectOutcome outcome =
          detail::connect_and_wait(*client, conn_opts, options, *log);
      if (!outcome.connected) {
        conn->connect_failed(outcome.rc, outcome.message);
        return false;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        last_connack = outcome.properties;
      }
      int64_t granted_expiry_ms = 0;
      const bool expiry_granted = granted_session_expiry(outcome.properties, &granted_expiry_ms);
      said_waiting = false;
      const bool session_present = outcome.session_present;
      const std::optional<detail::SessionKeeper::LostSession> lost =
          session->after_connack(session_present, expiry_granted ? &granted_expiry_ms : nullptr);
      ++connect_count;
      {
        if (lost) {
          // The inbox recorded a session (this process's last connection, or an earlier
          // run's) and the broker has none: what was queued for it is gone. At warn, the
          // journal's priority 4 (journal_log.h), and counted where a site looks:
          // health(), sessions_lost(), InboxStats::sessions_lost and its Prometheus text
          // (after_connack counted it in the Inboxes).
          ++lost_sessions;
          const std::string why = detail::lost_session_warning(
              options.broker_uri, options.client_id, *lost, Clock::system()->wall_ms());
          conn->session_lost(why);
          log->warn("{}", why);
        } else if (!session_present) {
          log->info(
              "broker {} has no session for client '{}' and the inbox records none "
              "with topic filters: a first connection; subscribing",
              options.broker_uri, options.client_id);
        } else {
          log->info("connected to {} with session present (client '{}')", options.broker_uri,
                    options.client_id);
        }
        const bool subscribed = subscribe_to_configuration();
        session->save();
        if (!subscribed) {
          client->disconnect();
          return false;
        }
      }
      // The one line that says messages published from now on reach this consumer: the
      // session holds every configured filter (SUBACK received, or kept from before).
      // "subscribing" above comes before the SUBSCRIBE; a publish between the two is
      // not queued for a new session (MQTT 5 section 3.8.4, 3.1.1 section 3.8.4).
      log->info("consuming: client '{}' holds its {} topic filter(s) at QoS 1",
                detail::printable(options.client_id), routes.size());
      return true;
    } catch (const mqtt::exception& e) {
      conn->fail(ConnectionHealth::Failure::kSubscribe,
                 std::string("connected, then Paho failed: ") + e.what());
      return false;
    }
  }

  void supervise() {
    int backoff = options.reconnect_backoff_initial_ms;
    for (bool first = true;; first = false) {
      bool lent_before = false;
      {
        std::unique_lock<std::mutex> lock(mu);
        if (stopping) return;
        lent_before = !lent.empty();
      }
      if (!first && lent_before) {
        renew_client();
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) return;  // stop() came while the old client was being destroyed
      }
      {
        // Cleared before connecting: a loss reported while connect_once() runs must wake
        // the wait below, not be forgotten.
        std::lock_guard<std::mutex> lock(mu);
        connection_lost = false;
        disconnect_reason = -1;
      }
      if (options.may_connect && !options.may_connect()) {
        // Not ours to connect now (a fleet slot whose lease is not held): ask again soon.
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::milliseconds(options.reconnect_backoff_initial_ms),
                    [&] { return stopping; });
        continue;
      }
      if (connect_once()) {
        const auto since = std::chrono::steady_clock::now();
        conn->set_connected(true);
        int reason = -1;
        {
          std::unique_lock<std::mutex> lock(mu);
          connected = true;
          if (watcher) watcher->connection_up(last_connack);
          cv.notify_all();
          cv.wait(lock, [&] { return stopping || connection_lost; });
          connected = false;
          reason = disconnect_reason;
          if (watcher) watcher->connection_down();
        }
        conn->set_connected(false);
        {
          std::unique_lock<std::mutex> lock(mu);
          if (stopping) return;
        }
        const auto lived = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - since)
                               .count();
        if (lived >= options.unstable_connection_ms) {
          backoff = options.reconnect_backoff_initial_ms;
          continue;  // a stable connection was lost: reconnect at once
        }
        log->warn("{}; backing off {} ms before reconnecting", short_connection_text(lived, reason),
                  backoff);
      } else if (!conn->attempt_failed()) {
        conn->fail(ConnectionHealth::Failure::kSubscribe,
                   "connected, but subscribing failed (see the log above)");
      }
      // A refused CONNECT will not be accepted sooner for asking again: wait the longest.
      const int wait_ms = conn->attempt_refused() ? options.reconnect_backoff_max_ms : backoff;
      if (conn->attempt_failed()) log->info("next connection attempt in {} ms", wait_ms);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return stopping; });
      backoff = std::min(backoff * 2, options.reconnect_backoff_max_ms);
    }
  }
};

Subscriber::Subscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Subscriber::~Subscriber() {
  if (!stop().ok()) {
    // The callback is still blocked on the store: destroying the client would hang, and
    // the callback and the supervisor still use the rest. Leave it all to the exit.
    (void)impl_.release();
    return;  // and the client-id lock stays held while that client lives
  }
  if (impl_->client_lock_fd >= 0) ::close(impl_->client_lock_fd);  // a stop() retried late
}

namespace {

// Paho C sends the PUBACK after the message callback returns only from 1.3.10 on (its
// change "ack after processing incoming message"); older versions ack before the
// callback runs, which voids the guarantee.
Status check_paho_version() {
  for (MQTTAsync_nameValue* nv = MQTTAsync_getVersionInfo(); nv && nv->name; ++nv) {
    if (std::strcmp(nv->name, "Version") != 0 && std::strcmp(nv->name, "Product version") != 0)
      continue;
    int major = 0, minor = 0, patch = 0;
    if (std::sscanf(nv->value, "%d.%d.%d", &major, &minor, &patch) >= 2) {
      if (std::make_tuple(major, minor, patch) < std::make_tuple(1, 3, 10))
        return Status::InvalidArgument(std::string("Paho MQTT C ") + nv->value +
                                       " acknowledges QoS 1 messages before the message "
                                       "callback runs; mqtt-inbox needs 1.3.10 or later");
      return Status::Ok();
    }
  }
  return Status::Ok();  // no version reported: nothing to check against
}

}  // namespace

Status Subscriber::create(const SubscriberOptions& options, std::unique_ptr<Subscriber>* out) {
  if (Status s = check_paho_version(); !s.ok()) return s;
  if (options.client_id.empty())
    return Status::InvalidArgument(
        "client_id is empty: the broker keeps the session (and the unacknowledged messages) "
        "under a stable client id");
  if (options.clean_session)
    return Status::InvalidArgument(
        "clean_session/clean_start=true would void redelivery: the broker would discard "
        "unacknowledged messages on reconnect (MQTT 3.1.1 section 3.1.2.4)");
  if (options.mqtt_version == MqttVersion::kV5 && options.session_expiry_s == 0)
    return Status::InvalidArgument(
        "session_expiry_s=0 would void redelivery: with MQTT 5 the session ends at "
        "disconnect and unacknowledged messages are lost (MQTT 5.0 section 3.1.2.11.2)");
  if (options.session_expiry_s == 0)
    return Status::InvalidArgument(
        "session_expiry_s=0: declare how long the broker keeps the session (MQTT 3.1.1: its "
        "persistent_client_expiration); the retention check needs it");
  if (options.receive_maximum == 0)
    return Status::InvalidArgument(
        "receive_maximum must be 1..65535 (MQTT 5.0 section 3.1.2.11.3)");
  if (options.stop_timeout_ms < 0) return Status::InvalidArgument("stop_timeout_ms must be >= 0");
  detail::BrokerAddress address;
  if (Status s = detail::check_connection_settings(options, &address); !s.ok()) return s;

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->address = address;
  impl->log = detail::logger_or_default(options.logger);
  impl->conn = std::make_unique<detail::HealthRecorder>(impl->options, address, impl->log);
  try {
    impl->client = impl->make_client();
  } catch (const mqtt::exception& e) {
    return Status::InvalidArgument(std::string("cannot create MQTT client: ") + e.what());
  }
  out->reset(new Subscriber(std::move(impl)));
  return Status::Ok();
}

Status Subscriber::subscribe(const std::string& topic_filter, MessageSink* consumer) {
  if (!consumer) return Status::InvalidArgument("sink is null");
  if (!consumer->sessions())
    return Status::InvalidArgument("sink '" + consumer->name() +
                                   "' has no session records: the subscriber records its "
                                   "session there (MessageSink::sessions())");
  // A filter the broker refuses would fail every SUBSCRIBE (mosquitto closes the
  // connection for it), connection after connection: refuse it here, once.
  if (Status s = check_topic_filter(topic_filter); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->started) return Status::InvalidArgument("subscribe() must be called before start()");
  for (const auto& r : impl_->routes)
    if (r.first == topic_filter)
      return Status::InvalidArgument("topic filter '" + topic_filter + "' already has a consumer");
  impl_->routes.emplace_back(topic_filter, consumer);
  return Status::Ok();
}

Status Subscriber::start() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.started) return Status::InvalidArgument("already started");
    if (m.routes.empty())
      return Status::InvalidArgument("no subscriptions: call subscribe() first");
    if (Status s = detail::take_client_id_lock(m.options.client_id_lock_dir, m.options.client_id,
                                               &m.client_lock_fd, &m.client_lock_path);
        !s.ok())
      return s;
    m.started = true;
  }
  m.install_callbacks(*m.client);
  m.conn_opts = detail::connect_options_builder(m.options, /*clean=*/false).finalize();
  // Set on the member itself, after the builder (see paho_ssl and conn_opts).
  detail::set_up_tls(m.options, m.address, m.conn.get(), *m.log, &m.paho_ssl, &m.conn_opts);
  m.conn->started();
  if (m.options.mqtt_version == MqttVersion::kV5) {
    // Set on the member itself, not through the builder (see conn_opts).
    mqtt::properties props{
        {mqtt::property::SESSION_EXPIRY_INTERVAL, static_cast<int>(m.options.session_expiry_s)},
        {mqtt::property::RECEIVE_MAXIMUM, static_cast<int>(m.options.receive_maximum)}};
    if (m.options.maximum_packet_size > 0)
      props.add(
          {mqtt::property::MAXIMUM_PACKET_SIZE, static_cast<int>(m.options.maximum_packet_size)});
    m.conn_opts.set_properties(props);
  }
  {
    std::vector<SessionRecords*> records;  // one per Inbox behind the sinks
    std::vector<std::string> filters;
    for (const auto& r : m.routes) {
      filters.push_back(r.first);
      if (std::find(records.begin(), records.end(), r.second->sessions()) == records.end())
        records.push_back(r.second->sessions());
    }
    m.session = std::make_unique<detail::SessionKeeper>(
        m.options.client_id, std::move(records), std::move(filters),
        1000LL * m.options.session_expiry_s,
        m.options.mqtt_version == MqttVersion::kV5 ? SessionExpirySource::kRequested
                                                   : SessionExpirySource::kDeclared,
        m.log);
  }
  m.supervisor = std::thread([&m] {
    m.supervise();
    std::lock_guard<std::mutex> lock(m.mu);
    m.supervisor_done = true;
    m.cv.notify_all();
  });
  return Status::Ok();
}

bool Subscriber::wait_connected(int timeout_ms) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return impl_->connected.load() || impl_->stopping;
  }) && impl_->connected.load();
}

bool Subscriber::is_connected() const { return impl_->connected.load(); }

Status Subscriber::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.started) {
      m.stopping = true;
      return Status::Ok();
    }
    // A stop() again after kBusy (a Fleet asks until the store answers) waits once more,
    // and finishes the stop once the message has committed.
    m.stopping = true;
    m.cv.notify_all();
  }
  // One deadline for everything stop() waits for. The supervisor can itself be stuck: a
  // redelivery arrives right after CONNACK, before the SUBSCRIBE, and while its callback
  // waits for the store it holds Paho's lock, which the supervisor's subscribe() waits
  // for. So it is joined only if it finished in time; otherwise the message is still in
  // the callback and stop() reports kBusy below.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(m.options.stop_timeout_ms);
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.cv.wait_until(lock, deadline, [&] { return m.supervisor_done; });
    if (!m.supervisor_done) {
      const bool first = !m.supervisor_detached;
      m.supervisor_detached = true;
      lock.unlock();
      if (first) {
        m.log->error(
            "stop: a message is still waiting for the store after {} ms (the connection "
            "was still being set up); it will not be acked before it commits. Exit the "
            "process; the broker redelivers it.",
            m.options.stop_timeout_ms);
        m.supervisor.detach();  // blocked in Paho behind the callback
      }
      return Status(Status::Code::kBusy, "a message is still waiting for the store");
    }
  }
  if (m.supervisor.joinable()) m.supervisor.join();

  // Wait for a message in the callback to reach its durable outcome.
  while (m.in_callback.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (m.in_callback.load() > 0) {
    if (!m.stop_reported_busy)
      m.log->error(
          "stop: a message is still waiting for the store after {} ms; it will not be "
          "acked before it commits. Exit the process; the broker redelivers it.",
          m.options.stop_timeout_ms);
    m.stop_reported_busy = true;
    return Status(Status::Code::kBusy, "a message is still waiting for the store");
  }
  try {
    if (m.client->is_connected())
      m.client->disconnect()->wait_for(std::chrono::milliseconds(m.options.stop_timeout_ms));
  } catch (const mqtt::exception& e) {
    m.log->info("disconnect: {}", e.what());
  }
  m.connected = false;
  // A clean stop: remove the lock file while still holding it.
  detail::release_client_id_lock(&m.client_lock_fd, m.client_lock_path);
  return Status::Ok();
}

ConnectionHealth Subscriber::health() const { return impl_->conn->snapshot(); }

namespace detail {

Status SubscriberConnection::attach(Subscriber& subscriber,
                                    std::shared_ptr<ConnectionWatcher> watcher) {
  Subscriber::Impl& m = *subscriber.impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.watcher)
    return Status::InvalidArgument("the subscriber's connection is already lent to a relay");
  m.watcher = watcher.get();
  // Kept once: a Relay restarted (stop, start) attaches its same link again.
  if (std::find(m.lent.begin(), m.lent.end(), watcher) == m.lent.end())
    m.lent.push_back(std::move(watcher));
  if (m.connected) m.watcher->connection_up(m.last_connack);
  return Status::Ok();
}

void SubscriberConnection::detach(Subscriber& subscriber, const ConnectionWatcher* watcher) {
  Subscriber::Impl& m = *subscriber.impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.watcher == watcher) m.watcher = nullptr;
}

std::shared_ptr<mqtt::async_client> SubscriberConnection::client(Subscriber& subscriber) {
  Subscriber::Impl& m = *subscriber.impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  return m.client;
}

MqttVersion SubscriberConnection::version(const Subscriber& subscriber) {
  return subscriber.impl_->options.mqtt_version;
}

}  // namespace detail

int64_t Subscriber::messages_received() const { return impl_->received.load(); }
int64_t Subscriber::connects() const { return impl_->connect_count.load(); }
int64_t Subscriber::sessions_lost() const { return impl_->lost_sessions.load(); }

}  // namespace mqtt_inbox

// Store-then-process, receipt: a message is stored (the store's store_received(), durable
// before the transport's callback returns and so before its PUBACK), or recognised as a
// duplicate, or dead-lettered with a named reason. Nothing here runs the application's
// handler; the workers (stp/workers.cpp) do.
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "inbox/message_id.h"
#include "inbox/properties_json.h"
#include "inbox/retained.h"
#include "store/lifetime.h"
#include "store/reentry.h"
#include "store/store.h"
#include "store/stp_rows.h"
#include "stp/store_then_process_impl.h"
#include "util/log.h"
#include "util/log_context.h"

namespace mqtt_inbox {

Outcome StoreThenProcess::Impl::receipt_dead_letter(const Message& m,
                                                    const std::optional<std::string>& id,
                                                    DeadLetterReason reason,
                                                    const std::string& text) {
  DeadLetter dl;
  dl.consumer_name = name;
  dl.message_id = id;
  dl.topic = m.topic;
  dl.payload = m.payload.substr(0, options.consumer.dead_letter_payload_bytes);
  dl.payload_size = static_cast<int64_t>(m.payload.size());
  dl.properties_json = detail::properties_json(m);
  dl.qos = m.qos;
  dl.reason = reason;
  dl.reason_text = text;
  dl.last_attempt_at_ms = clock->wall_ms();
  int64_t row = 0;
  until_stored("writing a dead letter",
               [&] { return store->add_dead_letter(dl, std::nullopt, &row); });
  count(&StoreThenProcessCounters::dead_lettered);
  log->warn("store-then-process '{}': dead-lettered message '{}' on topic '{}' as {} (row {}): {}",
            name, id ? detail::printable(*id) : std::string("<no id>"), detail::printable(m.topic),
            to_string(reason), row, detail::printable(text, 300));
  return Outcome::kDeadLettered;
}

Outcome StoreThenProcess::Impl::receive(const Message& m) {
  detail::LogContextScope log_fields(name);  // CONSUMER= (and below the id) in the journal
  const ConsumerOptions& o = options.consumer;
  // The message's expiry counts from here (the transport handed it over); the row keeps
  // its deadline, and the workers decide at processing (store_then_process.h).
  const int64_t received_at = retention_now();
  if (m.retain && o.retained != RetainedPolicy::kProcess) return receive_retained(m);
  if (m.payload.size() > o.max_payload_bytes) {
    // As Consumer: only the user property is consulted for an oversized payload.
    std::optional<std::string> id;
    if (const std::string* v = m.user_property(o.message_id.user_property))
      if (detail::validate_message_id(*v, o.message_id.max_id_bytes).empty()) id = *v;
    if (id) {
      bool found = false;
      until_stored("looking up a message", [&] { return rows->is_stored(*id, &found); });
      if (found) {
        count(&StoreThenProcessCounters::duplicates);
        return Outcome::kDuplicate;
      }
    }
    return receipt_dead_letter(m, id, DeadLetterReason::kPayloadTooLarge,
                               "payload is " + std::to_string(m.payload.size()) +
                                   " bytes, limit is " + std::to_string(o.max_payload_bytes));
  }

  std::string id;
  DeadLetterReason reason;
  std::string why;
  if (!detail::extract_message_id(m, o.message_id, &id, &reason, &why))
    return receipt_dead_letter(m, std::nullopt, reason, why);
  log_fields.set_message_id(id);

  std::string key;
  if (options.aggregate_key) {
    try {
      key = options.aggregate_key(m);
    } catch (const std::exception& e) {
      return receipt_dead_letter(m, id, DeadLetterReason::kUndecodablePayload,
                                 std::string("aggregate key extractor threw: ") + e.what());
    } catch (...) {
      return receipt_dead_letter(m, id, DeadLetterReason::kUndecodablePayload,
                                 "aggregate key extractor threw");
    }
  }

  const std::string props = detail::properties_json(m);
  std::optional<int64_t> expires_at;
  if (const auto e = detail::expiry_of(m, ExpiredPolicy::kDeadLetter, received_at))
    expires_at = e->expires_at();
  bool inserted = false;
  until_stored("storing",
               [&] { return rows->store_received(id, key, m, props, expires_at, &inserted); });
  if (!inserted) {
    count(&StoreThenProcessCounters::duplicates);
    return Outcome::kDuplicate;
  }
  count(&StoreThenProcessCounters::stored);
  if (inbox->options().after_commit_hook) inbox->options().after_commit_hook(name, id);
  notify_workers();
  return Outcome::kProcessed;
}

Outcome StoreThenProcess::reject(const Message& message, const std::string& why) {
  // From inside a handler of the same inbox: refused (store/reentry.h); that handler's message
  // is dead-lettered as handler_reentered.
  if (!detail::refuse_if_in_handler(impl_->inbox, "StoreThenProcess::reject").ok())
    return Outcome::kRefused;
  try {
    return impl_->receipt_dead_letter(message, std::nullopt, DeadLetterReason::kHandlerFailed, why);
  } catch (...) {
    std::abort();  // only bad_alloc can get here; never report an unrecorded message as done
  }
}

Outcome StoreThenProcess::handle(const Message& message) {
  if (!detail::refuse_if_in_handler(impl_->inbox, "StoreThenProcess::handle").ok())
    return Outcome::kRefused;
  Outcome o = Outcome::kDuplicate;
  try {
    o = impl_->receive(message);
  } catch (const std::exception& e) {
    // Only a bug (or std::bad_alloc) gets here. Never let it cross into the transport's
    // callback; the message was not stored, so die rather than ack it.
    impl_->log->critical("store-then-process '{}': unexpected error at receipt: {}", impl_->name,
                         e.what());
    std::abort();
  }
  if (impl_->log->should_log(spdlog::level::debug))
    impl_->log->debug("store-then-process '{}': message on '{}': {}", impl_->name,
                      detail::printable(message.topic), to_string(o));
  return o;
}

Outcome StoreThenProcess::Impl::receive_retained(const Message& m) {
  const ConsumerOptions& o = options.consumer;
  if (o.retained == RetainedPolicy::kSkip) {
    count(&StoreThenProcessCounters::retained_skipped);
    log->info("store-then-process '{}': {}", name, detail::retained_skip_text(m.topic));
    return Outcome::kSkipped;
  }
  // kDeadLetter, under its id when it has one (a repeat bumps the same row); the payload
  // of an oversized message is not parsed for it.
  std::string id;
  DeadLetterReason ignored;
  std::string why;
  if (m.payload.size() > o.max_payload_bytes ||
      !detail::extract_message_id(m, o.message_id, &id, &ignored, &why))
    return receipt_dead_letter(m, std::nullopt, DeadLetterReason::kRetained,
                               detail::retained_dead_letter_text());
  bool found = false;
  until_stored("looking up a message", [&] { return rows->is_stored(id, &found); });
  if (found) {
    count(&StoreThenProcessCounters::duplicates);
    return Outcome::kDuplicate;
  }
  return receipt_dead_letter(m, id, DeadLetterReason::kRetained,
                             detail::retained_dead_letter_text());
}

}  // namespace mqtt_inbox

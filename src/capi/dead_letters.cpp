// Dead letters from C: the list as JSON and the requeue (c.h, "Dead letters").
#include <nlohmann/json.hpp>

#include "capi/handles.h"

using mqtt_inbox::capi::guarded;

extern "C" {

int mqtt_inbox_dead_letters_json(mqtt_inbox_t* inbox, const char* consumer_name, int64_t limit,
                                 char** json) {
  if (!inbox) return MQTT_INBOX_MISUSE;
  auto& err = inbox->error;
  return guarded(&err, [&] {
    if (!json) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_dead_letters_json: NULL json");
    mqtt_inbox::DeadLetterFilter f;
    if (consumer_name) f.consumer_name = consumer_name;
    f.limit = limit;
    std::vector<mqtt_inbox::DeadLetter> rows;
    if (int r = err.set(inbox->inbox->list_dead_letters(f, &rows))) return r;
    nlohmann::json a = nlohmann::json::array();
    for (const auto& d : rows) {
      a.push_back({{"id", d.id},
                   {"consumer", d.consumer_name},
                   {"message_id", d.message_id ? nlohmann::json(*d.message_id) : nullptr},
                   {"topic", d.topic},
                   {"payload", d.payload},
                   {"payload_size", d.payload_size},
                   {"qos", d.qos},
                   {"reason", mqtt_inbox::to_string(d.reason)},
                   {"reason_text", d.reason_text},
                   {"attempts", d.attempts},
                   {"first_attempt_at_ms", d.first_attempt_at_ms},
                   {"last_attempt_at_ms", d.last_attempt_at_ms},
                   {"dead_lettered_at_ms", d.dead_lettered_at_ms},
                   {"redeliveries", d.redeliveries},
                   {"status", d.replayed   ? "replayed"
                              : d.requeued ? "requeued"
                                           : "dead"}});
    }
    char* p = mqtt_inbox::capi::malloc_copy(
        a.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (!p) return err.set(MQTT_INBOX_NOMEM, "out of memory");
    *json = p;
    return MQTT_INBOX_OK;
  });
}

int mqtt_inbox_dead_letter_requeue(mqtt_inbox_t* inbox, int64_t id) {
  if (!inbox) return MQTT_INBOX_MISUSE;
  return guarded(&inbox->error,
                 [&] { return inbox->error.set(inbox->inbox->requeue_dead_letter(id)); });
}

}  // extern "C"

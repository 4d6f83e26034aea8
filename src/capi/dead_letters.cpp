// Dead letters from C: the list as JSON and the requeue (c.h, "Dead letters").
#include <string>
#include <vector>

#include "capi/handles.h"
#include "capi/json_text.h"

using mqtt_inbox::capi::JsonObject;
using mqtt_inbox::capi::Kind;
using mqtt_inbox::capi::with_handle;

extern "C" {

int mqtt_inbox_dead_letters_json(mqtt_inbox_t* inbox, const char* consumer_name, int64_t limit,
                                 char** json) {
  return with_handle(inbox, Kind::kInbox, [&] {
    auto& err = inbox->error;
    if (!json) return err.set(MQTT_INBOX_MISUSE, "mqtt_inbox_dead_letters_json: NULL json");
    mqtt_inbox::DeadLetterFilter f;
    if (consumer_name) f.consumer_name = consumer_name;
    f.limit = limit;
    std::vector<mqtt_inbox::DeadLetter> rows;
    if (int r = err.set(inbox->inbox->list_dead_letters(f, &rows))) return r;
    // As text, not an nlohmann document (capi/json_text.h: out of memory must be NOMEM).
    std::string a = "[";
    for (const auto& d : rows) {
      if (a.size() > 1) a += ',';
      JsonObject o;
      o.number("id", d.id).text("consumer", d.consumer_name);
      if (d.message_id)
        o.text("message_id", *d.message_id);
      else
        o.null("message_id");
      a += o.text("topic", d.topic)
               .text("payload", d.payload)
               .number("payload_size", d.payload_size)
               .number("qos", d.qos)
               .text("reason", mqtt_inbox::to_string(d.reason))
               .text("reason_text", d.reason_text)
               .number("attempts", d.attempts)
               .number("first_attempt_at_ms", d.first_attempt_at_ms)
               .number("last_attempt_at_ms", d.last_attempt_at_ms)
               .number("dead_lettered_at_ms", d.dead_lettered_at_ms)
               .number("redeliveries", d.redeliveries)
               .text("status", d.replayed   ? "replayed"
                               : d.requeued ? "requeued"
                                            : "dead")
               .done();
    }
    a += ']';
    return mqtt_inbox::capi::hand_out_json(a, &err, json);
  });
}

int mqtt_inbox_dead_letter_requeue(mqtt_inbox_t* inbox, int64_t id) {
  return with_handle(inbox, Kind::kInbox,
                     [&] { return inbox->error.set(inbox->inbox->requeue_dead_letter(id)); });
}

}  // extern "C"

/* include/mqtt_inbox/c.h as C89, C99, C11 and C++ see it (ctests capi_header_*): compiled
 * with -pedantic -Werror, every _INIT macro used the way a program uses it. Not run. */
#include <mqtt_inbox/c.h>

int mqtt_inbox_header_check(void);

int mqtt_inbox_header_check(void) {
  mqtt_inbox_options_t o = MQTT_INBOX_OPTIONS_INIT;
  mqtt_inbox_consumer_options_t co = MQTT_INBOX_CONSUMER_OPTIONS_INIT;
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  mqtt_inbox_consumer_counters_t cc = MQTT_INBOX_CONSUMER_COUNTERS_INIT;
  mqtt_inbox_subscriber_options_t so = MQTT_INBOX_SUBSCRIBER_OPTIONS_INIT;
  mqtt_inbox_connection_health_t h = MQTT_INBOX_CONNECTION_HEALTH_INIT;
  mqtt_inbox_outbox_class_t oc = MQTT_INBOX_OUTBOX_CLASS_INIT;
  mqtt_inbox_outbox_options_t oo = MQTT_INBOX_OUTBOX_OPTIONS_INIT;
  mqtt_inbox_outgoing_t og = MQTT_INBOX_OUTGOING_INIT;
  mqtt_inbox_relay_options_t ro = MQTT_INBOX_RELAY_OPTIONS_INIT;
  mqtt_inbox_pruner_options_t po = MQTT_INBOX_PRUNER_OPTIONS_INIT;
  return o.struct_version + co.struct_version + m.struct_version + cc.struct_version +
         so.struct_version + h.struct_version + oc.struct_version + oo.struct_version +
         og.struct_version + ro.struct_version + po.struct_version +
         (mqtt_inbox_version(NULL) == MQTT_INBOX_C_VERSION_NUMBER);
}

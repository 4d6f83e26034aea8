/* An installed mqtt_inbox from C: open the file given as argv[1], create a table, feed
 * one message twice through a consumer, and check that its effect is there once. */
#include <mqtt_inbox/c.h>
#include <stdio.h>
#include <string.h>

static int apply(void* ctx, sqlite3* db, const mqtt_inbox_delivery_t* d) {
  (void)ctx;
  (void)d;
  return sqlite3_exec(db, "UPDATE counter SET n = n + 1", NULL, NULL, NULL) == SQLITE_OK
             ? MQTT_INBOX_HANDLER_OK
             : MQTT_INBOX_HANDLER_RETRY;
}

int main(int argc, char** argv) {
  mqtt_inbox_t* inbox = NULL;
  mqtt_inbox_consumer_t* consumer = NULL;
  mqtt_inbox_message_t m = MQTT_INBOX_MESSAGE_INIT;
  const char* payload = "{\"message_id\":\"m-1\"}";
  char* err = NULL;
  int first = -1, second = -1;
  if (argc != 2) return 2;
  printf("mqtt_inbox %d\n", mqtt_inbox_version(NULL));
  if (mqtt_inbox_open(argv[1], NULL, &inbox, &err) != MQTT_INBOX_OK) {
    fprintf(stderr, "open: %s\n", err);
    return 1;
  }
  if (mqtt_inbox_setup(inbox,
                       "CREATE TABLE IF NOT EXISTS counter (n INTEGER);"
                       "INSERT INTO counter SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM counter)") ||
      mqtt_inbox_consumer_create(inbox, "c", apply, NULL, NULL, &consumer)) {
    fprintf(stderr, "%s\n", mqtt_inbox_errmsg(inbox));
    return 1;
  }
  m.topic = "t";
  m.payload = payload;
  m.payload_len = strlen(payload);
  if (mqtt_inbox_consumer_feed(consumer, &m, &first) ||
      mqtt_inbox_consumer_feed(consumer, &m, &second))
    return 1;
  mqtt_inbox_consumer_destroy(consumer);
  mqtt_inbox_close(inbox);
  if (first != MQTT_INBOX_OUTCOME_PROCESSED || second != MQTT_INBOX_OUTCOME_DUPLICATE) {
    fprintf(stderr, "outcomes %d %d\n", first, second);
    return 1;
  }
  printf("processed once, duplicate skipped\n");
  return 0;
}

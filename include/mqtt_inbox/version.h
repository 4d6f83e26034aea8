/* Library version. Follows semantic versioning; the schema has its own version
 * (kSchemaVersion in inbox.h). Plain macros and C comments: c.h includes it, and C89
 * reads it. */
#ifndef MQTT_INBOX_VERSION_H
#define MQTT_INBOX_VERSION_H

#define MQTT_INBOX_VERSION_MAJOR 0
#define MQTT_INBOX_VERSION_MINOR 4
#define MQTT_INBOX_VERSION_PATCH 0
#define MQTT_INBOX_VERSION_STRING "0.4.0"

#endif /* MQTT_INBOX_VERSION_H */

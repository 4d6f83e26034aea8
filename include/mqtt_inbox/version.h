// Library version. Follows semantic versioning; the schema has its own version
// (kSchemaVersion in inbox.h).
#pragma once

#define MQTT_INBOX_VERSION_MAJOR 0
#define MQTT_INBOX_VERSION_MINOR 4
#define MQTT_INBOX_VERSION_PATCH 0
#define MQTT_INBOX_VERSION_STRING "0.4.0"

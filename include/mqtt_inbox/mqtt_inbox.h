// Umbrella header: the whole public API of mqtt-inbox.
#pragma once

#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/consumer.h"
#include "mqtt_inbox/dead_letter.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/journal_log.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/options.h"
#include "mqtt_inbox/retention.h"
#include "mqtt_inbox/service_notifier.h"
#include "mqtt_inbox/stats.h"
#include "mqtt_inbox/status.h"
#include "mqtt_inbox/store_then_process.h"
#include "mqtt_inbox/subscriber.h"
#include "mqtt_inbox/version.h"

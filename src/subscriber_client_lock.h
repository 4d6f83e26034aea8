// Internal (MQTT layer): the per-host lock on a client id (SubscriberOptions::
// client_id_lock_dir), so that two processes on one host never take one MQTT session
// from each other. Defined in subscriber_client_lock.cpp.
#pragma once

#include <string>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox {
namespace detail {

// The folder for the lock files: `configured`, or for "auto" $RUNTIME_DIRECTORY (its
// first entry), else /run/mqtt-inbox if writable, else /tmp.
std::string client_id_lock_dir(const std::string& configured);

// Takes an exclusive flock(2) on `path` (created 0644 if missing) and stores the open
// descriptor in *fd_out. Errors: kBusy when another process holds it (or the file keeps
// being replaced), kIoError when it cannot be opened.
Status lock_client_id(const std::string& path, const std::string& client_id, int* fd_out);

}  // namespace detail
}  // namespace mqtt_inbox

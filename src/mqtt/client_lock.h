// Internal (MQTT layer): the per-host lock on a client id (SubscriberOptions::
// client_id_lock_dir, RelayOptions::client_id_lock_dir), so that two processes on one host never
// take one MQTT session from each other. Defined in mqtt/client_lock.cpp.
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

// The lock of a client's start(): "<dir>/mqtt-inbox-client-<id>.lock" with `dir` from
// client_id_lock_dir(configured) and the id made safe for a file name (other bytes as
// %xx), locked with lock_client_id(). `configured` "" takes no lock (OK, *fd_out -1).
// On success *fd_out holds the descriptor and *path_out the file. Errors: as
// lock_client_id().
Status take_client_id_lock(const std::string& configured, const std::string& client_id, int* fd_out,
                           std::string* path_out);

// A clean stop: removes the lock file while still holding it, then closes it. Does
// nothing if *fd is -1; sets it to -1.
void release_client_id_lock(int* fd, const std::string& path);

}  // namespace detail
}  // namespace mqtt_inbox

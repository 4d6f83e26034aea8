// The C API's errors (include/mqtt_inbox/c.h): result codes from a Status, the last error
// message each handle keeps, and the guard every entry point runs its body in, so that no
// C++ exception crosses into C (std::bad_alloc becomes MQTT_INBOX_NOMEM, anything else
// MQTT_INBOX_INTERNAL).
#pragma once

#include <mutex>
#include <new>
#include <string>

#include "mqtt_inbox/c.h"
#include "mqtt_inbox/status.h"

namespace mqtt_inbox::capi {

// The result code of a Status (the codes of c.h follow Status::Code's order).
int to_rc(const Status& s) noexcept;

// The last failure on one handle. Written by any thread; read() copies it into a buffer of
// the reading thread, so the pointer c.h hands out cannot be freed by another thread.
class LastError {
 public:
  // Records `message` for result `rc`; returns rc. Never throws (an allocation failure
  // keeps a fixed text instead).
  int set(int rc, const char* message) noexcept;
  int set(int rc, const std::string& message) noexcept { return set(rc, message.c_str()); }
  // Records s; returns its code (OK clears the message).
  int set(const Status& s) noexcept;
  // A call succeeded: the message is "" again, as sqlite3_errmsg's after a success.
  void clear() noexcept;
  // The message, valid until the next read() on this thread.
  const char* read() const noexcept;

 private:
  mutable std::mutex mu_;
  std::string text_;
};

// Runs `body` (which returns a result code) and turns whatever it throws into a code,
// recorded in `err` when there is one; MQTT_INBOX_OK clears `err`.
template <typename Body>
int guarded(LastError* err, Body&& body) noexcept {
  try {
    const int rc = body();
    if (rc == MQTT_INBOX_OK && err) err->clear();
    return rc;
  } catch (const std::bad_alloc&) {
    return err ? err->set(MQTT_INBOX_NOMEM, "out of memory") : MQTT_INBOX_NOMEM;
  } catch (const std::exception& e) {
    return err ? err->set(MQTT_INBOX_INTERNAL, e.what()) : MQTT_INBOX_INTERNAL;
  } catch (...) {
    return err ? err->set(MQTT_INBOX_INTERNAL, "unknown exception") : MQTT_INBOX_INTERNAL;
  }
}

// A copy of `s` in memory from malloc (for mqtt_inbox_free), or nullptr.
char* malloc_copy(const std::string& s) noexcept;
// The same for a C string, with no std::string on the way: callable outside guarded()
// (an error message handed out after the guarded body, as mqtt_inbox_open does), where a
// std::string temporary's std::bad_alloc would cross into C. nullptr for nullptr.
char* malloc_copy(const char* s) noexcept;

}  // namespace mqtt_inbox::capi

// The structs behind c.h's opaque handles, and the registry that knows which are live.
// Every entry point looks a handle up before it reads a byte of it, so a handle used after
// its close, closed twice or passed as another kind is MQTT_INBOX_MISUSE, not a crash; and
// a handle that something still uses (a child made from it, another thread inside a call
// on it) is not freed: its close or destroy returns MQTT_INBOX_BUSY, as sqlite3_close does
// (c.h, the conventions). Only src/capi/ sees these.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "capi/errors.h"
#include "mqtt_inbox/consumer.h"
#include "mqtt_inbox/inbox.h"
#include "mqtt_inbox/subscriber.h"

namespace mqtt_inbox::capi {

enum class Kind { kInbox, kConsumer, kSubscriber, kOutbox, kRelay, kPruner };

// "mqtt_inbox_t", "mqtt_inbox_consumer_t", ...
const char* type_name(Kind kind) noexcept;

// What every handle is besides its C++ object. The counters are the registry's (read and
// written under its lock only).
struct Handle {
  explicit Handle(Kind k) noexcept : kind(k) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() = default;

  const Kind kind;
  LastError error;
  int calls = 0;                 // entry points running with this handle now
  int children = 0;              // live handles that use this one (consumers of an inbox, ...)
  std::vector<Handle*> parents;  // the handles this one uses: each counts it as a child
};

// Makes `h` live, each of `parents` (live, held by the caller's Use) gaining it as a
// child. Throws std::bad_alloc (then nothing changed).
void adopt(Handle* h, std::initializer_list<Handle*> parents);
// Links a live `child` to a live `parent` (a subscriber to a consumer it routes to), once:
// a second link between the two is a no-op. Throws std::bad_alloc.
void link(Handle* child, Handle* parent);

// An entry point's hold on a handle: live and of `kind`, or not (then nothing may be read
// of it). While held, the handle is not freed.
class Use {
 public:
  Use(const void* p, Kind kind) noexcept;
  ~Use();
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;
  explicit operator bool() const noexcept { return h_ != nullptr; }

 private:
  Handle* h_ = nullptr;
};

// Takes `p` out of the live handles so that its owner may free it: MQTT_INBOX_OK, or
// MQTT_INBOX_MISUSE (not live, or another kind), or MQTT_INBOX_BUSY (children alive, or
// another call inside it: *why says which) with nothing changed. After OK, the caller
// frees the object and then calls finish_release.
int begin_release(const void* p, Kind kind, std::string* why) noexcept;
// Drops `h`'s links to its parents (after the object is freed; its parents were held
// until then, so nothing it used was freed under it).
void finish_release(std::vector<Handle*> parents) noexcept;

// Marks this thread as running application code the library called back (a handler, an
// id extractor, a set-up function) for as long as it lives.
class InCallback {
 public:
  InCallback() noexcept;
  ~InCallback();
  InCallback(const InCallback&) = delete;
  InCallback& operator=(const InCallback&) = delete;
  // True on a thread inside such a callback.
  static bool active() noexcept;
};

// MQTT_INBOX_MISUSE with the text saying that `call` waits for another thread and may not
// be made from a callback; recorded in `err` if there is one.
int refused_in_callback(LastError* err, const char* call) noexcept;

// Runs `body` for a live handle `h` of kind `kind` under guarded(): MQTT_INBOX_MISUSE if it
// is not one; the handle's error is set by a failure and cleared by a success.
template <typename H, typename Body>
int with_handle(H* h, Kind kind, Body&& body) noexcept {
  Use use(h, kind);
  if (!use) return MQTT_INBOX_MISUSE;
  return guarded(&h->error, std::forward<Body>(body));
}

// The text *_errmsg returns for a handle that is not live.
const char* dead_handle_text(Kind kind) noexcept;

// Frees a handle made by new, through the registry: `p` is taken out of the live handles
// (or the call refused, see begin_release), deleted as T, then unlinked from its parents.
// `stop` runs between taking it out and deleting it (a subscriber's stop), and its code
// is returned if the rest succeeded. Never throws.
template <typename T, typename Stop>
int release_handle(T* p, Kind kind, const char* call, Stop&& stop) noexcept {
  if (!p) return MQTT_INBOX_OK;
  std::string why;
  if (int rc = begin_release(p, kind, &why)) {
    // Only a live handle has an error to set: a BUSY one is live.
    if (rc == MQTT_INBOX_BUSY) p->error.set(rc, std::string(call) + ": " + why);
    return rc;
  }
  int rc = MQTT_INBOX_OK;
  try {
    rc = stop(p);
  } catch (...) {
    rc = MQTT_INBOX_INTERNAL;
  }
  std::vector<Handle*> parents = std::move(p->parents);
  delete p;
  finish_release(std::move(parents));
  return rc;
}

}  // namespace mqtt_inbox::capi

struct mqtt_inbox_t : mqtt_inbox::capi::Handle {
  mqtt_inbox_t() noexcept : Handle(mqtt_inbox::capi::Kind::kInbox) {}
  std::unique_ptr<mqtt_inbox::Inbox> inbox;
  bool low_memory = true;  // mqtt_inbox_options_t.low_memory
};

struct mqtt_inbox_consumer_t : mqtt_inbox::capi::Handle {
  mqtt_inbox_consumer_t() noexcept : Handle(mqtt_inbox::capi::Kind::kConsumer) {}
  mqtt_inbox_t* owner = nullptr;
  mqtt_inbox_handler handler = nullptr;
  void* ctx = nullptr;
  std::unique_ptr<mqtt_inbox::Consumer> consumer;
};

namespace mqtt_inbox::capi {

// The C++ Subscriber behind a C subscriber handle (capi/subscriber.cpp keeps the handle's
// struct), for a relay lent its connection (mqtt_inbox_relay_create_on).
mqtt_inbox::Subscriber* subscriber_of(mqtt_inbox_subscriber_t* subscriber) noexcept;
// The same handle as the registry's Handle (its struct is complete in subscriber.cpp only).
Handle* handle_of(mqtt_inbox_subscriber_t* subscriber) noexcept;

// Writes `h` into the caller's *out (subscriber and relay health), the fields of its
// version (capi/sized_struct.h).
int write_connection_health(const ConnectionHealth& h, mqtt_inbox_connection_health_t* out,
                            LastError* err);

}  // namespace mqtt_inbox::capi

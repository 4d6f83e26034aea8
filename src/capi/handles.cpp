// The registry of live C handles (capi/handles.h): a map from address to kind under one
// mutex, taken for the length of a lookup, never while the library runs.
#include "capi/handles.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace mqtt_inbox::capi {

namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, Handle*> live;
};

// Never destroyed: a handle may be used from a static destructor or an atexit function.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// The live handle at `p` of `kind`, or null. Under the registry's lock.
Handle* find_locked(Registry& r, const void* p, Kind kind) {
  if (!p) return nullptr;
  const auto it = r.live.find(p);
  if (it == r.live.end() || it->second->kind != kind) return nullptr;
  return it->second;
}

thread_local int callback_depth = 0;

}  // namespace

const char* type_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::kInbox:
      return "mqtt_inbox_t";
    case Kind::kConsumer:
      return "mqtt_inbox_consumer_t";
    case Kind::kSubscriber:
      return "mqtt_inbox_subscriber_t";
    case Kind::kOutbox:
      return "mqtt_inbox_outbox_t";
    case Kind::kRelay:
      return "mqtt_inbox_relay_t";
    case Kind::kPruner:
      return "mqtt_inbox_pruner_t";
  }
  return "handle";
}

const char* dead_handle_text(Kind kind) noexcept {
  switch (kind) {
    case Kind::kInbox:
      return "not a live mqtt_inbox_t: NULL, closed, or a handle of another kind";
    case Kind::kConsumer:
      return "not a live mqtt_inbox_consumer_t: NULL, destroyed, or a handle of another kind";
    case Kind::kSubscriber:
      return "not a live mqtt_inbox_subscriber_t: NULL, destroyed, or a handle of another kind";
    case Kind::kOutbox:
      return "not a live mqtt_inbox_outbox_t: NULL, destroyed, or a handle of another kind";
    case Kind::kRelay:
      return "not a live mqtt_inbox_relay_t: NULL, destroyed, or a handle of another kind";
    case Kind::kPruner:
      return "not a live mqtt_inbox_pruner_t: NULL, destroyed, or a handle of another kind";
  }
  return "not a live handle";
}

void adopt(Handle* h, std::initializer_list<Handle*> parents) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // The two allocations first, so that a std::bad_alloc leaves everything as it was.
  h->parents.reserve(parents.size());
  r.live.emplace(h, h);
  for (Handle* p : parents) {
    h->parents.push_back(p);
    ++p->children;
  }
}

void link(Handle* child, Handle* parent) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (std::find(child->parents.begin(), child->parents.end(), parent) != child->parents.end())
    return;
  child->parents.push_back(parent);
  ++parent->children;
}

Use::Use(const void* p, Kind kind) noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  h_ = find_locked(r, p, kind);
  if (h_) ++h_->calls;
}

Use::~Use() {
  if (!h_) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  --h_->calls;
}

int begin_release(const void* p, Kind kind, std::string* why) noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Handle* h = find_locked(r, p, kind);
  if (!h) return MQTT_INBOX_MISUSE;
  if (h->children > 0 || h->calls > 0) {
    try {
      if (h->children > 0)
        *why = std::to_string(h->children) +
               (kind == Kind::kInbox        ? " consumer(s), outbox(es) or pruner(s) made on it"
                : kind == Kind::kConsumer   ? " subscriber(s) routing messages to it"
                : kind == Kind::kOutbox     ? " relay(s) publishing its rows"
                : kind == Kind::kSubscriber ? " relay(s) publishing on its connection"
                                            : " handle(s) using it") +
               " still alive: destroy them first; nothing was freed";
      else
        *why = "another thread is inside a call on it; nothing was freed";
    } catch (...) {
      why->clear();
    }
    return MQTT_INBOX_BUSY;
  }
  r.live.erase(h);
  return MQTT_INBOX_OK;
}

void finish_release(std::vector<Handle*> parents) noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (Handle* p : parents) --p->children;
}

InCallback::InCallback() noexcept { ++callback_depth; }
InCallback::~InCallback() { --callback_depth; }
bool InCallback::active() noexcept { return callback_depth > 0; }

int refused_in_callback(LastError* err, const char* call) noexcept {
  if (!err) return MQTT_INBOX_MISUSE;
  char text[512];
  std::snprintf(text, sizeof text,
                "%s was called from inside a handler, an id extractor or a set-up function: it "
                "waits for another thread, which may be waiting for the one this callback "
                "holds, so it is refused (from a handler, ask for a subscriber's stop with "
                "mqtt_inbox_subscriber_request_stop)",
                call);
  return err->set(MQTT_INBOX_MISUSE, text);
}

}  // namespace mqtt_inbox::capi

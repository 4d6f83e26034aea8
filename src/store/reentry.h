// Internal: handler re-entry. While the library runs a handler for an Inbox, that handler
// holds the Inbox's connection: the Inbox's mutex (Consumer mode) or SQLite's write lock
// (store-then-process workers). A call from the handler back into that Inbox, or into a
// Consumer, Pruner or StoreThenProcess built on it, would wait for what its own thread
// holds: on Paho's callback thread that is a silent hang (no PUBACK, no log). So the
// library marks the thread while a handler runs, every public call that touches the
// store checks the mark first, and a call made from inside the handler is refused and
// remembered: the handler's message is then dead-lettered as handler_reentered, whatever
// the handler did with the refusal (handler.h states the rule).
//
// Thread safety: the marks are thread_local; a HandlerScope lives on one thread's stack.
#pragma once

#include <string>

#include "mqtt_inbox/status.h"

namespace mqtt_inbox {
class Inbox;
}

namespace mqtt_inbox::detail {

// Marks the current thread as running a handler for `inbox` for its lifetime. Scopes
// nest (a handler of one inbox may use another inbox, whose handler then runs inside).
class HandlerScope {
 public:
  explicit HandlerScope(const Inbox* inbox);
  ~HandlerScope();
  HandlerScope(const HandlerScope&) = delete;
  HandlerScope& operator=(const HandlerScope&) = delete;

  // The first refused call the handler made back into its inbox, e.g.
  // "Inbox::list_dead_letters"; empty if none.
  const std::string& reentered_call() const { return call_; }
  // The dead letter's reason text for such a handler.
  std::string reentry_text() const;

 private:
  friend Status refuse_if_in_handler(const Inbox*, const char*);
  friend bool in_handler_of(const Inbox*);
  const Inbox* inbox_;
  HandlerScope* outer_;
  std::string call_;
};

// OK unless the calling thread runs a handler for `inbox`. Then the call is refused: it
// returns kInvalidArgument naming `call` and the rule, and the handler's scope records it.
// The first line of every public method that takes the Inbox's mutex or writes its file.
Status refuse_if_in_handler(const Inbox* inbox, const char* call);

// Whether the calling thread runs a handler for `inbox`, without refusing or recording
// anything: for a call that stays allowed there but must then skip its store write
// (SessionRecords::note_lost).
bool in_handler_of(const Inbox* inbox);

}  // namespace mqtt_inbox::detail

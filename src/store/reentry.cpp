// Handler re-entry: the thread's marks and the refusal (store/reentry.h).
#include "store/reentry.h"

namespace mqtt_inbox::detail {

namespace {
thread_local HandlerScope* t_innermost = nullptr;
}  // namespace

HandlerScope::HandlerScope(const Inbox* inbox) : inbox_(inbox), outer_(t_innermost) {
  t_innermost = this;
}

HandlerScope::~HandlerScope() { t_innermost = outer_; }

std::string HandlerScope::reentry_text() const {
  return "the handler called " + call_ +
         " on its own inbox, which would deadlock (the handler holds the inbox's connection); "
         "use the SQLite::Database& the handler is given (handler.h)";
}

bool in_handler_of(const Inbox* inbox) {
  for (HandlerScope* s = t_innermost; s; s = s->outer_)
    if (s->inbox_ == inbox) return true;
  return false;
}

Status refuse_if_in_handler(const Inbox* inbox, const char* call) {
  for (HandlerScope* s = t_innermost; s; s = s->outer_) {
    if (s->inbox_ != inbox) continue;
    if (s->call_.empty()) s->call_ = call;
    return Status::InvalidArgument(std::string(call) +
                                   " called from inside a handler of this inbox: refused, it "
                                   "would deadlock; the message is dead-lettered as "
                                   "handler_reentered (handler.h)");
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail

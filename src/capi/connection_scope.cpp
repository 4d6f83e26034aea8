// The connections lent to C code, per thread (capi/connection_scope.h).
#include "capi/connection_scope.h"

#include <SQLiteCpp/Database.h>

namespace mqtt_inbox::capi {

namespace {
thread_local ConnectionScope* innermost = nullptr;
}

ConnectionScope::ConnectionScope(SQLite::Database* db) noexcept : db_(db), outer_(innermost) {
  innermost = this;
}

ConnectionScope::~ConnectionScope() { innermost = outer_; }

ConnectionScope* ConnectionScope::find(sqlite3* handle) noexcept {
  for (ConnectionScope* s = innermost; s; s = s->outer_)
    if (s->db_->getHandle() == handle) return s;
  return nullptr;
}

void ConnectionScope::note_refusal(Refusal r, const std::string& text) {
  if (refusal_ != Refusal::kNone) return;
  refusal_ = r;
  refusal_text_ = text;
}

}  // namespace mqtt_inbox::capi

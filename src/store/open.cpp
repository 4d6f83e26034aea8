// Which store a location names (Inbox::open): a PostgreSQL connection URI, or an SQLite
// file. The one place that decides it, so the programs, the admin tool and the library
// agree.
#include <string>

#include "store/store.h"

namespace mqtt_inbox::detail {

bool is_postgres_location(const std::string& location) {
  return location.rfind("postgresql://", 0) == 0 || location.rfind("postgres://", 0) == 0;
}

Status open_store(const std::string& location, const InboxOptions& options,
                  std::unique_ptr<Store>* out) {
  if (is_postgres_location(location)) {
#if MQTT_INBOX_WITH_POSTGRES
    return open_postgres_store(location, options, out);
#else
    return Status::InvalidArgument(
        "this build of mqtt-inbox has no PostgreSQL store (configured with "
        "MQTT_INBOX_WITH_POSTGRES=OFF): it cannot open a postgresql:// location");
#endif
  }
  return open_sqlite_store(location, options, out);
}

}  // namespace mqtt_inbox::detail

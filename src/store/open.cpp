// Which store a location names (Inbox::open): a PostgreSQL connection URI, or an SQLite
// file. The one place that decides it, so the programs, the admin tool and the library
// agree. The PostgreSQL store lives in its own library (mqtt_inbox_postgres), which
// registers its opener here when the program calls enable_postgres_store() (postgres.h).
#include <atomic>
#include <string>

#include "store/store.h"

namespace mqtt_inbox::detail {

namespace {
// Constant-initialised (std::atomic's constexpr constructor): set before any Inbox::open
// that follows enable_postgres_store(), whatever the order of static initialisers.
std::atomic<StoreOpener> g_postgres_opener{nullptr};
}  // namespace

void register_postgres_opener(StoreOpener opener) {
  g_postgres_opener.store(opener, std::memory_order_release);
}

bool is_postgres_location(const std::string& location) {
  return location.rfind("postgresql://", 0) == 0 || location.rfind("postgres://", 0) == 0;
}

Status open_store(const std::string& location, const InboxOptions& options,
                  std::unique_ptr<Store>* out) {
  if (is_postgres_location(location)) {
#if MQTT_INBOX_WITH_POSTGRES
    StoreOpener opener = g_postgres_opener.load(std::memory_order_acquire);
    if (!opener)
      return Status::InvalidArgument(
          "the PostgreSQL store is not enabled in this program: link the library "
          "mqtt_inbox_postgres (CMake: mqtt_inbox::postgres, pkg-config: mqtt_inbox_postgres) "
          "and call mqtt_inbox::enable_postgres_store() (mqtt_inbox/postgres.h) before "
          "Inbox::open of a postgresql:// location");
    return opener(location, options, out);
#else
    return Status::InvalidArgument(
        "this build of mqtt-inbox has no PostgreSQL store (configured with "
        "MQTT_INBOX_WITH_POSTGRES=OFF): it cannot open a postgresql:// location");
#endif
  }
  return open_sqlite_store(location, options, out);
}

}  // namespace mqtt_inbox::detail

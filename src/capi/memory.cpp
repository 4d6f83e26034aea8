// mqtt_inbox_options_t.low_memory's two measures (capi/memory.h).
#include "capi/memory.h"

#include <sqlite3.h>

#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace mqtt_inbox::capi {

void configure_sqlite_for_low_memory() noexcept {
  static std::once_flag once;
  try {
    // SQLITE_MISUSE when SQLite is initialised already: then its settings stay.
    std::call_once(once, [] { (void)sqlite3_config(SQLITE_CONFIG_PAGECACHE, nullptr, 0, 0); });
  } catch (...) {
  }
}

void give_back_freed_memory() noexcept {
#if defined(__GLIBC__)
  (void)malloc_trim(0);
#endif
}

}  // namespace mqtt_inbox::capi

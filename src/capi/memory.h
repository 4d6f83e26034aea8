// What mqtt_inbox_options_t.low_memory does (docs/c-api.md#memory): the idle memory of a
// C consumer on a device, where SQLite's and glibc's defaults are sized for larger
// machines.
#pragma once

namespace mqtt_inbox::capi {

// Before the first inbox of the process opens: SQLite's page cache takes its memory a
// page at a time instead of a block of 20 pages per connection (about 87 KiB each with
// 4 KiB pages, most of it never used by the inbox's small working set), set with
// sqlite3_config(SQLITE_CONFIG_PAGECACHE, NULL, 0, 0). Process-wide; only possible while
// SQLite is not initialised: once the program (or an earlier open) used SQLite, nothing
// changes. Once per process.
void configure_sqlite_for_low_memory() noexcept;

// Gives the memory that start-up allocated and freed back to the system (glibc's
// malloc_trim(0): the schema migration of a new file, the connections opened to check it),
// which the allocator otherwise keeps resident. A no-op without glibc.
void give_back_freed_memory() noexcept;

}  // namespace mqtt_inbox::capi

// Test support: the store the core cases (support/core_cases.h) run the ledger on, as
// BrokerUnderTest is the broker. sqlite_store() here is what every core case used before
// there was a choice (a file ledger.db in the case's folder); postgres_store()
// (support/pg_store_under_test.h, for binaries that link the PostgreSQL store) gives a new
// database of a private cluster per location.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <mqtt_inbox/mqtt_inbox.h>

#include "support/ledger_fixture.h"

namespace mqtt_inbox::test {

struct StoreUnderTest {
  std::string name;  // for messages: "sqlite", "postgresql"
  // A new, empty location for one inbox whose case works in folder `dir`: a file in it
  // (SQLite) or a new database (PostgreSQL). As Inbox::open and crash_consumer's DB take it.
  std::function<std::string(const std::string& dir)> make_location;
  // Opens the inbox at `location` with the ledger's business tables (accounts,
  // ledger_entries) and creates the Consumer "ledger" on it, whose handler applies a
  // credit as ledger_consumer does. Fails the test (EXPECT) if either step fails.
  std::function<void(const std::string& location, const ConsumerOptions& options,
                     std::unique_ptr<Inbox>* inbox, std::unique_ptr<Consumer>* consumer)>
      open_ledger;
  // One integer read at `location` on a connection of its own (what a fresh process would
  // see); NULL or no row is 0. Business tables by their plain names; inbox tables as
  // inbox_tables + "inbox_processed".
  std::function<int64_t(const std::string& location, const std::string& sql)> query;
  // What names the inbox's tables in `query`'s SQL: "" (SQLite), "mqtt_inbox." (PostgreSQL).
  std::string inbox_tables;
};

// The SQLite store: ledger.db in the case's folder, read with query_int.
inline StoreUnderTest sqlite_store() {
  StoreUnderTest s;
  s.name = "sqlite";
  s.make_location = [](const std::string& dir) { return dir + "/ledger.db"; };
  s.open_ledger = [](const std::string& location, const ConsumerOptions& options,
                     std::unique_ptr<Inbox>* inbox, std::unique_ptr<Consumer>* consumer) {
    *inbox = open_ledger_inbox(location);
    if (!*inbox) return;
    const Status st =
        Consumer::create(inbox->get(), "ledger", ledger::apply_credit, options, consumer);
    EXPECT_TRUE(st.ok()) << st.to_string();
  };
  s.query = [](const std::string& location, const std::string& sql) {
    return query_int(location, sql);
  };
  return s;
}

}  // namespace mqtt_inbox::test

// Test support: the PostgreSQL store for the core cases (support/store_under_test.h), on a
// private cluster (support/postgres.h). For test binaries that link mqtt_inbox::postgres
// and libpqxx (tests/postgres/core_pg_test).
#pragma once

#include <atomic>

#include <mqtt_inbox/postgres.h>

#include <pqxx/pqxx>

#include "ledger_postgres.h"
#include "support/postgres.h"
#include "support/store_under_test.h"

namespace mqtt_inbox::test {

// Each location is a new database of `pg` ("core_1", "core_2", ...), as a URI without a
// password; the inbox's tables in the schema mqtt_inbox, the ledger's in public, the
// credit applied by ledger_postgres.h's PgHandler (what ledger_consumer --db
// postgresql:// runs). `pg` must outlive the store and every case run on it.
inline StoreUnderTest postgres_store(const Postgres& pg) {
  enable_postgres_store();
  StoreUnderTest s;
  s.name = "postgresql";
  s.inbox_tables = "mqtt_inbox.";
  s.make_location = [&pg](const std::string&) {
    static std::atomic<int> next{0};
    const std::string db = "core_" + std::to_string(++next);
    pg.create_database(db);
    return pg.uri(db);
  };
  s.open_ledger = [](const std::string& location, const ConsumerOptions& options,
                     std::unique_ptr<Inbox>* inbox, std::unique_ptr<Consumer>* consumer) {
    Status st = Inbox::open(location, {}, inbox);
    ASSERT_TRUE(st.ok()) << st.to_string();
    st = (*inbox)->setup_sql(ledger::postgres::kCreateTables);
    ASSERT_TRUE(st.ok()) << st.to_string();
    st = Consumer::create(inbox->get(), "ledger", PgHandler(ledger::postgres::apply_credit),
                          options, consumer);
    EXPECT_TRUE(st.ok()) << st.to_string();
  };
  s.query = [](const std::string& location, const std::string& sql) -> int64_t {
    pqxx::connection c(location);
    pqxx::nontransaction n(c);
    const pqxx::result r = n.exec(sql);
    if (r.empty() || r[0][0].is_null()) return 0;
    return r[0][0].as<int64_t>();
  };
  return s;
}

}  // namespace mqtt_inbox::test

// Test support: an Inbox with the ledger example's tables in a temporary folder, and
// helpers that read business state straight from the file.
#pragma once

#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <mqtt_inbox/mqtt_inbox.h>

#include "ledger.h"
#include "support/process.h"

namespace mqtt_inbox::test {

// Reads one integer with a separate read-only connection: what a fresh process would see.
inline int64_t query_int(const std::string& db_path, const std::string& sql) {
  SQLite::Database db(db_path, SQLite::OPEN_READONLY, 5000);
  SQLite::Statement q(db, sql);
  if (!q.executeStep() || q.getColumn(0).isNull()) return 0;
  return q.getColumn(0).getInt64();
}

inline std::unique_ptr<Inbox> open_ledger_inbox(const std::string& path,
                                                InboxOptions options = {}) {
  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(path, options, &inbox);
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (inbox) inbox->with_connection([](SQLite::Database& db) { ledger::create_tables(db); });
  return inbox;
}

inline Message credit_message(const std::string& id, const std::string& account, long long amount,
                              const std::string& topic = "credits/test") {
  Message m;
  m.topic = topic;
  m.payload = "{\"message_id\":\"" + id + "\",\"account\":\"" + account +
              "\",\"amount\":" + std::to_string(amount) + "}";
  return m;
}

}  // namespace mqtt_inbox::test

// The classification table of SQLite result codes (src/store/sqlite/errors.cpp), one test per
// row, checked against two things the table does not come from:
//  - sqlite3.h itself (its path is compiled in): every error code it defines has a row,
//    and every row's code is the value sqlite3.h gives its name;
//  - the rules of issue 13, written here as rules over code families: BUSY, LOCKED, FULL,
//    IOERR_*, READONLY_*, CANTOPEN, NOMEM, PROTOCOL (and PERM, NOLFS, SCHEMA, ABORT_ROLLBACK)
//    are transient; CORRUPT, NOTADB (and the IOERR codes that report corruption found
//    below SQLite) are fatal; everything else, CONSTRAINT_*, TOOBIG, MISMATCH, RANGE and
//    the errors a handler's statements raise, belongs to the message.
// What each class makes the consumer do is tested with real triggers in
// error_class_test.cpp.
#include "store/sqlite/errors.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace mqtt_inbox::detail {

// Test names and failure messages show the row's name (found by ADL).
[[maybe_unused]] static void PrintTo(const SqliteErrorRow& r, std::ostream* os) { *os << r.name; }

namespace {

// Every result code sqlite3.h defines, by name: the primary codes between SQLITE_OK and
// SQLITE_ROW, and every "(SQLITE_X | (n<<8))" extended code.
const std::map<std::string, int>& header_codes() {
  static const std::map<std::string, int> codes = [] {
    std::map<std::string, int> out;
    std::vector<std::tuple<std::string, std::string, int>> extended;  // name, base, n
    std::ifstream in(MQTT_INBOX_SQLITE3_H);
    EXPECT_TRUE(in) << "cannot read " << MQTT_INBOX_SQLITE3_H;
    const std::regex prim(R"(^#define (SQLITE_[A-Z]+)\s+(\d+)\s*(/\*.*)?$)");
    const std::regex ext(
        R"(^#define (SQLITE_[A-Z_]+)\s+\((SQLITE_[A-Z]+)\s*\|\s*\(\s*(\d+)\s*<<\s*8\)\).*$)");
    bool in_primary = false;
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_match(line, m, prim)) {
        if (m[1] == "SQLITE_OK")
          in_primary = true;
        else if (m[1] == "SQLITE_ROW")
          in_primary = false;
        else if (in_primary)
          out[m[1]] = std::stoi(m[2]);
      } else if (std::regex_match(line, m, ext) && m[2] != "SQLITE_OK") {  // OK_*: success
        extended.emplace_back(m[1], m[2], std::stoi(m[3]));
      }
    }
    for (const auto& [name, base, n] : extended)
      out[name] = out.count(base) ? (out.at(base) | (n << 8)) : -1;
    return out;
  }();
  return codes;
}

// The rules, by family (the name up to the second underscore).
ErrorClass expected_class(const std::string& name) {
  if (name == "SQLITE_IOERR_DATA" || name == "SQLITE_IOERR_CORRUPTFS") return ErrorClass::kFatal;
  if (name == "SQLITE_ABORT_ROLLBACK") return ErrorClass::kTransient;
  const size_t second = name.find('_', 7);
  const std::string family =
      name.substr(7, second == std::string::npos ? std::string::npos : second - 7);
  static const std::set<std::string> transient = {"BUSY",     "LOCKED",   "FULL",  "IOERR",
                                                  "READONLY", "CANTOPEN", "NOMEM", "PROTOCOL",
                                                  "PERM",     "NOLFS",    "SCHEMA"};
  if (transient.count(family)) return ErrorClass::kTransient;
  if (family == "CORRUPT" || family == "NOTADB") return ErrorClass::kFatal;
  return ErrorClass::kMessage;
}

std::vector<SqliteErrorRow> rows() {
  size_t n = 0;
  const SqliteErrorRow* r = sqlite_error_rows(&n);
  return std::vector<SqliteErrorRow>(r, r + n);
}

TEST(SqliteErrorTable, HasARowForEveryErrorCodeOfSqlite3H) {
  const auto& header = header_codes();
  ASSERT_GE(header.size(), 90u) << "sqlite3.h parsed badly";
  std::set<std::string> in_table;
  for (const SqliteErrorRow& r : rows()) {
    EXPECT_TRUE(in_table.insert(r.name).second) << "two rows for " << r.name;
    EXPECT_TRUE(header.count(r.name)) << r.name << " is not an error code of sqlite3.h";
  }
  for (const auto& [name, code] : header)
    EXPECT_TRUE(in_table.count(name)) << name << " (" << code << ") has no row";
}

TEST(SqliteErrorTable, UnknownCodesFallBackToTheirPrimaryRow) {
  // An extended code from a newer SQLite is classified as its family.
  EXPECT_EQ(classify_sqlite_error(SQLITE_IOERR | (99 << 8)).code, SQLITE_IOERR);
  EXPECT_EQ(classify_sqlite_error(SQLITE_CONSTRAINT | (99 << 8)).error_class, ErrorClass::kMessage);
  EXPECT_EQ(classify_sqlite_error(SQLITE_CORRUPT | (99 << 8)).error_class, ErrorClass::kFatal);
  // An unknown primary code is held against the message, like an unknown handler error.
  EXPECT_EQ(classify_sqlite_error(99).error_class, ErrorClass::kMessage);
  EXPECT_EQ(to_status(99, "x").code(), Status::Code::kInternal);
}

class SqliteErrorRowTest : public ::testing::TestWithParam<SqliteErrorRow> {};

TEST_P(SqliteErrorRowTest, FollowsTheRulesAndSqlite3H) {
  const SqliteErrorRow& r = GetParam();
  const auto& header = header_codes();
  ASSERT_TRUE(header.count(r.name)) << r.name;
  EXPECT_EQ(r.code, header.at(r.name)) << "the row's code is not sqlite3.h's value";
  EXPECT_EQ(to_string(r.error_class), std::string(to_string(expected_class(r.name))));
  // The lookup finds this very row (no duplicate code earlier in the table).
  EXPECT_STREQ(classify_sqlite_error(r.code).name, r.name);
  // The Status it becomes says the same as the class.
  const Status s = to_status(r.code, "test");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.is_transient_store_error(), r.error_class == ErrorClass::kTransient) << s.to_string();
  EXPECT_EQ(s.is_fatal_store_error(), r.error_class == ErrorClass::kFatal) << s.to_string();
  if (r.error_class == ErrorClass::kMessage) {
    const Status::Code c = s.code();
    EXPECT_TRUE(c == Status::Code::kRejected || c == Status::Code::kInternal ||
                c == Status::Code::kAborted)
        << s.to_string();
  }
  // Constraint-like refusals are reported as such, not as an internal error.
  const std::string name = r.name;
  if (name.rfind("SQLITE_CONSTRAINT", 0) == 0 || name == "SQLITE_TOOBIG" ||
      name == "SQLITE_MISMATCH" || name == "SQLITE_RANGE") {
    EXPECT_EQ(s.code(), Status::Code::kRejected);
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, SqliteErrorRowTest, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<SqliteErrorRow>& p) {
                           return std::string(p.param.name).substr(7);  // without SQLITE_
                         });

}  // namespace
}  // namespace mqtt_inbox::detail

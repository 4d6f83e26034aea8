#include "store/sqlite/schema.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "mqtt_inbox/sqlite.h"

namespace mqtt_inbox::detail {

const std::vector<SchemaStep>& schema_steps() {
  static const std::vector<SchemaStep> steps = [] {
    // Split by hand, not with std::getline on a stream: a stream swallows a
    // std::bad_alloc (it sets badbit), which left this static list cut short for the
    // life of the process, and every new file then failed to open ("schema.sql ends at
    // user_version 0"). An exception here leaves the static uninitialised, so the next
    // call tries again.
    std::vector<SchemaStep> out;
    const std::string sql = schema_sql();
    const std::string marker = "-- @version ";
    size_t at = 0;
    while (at < sql.size()) {
      size_t end = sql.find('\n', at);
      if (end == std::string::npos) end = sql.size();
      if (sql.compare(at, marker.size(), marker) == 0) {
        out.push_back({std::atoi(sql.c_str() + at + marker.size()), ""});
      } else if (!out.empty()) {
        out.back().sql.append(sql, at, end - at);
        out.back().sql += '\n';
      }
      at = end + 1;
    }
    return out;
  }();
  return steps;
}

}  // namespace mqtt_inbox::detail

#include "store/sqlite/schema.h"

#include <cstdlib>
#include <sstream>

#include "mqtt_inbox/inbox.h"

namespace mqtt_inbox::detail {

const std::vector<SchemaStep>& schema_steps() {
  static const std::vector<SchemaStep> steps = [] {
    std::vector<SchemaStep> out;
    std::istringstream in(schema_sql());
    std::string line;
    const std::string marker = "-- @version ";
    while (std::getline(in, line)) {
      if (line.rfind(marker, 0) == 0) {
        out.push_back({std::atoi(line.c_str() + marker.size()), ""});
      } else if (!out.empty()) {
        out.back().sql += line + "\n";
      }
    }
    return out;
  }();
  return steps;
}

}  // namespace mqtt_inbox::detail

// The steps of schema.sql (see its header), parsed from the embedded text.
#pragma once

#include <string>
#include <vector>

namespace mqtt_inbox::detail {

struct SchemaStep {
  int version;      // the user_version this step ends at
  std::string sql;  // everything from its "-- @version N" line to the next one
};

// In ascending version order. Parsed once.
const std::vector<SchemaStep>& schema_steps();

}  // namespace mqtt_inbox::detail

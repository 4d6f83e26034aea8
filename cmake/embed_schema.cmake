# Writes OUT, a C++ file defining mqtt_inbox::schema_sql() as the verbatim text of IN.
file(READ "${IN}" SQL)
string(FIND "${SQL}" ")inbox_schema\"" CLASH)
if(NOT CLASH EQUAL -1)
  message(FATAL_ERROR "schema.sql contains the raw-string delimiter")
endif()
file(WRITE "${OUT}.tmp" "// Generated from schema.sql by cmake/embed_schema.cmake. Do not edit.\n"
  "namespace mqtt_inbox {\n"
  "const char* schema_sql() {\n"
  "  return R\"inbox_schema(${SQL})inbox_schema\";\n"
  "}\n"
  "}  // namespace mqtt_inbox\n")
file(RENAME "${OUT}.tmp" "${OUT}")

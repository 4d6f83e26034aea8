# ctest `format_check` (label unit): fails if a file of src/, include/, tools/, examples/,
# bench/ or tests/ is not formatted by the repository's .clang-format, except the debts
# listed in cmake/format_rules.cmake (which may only shrink).
#   cmake -DROOT=<source dir> -DCLANG_FORMAT=<program> -P check_format.cmake
# Without clang-format (apt-get install clang-format; scripts/test.sh installs it) the
# test is skipped, saying so.
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/format_rules.cmake")
if(NOT CLANG_FORMAT OR NOT EXISTS "${CLANG_FORMAT}")
  message(FATAL_ERROR "clang-format not found: format check skipped")
endif()
execute_process(COMMAND ${CLANG_FORMAT} --version OUTPUT_VARIABLE version
  OUTPUT_STRIP_TRAILING_WHITESPACE)
message(STATUS "${version}")
mqtt_inbox_format_violations(errors ROOT "${ROOT}" CLANG_FORMAT "${CLANG_FORMAT}"
  DEBTS ${MQTT_INBOX_FORMAT_DEBTS})
if(errors)
  list(LENGTH errors n)
  list(JOIN errors "\n  " text)
  message(FATAL_ERROR "format_check: ${n} problem(s):\n  ${text}")
endif()
message(STATUS "format_check: formatted (${CMAKE_CURRENT_LIST_DIR}/../.clang-format)")

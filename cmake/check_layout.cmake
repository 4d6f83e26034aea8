# ctest `layout_check` (label unit): fails if the house loses its shape (the folder table and
# the rules are in cmake/layout_rules.cmake).
#   cmake -DROOT=<source dir> -DINPUTS=<file setting CORE_SOURCES, MQTT_SOURCES,
#   POSTGRES_SOURCES> -P check_layout.cmake
# INPUTS is written at generate time from the targets' SOURCES
# (tests/build/CMakeLists.txt), so a file added to either library is checked without
# editing this script.
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/layout_rules.cmake")
include("${INPUTS}")
mqtt_inbox_layout_violations(errors ROOT "${ROOT}" CORE ${CORE_SOURCES} MQTT ${MQTT_SOURCES}
  POSTGRES ${POSTGRES_SOURCES})
if(errors)
  list(LENGTH errors count)
  foreach(e IN LISTS errors)
    message("layout: ${e}")
  endforeach()
  message(FATAL_ERROR "layout check: ${count} violation(s) (rules: cmake/layout_rules.cmake)")
endif()
list(LENGTH CORE_SOURCES n_core)
list(LENGTH MQTT_SOURCES n_mqtt)
list(LENGTH POSTGRES_SOURCES n_pg)
message(STATUS "layout check: ok (${n_core} core sources, ${n_mqtt} MQTT sources, "
               "${n_pg} PostgreSQL sources)")

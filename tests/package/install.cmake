# cmake --install of the current build into a fresh scratch prefix.
#   cmake -DBUILD=<build dir> -DPREFIX=<scratch> -P install.cmake
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD}" --prefix "${PREFIX}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
foreach(f include/mqtt_inbox/mqtt_inbox.h share/mqtt_inbox/schema.sql)
  if(NOT EXISTS "${PREFIX}/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
file(GLOB_RECURSE installed RELATIVE "${PREFIX}" "${PREFIX}/*")
list(SORT installed)
string(REPLACE ";" "\n  " installed "${installed}")
message(STATUS "installed into ${PREFIX}:\n  ${installed}")

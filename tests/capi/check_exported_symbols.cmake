# ctest capi_exported_symbols: what the shared MQTT library exports is its API and nothing
# else (cmake/export_map.cmake, docs/c-api.md#symbols).
#  - The C symbols (mqtt_inbox_*) are exactly tests/capi/exported_c_symbols.txt, so an
#    accidental change of the C ABI (a function removed or renamed, an internal one
#    exported) fails. A deliberate change updates the list in the same commit.
#  - Every other exported symbol belongs to the C++ API (cmake/export_rules.cmake): never
#    mqtt_inbox::detail or mqtt_inbox::capi, a class's ::Impl, a Paho type (mqtt::), std,
#    fmt, nlohmann or SQLiteCpp, never a weak (inline) function.
#  - The counts are the ones docs/c-api.md states ("exports N symbols: C functions of the
#    C API and K of the C++ API"), so the page cannot fall behind the library.
cmake_minimum_required(VERSION 3.16)
# cmake -DNM=<nm> -DLIB=<libmqtt_inbox.so> -DEXPECTED=<list> [-DDOCS=<c-api.md>]
#       -P check_exported_symbols.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/export_rules.cmake)
execute_process(COMMAND ${NM} -D --defined-only ${LIB} OUTPUT_VARIABLE raw RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D ${LIB} failed")
endif()
execute_process(COMMAND ${NM} -D --defined-only -C ${LIB} OUTPUT_VARIABLE demangled)
# Symbol names hold ';', '[' and ']' (templates, lambdas): neutral characters first.
foreach(var raw demangled)
  string(REPLACE ";" "," ${var} "${${var}}")
  string(REPLACE "[" "(" ${var} "${${var}}")
  string(REPLACE "]" ")" ${var} "${${var}}")
  string(REPLACE "\n" ";" ${var} "${${var}}")
endforeach()
list(LENGTH raw n)
set(c_symbols "")
set(cxx_count 0)
set(problems "")
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  list(GET raw ${i} line)
  list(GET demangled ${i} dline)
  if(NOT line MATCHES "^[0-9a-f]+ ([A-Za-z]) (.+)$")
    continue()
  endif()
  set(type "${CMAKE_MATCH_1}")
  set(name "${CMAKE_MATCH_2}")
  string(REGEX REPLACE "^[0-9a-f]+ [A-Za-z] " "" dname "${dline}")
  if(type STREQUAL "A")
    continue()  # the version node's own name
  endif()
  mqtt_inbox_is_api_symbol("${type}" "${name}" "${dname}" api)
  if(NOT api)
    list(APPEND problems "not the API: ${type} ${dname}")
  elseif(name MATCHES "^mqtt_inbox_")
    list(APPEND c_symbols "${name}")
  else()
    math(EXPR cxx_count "${cxx_count} + 1")
  endif()
endforeach()
list(SORT c_symbols)
file(STRINGS ${EXPECTED} expected REGEX "^[a-z]")
list(SORT expected)
foreach(s IN LISTS c_symbols)
  if(NOT s IN_LIST expected)
    list(APPEND problems "exported but not in the list: ${s}")
  endif()
endforeach()
foreach(s IN LISTS expected)
  if(NOT s IN_LIST c_symbols)
    list(APPEND problems "in the list but not exported: ${s}")
  endif()
endforeach()
list(LENGTH c_symbols c_count)
math(EXPR total "${c_count} + ${cxx_count}")
if(DOCS)
  file(READ ${DOCS} doc)
  string(REGEX MATCH "exports ([0-9]+) symbols: the ([0-9]+) functions of the C API and ([0-9]+)"
               found "${doc}")
  if(NOT found)
    list(APPEND problems "${DOCS} does not say \"exports N symbols: the C functions of the C API and K ...\"")
  elseif(NOT CMAKE_MATCH_1 EQUAL total OR NOT CMAKE_MATCH_2 EQUAL c_count
         OR NOT CMAKE_MATCH_3 EQUAL cxx_count)
    list(APPEND problems "${DOCS} says ${CMAKE_MATCH_1} symbols (${CMAKE_MATCH_2} C, "
                         "${CMAKE_MATCH_3} C++); the library exports ${total} (${c_count} C, "
                         "${cxx_count} C++)")
  endif()
endif()
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "${LIB} exports what it should not, lost a C symbol, or the docs' "
                      "count differs:\n  ${text}\n"
                      "An intended change of the C API updates ${EXPECTED} and ${DOCS}.")
endif()
message(STATUS "${LIB}: ${total} exported symbols, all API: ${c_count} C functions as listed, "
               "${cxx_count} of the C++ API")

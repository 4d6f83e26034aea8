# ctest `layout_check_selftest`: the layout rules (cmake/layout_rules.cmake) fire on small
# trees that break each of them, and stay quiet on one that breaks none, so layout_check
# passing on the real tree means something.
#   cmake -DWORK=<scratch folder> -P layout_check_selftest.cmake
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/../cmake/layout_rules.cmake")

set(failures 0)

# A tree shaped like the project: a core source, a private header, public headers, the
# MQTT layer, a tool that uses Paho and an example with business SQL (allowed).
function(make_tree dir)
  file(REMOVE_RECURSE "${dir}")
  file(WRITE "${dir}/include/mqtt_inbox/inbox.h" "#pragma once\n#include \"mqtt_inbox/status.h\"\n")
  file(WRITE "${dir}/include/mqtt_inbox/status.h" "#pragma once\n#include <string>\n")
  file(WRITE "${dir}/include/mqtt_inbox/subscriber.h" "#pragma once\n#include \"mqtt_inbox/status.h\"\n")
  file(WRITE "${dir}/src/log.h" "#pragma once\n#include <string>\n")
  file(WRITE "${dir}/src/inbox.cpp"
    "#include \"mqtt_inbox/inbox.h\"\n#include \"log.h\"\n#include <SQLiteCpp/SQLiteCpp.h>\n"
    "const char* k = \"SELECT 1 FROM inbox_processed WHERE a = ?1; -- [x]\";\n")
  file(WRITE "${dir}/src/subscriber.cpp"
    "#include \"mqtt_inbox/subscriber.h\"\n#include <mqtt/async_client.h>\n#include \"log.h\"\n"
    "// A comment may say SELECT or \"COMMIT\" without being SQL.\n"
    "void f() { log(\"subscribed; the PUBACK follows the commit\"); }\n")
  file(WRITE "${dir}/tools/probe.cpp" "#include <mqtt/async_client.h>\nint x;\n")
  file(WRITE "${dir}/tools/stats.cpp" "#include <SQLiteCpp/SQLiteCpp.h>\nconst char* q = \"SELECT count(*) FROM t\";\n")
  file(WRITE "${dir}/examples/ledger.cpp"
    "#include <mqtt_inbox/subscriber.h>\nconst char* q = \"UPDATE accounts SET balance = 1\";\n")
endfunction()

# expect(NAME PATTERN): the rules report a violation matching PATTERN ("" = none at all).
function(expect name dir pattern)
  mqtt_inbox_layout_violations(errors ROOT "${dir}" CORE src/inbox.cpp MQTT src/subscriber.cpp)
  if(pattern STREQUAL "")
    if(errors)
      message("FAIL ${name}: expected no violation, got: ${errors}")
      math(EXPR f "${failures} + 1")
      set(failures ${f} PARENT_SCOPE)
    else()
      message("ok   ${name}: clean")
    endif()
    return()
  endif()
  set(hit "")
  foreach(e IN LISTS errors)
    if(e MATCHES "${pattern}")
      set(hit "${e}")
    endif()
  endforeach()
  if(hit)
    message("ok   ${name}: ${hit}")
  else()
    message("FAIL ${name}: expected a violation matching '${pattern}', got: '${errors}'")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  endif()
endfunction()

set(t "${WORK}/tree")

make_tree("${t}")
expect("clean tree" "${t}" "")

make_tree("${t}")
file(APPEND "${t}/src/subscriber.cpp" "const char* q = \"INSERT INTO inbox_processed VALUES (1)\";\n")
expect("SQL literal in subscriber.cpp" "${t}" "^src/subscriber.cpp:6 is in the MQTT layer but holds SQL")

make_tree("${t}")
file(APPEND "${t}/src/subscriber.cpp" "void g(SQLite::Database& db) { db.exec(\"x\"); }\n")
expect("statement run in subscriber.cpp" "${t}" "^src/subscriber.cpp:6 is in the MQTT layer")

make_tree("${t}")
file(WRITE "${t}/src/subscriber_session.cpp" "void h() { run(\"DELETE FROM inbox_meta\"); }\n")
expect("SQL in a new src/subscriber*.cpp" "${t}" "^src/subscriber_session.cpp:1 is in the MQTT layer")

make_tree("${t}")
file(APPEND "${t}/tools/probe.cpp" "const char* q = \"PRAGMA user_version\";\n")
expect("SQL in a tool file that uses Paho" "${t}" "^tools/probe.cpp:3 is in the MQTT layer")

make_tree("${t}")
file(APPEND "${t}/src/inbox.cpp" "#include \"mqtt_inbox/subscriber.h\"\n")
expect("core includes subscriber.h" "${t}" "^core source src/inbox.cpp includes include/mqtt_inbox/subscriber.h")

make_tree("${t}")
file(APPEND "${t}/src/log.h" "#include <mqtt/message.h>\n")
expect("core reaches Paho through a header" "${t}" "^core source src/inbox.cpp includes Paho's <mqtt/message.h> \\(in src/log.h\\)")

make_tree("${t}")
file(APPEND "${t}/include/mqtt_inbox/inbox.h" "#include \"log.h\"\n")
expect("public header includes src/" "${t}" "^include/mqtt_inbox/inbox.h includes 'log.h' from src/")

make_tree("${t}")
file(APPEND "${t}/include/mqtt_inbox/status.h" "#include \"../../src/log.h\"\n")
expect("public header includes ../../src" "${t}" "^include/mqtt_inbox/status.h includes '../../src/log.h'")

make_tree("${t}")
file(APPEND "${t}/include/mqtt_inbox/status.h" "#include \"mqtt_inbox/inbox.h\"\n")
expect("include cycle" "${t}" "^include cycle among: include/mqtt_inbox/inbox.h, include/mqtt_inbox/status.h$")

file(REMOVE_RECURSE "${t}")
if(failures GREATER 0)
  message(FATAL_ERROR "layout check self-test: ${failures} case(s) failed")
endif()
message(STATUS "layout check self-test: every rule fires on its violation")

# ctest `layout_check_selftest`: the layout rules (cmake/layout_rules.cmake) fire on small
# trees that break each of them, and stay quiet on one that breaks none, so layout_check
# passing on the real tree means something.
#   cmake -DWORK=<scratch folder> -P layout_check_selftest.cmake
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/layout_rules.cmake")

set(failures 0)
# The self-test's trees owe nothing unless a case says so.
set(MQTT_INBOX_LAYOUT_DEBTS "")

# A tree shaped like the project: a util header, the store seam, a store implementation
# with its SQL, a policy file, the MQTT layer, public headers, a tool that uses Paho, a
# tool whose message names SQL a person runs (allowed: no statement) and an example with
# business SQL (allowed).
function(make_tree dir)
  file(REMOVE_RECURSE "${dir}")
  file(WRITE "${dir}/include/mqtt_inbox/inbox.h" "#pragma once\n#include \"mqtt_inbox/status.h\"\n")
  file(WRITE "${dir}/include/mqtt_inbox/status.h" "#pragma once\n#include <string>\n")
  file(WRITE "${dir}/include/mqtt_inbox/subscriber.h" "#pragma once\n#include \"mqtt_inbox/status.h\"\n")
  file(WRITE "${dir}/src/util/log.h" "#pragma once\n#include <string>\n")
  file(WRITE "${dir}/src/store/store.h" "#pragma once\n#include \"util/log.h\"\n")
  file(WRITE "${dir}/src/store/sqlite/claim.cpp"
    "#include \"mqtt_inbox/inbox.h\"\n#include \"store/store.h\"\n#include <SQLiteCpp/SQLiteCpp.h>\n"
    "const char* k = \"SELECT 1 FROM inbox_processed WHERE a = ?1; -- [x]\";\n")
  file(WRITE "${dir}/src/inbox/consumer_impl.h" "#pragma once\n#include \"store/store.h\"\n")
  file(WRITE "${dir}/src/inbox/consumer.cpp"
    "#include \"inbox/consumer_impl.h\"\n#include \"util/log.h\"\n"
    "// A comment may say SELECT or \"COMMIT\" without being SQL.\n")
  file(WRITE "${dir}/src/mqtt/subscriber.cpp"
    "#include \"mqtt_inbox/subscriber.h\"\n#include <mqtt/async_client.h>\n#include \"util/log.h\"\n"
    "// A comment may say SELECT or \"COMMIT\" without being SQL.\n"
    "void f() { log(\"subscribed; the PUBACK follows the commit\"); }\n")
  file(WRITE "${dir}/tools/probe.cpp" "#include <mqtt/async_client.h>\nint x;\n")
  file(WRITE "${dir}/tools/stats.cpp"
    "#include \"store/store.h\"\nconst char* m = \"GRANT CREATE on the schema, or turn its ROLLBACK into COMMIT\";\n")
  file(WRITE "${dir}/examples/ledger.cpp"
    "#include <mqtt_inbox/subscriber.h>\nconst char* q = \"UPDATE accounts SET balance = 1\";\n")
endfunction()

set(core src/store/sqlite/claim.cpp src/inbox/consumer.cpp)
set(mqtt src/mqtt/subscriber.cpp)
set(pg "")

# expect(NAME DIR PATTERN): the rules report a violation matching PATTERN ("" = none).
function(expect name dir pattern)
  mqtt_inbox_layout_violations(errors ROOT "${dir}" CORE ${core} MQTT ${mqtt} POSTGRES ${pg})
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

# Rule 1: the folder table.
make_tree("${t}")
file(WRITE "${t}/src/store/sqlite/backend.h" "#pragma once\n")
file(APPEND "${t}/src/inbox/consumer.cpp" "#include \"store/sqlite/backend.h\"\n")
expect("policy includes a store implementation" "${t}"
  "^src/inbox/consumer.cpp \\(layer inbox\\) includes src/store/sqlite/backend.h \\(layer store/sqlite\\)")

make_tree("${t}")
file(APPEND "${t}/src/util/log.h" "#include \"store/store.h\"\n")
expect("util includes a layer above it" "${t}" "^src/util/log.h \\(layer util\\) includes src/store/store.h")

make_tree("${t}")
file(APPEND "${t}/src/mqtt/subscriber.cpp" "#include \"inbox/consumer_impl.h\"\n")
expect("mqtt includes the inbox layer" "${t}" "^src/mqtt/subscriber.cpp \\(layer mqtt\\) includes src/inbox/")

make_tree("${t}")
file(WRITE "${t}/src/misc/thing.h" "#pragma once\n")
expect("a folder the table does not know" "${t}" "^src/misc/thing.h is in no folder of the layer table")

# Rule 2: public headers.
make_tree("${t}")
file(APPEND "${t}/include/mqtt_inbox/inbox.h" "#include \"util/log.h\"\n")
expect("public header includes src/" "${t}" "^include/mqtt_inbox/inbox.h includes 'util/log.h' from src/")

make_tree("${t}")
file(APPEND "${t}/include/mqtt_inbox/status.h" "#include \"../../src/util/log.h\"\n")
expect("public header includes ../../src" "${t}" "^include/mqtt_inbox/status.h includes '../../src/util/log.h'")

make_tree("${t}")
file(APPEND "${t}/include/mqtt_inbox/inbox.h" "#include \"mqtt_inbox/subscriber.h\"\n")
expect("core public header includes an MQTT one" "${t}"
  "^core public header include/mqtt_inbox/inbox.h includes the MQTT header")

# Rule 3: the core knows no MQTT.
make_tree("${t}")
file(APPEND "${t}/src/util/log.h" "#include <mqtt/message.h>\n")
expect("core reaches Paho through a header" "${t}"
  "^core source src/store/sqlite/claim.cpp includes Paho's <mqtt/message.h> \\(in src/util/log.h\\)")

make_tree("${t}")
file(APPEND "${t}/src/inbox/consumer.cpp" "#include \"mqtt_inbox/subscriber.h\"\n")
expect("core source includes an MQTT public header" "${t}"
  "^core source src/inbox/consumer.cpp includes include/mqtt_inbox/subscriber.h")

# Rule 4: SQL only in the store layer.
make_tree("${t}")
file(APPEND "${t}/src/inbox/consumer.cpp" "const char* q = \"DELETE FROM inbox_meta\";\n")
expect("SQL in a policy folder" "${t}" "^src/inbox/consumer.cpp:4 is outside the store layer")

make_tree("${t}")
file(APPEND "${t}/src/store/store.h" "const char* q = \"PRAGMA user_version\";\n")
expect("SQL in the store seam, above any store" "${t}" "^src/store/store.h:3 is outside the store layer")

make_tree("${t}")
file(APPEND "${t}/src/mqtt/subscriber.cpp" "const char* q = \"INSERT INTO inbox_processed VALUES (1)\";\n")
expect("SQL literal in the MQTT layer" "${t}" "^src/mqtt/subscriber.cpp:6 is in the MQTT layer but holds SQL")

make_tree("${t}")
file(APPEND "${t}/src/mqtt/subscriber.cpp" "void g(SQLite::Database& db) { db.exec(\"x\"); }\n")
expect("statement run in the MQTT layer" "${t}" "^src/mqtt/subscriber.cpp:6 is in the MQTT layer")

make_tree("${t}")
file(APPEND "${t}/tools/probe.cpp" "const char* q = \"PRAGMA user_version\";\n")
expect("SQL in a tool file that uses Paho" "${t}" "^tools/probe.cpp:3 is in the MQTT layer")

make_tree("${t}")
file(APPEND "${t}/tools/stats.cpp" "const char* q = \"SELECT count(*) FROM t\";\n")
expect("a statement in the admin tool" "${t}" "^tools/stats.cpp:3 is in the admin tool")

make_tree("${t}")
file(APPEND "${t}/tools/stats.cpp" "void g(SQLite::Database& db) { SQLite::Statement q(db, sql); }\n")
expect("a statement run by the admin tool" "${t}" "^tools/stats.cpp:3 is in the admin tool")

# Rule 5: *_impl.h private to its folder.
make_tree("${t}")
file(APPEND "${t}/src/store/sqlite/claim.cpp" "#include \"inbox/consumer_impl.h\"\n")
expect("another folder's _impl.h" "${t}" "^src/store/sqlite/claim.cpp includes src/inbox/consumer_impl.h, private to src/inbox")

# The MQTT layer may use the outbox for its relay port, never for the outbox's insides.
make_tree("${t}")
file(WRITE "${t}/src/outbox/relay_source.h" "#pragma once\n#include \"mqtt_inbox/status.h\"\n")
file(WRITE "${t}/src/outbox/outbox_impl.h" "#pragma once\n#include \"outbox/relay_source.h\"\n")
file(APPEND "${t}/src/mqtt/subscriber.cpp" "#include \"outbox/relay_source.h\"\n")
expect("the MQTT layer includes the outbox's relay port" "${t}" "")
file(APPEND "${t}/src/mqtt/subscriber.cpp" "#include \"outbox/outbox_impl.h\"\n")
expect("the MQTT layer includes the outbox's implementation" "${t}"
  "^src/mqtt/subscriber.cpp includes src/outbox/outbox_impl.h, private to src/outbox")

# Rule 6: cycles.
make_tree("${t}")
file(APPEND "${t}/include/mqtt_inbox/status.h" "#include \"mqtt_inbox/inbox.h\"\n")
expect("include cycle" "${t}" "^include cycle among: include/mqtt_inbox/inbox.h, include/mqtt_inbox/status.h$")

make_tree("${t}")
file(WRITE "${t}/src/store/bad.h" "#pragma once\n#include \"inbox/consumer_impl.h\"\n")
set(MQTT_INBOX_LAYOUT_DEBTS "src/store/bad.h:inbox")
expect("folders that include each other (through a debt)" "${t}" "^folders (inbox and store|store and inbox) include each other")
set(MQTT_INBOX_LAYOUT_DEBTS "")

# Rule 7: a library's sources are its folders' files.
make_tree("${t}")
file(WRITE "${t}/src/inbox/dead_letters.cpp" "int y;\n")
expect("a core folder's file left out of the core library" "${t}"
  "^src/inbox/dead_letters.cpp is in a folder of the CORE library but not among its sources")

make_tree("${t}")
list(APPEND core src/mqtt/subscriber.cpp)
expect("an MQTT file in the core library" "${t}"
  "^src/mqtt/subscriber.cpp is a source of the CORE library but not in one of its folders")
list(REMOVE_ITEM core src/mqtt/subscriber.cpp)

# The PostgreSQL store is its own library: its files in the core are refused (a program
# on SQLite would load libpq), and so are its files left out of its library.
make_tree("${t}")
file(WRITE "${t}/src/store/postgres/claim.cpp" "#include \"store/store.h\"\n")
set(pg src/store/postgres/claim.cpp)
expect("the PostgreSQL store in its own library" "${t}" "")
list(APPEND core src/store/postgres/claim.cpp)
expect("a PostgreSQL store file in the core library" "${t}"
  "^src/store/postgres/claim.cpp is a source of the CORE library but not in one of its folders")
list(REMOVE_ITEM core src/store/postgres/claim.cpp)
file(WRITE "${t}/src/store/postgres/open.cpp" "int z;\n")
expect("a PostgreSQL store file left out of its library" "${t}"
  "^src/store/postgres/open.cpp is in a folder of the POSTGRES library but not among its sources")
set(pg "")

# Debts shrink: one that matches nothing is reported.
make_tree("${t}")
set(MQTT_INBOX_LAYOUT_DEBTS "src/inbox/consumer.cpp:sql")
expect("a paid debt still listed" "${t}" "^layout debt 'src/inbox/consumer.cpp:sql' is paid")
set(MQTT_INBOX_LAYOUT_DEBTS "")

file(REMOVE_RECURSE "${t}")
if(failures GREATER 0)
  message(FATAL_ERROR "layout check self-test: ${failures} case(s) failed")
endif()
message(STATUS "layout check self-test: every rule fires on its violation")

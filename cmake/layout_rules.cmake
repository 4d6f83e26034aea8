# The house's shape: the folders of src/ are its layers, and this table says what each may
# use. Used by cmake/check_layout.cmake (the ctest `layout_check`) and by
# tests/build/layout_check_selftest.cmake, which proves each rule fires on a tree that
# breaks it.
# docs/design.md#the-house says what each folder owns.
#
# mqtt_inbox_layout_violations(OUT ROOT <dir> CORE <files...> MQTT <files...>
#                              [POSTGRES <files...>])
#   ROOT  the source tree: src/, include/, tools/ and examples/ below it are read.
#   CORE  the sources of the core library target (mqtt_inbox_core), relative to ROOT or
#         absolute; files outside ROOT/src (generated ones) are skipped.
#   MQTT  the sources of the MQTT library target (mqtt_inbox).
#   POSTGRES  the sources of the PostgreSQL store's library (mqtt_inbox_postgres); none in
#         a build without it (MQTT_INBOX_WITH_POSTGRES=OFF), and rule 7 skips it then.
#   OUT   set to the list of violations, one message each ("" when the tree is clean).
#
# The folder table (a folder of src/: the folders, comma-separated, its files may include
# from). mqtt uses outbox for one header, outbox/relay_source.h: the Relay's port into the
# Outbox it publishes from, which names public types only (outbox_impl.h stays private, rule
# 5), so the relay reaches neither the store nor SQL through it.
set(MQTT_INBOX_LAYERS
  "util:"
  "store:util"
  "store/sqlite:store,util"
  "store/postgres:store,util"
  "inbox:store,util"
  "outbox:store,inbox,util"
  "retention:store,util"
  "stp:store,inbox,util"
  "service:util"
  "mqtt:service,outbox,util"
  "fleet:mqtt,store,util"
  "capi:util")
# Which library target each folder's .cpp files make up (rule 7).
# The PostgreSQL store is a library of its own (mqtt_inbox_postgres), so that a program on
# SQLite never loads libpq: its folder is not the core's.
set(MQTT_INBOX_CORE_FOLDERS util store store/sqlite inbox outbox retention stp service)
set(MQTT_INBOX_MQTT_FOLDERS mqtt capi fleet)
set(MQTT_INBOX_POSTGRES_FOLDERS store/postgres)
# The MQTT library's public headers: the core's public headers never include them.
set(MQTT_INBOX_MQTT_HEADERS subscriber.h relay.h connection.h tls.h fleet.h)
# Files still on their way to their layer (issue 28): "<file>:<what it may still do>",
# where what is a folder it includes against the table, or "sql". Each entry is a debt;
# an entry that no longer matches anything is reported too, so the list only shrinks.
# Empty since the outbox's SQL moved into the store (issue 28): keep it so.
set(MQTT_INBOX_LAYOUT_DEBTS)
#
# Rules:
#   1. Layers: a file of src/<F>/ includes from src/<G>/ only if G is F or is listed for F
#      in the table (a folder is the longest listed prefix of the file's path).
#   2. include/ includes nothing from src/ (nor any path with "src/" or ".."); a core
#      public header never includes an MQTT one (MQTT_INBOX_MQTT_HEADERS).
#   3. The core (and the PostgreSQL store) knows no MQTT: nothing a core source includes, directly or through the
#      project's own headers, is in src/mqtt/, an MQTT public header, or a Paho header.
#   4. SQL lives in src/store/<kind>/ only: no other file of src/ holds SQL, no file
#      that uses Paho (src/, tools/, examples/) does, and no file of tools/ runs a
#      statement or holds one (what the admin tool reads of a store beyond the public API
#      is the store's: src/store/<kind>/admin.h). SQL: a string literal holding an SQL
#      keyword (SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, PRAGMA, BEGIN, COMMIT,
#      ROLLBACK, SAVEPOINT, VACUUM), or running statements (SQLite::Statement, exec(,
#      execAndGet, sqlite3_exec, sqlite3_prepare, pqxx). In tools/ a literal is a statement
#      only when it begins with such a keyword: the tool's messages name SQL a person runs
#      ("GRANT CREATE on the schema", "its final ROLLBACK turned into COMMIT").
#   5. A *_impl.h is private to its folder.
#   6. No include cycles: among the files of src/, include/ and tools/, nor among folders.
#   7. Each library target's sources are exactly the .cpp files of its folders.
# Quoted includes resolve like the build does: the including file's folder, then src/,
# then include/; <mqtt_inbox/...> resolves in include/. Other includes are external.

set(_MQTT_INBOX_PAHO_INCLUDE "^(mqtt/.*|MQTTAsync\\.h|MQTTClient\\.h)$")
set(_MQTT_INBOX_SQL_LITERAL
  "\"[^\"\n]*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|VACUUM)[ \";(]")
set(_MQTT_INBOX_SQL_STATEMENT_LITERAL
  "\"[ \t]*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|VACUUM)[ \";(]")
set(_MQTT_INBOX_SQL_CALL
  "(SQLite::Statement|[.>]exec\\(|execAndGet|sqlite3_exec|sqlite3_prepare|pqxx::)")

# The include directives of FILE, as a list of "q:<path>" (quoted) or "a:<path>" (angle).
function(_mqtt_inbox_includes file out)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  set(result "")
  foreach(line IN LISTS lines)
    if(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      list(APPEND result "q:${CMAKE_MATCH_1}")
    elseif(line MATCHES "#[ \t]*include[ \t]*<([^>]+)>")
      list(APPEND result "a:${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# The project file an include directive names, or "" if it is external.
function(_mqtt_inbox_resolve root from directive out)
  string(SUBSTRING "${directive}" 0 1 kind)
  string(SUBSTRING "${directive}" 2 -1 path)
  set(candidates "")
  if(kind STREQUAL "q")
    get_filename_component(dir "${from}" DIRECTORY)
    list(APPEND candidates "${dir}/${path}" "${root}/src/${path}" "${root}/include/${path}")
  elseif(path MATCHES "^mqtt_inbox/")
    list(APPEND candidates "${root}/include/${path}")
  endif()
  foreach(c IN LISTS candidates)
    if(EXISTS "${c}" AND NOT IS_DIRECTORY "${c}")
      get_filename_component(c "${c}" REALPATH)
      set(${out} "${c}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

function(_mqtt_inbox_rel root file out)
  file(RELATIVE_PATH rel "${root}" "${file}")
  set(${out} "${rel}" PARENT_SCOPE)
endfunction()

# The layer (a folder of the table) of a path relative to ROOT, or "" if not in src/.
function(_mqtt_inbox_layer rel out)
  set(best "")
  if(rel MATCHES "^src/")
    string(SUBSTRING "${rel}" 4 -1 inner)
    foreach(entry IN LISTS MQTT_INBOX_LAYERS)
      string(REGEX REPLACE ":.*" "" folder "${entry}")
      string(LENGTH "${folder}" len)
      string(LENGTH "${best}" best_len)
      if(inner MATCHES "^${folder}/" AND len GREATER best_len)
        set(best "${folder}")
      endif()
    endforeach()
    if(best STREQUAL "")
      set(best "?")  # a file of src/ outside every listed folder
    endif()
  endif()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

function(_mqtt_inbox_allowed folder out)
  set(result "")
  foreach(entry IN LISTS MQTT_INBOX_LAYERS)
    if(entry MATCHES "^${folder}:(.*)$")
      string(REPLACE "," ";" result "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# SQL in FILE: appends "<rel>:<line> <what>: <code>" to the list named by OUT. With a
# fifth argument STATEMENTS, a literal counts only if it begins with a keyword (tools/).
function(_mqtt_inbox_sql_lines root file what out)
  set(literal "${_MQTT_INBOX_SQL_LITERAL}")
  if(ARGV4 STREQUAL "STATEMENTS")
    set(literal "${_MQTT_INBOX_SQL_STATEMENT_LITERAL}")
  endif()
  _mqtt_inbox_rel("${root}" "${file}" rel)
  # One list element per line: ';' and brackets would otherwise split or join lines.
  file(READ "${file}" content)
  string(REPLACE ";" "," content "${content}")
  string(REPLACE "[" "(" content "${content}")
  string(REPLACE "]" ")" content "${content}")
  string(REPLACE "\n" ";" lines "${content}")
  set(found "${${out}}")
  set(lineno 0)
  foreach(line IN LISTS lines)
    math(EXPR lineno "${lineno} + 1")
    string(REGEX REPLACE "^[ \t]*//.*" "" code "${line}")
    if(code MATCHES "${literal}" OR code MATCHES "${_MQTT_INBOX_SQL_CALL}")
      string(STRIP "${code}" code)
      list(APPEND found "${rel}:${lineno} ${what} but holds SQL: ${code}")
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

function(mqtt_inbox_layout_violations out)
  cmake_parse_arguments(A "" "ROOT" "CORE;MQTT;POSTGRES" ${ARGN})
  get_filename_component(root "${A_ROOT}" REALPATH)
  set(errors "")
  set(debts_used "")

  # The graph: every file of src/, include/ and tools/; edges to the project files each
  # includes (variables edges_<n>), external includes kept for rule 3 (ext_<n>).
  file(GLOB_RECURSE files LIST_DIRECTORIES false
    "${root}/src/*.h" "${root}/src/*.cpp" "${root}/src/*.c" "${root}/include/*.h"
    "${root}/tools/*.h" "${root}/tools/*.cpp")
  set(nodes "")
  foreach(f IN LISTS files)
    get_filename_component(f "${f}" REALPATH)
    list(APPEND nodes "${f}")
  endforeach()
  list(REMOVE_DUPLICATES nodes)
  set(i 0)
  foreach(f IN LISTS nodes)
    set(id_${i} "${f}")
    string(MD5 key "${f}")
    set(index_${key} ${i})
    math(EXPR i "${i} + 1")
  endforeach()
  set(n ${i})
  set(folder_edges "")
  foreach(f IN LISTS nodes)
    string(MD5 key "${f}")
    set(me ${index_${key}})
    set(edges_${me} "")
    set(ext_${me} "")
    _mqtt_inbox_includes("${f}" incs)
    _mqtt_inbox_rel("${root}" "${f}" rel)
    _mqtt_inbox_layer("${rel}" layer)
    if(layer STREQUAL "?")
      list(APPEND errors "${rel} is in no folder of the layer table")
    endif()
    foreach(d IN LISTS incs)
      _mqtt_inbox_resolve("${root}" "${f}" "${d}" target)
      string(SUBSTRING "${d}" 2 -1 path)
      set(trel "")
      if(target)
        _mqtt_inbox_rel("${root}" "${target}" trel)
      endif()
      # Rule 2: include/ includes nothing from src/; core headers no MQTT header.
      if(rel MATCHES "^include/")
        string(FIND "${target}" "${root}/src/" in_src)
        if(path MATCHES "(^|/)src/" OR path MATCHES "\\.\\." OR in_src EQUAL 0)
          list(APPEND errors "${rel} includes '${path}' from src/: public headers include only include/ and external headers")
        endif()
        get_filename_component(me_name "${rel}" NAME)
        get_filename_component(t_name "${trel}" NAME)
        if(trel MATCHES "^include/" AND t_name IN_LIST MQTT_INBOX_MQTT_HEADERS
           AND NOT me_name IN_LIST MQTT_INBOX_MQTT_HEADERS AND NOT me_name STREQUAL "mqtt_inbox.h")
          list(APPEND errors "core public header ${rel} includes the MQTT header ${trel}")
        endif()
      endif()
      if(target)
        # Rules 1 and 5: the layer table, and *_impl.h private to its folder.
        _mqtt_inbox_layer("${trel}" tlayer)
        if(layer AND tlayer AND NOT layer STREQUAL "?" AND NOT tlayer STREQUAL "?"
           AND NOT layer STREQUAL tlayer)
          list(APPEND folder_edges "${layer}>${tlayer}")
          _mqtt_inbox_allowed("${layer}" allowed)
          if(NOT tlayer IN_LIST allowed)
            if("${rel}:${tlayer}" IN_LIST MQTT_INBOX_LAYOUT_DEBTS)
              list(APPEND debts_used "${rel}:${tlayer}")
            else()
              list(JOIN allowed ", " allowed_text)
              list(APPEND errors "${rel} (layer ${layer}) includes ${trel} (layer ${tlayer}): ${layer} may use only '${allowed_text}'")
            endif()
          endif()
        endif()
        get_filename_component(t_name "${trel}" NAME)
        get_filename_component(t_dir "${trel}" DIRECTORY)
        get_filename_component(me_dir "${rel}" DIRECTORY)
        if(t_name MATCHES "_impl\\.h$" AND NOT t_dir STREQUAL me_dir)
          list(APPEND errors "${rel} includes ${trel}, private to ${t_dir}/")
        endif()
        string(MD5 tkey "${target}")
        if(DEFINED index_${tkey})
          list(APPEND edges_${me} ${index_${tkey}})
        endif()
      else()
        list(APPEND ext_${me} "${path}")
      endif()
    endforeach()
  endforeach()

  # Rule 3: what the core's (and the PostgreSQL store's) sources reach through the
  # project's headers.
  foreach(src IN LISTS A_CORE A_POSTGRES)
    if(NOT IS_ABSOLUTE "${src}")
      set(src "${root}/${src}")
    endif()
    if(NOT EXISTS "${src}")
      continue()
    endif()
    get_filename_component(src "${src}" REALPATH)
    string(MD5 key "${src}")
    if(NOT DEFINED index_${key})
      continue()  # generated, or outside src/ and include/
    endif()
    _mqtt_inbox_rel("${root}" "${src}" srcrel)
    set(seen ${index_${key}})
    set(todo ${index_${key}})
    while(todo)
      list(POP_FRONT todo cur)
      _mqtt_inbox_rel("${root}" "${id_${cur}}" currel)
      get_filename_component(name "${id_${cur}}" NAME)
      if(currel MATCHES "^src/mqtt/" OR (currel MATCHES "^include/" AND name IN_LIST MQTT_INBOX_MQTT_HEADERS))
        list(APPEND errors "core source ${srcrel} includes ${currel} (the MQTT layer)")
      endif()
      foreach(e IN LISTS ext_${cur})
        if(e MATCHES "${_MQTT_INBOX_PAHO_INCLUDE}")
          list(APPEND errors "core source ${srcrel} includes Paho's <${e}> (in ${currel})")
        endif()
      endforeach()
      foreach(next IN LISTS edges_${cur})
        if(NOT next IN_LIST seen)
          list(APPEND seen ${next})
          list(APPEND todo ${next})
        endif()
      endforeach()
    endwhile()
  endforeach()

  # Rule 4: SQL only under src/store/<kind>/; none in what uses Paho, nor in tools/.
  file(GLOB_RECURSE candidates LIST_DIRECTORIES false
    "${root}/src/*.h" "${root}/src/*.cpp" "${root}/tools/*.h" "${root}/tools/*.cpp"
    "${root}/examples/*.h" "${root}/examples/*.cpp")
  foreach(f IN LISTS candidates)
    get_filename_component(f "${f}" REALPATH)
    _mqtt_inbox_rel("${root}" "${f}" rel)
    set(uses_paho FALSE)
    if(rel MATCHES "^src/mqtt/")
      set(uses_paho TRUE)
    endif()
    _mqtt_inbox_includes("${f}" incs)
    foreach(d IN LISTS incs)
      string(SUBSTRING "${d}" 2 -1 path)
      if(path MATCHES "${_MQTT_INBOX_PAHO_INCLUDE}")
        set(uses_paho TRUE)
      endif()
    endforeach()
    set(found "")
    if(uses_paho)
      _mqtt_inbox_sql_lines("${root}" "${f}" "is in the MQTT layer" found)
    elseif(rel MATCHES "^src/" AND NOT rel MATCHES "^src/store/[^/]+/")
      _mqtt_inbox_sql_lines("${root}" "${f}" "is outside the store layer (src/store/<kind>/)" found)
      if(found AND "${rel}:sql" IN_LIST MQTT_INBOX_LAYOUT_DEBTS)
        list(APPEND debts_used "${rel}:sql")
        set(found "")
      endif()
    elseif(rel MATCHES "^tools/")
      _mqtt_inbox_sql_lines("${root}" "${f}"
        "is in the admin tool (its reads of a store are src/store/<kind>/admin.h's)" found
        STATEMENTS)
    endif()
    list(APPEND errors ${found})
  endforeach()

  # Rule 6a: no include cycles among files. Peel off files that include no remaining
  # file (they cannot be on a cycle), then files no remaining file includes; what is
  # left is cycles.
  set(remaining "")
  if(n GREATER 0)
    math(EXPR last "${n} - 1")
    foreach(k RANGE 0 ${last})
      list(APPEND remaining ${k})
    endforeach()
  endif()
  set(changed TRUE)
  while(changed)
    set(changed FALSE)
    set(included "")
    foreach(k IN LISTS remaining)
      foreach(e IN LISTS edges_${k})
        if(e IN_LIST remaining)
          list(APPEND included ${e})
        endif()
      endforeach()
    endforeach()
    set(keep "")
    foreach(k IN LISTS remaining)
      set(out_live FALSE)
      foreach(e IN LISTS edges_${k})
        if(e IN_LIST remaining)
          set(out_live TRUE)
          break()
        endif()
      endforeach()
      if(out_live AND k IN_LIST included)
        list(APPEND keep ${k})
      else()
        set(changed TRUE)
      endif()
    endforeach()
    set(remaining ${keep})
  endwhile()
  if(remaining)
    set(names "")
    foreach(k IN LISTS remaining)
      _mqtt_inbox_rel("${root}" "${id_${k}}" rel)
      list(APPEND names "${rel}")
    endforeach()
    list(JOIN names ", " names)
    list(APPEND errors "include cycle among: ${names}")
  endif()

  # Rule 6b: no cycles among folders (the table is acyclic, but debts could close one).
  list(REMOVE_DUPLICATES folder_edges)
  foreach(edge IN LISTS folder_edges)
    string(REPLACE ">" ";" pair "${edge}")
    list(GET pair 0 a)
    list(GET pair 1 b)
    if("${b}>${a}" IN_LIST folder_edges)
      list(APPEND errors "folders ${a} and ${b} include each other")
    endif()
  endforeach()

  # Rule 7: each library target's sources are exactly its folders' .cpp files.
  foreach(kind CORE MQTT POSTGRES)
    set(listed "")
    foreach(src IN LISTS A_${kind})
      if(NOT IS_ABSOLUTE "${src}")
        set(src "${root}/${src}")
      endif()
      get_filename_component(src "${src}" REALPATH)
      string(FIND "${src}" "${root}/src/" in_src)
      if(in_src EQUAL 0)
        _mqtt_inbox_rel("${root}" "${src}" srcrel)
        list(APPEND listed "${srcrel}")
      endif()
    endforeach()
    set(expected "")
    foreach(folder IN LISTS MQTT_INBOX_${kind}_FOLDERS)
      file(GLOB these LIST_DIRECTORIES false "${root}/src/${folder}/*.cpp" "${root}/src/${folder}/*.c")
      foreach(t IN LISTS these)
        _mqtt_inbox_rel("${root}" "${t}" trel)
        list(APPEND expected "${trel}")
      endforeach()
    endforeach()
    if(A_${kind})
      foreach(e IN LISTS expected)
        if(NOT e IN_LIST listed)
          list(APPEND errors "${e} is in a folder of the ${kind} library but not among its sources")
        endif()
      endforeach()
      foreach(l IN LISTS listed)
        if(NOT l IN_LIST expected)
          list(JOIN MQTT_INBOX_${kind}_FOLDERS ", " folders_text)
          list(APPEND errors "${l} is a source of the ${kind} library but not in one of its folders (${folders_text})")
        endif()
      endforeach()
    endif()
  endforeach()

  # Debts that no longer match anything: take them off the list.
  foreach(debt IN LISTS MQTT_INBOX_LAYOUT_DEBTS)
    if(NOT debt IN_LIST debts_used)
      list(APPEND errors "layout debt '${debt}' is paid: remove it from MQTT_INBOX_LAYOUT_DEBTS")
    endif()
  endforeach()

  set(${out} "${errors}" PARENT_SCOPE)
endfunction()

# The code is formatted by the repository's .clang-format. Used by cmake/check_format.cmake
# (the ctest `format_check`) and by tests/build/format_check_selftest.cmake, which proves
# the check fires on an unformatted file and on a debt that is paid.
#
# mqtt_inbox_format_violations(OUT ROOT <dir> CLANG_FORMAT <program> [DEBTS <files...>])
#   ROOT          the source tree: every .h, .cpp and .c under src/, include/, tools/,
#                 examples/, bench/ and tests/ below it is checked.
#   CLANG_FORMAT  the clang-format program; it reads ROOT/.clang-format.
#   DEBTS         files (relative to ROOT) not formatted yet, left out of the check. A debt
#                 that is formatted, or no longer exists, is reported too, so the list only
#                 shrinks.
#   OUT           set to the list of violations, one message each ("" when the tree is clean).

# Files not formatted yet: empty since issue 28 formatted the whole tree. Keep it empty:
# it exists for a file that must wait (another change in flight), and it may only shrink
# (a formatted or missing debt fails the check).
set(MQTT_INBOX_FORMAT_DEBTS)

function(_mqtt_inbox_unformatted clang_format root files out)
  set(result "")
  if(files)
    execute_process(COMMAND ${clang_format} --dry-run ${files}
      WORKING_DIRECTORY "${root}" RESULT_VARIABLE rc OUTPUT_VARIABLE stdout
      ERROR_VARIABLE stderr)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${clang_format} failed (${rc}): ${stderr}")
    endif()
    # One "<file>:<line>:<col>: warning: code should be clang-formatted" per change.
    string(REGEX MATCHALL "[^\n:]+:[0-9]+:[0-9]+: warning: code should be clang-formatted"
      found "${stderr}")
    foreach(line IN LISTS found)
      string(REGEX REPLACE ":[0-9]+:[0-9]+: warning: .*" "" file "${line}")
      list(APPEND result "${file}")
    endforeach()
    list(REMOVE_DUPLICATES result)
  endif()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

function(mqtt_inbox_format_violations out)
  cmake_parse_arguments(A "" "ROOT;CLANG_FORMAT" "DEBTS" ${ARGN})
  get_filename_component(root "${A_ROOT}" REALPATH)
  set(globs "")
  foreach(dir src include tools examples bench tests)
    list(APPEND globs "${root}/${dir}/*.h" "${root}/${dir}/*.cpp" "${root}/${dir}/*.c")
  endforeach()
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${root}" ${globs})
  list(SORT files)
  set(checked "")
  foreach(f IN LISTS files)
    if(NOT f IN_LIST A_DEBTS)
      list(APPEND checked "${f}")
    endif()
  endforeach()
  set(errors "")
  _mqtt_inbox_unformatted("${A_CLANG_FORMAT}" "${root}" "${checked}" bad)
  foreach(f IN LISTS bad)
    list(APPEND errors "${f} is not formatted: clang-format -i ${f}")
  endforeach()
  set(present "")
  foreach(debt IN LISTS A_DEBTS)
    if(debt IN_LIST files)
      list(APPEND present "${debt}")
    else()
      list(APPEND errors "format debt '${debt}' names no file: remove it from the list")
    endif()
  endforeach()
  _mqtt_inbox_unformatted("${A_CLANG_FORMAT}" "${root}" "${present}" still)
  foreach(debt IN LISTS present)
    if(NOT debt IN_LIST still)
      list(APPEND errors "format debt '${debt}' is paid (the file is formatted): remove it from the list")
    endif()
  endforeach()
  set(${out} "${errors}" PARENT_SCOPE)
endfunction()

# ctest `format_check_selftest`: the format check (cmake/format_rules.cmake) fires on an
# unformatted file, on a debt that is paid and on a debt that names no file, and stays
# quiet on a tree that has none of these, so format_check passing means something.
#   cmake -DWORK=<scratch folder> -DCLANG_FORMAT=<program> -DSTYLE=<.clang-format>
#         -P format_check_selftest.cmake
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/format_rules.cmake")
if(NOT CLANG_FORMAT OR NOT EXISTS "${CLANG_FORMAT}")
  message(FATAL_ERROR "clang-format not found: format check skipped")
endif()

set(failures 0)
set(formatted "int f(int a) {\n  if (a > 1) return a;\n  return 0;\n}\n")
set(unformatted "int  f( int a ){ if(a>1) return a;\n return 0; }\n")

# A tree with the project's .clang-format: formatted files in every checked folder, one
# unformatted file under tests/ and one under src/, and a file outside the checked folders
# that is unformatted (not checked).
function(make_tree dir)
  file(REMOVE_RECURSE "${dir}")
  configure_file("${STYLE}" "${dir}/.clang-format" COPYONLY)
  foreach(f src/util/a.cpp include/mqtt_inbox/a.h tools/a.cpp examples/common/a.h bench/a.c
      tests/unit/a_test.cpp)
    file(WRITE "${dir}/${f}" "${formatted}")
  endforeach()
  file(WRITE "${dir}/src/store/b.cpp" "${unformatted}")
  file(WRITE "${dir}/tests/support/b.h" "${unformatted}")
  file(WRITE "${dir}/docs/b.cpp" "${unformatted}")
endfunction()

# expect(NAME DEBTS <list> PATTERNS <regex...>): each pattern matches one violation, and
# there are as many violations as patterns (none for a clean tree).
function(expect name)
  cmake_parse_arguments(A "" "" "DEBTS;PATTERNS" ${ARGN})
  mqtt_inbox_format_violations(errors ROOT "${WORK}/t" CLANG_FORMAT "${CLANG_FORMAT}"
    DEBTS ${A_DEBTS})
  list(LENGTH errors n)
  list(LENGTH A_PATTERNS want)
  set(ok TRUE)
  if(NOT n EQUAL want)
    set(ok FALSE)
  endif()
  foreach(p IN LISTS A_PATTERNS)
    set(hit FALSE)
    foreach(e IN LISTS errors)
      if(e MATCHES "${p}")
        set(hit TRUE)
      endif()
    endforeach()
    if(NOT hit)
      set(ok FALSE)
    endif()
  endforeach()
  if(ok)
    message(STATUS "ok: ${name}")
  else()
    list(JOIN errors "\n    " got)
    message(SEND_ERROR "FAILED: ${name}: want ${want} violation(s) matching '${A_PATTERNS}', got ${n}:\n    ${got}")
  endif()
endfunction()

make_tree("${WORK}/t")
expect("unformatted files are found, outside folders are not read"
  PATTERNS "^src/store/b.cpp is not formatted" "^tests/support/b.h is not formatted")
expect("listed debts are left out"
  DEBTS src/store/b.cpp tests/support/b.h)
expect("a paid debt and a missing one are reported"
  DEBTS src/store/b.cpp tests/support/b.h src/util/a.cpp tests/gone.cpp
  PATTERNS "^format debt 'src/util/a.cpp' is paid" "^format debt 'tests/gone.cpp' names no file")

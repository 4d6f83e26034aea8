# Files the README shows verbatim: every block of the form
#
#   <!-- include examples/walkthrough.cpp -->
#   ```cpp
#   ...the file, byte for byte...
#   ```
#   <!-- end include -->
#
# must hold exactly that file (path relative to ROOT), so the code a reader copies is the
# code CI compiles. Checks by default; UPDATE=ON copies the files into the README instead.
#
#   cmake -DROOT=<repo> [-DWORK=<scratch dir>] [-DEXPECT=<file;file>] [-DREADME=<path>]
#         [-DUPDATE=ON] -P check_readme_includes.cmake
#
# WORK: where the README's differing copy is written for `diff -u` (no diff without it).
#
# EXPECT lists files that must have a block (so deleting the markers fails too).
cmake_minimum_required(VERSION 3.16)
if(NOT ROOT)
  message(FATAL_ERROR "ROOT not set")
endif()
if(NOT README)
  set(README "${ROOT}/README.md")
endif()
set(_begin "<!-- include ")
set(_end "<!-- end include -->")
set(_fence "```")

file(READ "${README}" _text)
set(_out "")      # the README rebuilt with the files' current text (UPDATE=ON)
set(_found "")
set(_errors "")
while(TRUE)
  string(FIND "${_text}" "${_begin}" _b)
  if(_b EQUAL -1)
    string(APPEND _out "${_text}")
    break()
  endif()
  # The marker line: <!-- include FILE -->
  string(SUBSTRING "${_text}" 0 ${_b} _head)
  string(APPEND _out "${_head}")
  string(SUBSTRING "${_text}" ${_b} -1 _text)
  string(FIND "${_text}" "\n" _eol)
  string(SUBSTRING "${_text}" 0 ${_eol} _marker)
  math(EXPR _after "${_eol} + 1")
  string(SUBSTRING "${_text}" ${_after} -1 _text)
  if(NOT _marker MATCHES "^<!-- include ([^ ]+) -->$")
    message(FATAL_ERROR "${README}: malformed include marker: ${_marker}")
  endif()
  set(_file "${CMAKE_MATCH_1}")
  list(APPEND _found "${_file}")
  string(FIND "${_text}" "${_end}" _e)
  if(_e EQUAL -1)
    message(FATAL_ERROR "${README}: '${_marker}' has no '${_end}'")
  endif()
  string(SUBSTRING "${_text}" 0 ${_e} _block)
  string(SUBSTRING "${_text}" ${_e} -1 _text)
  # The block is a fence line, the file, and a closing fence.
  string(FIND "${_block}" "\n" _eol)
  string(SUBSTRING "${_block}" 0 ${_eol} _open)
  if(NOT _open MATCHES "^```[a-z]*$")
    message(FATAL_ERROR "${README}: '${_marker}' must be followed by a ``` fence line")
  endif()
  math(EXPR _after "${_eol} + 1")
  string(SUBSTRING "${_block}" ${_after} -1 _shown)
  string(LENGTH "${_shown}" _len)
  math(EXPR _len "${_len} - 4")
  if(_len LESS 0)
    set(_len 0)
  endif()
  string(SUBSTRING "${_shown}" ${_len} -1 _close)
  if(NOT _close STREQUAL "${_fence}\n")
    message(FATAL_ERROR "${README}: the block of ${_file} must end with a ``` line before '${_end}'")
  endif()
  string(SUBSTRING "${_shown}" 0 ${_len} _shown)
  if(NOT EXISTS "${ROOT}/${_file}")
    message(FATAL_ERROR "${README}: includes ${_file}, which does not exist")
  endif()
  file(READ "${ROOT}/${_file}" _want)
  string(APPEND _out "${_marker}\n${_open}\n${_want}${_fence}\n")
  if(NOT _shown STREQUAL _want)
    list(APPEND _errors "${_file}")
    find_program(_diff diff)
    if(WORK AND _diff AND NOT UPDATE)  # show the difference: the README's copy in a file
      string(MAKE_C_IDENTIFIER "${_file}" _id)
      file(WRITE "${WORK}/${_id}.in_readme" "${_shown}")
      execute_process(COMMAND "${_diff}" -u "${ROOT}/${_file}" "${WORK}/${_id}.in_readme")
    endif()
  endif()
endwhile()

foreach(_f IN LISTS EXPECT)
  if(NOT _f IN_LIST _found)
    message(FATAL_ERROR "${README}: no '<!-- include ${_f} -->' block")
  endif()
endforeach()

if(UPDATE)
  if(_errors)
    file(WRITE "${README}" "${_out}")
    message(STATUS "updated ${README} from: ${_errors}")
  endif()
elseif(_errors)
  message(FATAL_ERROR "${README} differs from ${_errors} (diff above: - the file, + the "
    "README). Edit the file, then copy it into the README with:\n"
    "  cmake -DROOT=${ROOT} -DUPDATE=ON -P ${CMAKE_CURRENT_LIST_FILE}")
else()
  message(STATUS "${README}: ${_found} shown verbatim")
endif()

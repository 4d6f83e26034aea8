# ctest `doc_anchors` (label unit): fails if a citation of the manual does not land, i.e.
# a `docs/<file>.md#<anchor>` in the sources, or a relative link in README.md or docs/,
# names a file or heading that does not exist. The checks are in cmake/doc_anchors.cmake.
#   cmake -DROOT=<source dir> -P check_doc_anchors.cmake
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/doc_anchors.cmake")
if(NOT ROOT)
  message(FATAL_ERROR "ROOT not set")
endif()
mqtt_inbox_doc_anchor_violations(errors ROOT "${ROOT}")
if(errors)
  list(LENGTH errors count)
  foreach(e IN LISTS errors)
    message("doc anchors: ${e}")
  endforeach()
  message(FATAL_ERROR "doc anchors: ${count} citation(s) that do not land (anchors are "
    "GitHub's: lower case, punctuation dropped, spaces to '-'; cmake/doc_anchors.cmake)")
endif()
message(STATUS "doc anchors: every citation lands")

# ctest `doc_anchors_selftest`: the citation checks (cmake/doc_anchors.cmake) fire on small
# trees that break each of them, and stay quiet on one that breaks none, so doc_anchors
# passing on the real tree means something.
#   cmake -DWORK=<scratch folder> -P doc_anchors_selftest.cmake
# The citations below are spelled through ${D} so that this file, which doc_anchors reads
# too, holds none.
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/doc_anchors.cmake")

set(failures 0)
set(D "docs")
set(F "```")

# A tree whose every citation lands: headings with punctuation, code and a link in them,
# a heading twice, a heading-like line inside a code fence, an HTML anchor, links between
# docs/ files, to README.md and to a source file, and an URL that is not followed.
function(make_tree dir)
  file(REMOVE_RECURSE "${dir}")
  file(WRITE "${dir}/README.md"
    "# Title\n\nSee [the guide](${D}/guide.md#start-up-disk-space--corruption) and "
    "[the other](${D}/other.md).\n")
  file(WRITE "${dir}/${D}/guide.md"
    "# Guide\n\n## Start-up, disk space & corruption\n\n### `Inbox::open()` [waits]\n\n"
    "## Twice\n\ntext\n\n## Twice\n\n## See [this](other.md) too ##\n\n"
    "${F}sh\n# Not a heading: a shell comment\n${F}\n\n<a name=\"by-hand\"></a>\n")
  file(WRITE "${dir}/${D}/other.md"
    "# Other\n\n## Local\n\n[up](../README.md#title), [guide](guide.md#twice-1), "
    "[here](#local), [code](../src/x.cpp), [web](https://example.com/x.md#y); "
    "`v[0](x)` is code.\n\n"
    "${F}cpp\nauto f = [&](int x) { return x; };  // [not](a-link.md#here)\n${F}\n")
  file(WRITE "${dir}/src/x.cpp"
    "// Why: ${D}/guide.md#inboxopen-waits, ${D}/guide.md#twice, ${D}/guide.md#by-hand.\n"
    "int x;\n")
  file(WRITE "${dir}/include/y.h" "// ${D}/guide.md#see-this-too\n")
endfunction()

# expect(NAME DIR PATTERN): the checks report a violation matching PATTERN ("" = none).
function(expect name dir pattern)
  mqtt_inbox_doc_anchor_violations(errors ROOT "${dir}")
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

# Each case gets a tree of its own: the anchors of a file are cached by its path.
set(n 0)
macro(next_tree)
  math(EXPR n "${n} + 1")
  set(t "${WORK}/tree${n}")
  make_tree("${t}")
endmacro()

next_tree()
expect("clean tree" "${t}" "")

next_tree()
file(APPEND "${t}/src/x.cpp" "// ${D}/guide.md#no-such-section\n")
expect("an anchor cited in code that no heading has" "${t}"
  "^src/x.cpp:3: .*guide.md#no-such-section: .*guide.md has no heading with the anchor")

next_tree()
file(APPEND "${t}/include/y.h" "// ${D}/gone.md#start\n")
expect("a docs file cited in a header that does not exist" "${t}"
  "^include/y.h:2: .*gone.md#start: .*gone.md does not exist")

next_tree()
file(WRITE "${t}/cmake/rules.cmake" "# see ${D}/guide.md#startup\n")
expect("a citation in cmake/" "${t}" "^cmake/rules.cmake:1: .*has no heading with the anchor 'startup'")

next_tree()
file(APPEND "${t}/src/x.cpp" "// ${D}/guide.md#not-a-heading-a-shell-comment\n")
expect("a '#' line inside a code fence is no heading" "${t}"
  "^src/x.cpp:3: .*anchor 'not-a-heading-a-shell-comment'")

next_tree()
file(APPEND "${t}/src/x.cpp" "// ${D}/guide.md#twice-2\n")
expect("a heading twice has two anchors, not three" "${t}" "^src/x.cpp:3: .*anchor 'twice-2'")

next_tree()
file(APPEND "${t}/${D}/other.md" "\nAnd [gone](guide.md#missing).\n")
expect("a relative link between docs files" "${t}"
  "^${D}/other.md:11: \\(guide.md#missing\\): .*guide.md has no heading")

next_tree()
file(APPEND "${t}/${D}/other.md" "\nAnd [here](#nowhere).\n")
expect("a link to a heading of the same file" "${t}" "^${D}/other.md:11: \\(#nowhere\\)")

next_tree()
file(APPEND "${t}/README.md" "\nThe [manual](${D}/manual.md).\n")
expect("a README link to a file that does not exist" "${t}"
  "^README.md:5: \\(${D}/manual.md\\): ${D}/manual.md does not exist")

next_tree()
file(APPEND "${t}/README.md" "\nThe [guide](guide.md#twice).\n")
expect("a README link resolves from the README's folder" "${t}"
  "^README.md:5: \\(guide.md#twice\\): guide.md does not exist")

if(failures GREATER 0)
  message(FATAL_ERROR "doc anchors self-test: ${failures} case(s) failed")
endif()
message(STATUS "doc anchors self-test: every check fires, and a clean tree passes")

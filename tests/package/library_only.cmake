# The configure of docs/packaging.md#install-the-library-into-a-prefix: tests, examples, tools and
# benchmarks off. It must not need GoogleTest (a test-only dependency) nor CLI11 (the
# programs'), so both are made unfindable: a find_package(GTest REQUIRED) reached with
# tests off fails the configure. Configure only; package_install covers the install.
#   cmake -DSOURCE=<repo> -DBINARY=<scratch> [-DGENERATOR=<gen>] -P library_only.cmake
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)
file(REMOVE_RECURSE "${BINARY}")
set(gen)
if(GENERATOR)
  set(gen -G "${GENERATOR}")
endif()
run(${CMAKE_COMMAND} -S "${SOURCE}" -B "${BINARY}" ${gen}
  -DMQTT_INBOX_BUILD_TESTS=OFF -DMQTT_INBOX_BUILD_EXAMPLES=OFF
  -DMQTT_INBOX_BUILD_TOOLS=OFF -DMQTT_INBOX_BUILD_BENCH=OFF
  -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON)

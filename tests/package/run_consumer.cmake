# Configure, build (-j2: shared 2-core machines) and run one consumer project.
#   cmake -DSOURCE=<dir> -DBINARY=<dir> [-DGENERATOR=<gen>] [-DARGS=<a;b>]
#         [-DRUN=<exe;exe>] [-DLD_PATH=<dir>] -P run_consumer.cmake
# RUN lists the programs (relative to BINARY) to run after the build; each must exit 0.
foreach(v SOURCE BINARY)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "${v} not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${BINARY}")
set(gen)
if(GENERATOR)
  set(gen -G "${GENERATOR}")
endif()
string(REPLACE "|" ";" ARGS "${ARGS}")
string(REPLACE "|" ";" RUN "${RUN}")

include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)

run(${CMAKE_COMMAND} -S "${SOURCE}" -B "${BINARY}" ${gen} ${ARGS})
run(${CMAKE_COMMAND} --build "${BINARY}" --parallel 2)
foreach(exe IN LISTS RUN)
  if(LD_PATH)
    run(${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${LD_PATH}" "${BINARY}/${exe}"
        "${BINARY}/${exe}.db")
  else()
    run("${BINARY}/${exe}" "${BINARY}/${exe}.db")
  endif()
endforeach()

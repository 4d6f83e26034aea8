# run(<command> <args>...): echo the command, run it, stop the script if it fails.
# Included by the packaging test scripts (cmake -P).
function(run)
  message(STATUS "+ ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

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

# Files not formatted yet (issue 28): being edited elsewhere when the format check came
# (src/outbox, the relay's files in src/mqtt and the store they extend, examples/, tools/,
# tests/), so they were left alone to keep those changes mergeable. Format a file
# (clang-format -i <file>) when next working on it, and take it off the list: the list
# may only shrink (a formatted or missing debt fails the check).
set(MQTT_INBOX_FORMAT_DEBTS
  "examples/common/connection_flags.cpp"
  "examples/common/connection_flags.h"
  "examples/publisher.cpp"
  "examples/sensor_gateway.cpp"
  "src/mqtt/relay_figures.cpp"
  "src/mqtt/relay_message.cpp"
  "src/mqtt/relay_publish.cpp"
  "tests/broker/admin_tool_test.cpp"
  "tests/broker/paho_trace_test.cpp"
  "tests/broker/poison_test.cpp"
  "tests/broker/rabbitmq_test.cpp"
  "tests/broker/relay_lent_test.cpp"
  "tests/broker/relay_test.cpp"
  "tests/broker/service_e2e_test.cpp"
  "tests/broker/store_then_process_test.cpp"
  "tests/broker/subscriber_test.cpp"
  "tests/broker/subscriptions_test.cpp"
  "tests/broker/tls_test.cpp"
  "tests/crash/crash_loop_test.cpp"
  "tests/crash/crash_test.cpp"
  "tests/crash/one_transaction_test.cpp"
  "tests/crash/power_loss_test.cpp"
  "tests/crash/stop_while_stuck_test.cpp"
  "tests/crash/store_failure_test.cpp"
  "tests/crash/two_hop_test.cpp"
  "tests/fuzz/fuzz_message_id.cpp"
  "tests/fuzz/regression_main.cpp"
  "tests/package/common/consumer.cpp"
  "tests/support/child_consumer.h"
  "tests/support/core_cases.cpp"
  "tests/support/crash_consumer.cpp"
  "tests/support/fault_vfs.cpp"
  "tests/support/fault_vfs.h"
  "tests/support/ledger_fixture.h"
  "tests/support/notify_socket.cpp"
  "tests/support/notify_socket.h"
  "tests/support/process.cpp"
  "tests/support/rabbitmq.cpp"
  "tests/support/relay_fixture.h"
  "tests/support/stp_consumer.cpp"
  "tests/support/tls_fixture.h"
  "tests/support/tls_pki.cpp"
  "tests/unit/delivery_policy_test.cpp"
  "tests/unit/error_class_test.cpp"
  "tests/unit/fault_vfs_test.cpp"
  "tests/unit/inbox_test.cpp"
  "tests/unit/journal_log_test.cpp"
  "tests/unit/message_id_test.cpp"
  "tests/unit/reentry_test.cpp"
  "tests/unit/reject_message_test.cpp"
  "tests/unit/requeue_test.cpp"
  "tests/unit/retention_test.cpp"
  "tests/unit/service_notifier_test.cpp"
  "tests/unit/startup_test.cpp"
  "tools/check.cpp"
  "tools/commands.h"
  "tools/database.cpp"
  "tools/database.h"
  "tools/dead_letters.cpp"
  "tools/export.cpp"
  "tools/format.cpp"
  "tools/format.h"
  "tools/main.cpp"
  "tools/outbox.cpp"
  "tools/probe_broker.cpp"
  "tools/prune.cpp"
  "tools/replay.cpp"
  "tools/stats.cpp"
  "tools/tool.cpp"
  "tools/tool.h")

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

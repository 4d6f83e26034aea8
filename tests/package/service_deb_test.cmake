# The mqtt-inbox (service) .deb, checked from a scratch root (included by deb_test.cmake).
#
# mqtt_inbox_check_service_deb(<deb> <work dir>):
#  1. dpkg -x into <work>/root: exactly the files README "Running as a service" lists;
#  2. its control data: the package name, Depends: adduser, maintainer scripts that enable
#     and start nothing;
#  3. the programs run from the scratch root (--help);
#  4. systemd-analyze verify on its units, with ExecStart= pointed into the scratch root
#     (after checking that the unit's own path is a file of the package), silent and
#     successful; systemd-analyze security --offline: exposure at most 2.0;
#  5. the postinst run with DPKG_ROOT=<scratch root> (as dpkg --root would): it creates the
#     user mqtt-inbox from the packaged sysusers.d file and /etc/mqtt-inbox, twice
#     (upgrade); prerm and postrm purge afterwards.
# No systemd runs here (systemd-analyze and systemd-sysusers work offline on files); where
# a tool is missing its step says so and is skipped.
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)

function(mqtt_inbox_check_service_deb deb work)
  set(root "${work}/root")
  file(REMOVE_RECURSE "${work}")
  file(MAKE_DIRECTORY "${root}" "${work}/control" "${work}/verify")
  run(dpkg-deb --info ${deb})
  run(dpkg-deb --contents ${deb})
  run(dpkg -x ${deb} "${root}")
  run(dpkg-deb -e ${deb} "${work}/control")

  # 1. The files, all of them.
  set(expected
    usr/bin/mqtt-inbox
    usr/lib/systemd/system/mqtt-inbox-ledger-consumer.service
    usr/lib/systemd/system/mqtt-inbox-sensor-gateway.service
    usr/lib/sysusers.d/mqtt-inbox.conf
    usr/libexec/mqtt-inbox/ledger_consumer
    usr/libexec/mqtt-inbox/sensor_gateway
    usr/share/doc/mqtt-inbox/examples/ledger-consumer.env
    usr/share/doc/mqtt-inbox/examples/sensor-gateway.env)
  file(GLOB_RECURSE found LIST_DIRECTORIES false RELATIVE "${root}" "${root}/*")
  list(SORT found)
  if(NOT found STREQUAL expected)
    string(REPLACE ";" "\n  " f "${found}")
    string(REPLACE ";" "\n  " e "${expected}")
    message(FATAL_ERROR "mqtt-inbox package files:\n  ${f}\nexpected:\n  ${e}")
  endif()

  # 2. Control data and maintainer scripts.
  file(READ "${work}/control/control" control)
  if(NOT control MATCHES "\nPackage: mqtt-inbox\n" AND NOT control MATCHES "^Package: mqtt-inbox\n")
    message(FATAL_ERROR "control: not package mqtt-inbox:\n${control}")
  endif()
  if(NOT control MATCHES "\nDepends: [^\n]*adduser")
    message(FATAL_ERROR "control: Depends lacks adduser:\n${control}")
  endif()
  foreach(script postinst prerm postrm)
    set(p "${work}/control/${script}")
    if(NOT EXISTS "${p}")
      message(FATAL_ERROR "the package has no ${script}")
    endif()
    file(READ "${p}" text)
    if(text MATCHES "systemctl[^\n]*(enable|start|restart) " AND NOT text MATCHES "try-restart")
      message(FATAL_ERROR "${script} enables or starts a unit; the package enables nothing")
    endif()
    execute_process(COMMAND test -x "${p}" RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${script} is not executable")
    endif()
  endforeach()

  # 3. The programs run (they link the mqtt-inbox libraries statically).
  foreach(prog usr/bin/mqtt-inbox usr/libexec/mqtt-inbox/ledger_consumer
               usr/libexec/mqtt-inbox/sensor_gateway)
    execute_process(COMMAND "${root}/${prog}" --help OUTPUT_VARIABLE out RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${prog} --help failed (${rc})")
    endif()
  endforeach()

  # 4. The units.
  find_program(SYSTEMD_ANALYZE systemd-analyze)
  if(SYSTEMD_ANALYZE)
    set(units "")
    foreach(unit mqtt-inbox-ledger-consumer.service mqtt-inbox-sensor-gateway.service)
      file(READ "${root}/usr/lib/systemd/system/${unit}" text)
      if(NOT text MATCHES "\nExecStart=(/[^ \n]+)")
        message(FATAL_ERROR "${unit}: no absolute ExecStart=")
      endif()
      if(NOT EXISTS "${root}${CMAKE_MATCH_1}")
        message(FATAL_ERROR "${unit}: ExecStart=${CMAKE_MATCH_1} is not a file of the package")
      endif()
      string(REPLACE "\nExecStart=/usr/" "\nExecStart=${root}/usr/" text "${text}")
      file(WRITE "${work}/verify/${unit}" "${text}")
      list(APPEND units "${work}/verify/${unit}")
    endforeach()
    message(STATUS "+ systemd-analyze verify ${units}")
    execute_process(COMMAND ${SYSTEMD_ANALYZE} verify --man=no ${units}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0 OR NOT "${out}${err}" STREQUAL "")
      message(FATAL_ERROR "systemd-analyze verify (${rc}) is not silent:\n${out}${err}")
    endif()
    foreach(u IN LISTS units)
      execute_process(COMMAND ${SYSTEMD_ANALYZE} security --offline=yes --no-pager "${u}"
        RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
      if(NOT "${out}" MATCHES "Overall exposure level for [^:]+: ([0-9]+)\\.([0-9])")
        message(FATAL_ERROR "systemd-analyze security --offline: no exposure level:\n${out}${err}")
      endif()
      set(level "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
      message(STATUS "exposure of ${u}: ${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
      if(level GREATER 20)
        message(FATAL_ERROR "exposure above 2.0: a hardening setting was lost\n${out}")
      endif()
    endforeach()
  else()
    message(STATUS "systemd-analyze not found (Debian package systemd): units not verified")
  endif()

  # 5. The maintainer scripts in the scratch root (DPKG_ROOT, as dpkg --root runs them).
  find_program(SYSTEMD_SYSUSERS systemd-sysusers)
  if(SYSTEMD_SYSUSERS)
    file(MAKE_DIRECTORY "${root}/etc")
    foreach(args "configure" "configure;0.0.9")
      run(${CMAKE_COMMAND} -E env "DPKG_ROOT=${root}" sh "${work}/control/postinst" ${args})
    endforeach()
    file(READ "${root}/etc/passwd" passwd)
    if(NOT passwd MATCHES "(^|\n)mqtt-inbox:x:[0-9]+:[0-9]+:[^:]*:/var/lib/mqtt-inbox:[^\n]*nologin\n")
      message(FATAL_ERROR "postinst did not create the user mqtt-inbox:\n${passwd}")
    endif()
    string(REGEX MATCHALL "(^|\n)mqtt-inbox:" once "${passwd}")
    list(LENGTH once n)
    if(NOT n EQUAL 1 OR NOT IS_DIRECTORY "${root}/etc/mqtt-inbox")
      message(FATAL_ERROR "postinst twice: ${n} users mqtt-inbox, /etc/mqtt-inbox missing?")
    endif()
    run(${CMAKE_COMMAND} -E env "DPKG_ROOT=${root}" sh "${work}/control/prerm" remove)
    run(${CMAKE_COMMAND} -E env "DPKG_ROOT=${root}" sh "${work}/control/postrm" purge)
    if(EXISTS "${root}/etc/mqtt-inbox")
      message(FATAL_ERROR "postrm purge left the empty /etc/mqtt-inbox")
    endif()
  else()
    message(STATUS "systemd-sysusers not found (Debian package systemd): postinst not run")
  endif()
endfunction()

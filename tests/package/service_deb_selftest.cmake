# The checks of service_deb_test.cmake fail where they must: copies of the built
# mqtt-inbox .deb, each with one fault a real package had or could have, are refused with
# the reason:
#   depends   Depends: adduser only (the arm64 package while dpkg-shlibdeps was off)
#   type      a Type=notify unit whose program is not linked with libsystemd (the arm64
#             build without libsystemd)
#   restart   a unit without RestartPreventExitStatus=
#   confdir   the old postinst: /etc/mqtt-inbox root:root 0750 (a CA file unreadable)
#   cmake -DOUT=<folder with mqtt-inbox_*.deb> -DWORK=<scratch> -P service_deb_selftest.cmake
cmake_minimum_required(VERSION 3.16)
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)

file(GLOB deb "${OUT}/mqtt-inbox_*.deb")
if(NOT deb)
  message(FATAL_ERROR "no mqtt-inbox_*.deb in ${OUT} (package_deb makes it)")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(WRITE "${WORK}/check.cmake"
  "cmake_minimum_required(VERSION 3.16)\n"
  "include(${CMAKE_CURRENT_LIST_DIR}/service_deb_test.cmake)\n"
  "mqtt_inbox_check_service_deb(\"\${DEB}\" \"\${CHECK_WORK}\")\n")
# The good package passes (so the faults below are what fails).
run(${CMAKE_COMMAND} -DDEB=${deb} -DCHECK_WORK=${WORK}/good-check -P ${WORK}/check.cmake)

# broken(<name> <regex>): builds ${WORK}/<name>.deb from the tree ${WORK}/<name> and
# expects the checks to fail with output matching <regex>.
function(broken name expect)
  run(dpkg-deb --root-owner-group -Znone -b "${WORK}/${name}" "${WORK}/${name}.deb")
  execute_process(COMMAND ${CMAKE_COMMAND} -DDEB=${WORK}/${name}.deb
    -DCHECK_WORK=${WORK}/${name}-check -P ${WORK}/check.cmake
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the checks accepted the package with fault '${name}'")
  endif()
  string(REGEX REPLACE "[ \n]+" " " text "${out}${err}")
  if(NOT text MATCHES "${expect}")
    message(FATAL_ERROR "fault '${name}' refused, but not with '${expect}':\n${out}${err}")
  endif()
  message(STATUS "fault '${name}': refused ('${CMAKE_MATCH_0}')")
endfunction()

function(tree name out)
  set(t "${WORK}/${name}")
  run(dpkg-deb -R "${deb}" "${t}")
  set(${out} "${t}" PARENT_SCOPE)
endfunction()

tree(depends t)
file(READ "${t}/DEBIAN/control" control)
string(REGEX REPLACE "\nDepends: [^\n]*" "\nDepends: adduser" control "${control}")
file(WRITE "${t}/DEBIAN/control" "${control}")
broken(depends "lacks what the programs load: usr/bin/mqtt-inbox needs")

tree(type t)
run(cp "${t}/usr/bin/mqtt-inbox" "${t}/usr/libexec/mqtt-inbox/sensor_gateway")
broken(type "Type=notify, but /usr/libexec/mqtt-inbox/sensor_gateway is built without libsystemd")

tree(restart t)
set(unit "${t}/usr/lib/systemd/system/mqtt-inbox-ledger-consumer.service")
file(READ "${unit}" text)
string(REGEX REPLACE "\nRestartPreventExitStatus=[^\n]*" "" text "${text}")
file(WRITE "${unit}" "${text}")
broken(restart "no RestartPreventExitStatus=1 2 5 6 7")

find_program(SYSTEMD_SYSUSERS systemd-sysusers)
if(SYSTEMD_SYSUSERS)
  tree(confdir t)
  file(READ "${t}/DEBIAN/postinst" text)
  string(REPLACE "chown \"0:$gid\" \"$dir\"" "true" text "${text}")
  file(WRITE "${t}/DEBIAN/postinst" "${text}")
  broken(confdir "/etc/mqtt-inbox is '0 0 750'")
else()
  message(STATUS "systemd-sysusers not found: the postinst fault is not tried")
endif()

# The packages of a cross build, checked on the build machine (scripts/cross-aarch64.sh,
# stage "package"): cpack -G DEB in that build, then the service package's checks of
# service_deb_test.cmake: its files, Depends against what its programs load (from the
# target architecture's packages in this machine's dpkg database), Type= against their
# libsystemd linkage, RestartPreventExitStatus= and TimeoutStartSec=, systemd-analyze
# verify, the postinst's user and /etc/mqtt-inbox, and the programs' --help under the
# emulator.
#   cmake -DBUILD=<cross build> -DWORK=<scratch> [-DEMULATOR="qemu-aarch64;-L;/"]
#         -P service_deb_arch_test.cmake
cmake_minimum_required(VERSION 3.16)
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/service_deb_test.cmake)

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/out")
run(cpack -G DEB --config "${BUILD}/CPackConfig.cmake" -B "${WORK}/out")
file(GLOB dev_deb "${WORK}/out/libmqtt-inbox-dev_*.deb")
file(GLOB service_deb "${WORK}/out/mqtt-inbox_*.deb")
if(NOT dev_deb OR NOT service_deb)
  file(GLOB all "${WORK}/out/*.deb")
  message(FATAL_ERROR "expected libmqtt-inbox-dev_*.deb and mqtt-inbox_*.deb, found: ${all}")
endif()
run(dpkg-deb --info ${dev_deb})
mqtt_inbox_check_service_deb("${service_deb}" "${WORK}/service" EMULATOR ${EMULATOR})
message(STATUS "checked ${service_deb}")

# Packaging, the service side (issue 17): a second .deb, `mqtt-inbox`, beside
# `libmqtt-inbox-dev`. Included by the top-level CMakeLists.txt in its CPack block, after
# the shared CPACK_* settings and before include(CPack), when MQTT_INBOX_INSTALL is on.
#
# One install component per package (CPACK_DEB_COMPONENT_INSTALL):
#   dev      libmqtt-inbox-dev  headers, static + shared libraries, CMake and pkg-config files
#   service  mqtt-inbox         the admin tool, the example consumers, their systemd units,
#                               the sysusers.d file of the service user, example settings
# Files of the service package (docs/operations.md#installing-and-starting-a-unit), under /usr:
#   bin/mqtt-inbox                                        the admin tool (tools/CMakeLists.txt)
#   libexec/mqtt-inbox/ledger_consumer, sensor_gateway    the example consumers
#   lib/systemd/system/mqtt-inbox-ledger-consumer.service, mqtt-inbox-sensor-gateway.service
#   lib/sysusers.d/mqtt-inbox.conf                        user mqtt-inbox
#   share/doc/mqtt-inbox/examples/ledger-consumer.env, sensor-gateway.env
# The units' ExecStart= name /usr/libexec/mqtt-inbox/...: the package's prefix
# (CPACK_PACKAGING_INSTALL_PREFIX). tests/package/deb_test.cmake checks that they match.
# The maintainer scripts (cmake/deb/) create the user and enable nothing.

set(MQTT_INBOX_SERVICE_LIBEXECDIR "${CMAKE_INSTALL_LIBEXECDIR}/mqtt-inbox")

# Whether the service package is made. Its units are Type=notify with WatchdogSec=: a
# program built without libsystemd never sends READY=1, so systemd would time its start
# out and restart it in a loop; and a package whose Depends dpkg-shlibdeps did not compute
# installs programs that do not load on a fresh machine. Neither combination is packaged:
# AUTO leaves the service package out (saying why), ON stops the configure.
# A firmware build (MQTT_INBOX_FIRMWARE) makes no programs: no service package, no warning.
set(_mqtt_inbox_service_default AUTO)
if(MQTT_INBOX_FIRMWARE)
  set(_mqtt_inbox_service_default OFF)
endif()
set(MQTT_INBOX_PACKAGE_SERVICE ${_mqtt_inbox_service_default} CACHE STRING
  "Make the mqtt-inbox service .deb (programs + Type=notify units): AUTO, ON or OFF")
set_property(CACHE MQTT_INBOX_PACKAGE_SERVICE PROPERTY STRINGS AUTO ON OFF)
set(_mqtt_inbox_no_service "")
if(MQTT_INBOX_PACKAGE_SERVICE STREQUAL "OFF")
  set(_mqtt_inbox_no_service "MQTT_INBOX_PACKAGE_SERVICE=OFF")
elseif(NOT (TARGET ledger_consumer AND TARGET sensor_gateway AND TARGET mqtt_inbox_cli))
  set(_mqtt_inbox_no_service "the example consumers or the admin tool are not built")
elseif(NOT MQTT_INBOX_HAVE_LIBSYSTEMD)
  set(_mqtt_inbox_no_service
    "built without libsystemd, so the programs cannot send READY=1 to the Type=notify units "
    "(install libsystemd-dev; for a cross build libsystemd-dev:${CPACK_DEBIAN_PACKAGE_ARCHITECTURE})")
elseif(NOT CPACK_DEBIAN_PACKAGE_SHLIBDEPS)
  set(_mqtt_inbox_no_service
    "dpkg-shlibdeps cannot compute the programs' runtime Depends here (it needs dpkg-dev "
    "and, for a cross build, Debian multiarch: docs/cross-compiling.md)")
endif()
if(_mqtt_inbox_no_service STREQUAL "")
  set(MQTT_INBOX_SERVICE_PACKAGE ON)
else()
  set(MQTT_INBOX_SERVICE_PACKAGE OFF)
  string(CONCAT _mqtt_inbox_no_service ${_mqtt_inbox_no_service})
  if(MQTT_INBOX_PACKAGE_SERVICE STREQUAL "ON")
    message(FATAL_ERROR "MQTT_INBOX_PACKAGE_SERVICE=ON, but the service package cannot be "
                        "made: ${_mqtt_inbox_no_service}")
  elseif(MQTT_INBOX_PACKAGE_SERVICE STREQUAL "AUTO")
    message(WARNING "mqtt-inbox: cpack makes libmqtt-inbox-dev only, no service package: "
                    "${_mqtt_inbox_no_service}")
  endif()
endif()

if(MQTT_INBOX_SERVICE_PACKAGE)
  install(TARGETS ledger_consumer sensor_gateway
    RUNTIME DESTINATION ${MQTT_INBOX_SERVICE_LIBEXECDIR} COMPONENT service)
  install(FILES
      ${PROJECT_SOURCE_DIR}/examples/systemd/mqtt-inbox-ledger-consumer.service
      ${PROJECT_SOURCE_DIR}/examples/systemd/mqtt-inbox-sensor-gateway.service
    DESTINATION lib/systemd/system COMPONENT service)
  install(FILES ${PROJECT_SOURCE_DIR}/examples/systemd/mqtt-inbox.sysusers.conf
    DESTINATION lib/sysusers.d RENAME mqtt-inbox.conf COMPONENT service)
  install(FILES
      ${PROJECT_SOURCE_DIR}/examples/systemd/ledger-consumer.env
      ${PROJECT_SOURCE_DIR}/examples/systemd/sensor-gateway.env
    DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/mqtt-inbox/examples COMPONENT service)
endif()

set(CPACK_DEB_COMPONENT_INSTALL ON)
if(MQTT_INBOX_SERVICE_PACKAGE)
  set(CPACK_COMPONENTS_ALL dev service)
else()
  set(CPACK_COMPONENTS_ALL dev)
endif()

# libmqtt-inbox-dev: the library (CPACK_DEBIAN_PACKAGE_DEPENDS of the shared block, plus
# libsystemd's and libpqxx's .pc files, which the config and .pc files look for when they
# were built in).
set(CPACK_DEBIAN_DEV_PACKAGE_NAME "libmqtt-inbox-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION "libdevel")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${CPACK_DEBIAN_PACKAGE_DEPENDS}")
if(MQTT_INBOX_HAVE_LIBSYSTEMD)
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libsystemd-dev")
endif()
# libpqxx's .pc file likewise, with the PostgreSQL store (MQTT_INBOX_WITH_POSTGRES).
if(MQTT_INBOX_WITH_POSTGRES)
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libpqxx-dev")
endif()
if(MQTT_INBOX_HAVE_LIBSYSTEMD OR MQTT_INBOX_WITH_POSTGRES)
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", pkg-config")
endif()
set(CPACK_DEBIAN_DEV_DESCRIPTION "${CPACK_PACKAGE_DESCRIPTION_SUMMARY}
Headers, static and shared libraries, CMake package and pkg-config files of mqtt-inbox.")

# mqtt-inbox: programs and units. Runtime libraries come from dpkg-shlibdeps, for every
# architecture (the mqtt-inbox libraries themselves are linked statically into the
# programs); tests/package/service_deb_test.cmake checks them against the programs' NEEDED.
set(CPACK_DEBIAN_SERVICE_PACKAGE_NAME "mqtt-inbox")
set(CPACK_DEBIAN_SERVICE_PACKAGE_SECTION "net")
set(CPACK_DEBIAN_SERVICE_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_SERVICE_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_SERVICE_DESCRIPTION "mqtt-inbox admin tool, example consumers and systemd units
The mqtt-inbox tool inspects and repairs an inbox database beside a running consumer.
The ledger and sensor gateway example consumers come with systemd units (Type=notify,
watchdog, hardened, user mqtt-inbox), installed but not enabled.")
set(CPACK_DEBIAN_SERVICE_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/cmake/deb/postinst
  ${PROJECT_SOURCE_DIR}/cmake/deb/prerm
  ${PROJECT_SOURCE_DIR}/cmake/deb/postrm)
set(CPACK_DEBIAN_SERVICE_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)

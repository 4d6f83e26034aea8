# Packaging, the service side (issue 17): a second .deb, `mqtt-inbox`, beside
# `libmqtt-inbox-dev`. Included by the top-level CMakeLists.txt in its CPack block, after
# the shared CPACK_* settings and before include(CPack), when MQTT_INBOX_INSTALL is on.
#
# One install component per package (CPACK_DEB_COMPONENT_INSTALL):
#   dev      libmqtt-inbox-dev  headers, static + shared libraries, CMake and pkg-config files
#   service  mqtt-inbox         the admin tool, the example consumers, their systemd units,
#                               the sysusers.d file of the service user, example settings
# Files of the service package (README "Running as a service"), under /usr:
#   bin/mqtt-inbox                                        the admin tool (tools/CMakeLists.txt)
#   libexec/mqtt-inbox/ledger_consumer, sensor_gateway    the example consumers
#   lib/systemd/system/mqtt-inbox-ledger-consumer.service, mqtt-inbox-sensor-gateway.service
#   lib/sysusers.d/mqtt-inbox.conf                        user mqtt-inbox
#   share/doc/mqtt-inbox/examples/ledger-consumer.env, sensor-gateway.env
# The units' ExecStart= name /usr/libexec/mqtt-inbox/...: the package's prefix
# (CPACK_PACKAGING_INSTALL_PREFIX). tests/package/deb_test.cmake checks that they match.
# The maintainer scripts (cmake/deb/) create the user and enable nothing.

set(MQTT_INBOX_SERVICE_LIBEXECDIR "${CMAKE_INSTALL_LIBEXECDIR}/mqtt-inbox")

if(TARGET ledger_consumer AND TARGET sensor_gateway)
  install(TARGETS ledger_consumer sensor_gateway
    RUNTIME DESTINATION ${MQTT_INBOX_SERVICE_LIBEXECDIR} COMPONENT service)
endif()
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

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL dev service)

# libmqtt-inbox-dev: the library (CPACK_DEBIAN_PACKAGE_DEPENDS of the shared block, plus
# libsystemd's .pc file, which the config and .pc files look for when it was built in).
set(CPACK_DEBIAN_DEV_PACKAGE_NAME "libmqtt-inbox-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION "libdevel")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${CPACK_DEBIAN_PACKAGE_DEPENDS}")
if(MQTT_INBOX_HAVE_LIBSYSTEMD)
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libsystemd-dev, pkg-config")
endif()
set(CPACK_DEBIAN_DEV_DESCRIPTION "${CPACK_PACKAGE_DESCRIPTION_SUMMARY}
Headers, static and shared libraries, CMake package and pkg-config files of mqtt-inbox.")

# mqtt-inbox: programs and units. Runtime libraries come from dpkg-shlibdeps (the
# mqtt-inbox libraries themselves are linked statically into the programs).
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

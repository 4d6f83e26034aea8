# cpack -G DEB in the build: two packages (cmake/packaging.cmake).
#  - libmqtt-inbox-dev, unpacked with dpkg -x into a scratch root: the find_package consumer
#    and a pkg-config compile against that root (and one of the PostgreSQL store's program
#    with mqtt_inbox_postgres.pc, when the package has it).
#  - mqtt-inbox, unpacked into another scratch root (service_deb_test.cmake): the files
#    where docs/operations.md#installing-and-starting-a-unit says, the programs run,
#    systemd-analyze verify on its units, its postinst creating the service user in the
#    scratch root.
#   cmake -DBUILD=<build> -DWORK=<scratch> -DSRC=<tests/package> [-DGENERATOR=..] -P deb_test.cmake
cmake_minimum_required(VERSION 3.16)
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/out" "${WORK}/root")
run(cpack -G DEB --config "${BUILD}/CPackConfig.cmake" -B "${WORK}/out")
file(GLOB all_debs "${WORK}/out/*.deb")
file(GLOB debs "${WORK}/out/libmqtt-inbox-dev_*.deb")
file(GLOB service_deb "${WORK}/out/mqtt-inbox_*.deb")
list(LENGTH all_debs n)
if(NOT n EQUAL 2 OR NOT debs OR NOT service_deb)
  message(FATAL_ERROR "expected libmqtt-inbox-dev_*.deb and mqtt-inbox_*.deb, found: ${all_debs}")
endif()
run(dpkg-deb --info ${debs})
run(dpkg-deb --contents ${debs})
run(dpkg -x ${debs} "${WORK}/root")
if(EXISTS "${WORK}/root/usr/bin" OR EXISTS "${WORK}/root/usr/lib/systemd")
  message(FATAL_ERROR "libmqtt-inbox-dev holds programs or units: they belong to mqtt-inbox")
endif()

set(root "${WORK}/root/usr")
file(GLOB_RECURSE cfg "${root}/*/mqtt_inbox-config.cmake")
file(GLOB_RECURSE pc "${root}/*/mqtt_inbox.pc")
if(NOT cfg OR NOT pc OR NOT EXISTS "${root}/share/mqtt_inbox/schema.sql")
  message(FATAL_ERROR "the .deb lacks the config, the .pc file or schema.sql")
endif()

# find_package against the unpacked root (static and shared targets).
run(${CMAKE_COMMAND} -DSOURCE=${SRC}/find_package -DBINARY=${WORK}/find_package
  -DGENERATOR=${GENERATOR} "-DARGS=-DCMAKE_PREFIX_PATH=${root}" "-DRUN=consumer|core_only"
  -P ${SRC}/run_consumer.cmake)
run(${CMAKE_COMMAND} -DSOURCE=${SRC}/find_package -DBINARY=${WORK}/find_package_shared
  -DGENERATOR=${GENERATOR} "-DARGS=-DCMAKE_PREFIX_PATH=${root}|-DMQTT_INBOX_LINKAGE=_shared"
  "-DRUN=consumer" -P ${SRC}/run_consumer.cmake)

# pkg-config: the relocatable .pc files from the unpacked root, shared libraries.
find_program(PKG_CONFIG pkg-config)
find_program(CXX NAMES c++ g++)
if(PKG_CONFIG AND CXX)
  get_filename_component(pcdir "${pc}" DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} "${pcdir}")
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs mqtt_inbox
    OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config mqtt_inbox failed")
  endif()
  message(STATUS "pkg-config --cflags --libs mqtt_inbox: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(${CXX} -std=c++17 ${SRC}/common/consumer.cpp -o ${WORK}/pc_consumer ${flags})
  get_filename_component(libdir "${pc}" DIRECTORY)
  get_filename_component(libdir "${libdir}" DIRECTORY)
  run(${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${libdir}" ${WORK}/pc_consumer
      ${WORK}/pc_consumer.db)
  # The PostgreSQL store's own .pc file, when the package has the store.
  if(EXISTS "${pcdir}/mqtt_inbox_postgres.pc")
    execute_process(COMMAND ${PKG_CONFIG} --cflags --libs mqtt_inbox_postgres
      OUTPUT_VARIABLE pgflags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "pkg-config mqtt_inbox_postgres failed")
    endif()
    message(STATUS "pkg-config --cflags --libs mqtt_inbox_postgres: ${pgflags}")
    separate_arguments(pgflags UNIX_COMMAND "${pgflags}")
    run(${CXX} -std=c++17 ${SRC}/find_package/postgres_only.cpp -o ${WORK}/pc_postgres_only
        ${pgflags})
    run(${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${libdir}" ${WORK}/pc_postgres_only)
  endif()
endif()

# The service package.
include(${CMAKE_CURRENT_LIST_DIR}/service_deb_test.cmake)
mqtt_inbox_check_service_deb("${service_deb}" "${WORK}/service")

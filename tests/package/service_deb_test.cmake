# The mqtt-inbox (service) .deb, checked from a scratch root (included by deb_test.cmake for
# the build's own architecture, and by service_deb_arch_test.cmake for a cross build's).
#
# mqtt_inbox_check_service_deb(<deb> <work dir> [EMULATOR <command>...]):
#  1. dpkg -x into <work>/root: exactly the files
#     docs/operations.md#installing-and-starting-a-unit lists;
#  2. its control data: the package name, maintainer scripts that enable and start nothing,
#     and Depends: adduser plus, for every library a packaged program needs (its NEEDED
#     entries), the package that ships that library for the package's architecture (dpkg -S
#     in this machine's dpkg database; multiarch for a foreign architecture), so it installs
#     complete on a fresh machine of that architecture;
#  3. the programs run from the scratch root (--help), under EMULATOR for a foreign
#     architecture (qemu-aarch64 -L /: its libraries are the multiarch ones);
#  4. its units: Type=notify (which waits for READY=1) exactly when the program is linked
#     with libsystemd, RestartPreventExitStatus= with the exit codes a restart cannot fix,
#     TimeoutStartSec=; systemd-analyze verify, with ExecStart= pointed into the scratch
#     root (after checking that the unit's own path is a file of the package), silent and
#     successful; systemd-analyze security --offline: exposure at most 2.0;
#  5. the postinst run with DPKG_ROOT=<scratch root> (as dpkg --root would): it creates the
#     user mqtt-inbox from the packaged sysusers.d file and /etc/mqtt-inbox root:mqtt-inbox
#     0750, twice (upgrade); as root, a CA file placed there (0644) is read by the service
#     user (setpriv) and a password file (0600) is not; prerm and postrm purge afterwards.
# No systemd runs here (systemd-analyze and systemd-sysusers work offline on files); where
# a tool is missing its step says so and is skipped.
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST), also under cmake -P
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)

# The NEEDED entries of the ELF file `file`, into `out`.
function(mqtt_inbox_needed file out)
  execute_process(COMMAND readelf -d "${file}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf -d ${file} failed")
  endif()
  string(REGEX MATCHALL "\\(NEEDED\\)[^[]*\\[([^]]+)\\]" lines "${dyn}")
  set(needed "")
  foreach(l IN LISTS lines)
    string(REGEX REPLACE ".*\\[([^]]+)\\]" "\\1" so "${l}")
    list(APPEND needed "${so}")
  endforeach()
  set(${out} "${needed}" PARENT_SCOPE)
endfunction()

# The package that ships library `soname` for multiarch triplet `ma`, from this machine's
# dpkg database, as a list: its name, then the names it Provides (a shlibs file may name
# one of those: libspdlog1.10 provides libspdlog1.10-fmt9); "" if no package ships it.
function(mqtt_inbox_package_of soname ma out)
  get_property(cached GLOBAL PROPERTY "mqtt_inbox_package_of_${ma}_${soname}" SET)
  if(cached)  # three programs need mostly the same libraries
    get_property(names GLOBAL PROPERTY "mqtt_inbox_package_of_${ma}_${soname}")
    set(${out} "${names}" PARENT_SCOPE)
    return()
  endif()
  set(names "")
  foreach(dir "/lib/${ma}" "/usr/lib/${ma}" "/lib" "/usr/lib")
    if(EXISTS "${dir}/${soname}")
      execute_process(COMMAND dpkg -S "${dir}/${soname}" OUTPUT_VARIABLE owner ERROR_QUIET
        RESULT_VARIABLE rc)
      if(rc EQUAL 0 AND owner MATCHES "^([^:, ]+)(:[^:, ]+)?:")
        set(names "${CMAKE_MATCH_1}")
        execute_process(COMMAND dpkg-query -W -f=\${Provides} "${CMAKE_MATCH_1}${CMAKE_MATCH_2}"
          OUTPUT_VARIABLE provides ERROR_QUIET)
        string(REGEX REPLACE "\\([^)]*\\)" "" provides "${provides}")
        string(REGEX REPLACE "[ \t\n]" "" provides "${provides}")
        string(REPLACE "," ";" provides "${provides}")
        list(APPEND names ${provides})
        break()
      endif()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "mqtt_inbox_package_of_${ma}_${soname}" "${names}")
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

function(mqtt_inbox_check_service_deb deb work)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "EMULATOR")
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
  if(NOT control MATCHES "(^|\n)Depends: ([^\n]*)")
    message(FATAL_ERROR "control: no Depends:\n${control}")
  endif()
  set(depends_line "${CMAKE_MATCH_2}")
  string(REGEX REPLACE "\\([^)]*\\)" "" names "${depends_line}")
  string(REGEX REPLACE "[ \t]" "" names "${names}")
  string(REGEX REPLACE "[,|]" ";" depends "${names}")
  if(NOT "adduser" IN_LIST depends)
    message(FATAL_ERROR "control: Depends lacks adduser:\n${control}")
  endif()
  if(NOT control MATCHES "(^|\n)Architecture: ([^\n]+)")
    message(FATAL_ERROR "control: no Architecture:\n${control}")
  endif()
  set(arch "${CMAKE_MATCH_2}")
  execute_process(COMMAND dpkg --print-architecture OUTPUT_VARIABLE host_arch
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND dpkg-architecture -a${arch} -qDEB_HOST_MULTIARCH
    OUTPUT_VARIABLE ma OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  # Every library a packaged program needs is shipped by a package in Depends (the
  # mqtt-inbox libraries are linked in statically, so every NEEDED entry is external).
  set(programs usr/bin/mqtt-inbox usr/libexec/mqtt-inbox/ledger_consumer
               usr/libexec/mqtt-inbox/sensor_gateway)
  set(missing "")
  foreach(prog IN LISTS programs)
    mqtt_inbox_needed("${root}/${prog}" needed)
    set(needed_${prog} "${needed}")
    foreach(so IN LISTS needed)
      mqtt_inbox_package_of("${so}" "${ma}" names)
      if(names STREQUAL "")
        message(FATAL_ERROR "${prog} needs ${so}, which no installed ${arch} package ships: "
                            "cannot check Depends (install the ${arch} runtime libraries)")
      endif()
      list(GET names 0 pkg)
      set(found "")
      foreach(name IN LISTS names)
        if(name IN_LIST depends)
          set(found "${name}")
        endif()
      endforeach()
      message(STATUS "${prog}: ${so} from ${pkg}, in Depends as '${found}'")
      if(found STREQUAL "")
        list(APPEND missing "${prog} needs ${so} (package ${pkg})")
      endif()
    endforeach()
  endforeach()
  if(missing)
    list(REMOVE_DUPLICATES missing)
    string(REPLACE ";" "\n  " m "${missing}")
    message(FATAL_ERROR "Depends: ${depends_line}\nlacks what the programs load:\n  ${m}\n"
                        "On a fresh ${arch} machine they would not start (dpkg-shlibdeps did "
                        "not run: cmake/packaging.cmake)")
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
  if(NOT arch STREQUAL host_arch AND NOT arg_EMULATOR)
    message(STATUS "${arch} programs on a ${host_arch} machine, no emulator: not run")
  else()
    foreach(prog IN LISTS programs)
      execute_process(COMMAND ${arg_EMULATOR} "${root}/${prog}" --help OUTPUT_VARIABLE out
        RESULT_VARIABLE rc)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "${prog} --help failed (${rc})")
      endif()
      message(STATUS "${arg_EMULATOR} ${prog} --help: ran")
    endforeach()
  endif()

  # 4. The units.
  find_program(SYSTEMD_ANALYZE systemd-analyze)
  if(SYSTEMD_ANALYZE)
    set(units "")
    foreach(unit mqtt-inbox-ledger-consumer.service mqtt-inbox-sensor-gateway.service)
      file(READ "${root}/usr/lib/systemd/system/${unit}" text)
      if(NOT text MATCHES "\nExecStart=(/[^ \n]+)")
        message(FATAL_ERROR "${unit}: no absolute ExecStart=")
      endif()
      set(exec "${CMAKE_MATCH_1}")
      if(NOT EXISTS "${root}${exec}")
        message(FATAL_ERROR "${unit}: ExecStart=${exec} is not a file of the package")
      endif()
      # Type=notify waits for READY=1, which only a program linked with libsystemd sends.
      string(SUBSTRING "${exec}" 1 -1 rel)
      set(has_libsystemd OFF)
      if("libsystemd.so.0" IN_LIST needed_${rel})
        set(has_libsystemd ON)
      endif()
      if(NOT text MATCHES "\nType=([a-z-]+)")
        message(FATAL_ERROR "${unit}: no Type=")
      endif()
      set(type "${CMAKE_MATCH_1}")
      message(STATUS "${unit}: Type=${type}, ${exec} linked with libsystemd: ${has_libsystemd}")
      if(type STREQUAL "notify" AND NOT has_libsystemd)
        message(FATAL_ERROR "${unit}: Type=notify, but ${exec} is built without libsystemd: "
                            "it never sends READY=1 and systemd restarts it in a loop")
      endif()
      if(text MATCHES "\nWatchdogSec=" AND NOT has_libsystemd)
        message(FATAL_ERROR "${unit}: WatchdogSec=, but ${exec} cannot ping the watchdog")
      endif()
      # The exit codes a restart cannot fix (examples/exit_codes.h: "Restart: no").
      if(NOT text MATCHES "\nRestartPreventExitStatus=1 2 5 6 7\n")
        message(FATAL_ERROR "${unit}: no RestartPreventExitStatus=1 2 5 6 7")
      endif()
      if(NOT text MATCHES "\nTimeoutStartSec=[0-9]")
        message(FATAL_ERROR "${unit}: no TimeoutStartSec=")
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
    # /etc/mqtt-inbox: root:mqtt-inbox 0750, so the service user can read a CA file there.
    string(REGEX MATCH "(^|\n)mqtt-inbox:x:([0-9]+):([0-9]+):" m "${passwd}")
    set(uid "${CMAKE_MATCH_2}")
    set(gid "${CMAKE_MATCH_3}")
    execute_process(COMMAND stat -c "%u %g %a" "${root}/etc/mqtt-inbox"
      OUTPUT_VARIABLE st OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT st STREQUAL "0 ${gid} 750")
      message(FATAL_ERROR "/etc/mqtt-inbox is '${st}' (uid gid mode), expected '0 ${gid} 750'")
    endif()
    execute_process(COMMAND id -u OUTPUT_VARIABLE me OUTPUT_STRIP_TRAILING_WHITESPACE)
    find_program(SETPRIV setpriv)
    if(me STREQUAL "0" AND SETPRIV)
      set(as_service ${SETPRIV} --reuid=${uid} --regid=${gid} --clear-groups)
      execute_process(COMMAND ${as_service} test -x "${root}/etc" RESULT_VARIABLE rc)
      if(NOT rc EQUAL 0)
        message(STATUS "the scratch root is not reachable by other users: read test skipped")
      else()
        file(WRITE "${root}/etc/mqtt-inbox/ca.crt" "a CA certificate\n")
        file(WRITE "${root}/etc/mqtt-inbox/ledger-consumer.password" "secret\n")
        file(CHMOD "${root}/etc/mqtt-inbox/ca.crt" PERMISSIONS OWNER_READ OWNER_WRITE
          GROUP_READ WORLD_READ)
        file(CHMOD "${root}/etc/mqtt-inbox/ledger-consumer.password" PERMISSIONS OWNER_READ
          OWNER_WRITE)
        execute_process(COMMAND ${as_service} cat "${root}/etc/mqtt-inbox/ca.crt"
          RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
        if(NOT rc EQUAL 0)
          message(FATAL_ERROR "the service user cannot read /etc/mqtt-inbox/ca.crt (0644)")
        endif()
        execute_process(COMMAND ${as_service} cat "${root}/etc/mqtt-inbox/ledger-consumer.password"
          RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
        if(rc EQUAL 0)
          message(FATAL_ERROR "the service user can read a 0600 password file")
        endif()
        message(STATUS "as uid ${uid}: /etc/mqtt-inbox/ca.crt readable, the password file not")
        file(REMOVE "${root}/etc/mqtt-inbox/ca.crt" "${root}/etc/mqtt-inbox/ledger-consumer.password")
      endif()
    else()
      message(STATUS "not root or no setpriv: reading /etc/mqtt-inbox as the service user not tried")
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

# Shared part of the mqtt-inbox cross toolchain files.
#
# Do not pass this file as CMAKE_TOOLCHAIN_FILE. It is included by
# aarch64-linux-gnu.cmake and arm-linux-gnueabihf.cmake after they set:
#
#   MQTT_INBOX_CROSS_TRIPLET     GNU triplet, e.g. aarch64-linux-gnu
#   MQTT_INBOX_CROSS_PROCESSOR   value for CMAKE_SYSTEM_PROCESSOR
#   MQTT_INBOX_CROSS_QEMU        qemu-user binary name, e.g. qemu-aarch64
#
# Everything a user may override (cache variable, or environment variable of
# the same name, cache wins):
#
#   MQTT_INBOX_SYSROOT        target root filesystem. Default "/" = Debian
#                             multiarch (target libraries in /usr/lib/<triplet>).
#   MQTT_INBOX_CROSS_PREFIX   compiler prefix, default "<triplet>-"; the compilers
#                             are ${MQTT_INBOX_CROSS_PREFIX}gcc / g++. An absolute
#                             prefix (/opt/sdk/bin/aarch64-poky-linux-) works too.
#   MQTT_INBOX_LIBRARY_ARCHITECTURE
#                             multiarch subdirectory below <sysroot>/usr/lib.
#                             Default: the triplet when <sysroot>/usr/lib/<triplet>
#                             exists (Debian, Ubuntu, mmdebstrap), else empty
#                             (Yocto and Buildroot use plain /usr/lib).
#   MQTT_INBOX_CROSS_FLAGS    extra target flags for C and C++ (e.g. the
#                             -mcpu/-mfpu/-mfloat-abi that a Yocto SDK puts in $CC).
#   MQTT_INBOX_EMULATOR       emulator command (a ;-list). Default: the qemu-user
#                             binary with "-L <sysroot>". Set to "" to disable.
#
# CMake reads a toolchain file more than once (first project() call and every
# try_compile), and try_compile projects do not see the outer cache, so every
# setting is also mirrored into the environment and listed in
# CMAKE_TRY_COMPILE_PLATFORM_VARIABLES.

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR "${MQTT_INBOX_CROSS_PROCESSOR}")

# --- user settings: cache variable > environment variable > default ---------
macro(_mqtt_inbox_cross_setting var default doc)
  if(DEFINED ${var})
    set(_mqtt_inbox_value "${${var}}")
  elseif(DEFINED ENV{${var}})
    set(_mqtt_inbox_value "$ENV{${var}}")
  else()
    set(_mqtt_inbox_value "${default}")
  endif()
  set(${var} "${_mqtt_inbox_value}" CACHE STRING "${doc}")
  set(ENV{${var}} "${_mqtt_inbox_value}")
  list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES ${var})
  unset(_mqtt_inbox_value)
endmacro()

_mqtt_inbox_cross_setting(MQTT_INBOX_SYSROOT "/"
  "Target sysroot (\"/\" = Debian multiarch on this machine)")
_mqtt_inbox_cross_setting(MQTT_INBOX_CROSS_PREFIX "${MQTT_INBOX_CROSS_TRIPLET}-"
  "Cross compiler prefix (<prefix>gcc, <prefix>g++)")

# Normalise the sysroot: no trailing slash, except for "/" itself.
if(NOT MQTT_INBOX_SYSROOT STREQUAL "/")
  string(REGEX REPLACE "/+$" "" _mqtt_inbox_sysroot "${MQTT_INBOX_SYSROOT}")
  if(NOT IS_DIRECTORY "${_mqtt_inbox_sysroot}")
    message(FATAL_ERROR
      "MQTT_INBOX_SYSROOT='${MQTT_INBOX_SYSROOT}' is not a directory")
  endif()
else()
  set(_mqtt_inbox_sysroot "/")
endif()

if(EXISTS "${_mqtt_inbox_sysroot}/usr/lib/${MQTT_INBOX_CROSS_TRIPLET}"
   OR EXISTS "${_mqtt_inbox_sysroot}/lib/${MQTT_INBOX_CROSS_TRIPLET}")
  set(_mqtt_inbox_default_arch "${MQTT_INBOX_CROSS_TRIPLET}")
else()
  set(_mqtt_inbox_default_arch "")
endif()
_mqtt_inbox_cross_setting(MQTT_INBOX_LIBRARY_ARCHITECTURE "${_mqtt_inbox_default_arch}"
  "Multiarch library subdirectory of the sysroot (empty for Yocto/Buildroot)")

# --- compilers ----------------------------------------------------------------
set(CMAKE_C_COMPILER   "${MQTT_INBOX_CROSS_PREFIX}gcc")
set(CMAKE_CXX_COMPILER "${MQTT_INBOX_CROSS_PREFIX}g++")
_mqtt_inbox_cross_setting(MQTT_INBOX_CROSS_FLAGS ""
  "Extra target compile/link flags (-mcpu=..., -mfloat-abi=...)")
set(CMAKE_C_FLAGS_INIT "${MQTT_INBOX_CROSS_FLAGS}")
# MQTT_INBOX_CROSS_CXX_FLAGS_DEFAULT: set by the per-target file (armhf:
# -Wno-psabi, silencing GCC's "parameter passing ... changed in GCC 7.1"
# notes, irrelevant when everything is built with the same compiler).
string(STRIP "${MQTT_INBOX_CROSS_CXX_FLAGS_DEFAULT} ${MQTT_INBOX_CROSS_FLAGS}"
  CMAKE_CXX_FLAGS_INIT)

# --- sysroot and find-root handling ----------------------------------------------
# For Debian multiarch the target files live in the host's own root, so no
# --sysroot is passed (the Debian cross gcc already searches
# /usr/lib/<triplet> and /usr/include/<triplet>); for a real sysroot the
# compiler and linker get --sysroot=<dir>.
if(NOT _mqtt_inbox_sysroot STREQUAL "/")
  set(CMAKE_SYSROOT "${_mqtt_inbox_sysroot}")
endif()
set(CMAKE_FIND_ROOT_PATH "${_mqtt_inbox_sysroot}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)   # build tools run on the host
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
if(MQTT_INBOX_LIBRARY_ARCHITECTURE)
  # Makes find_library/find_package look in <prefix>/lib/<triplet> (and
  # <prefix>/lib/<triplet>/cmake/<Pkg>, where Debian puts the CMake configs).
  set(CMAKE_LIBRARY_ARCHITECTURE "${MQTT_INBOX_LIBRARY_ARCHITECTURE}")
endif()

# With the sysroot "/" the host's own libraries are inside the find root too.
# CMAKE_LIBRARY_ARCHITECTURE already keeps CMake's default search away from
# them, but a HINTS path that comes from the host (a stale pkg-config result,
# a config file of a package only installed for the host) would still hit
# them. Ignore the host's multiarch directories outright.
if(_mqtt_inbox_sysroot STREQUAL "/")
  execute_process(COMMAND dpkg-architecture -qDEB_BUILD_MULTIARCH
    OUTPUT_VARIABLE _mqtt_inbox_host_multiarch
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _mqtt_inbox_rc)
  if(NOT _mqtt_inbox_rc EQUAL 0 OR _mqtt_inbox_host_multiarch STREQUAL "")
    set(_mqtt_inbox_host_multiarch "${CMAKE_HOST_SYSTEM_PROCESSOR}-linux-gnu")
  endif()
  if(NOT _mqtt_inbox_host_multiarch STREQUAL MQTT_INBOX_CROSS_TRIPLET)
    foreach(_d IN ITEMS /usr/lib /lib /usr/local/lib)
      list(APPEND CMAKE_IGNORE_PATH "${_d}/${_mqtt_inbox_host_multiarch}")
    endforeach()
    list(APPEND CMAKE_IGNORE_PREFIX_PATH
      "/usr/lib/${_mqtt_inbox_host_multiarch}"
      "/usr/lib/${_mqtt_inbox_host_multiarch}/cmake")
    list(REMOVE_DUPLICATES CMAKE_IGNORE_PATH)
    list(REMOVE_DUPLICATES CMAKE_IGNORE_PREFIX_PATH)
  endif()
endif()

# --- pkg-config -----------------------------------------------------------------------
# PKG_CONFIG_LIBDIR *replaces* pkg-config's built-in (host) search path, so
# only the target's .pc files are seen (FindOpenSSL, used by Paho's
# FindPahoMqttC, asks pkg-config for hints; a host answer would link the
# x86-64 libssl). PKG_CONFIG_SYSROOT_DIR prefixes the -I/-L paths found in
# those .pc files with the sysroot.
set(_mqtt_inbox_pc_dirs "")
if(MQTT_INBOX_LIBRARY_ARCHITECTURE)
  list(APPEND _mqtt_inbox_pc_dirs
    "${_mqtt_inbox_sysroot}/usr/lib/${MQTT_INBOX_LIBRARY_ARCHITECTURE}/pkgconfig")
endif()
list(APPEND _mqtt_inbox_pc_dirs
  "${_mqtt_inbox_sysroot}/usr/lib/pkgconfig"
  "${_mqtt_inbox_sysroot}/usr/share/pkgconfig")
if(NOT _mqtt_inbox_sysroot STREQUAL "/" AND NOT MQTT_INBOX_LIBRARY_ARCHITECTURE)
  # Buildroot/Yocto 64-bit targets may use lib64.
  list(APPEND _mqtt_inbox_pc_dirs "${_mqtt_inbox_sysroot}/usr/lib64/pkgconfig")
endif()
string(REPLACE "//" "/" _mqtt_inbox_pc_dirs "${_mqtt_inbox_pc_dirs}")
string(REPLACE ";" ":" _mqtt_inbox_pc_path "${_mqtt_inbox_pc_dirs}")
set(ENV{PKG_CONFIG_LIBDIR} "${_mqtt_inbox_pc_path}")
# A PKG_CONFIG_PATH from the calling shell would be searched before the
# LIBDIR and could point at host .pc files; drop it unless asked to keep it.
if(NOT DEFINED ENV{MQTT_INBOX_KEEP_PKG_CONFIG_PATH})
  unset(ENV{PKG_CONFIG_PATH})
endif()
if(_mqtt_inbox_sysroot STREQUAL "/")
  unset(ENV{PKG_CONFIG_SYSROOT_DIR})
else()
  set(ENV{PKG_CONFIG_SYSROOT_DIR} "${_mqtt_inbox_sysroot}")
endif()

# --- emulator for try_run, gtest_discover_tests and ctest ------------------
if(DEFINED MQTT_INBOX_EMULATOR OR DEFINED ENV{MQTT_INBOX_EMULATOR})
  _mqtt_inbox_cross_setting(MQTT_INBOX_EMULATOR "" "Emulator command for target binaries")
  set(_mqtt_inbox_emulator "${MQTT_INBOX_EMULATOR}")
else()
  find_program(MQTT_INBOX_QEMU_${MQTT_INBOX_CROSS_PROCESSOR}
    NAMES "${MQTT_INBOX_CROSS_QEMU}" "${MQTT_INBOX_CROSS_QEMU}-static"
    NO_CMAKE_FIND_ROOT_PATH)
  set(_mqtt_inbox_qemu "${MQTT_INBOX_QEMU_${MQTT_INBOX_CROSS_PROCESSOR}}")
  if(_mqtt_inbox_qemu)
    # -L: where the emulated program's dynamic loader and libraries are.
    set(_mqtt_inbox_emulator "${_mqtt_inbox_qemu}" -L "${_mqtt_inbox_sysroot}")
  else()
    set(_mqtt_inbox_emulator "")
    message(STATUS "mqtt-inbox cross: ${MQTT_INBOX_CROSS_QEMU} not found; "
      "target binaries cannot be run (install qemu-user)")
  endif()
endif()
if(_mqtt_inbox_emulator)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${_mqtt_inbox_emulator}")
endif()

list(REMOVE_DUPLICATES CMAKE_TRY_COMPILE_PLATFORM_VARIABLES)

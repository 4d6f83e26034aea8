# CMake toolchain file: cross-compile mqtt-inbox for 64-bit ARM Linux (aarch64).
#
#   cmake -S . -B build-aarch64 \
#         -DCMAKE_TOOLCHAIN_FILE=toolchains/aarch64-linux-gnu.cmake
#   cmake --build build-aarch64 -j2
#   ctest --test-dir build-aarch64        # runs the tests under qemu-aarch64
#
# scripts/cross-aarch64.sh does all of this, including the package install.
#
# 1. Debian multiarch (the default, MQTT_INBOX_SYSROOT="/")
#    ----------------------------------------------------------
#    Needs, on a Debian 12 host:
#      dpkg --add-architecture arm64 && apt-get update
#      apt-get install g++-aarch64-linux-gnu qemu-user \
#        libsqlite3-dev:arm64 libsqlitecpp-dev:arm64 libpaho-mqttpp-dev:arm64 \
#        libpaho-mqtt-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64 \
#        libgtest-dev:arm64 libssl-dev:arm64
#    The target libraries then live in /usr/lib/aarch64-linux-gnu, their CMake
#    configs in /usr/lib/aarch64-linux-gnu/cmake and their .pc files in
#    /usr/lib/aarch64-linux-gnu/pkgconfig. This file sets
#    CMAKE_LIBRARY_ARCHITECTURE=aarch64-linux-gnu, points pkg-config at those
#    .pc files only (PKG_CONFIG_LIBDIR) and tells CMake to ignore the host's
#    /usr/lib/x86_64-linux-gnu, so find_package(PahoMqttCpp) - whose
#    FindPahoMqttC module calls find_package(OpenSSL) - SQLiteCpp, spdlog,
#    fmt and GTest all resolve to the arm64 libraries.
#
# 2. Any other sysroot (a debootstrap/mmdebstrap tree, a Yocto or Buildroot SDK)
#    ---------------------------------------------------------------------------
#    Give the target root filesystem as MQTT_INBOX_SYSROOT (a -D cache
#    variable, or an environment variable of that name):
#
#    Yocto SDK (populate_sdk):
#      . /opt/poky/<ver>/environment-setup-cortexa53-poky-linux
#      cmake -S . -B build-yocto \
#        -DCMAKE_TOOLCHAIN_FILE=$PWD/toolchains/aarch64-linux-gnu.cmake \
#        -DMQTT_INBOX_SYSROOT="$SDKTARGETSYSROOT" \
#        -DMQTT_INBOX_CROSS_PREFIX=aarch64-poky-linux- \
#        -DMQTT_INBOX_CROSS_FLAGS="-mcpu=cortex-a53 -march=armv8-a+crc"
#      (the compiler is on PATH after sourcing the script; copy the -m... flags
#      that the script put in $CC into MQTT_INBOX_CROSS_FLAGS. The SDK needs
#      sqlite3, sqlitecpp, paho-mqtt-c, paho-mqtt-cpp, spdlog, fmt, googletest
#      and openssl in its image/SDK recipe - IMAGE_INSTALL / TOOLCHAIN_TARGET_TASK.)
#
#    Buildroot (make sdk, or an output/ tree):
#      cmake -S . -B build-br \
#        -DCMAKE_TOOLCHAIN_FILE=$PWD/toolchains/aarch64-linux-gnu.cmake \
#        -DMQTT_INBOX_SYSROOT=<br>/output/host/aarch64-buildroot-linux-gnu/sysroot \
#        -DMQTT_INBOX_CROSS_PREFIX=<br>/output/host/bin/aarch64-buildroot-linux-gnu-
#      (enable BR2_PACKAGE_SQLITE, _PAHO_MQTT_C, _PAHO_MQTT_CPP, _SPDLOG,
#      _OPENSSL and BR2_PACKAGE_GTEST; Buildroot has no SQLiteCpp package, so
#      add it as an external package or build it into the sysroot first.)
#
#    With a non-"/" sysroot this file passes --sysroot=<dir> (CMAKE_SYSROOT),
#    searches only below <dir> for libraries, headers and packages, and sets
#    PKG_CONFIG_LIBDIR=<dir>/usr/lib[/<triplet>]/pkgconfig:<dir>/usr/share/pkgconfig
#    plus PKG_CONFIG_SYSROOT_DIR=<dir>. The multiarch subdirectory is used
#    only when <dir>/usr/lib/aarch64-linux-gnu exists (Debian-style trees);
#    Yocto and Buildroot use plain <dir>/usr/lib. Override with
#    -DMQTT_INBOX_LIBRARY_ARCHITECTURE=... if the guess is wrong.
#
# Running the target binaries
#    CMAKE_CROSSCOMPILING_EMULATOR is "qemu-aarch64 -L <sysroot>", so ctest,
#    gtest_discover_tests and try_run execute target programs through
#    qemu-user; no binfmt_misc registration is needed. Override with
#    -DMQTT_INBOX_EMULATOR="<cmd>;<args>" or disable with -DMQTT_INBOX_EMULATOR=
#    Programs that a test starts with exec() (e.g. the host's
#    /usr/sbin/mosquitto) run natively: qemu-user hands exec() of a host
#    binary to the host kernel.
#
# All settings: see linux-gnu-cross-common.cmake next to this file.

set(MQTT_INBOX_CROSS_TRIPLET   aarch64-linux-gnu)
set(MQTT_INBOX_CROSS_PROCESSOR aarch64)
set(MQTT_INBOX_CROSS_QEMU      qemu-aarch64)
include("${CMAKE_CURRENT_LIST_DIR}/linux-gnu-cross-common.cmake")

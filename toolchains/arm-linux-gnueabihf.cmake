# CMake toolchain file: cross-compile mqtt-inbox for 32-bit ARM Linux, hard-float
# (armhf: ARMv7-A + VFPv3-D16, the Debian armhf baseline).
#
#   cmake -S . -B build-armhf \
#         -DCMAKE_TOOLCHAIN_FILE=toolchains/arm-linux-gnueabihf.cmake \
#         -DMQTT_INBOX_SYSROOT=/path/to/armhf-sysroot
#   cmake --build build-armhf -j2
#   ctest --test-dir build-armhf          # runs the tests under qemu-arm
#
# scripts/armhf-sysroot.sh builds a Debian armhf sysroot with mmdebstrap and
# then does all of this. (Debian multiarch, the default sysroot "/", works
# the same way as for arm64 on machines whose apt accepts armhf.)
#
# 1. Debian multiarch (the default, MQTT_INBOX_SYSROOT="/")
#    ----------------------------------------------------------
#    Needs, on a Debian 12 host:
#      dpkg --add-architecture armhf && apt-get update
#      apt-get install g++-arm-linux-gnueabihf qemu-user \
#        libsqlite3-dev:armhf libsqlitecpp-dev:armhf libpaho-mqttpp-dev:armhf \
#        libpaho-mqtt-dev:armhf libspdlog-dev:armhf libfmt-dev:armhf \
#        libgtest-dev:armhf libssl-dev:armhf
#    The target libraries then live in /usr/lib/arm-linux-gnueabihf, their CMake
#    configs in /usr/lib/arm-linux-gnueabihf/cmake and their .pc files in
#    /usr/lib/arm-linux-gnueabihf/pkgconfig. This file sets
#    CMAKE_LIBRARY_ARCHITECTURE=arm-linux-gnueabihf, points pkg-config at those
#    .pc files only (PKG_CONFIG_LIBDIR) and tells CMake to ignore the host's
#    /usr/lib/x86_64-linux-gnu, so find_package(PahoMqttCpp) - whose
#    FindPahoMqttC module calls find_package(OpenSSL) - SQLiteCpp, spdlog,
#    fmt and GTest all resolve to the armhf libraries.
#
# 2. Any other sysroot (a debootstrap/mmdebstrap tree, a Yocto or Buildroot SDK)
#    ---------------------------------------------------------------------------
#    Give the target root filesystem as MQTT_INBOX_SYSROOT (a -D cache
#    variable, or an environment variable of that name):
#
#    Yocto SDK (populate_sdk):
#      . /opt/poky/<ver>/environment-setup-cortexa7t2hf-neon-vfpv4-poky-linux-gnueabi
#      cmake -S . -B build-yocto \
#        -DCMAKE_TOOLCHAIN_FILE=$PWD/toolchains/arm-linux-gnueabihf.cmake \
#        -DMQTT_INBOX_SYSROOT="$SDKTARGETSYSROOT" \
#        -DMQTT_INBOX_CROSS_PREFIX=arm-poky-linux-gnueabi- \
#        -DMQTT_INBOX_CROSS_FLAGS="-march=armv7ve -mthumb -mfpu=neon-vfpv4 -mfloat-abi=hard -mcpu=cortex-a7"
#      (the compiler is on PATH after sourcing the script; copy the -m... flags
#      that the script put in $CC into MQTT_INBOX_CROSS_FLAGS. The SDK needs
#      sqlite3, sqlitecpp, paho-mqtt-c, paho-mqtt-cpp, spdlog, fmt, googletest
#      and openssl in its image/SDK recipe - IMAGE_INSTALL / TOOLCHAIN_TARGET_TASK.)
#
#    Buildroot (make sdk, or an output/ tree):
#      cmake -S . -B build-br \
#        -DCMAKE_TOOLCHAIN_FILE=$PWD/toolchains/arm-linux-gnueabihf.cmake \
#        -DMQTT_INBOX_SYSROOT=<br>/output/host/arm-buildroot-linux-gnueabihf/sysroot \
#        -DMQTT_INBOX_CROSS_PREFIX=<br>/output/host/bin/arm-buildroot-linux-gnueabihf-
#      (enable BR2_PACKAGE_SQLITE, _PAHO_MQTT_C, _PAHO_MQTT_CPP, _SPDLOG,
#      _OPENSSL and BR2_PACKAGE_GTEST; Buildroot has no SQLiteCpp package, so
#      add it as an external package or build it into the sysroot first.)
#
#    With a non-"/" sysroot this file passes --sysroot=<dir> (CMAKE_SYSROOT),
#    searches only below <dir> for libraries, headers and packages, and sets
#    PKG_CONFIG_LIBDIR=<dir>/usr/lib[/<triplet>]/pkgconfig:<dir>/usr/share/pkgconfig
#    plus PKG_CONFIG_SYSROOT_DIR=<dir>. The multiarch subdirectory is used
#    only when <dir>/usr/lib/arm-linux-gnueabihf exists (Debian-style trees);
#    Yocto and Buildroot use plain <dir>/usr/lib. Override with
#    -DMQTT_INBOX_LIBRARY_ARCHITECTURE=... if the guess is wrong.
#
# Running the target binaries
#    CMAKE_CROSSCOMPILING_EMULATOR is "qemu-arm -L <sysroot>", so ctest,
#    gtest_discover_tests and try_run execute target programs through
#    qemu-user; no binfmt_misc registration is needed. Override with
#    -DMQTT_INBOX_EMULATOR="<cmd>;<args>" or disable with -DMQTT_INBOX_EMULATOR=
#    Programs that a test starts with exec() (e.g. the host's
#    /usr/sbin/mosquitto) run natively: qemu-user hands exec() of a host
#    binary to the host kernel.
#
# All settings: see linux-gnu-cross-common.cmake next to this file.

set(MQTT_INBOX_CROSS_TRIPLET   arm-linux-gnueabihf)
set(MQTT_INBOX_CROSS_PROCESSOR armv7l)
set(MQTT_INBOX_CROSS_QEMU      qemu-arm)
set(MQTT_INBOX_CROSS_CXX_FLAGS_DEFAULT -Wno-psabi)
include("${CMAKE_CURRENT_LIST_DIR}/linux-gnu-cross-common.cmake")

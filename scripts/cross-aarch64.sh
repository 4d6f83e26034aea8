#!/usr/bin/env bash
# Cross-build mqtt-inbox for aarch64 (arm64) with Debian multiarch and run its
# tests under qemu-aarch64.
#
#   scripts/cross-aarch64.sh [--no-install] [--deps-only] [--no-tests]
#                            [--unit-only] [--all-integration] [--clean]
#
# Stages (each prints its duration):
#   deps       dpkg --add-architecture arm64; install g++-aarch64-linux-gnu,
#              qemu-user and the arm64 -dev packages, only those missing.
#              Aborts if apt would remove any installed package.
#   configure  cmake with toolchains/aarch64-linux-gnu.cmake into $BUILD_DIR
#   build      library, examples, the admin tool and (unless --no-tests) the tests
#              (-j$JOBS; with ccache when it is installed)
#   verify     every built ELF and every library recorded in CMakeCache.txt
#              must be aarch64, none x86-64
#   package    cpack -G DEB into $BUILD_DIR/packages/out: libmqtt-inbox-dev and
#              mqtt-inbox _arm64.deb, the latter checked (Depends computed by
#              dpkg-shlibdeps against what its programs load, Type=notify with
#              libsystemd, RestartPreventExitStatus=, TimeoutStartSec=, systemd-analyze
#              verify, its postinst, --help under qemu)
#   firmware   scripts/firmware.sh for aarch64 into $BUILD_DIR-firmware: the firmware
#              build (-DMQTT_INBOX_FIRMWARE=ON), installed, a C program linked against it
#              shared and static, what it needs (NEEDED; ldd under qemu)
#   tests      ctest under qemu-aarch64: the unit tests and the integration tests
#              labelled core, in one pass (-j$CTEST_JOBS); with --all-integration the
#              unit tests, then every integration test (they start the host's
#              /usr/sbin/mosquitto on 127.0.0.1; the test binary runs under qemu, the
#              broker natively)
#
# Environment:
#   SOURCE_DIR  project to build       (default: <repo>)
#   BUILD_DIR   build folder           (default: <repo>/build-aarch64)
#   JOBS        parallel build jobs    (default: 2)
#   CTEST_JOBS  tests at once, unit and core integration together (default: 3)
#   BUILD_TYPE  CMAKE_BUILD_TYPE       (default: RelWithDebInfo)
#   CTEST_TIMEOUT  per-test timeout, s (default: 300; qemu is ~5-20x slower)
#   MQTT_INBOX_CROSS_CTEST_EXCLUDE  regex of test names not to run under qemu
#   MQTT_INBOX_CROSS_CMAKE_ARGS     extra cmake configure arguments
#
# Idempotent: re-running skips installed packages and re-uses the build folder.
# The steps it shares with scripts/armhf-sysroot.sh are in scripts/cross-lib.sh.
set -euo pipefail

# shellcheck source=scripts/cross-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cross-lib.sh"

CROSS_NAME=cross-aarch64
CROSS_ARCH=arm64
BUILD_DIR="${BUILD_DIR:-$ROOT/build-aarch64}"
TOOLCHAIN="$ROOT/toolchains/aarch64-linux-gnu.cmake"
TRIPLET=aarch64-linux-gnu
CROSS_ELF_GLOB='*ARM aarch64*'
CROSS_OBJDUMP_FORMAT=elf64-littleaarch64
CROSS_QEMU=qemu-aarch64
CROSS_QEMU_ROOT=/
CROSS_PACKAGE=1
CROSS_FIRMWARE=1

DEPS_ONLY=0
cross_arg() {
  case "$1" in
    --deps-only) DEPS_ONLY=1 ;;
    *) return 1 ;;
  esac
}
cross_parse_args "$0" "$@"

# ---------------------------------------------------------------- deps --
HOST_PKGS=(g++-aarch64-linux-gnu qemu-user cmake make pkg-config file mosquitto)
TARGET_PKGS=(libsqlite3-dev libsqlitecpp-dev libpaho-mqttpp-dev libpaho-mqtt-dev
             libspdlog-dev libfmt-dev libgtest-dev libssl-dev libbenchmark-dev
             libsystemd-dev)
# Header-only build dependencies, architecture independent.
INDEP_PKGS=(nlohmann-json3-dev libcli11-dev)

deps() {
  if ! dpkg --print-foreign-architectures | grep -qx "$CROSS_ARCH" \
     && [ "$(dpkg --print-architecture)" != "$CROSS_ARCH" ]; then
    echo "enabling the $CROSS_ARCH architecture"
    "${SUDO[@]}" dpkg --add-architecture "$CROSS_ARCH"
  fi
  local want=() p
  for p in "${HOST_PKGS[@]}" "${INDEP_PKGS[@]}"; do is_installed "$p" || want+=("$p"); done
  for p in "${TARGET_PKGS[@]}"; do is_installed "$p:$CROSS_ARCH" || want+=("$p:$CROSS_ARCH"); done
  # qemu-user-binfmt only where binfmt_misc is usable: in a container its
  # postinst cannot register the handlers. It is not needed anyway, the
  # toolchain file runs target programs through qemu-aarch64 explicitly.
  if [ -w /proc/sys/fs/binfmt_misc/register ] && ! is_installed qemu-user-binfmt; then
    want+=(qemu-user-binfmt)
  fi
  if [ ${#want[@]} -eq 0 ]; then
    echo "all packages present"
    return
  fi
  apt_install_missing "${want[@]}"
}

cross_before_build() {
  [ "$DO_INSTALL" = 1 ] && stage deps deps
  if [ "$DEPS_ONLY" = 1 ]; then summary; exit 0; fi
}

# -------------------------------------------------------------- verify --
verify_linked_lib() {
  local f="$1" desc
  [ -e "$f" ] || return 0
  desc="$(file -bL "$f")"
  case "$desc" in
    *"ARM aarch64"*) echo "  linked: $f" ;;
    *"ar archive"*)
      # a static library: check its first member
      if "$TRIPLET-objdump" -f "$f" 2>/dev/null | grep -q "$CROSS_OBJDUMP_FORMAT"; then
        echo "  linked: $f (static, aarch64)"
      else echo "NOT aarch64: $f" >&2; VERIFY_BAD=1; fi ;;
    *) echo "NOT aarch64: $f: $desc" >&2; VERIFY_BAD=1 ;;
  esac
}

# With the sysroot / (multiarch), the host's own libraries are one wrong path away.
verify_extra() {
  local f desc libs
  # Every library path the configure step found.
  libs="$(grep -E '^[A-Za-z0-9_]+(_LIBRARY|_LIBRARIES|_LIBRARY_RELEASE)[A-Z_]*:FILEPATH=/' \
            "$BUILD_DIR/CMakeCache.txt" | sed 's/^[^=]*=//' | sort -u || true)"
  for f in $libs; do
    [ -e "$f" ] || continue
    desc="$(file -bL "$f")"
    echo "  cache: $f -> ${desc%%,*}"
    case "$desc" in
      *"ARM aarch64"*|*"ASCII text"*) ;;
      *) echo "NOT aarch64: $f: $desc" >&2; VERIFY_BAD=1 ;;
    esac
  done
  if grep -n "/$(dpkg-architecture -qDEB_BUILD_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)/" \
       "$BUILD_DIR/CMakeCache.txt" | grep -v -E 'CMAKE_(AR|RANLIB|LINKER|NM|OBJ|STRIP|READELF|ADDR2LINE|DLLTOOL|MAKE_PROGRAM|COMMAND|CTEST|CPACK)|_EXECUTABLE|QEMU|INTERNAL' ; then
    echo "CMakeCache.txt mentions host multiarch paths (see above)" >&2; VERIFY_BAD=1
  fi
  # What the first target program needs at run time.
  local exe=""
  while IFS= read -r -d '' f; do
    if file -b "$f" | grep -q 'ELF.*\(executable\|pie\)'; then exe="$f"; break; fi
  done < <(find "$BUILD_DIR" -path "$BUILD_DIR/CMakeFiles" -prune -o -type f -perm -u+x -print0)
  if [ -n "$exe" ]; then
    echo "  NEEDED by ${exe#"$BUILD_DIR"/}:"
    "$TRIPLET-readelf" -d "$exe" | awk '/NEEDED/ {print "    " $NF}'
  fi
}

cross_main

# shellcheck shell=bash
# The steps the cross builds share: options, timed stages, apt, configure, build,
# verify, and ctest under qemu. Sourced by scripts/cross-aarch64.sh (Debian multiarch)
# and scripts/armhf-sysroot.sh (an mmdebstrap sysroot); not run by itself.
#
# The sourcing script sets, before calling cross_main:
#   CROSS_NAME        log prefix, e.g. cross-aarch64
#   CROSS_ARCH        Debian architecture, for messages (arm64, armhf)
#   TOOLCHAIN         the CMake toolchain file
#   TRIPLET           GNU triplet of the cross binutils (aarch64-linux-gnu, ...)
#   CROSS_ELF_GLOB    `file -b` pattern (a case glob) every built ELF must match
#   CROSS_OBJDUMP_FORMAT  `objdump -f` file format of the static libraries' members
#   CROSS_QEMU        qemu-user program (qemu-aarch64, qemu-arm)
#   CROSS_QEMU_ROOT   its -L root: / for multiarch, the sysroot otherwise
#   CROSS_CMAKE_ARGS  array of extra configure arguments
#   CROSS_PACKAGE     1: a stage "package" makes the .debs and checks the service one
#                     (tests/package/service_deb_arch_test.cmake); needs a multiarch build
#   CROSS_FIRMWARE    1: a stage "firmware" runs scripts/firmware.sh for the target into
#                     $BUILD_DIR-firmware (the firmware build, a C program linked against it
#                     shared and static); needs a multiarch build
# and defines:
#   cross_arg ARG         handle an option of its own (return 1 if unknown)
#   cross_before_build    its stages before configure (deps, sysroot); may exit
#   verify_linked_lib F   check one external library found on a link line
#   verify_extra          further checks after the shared verify (may be empty)
# Environment: SOURCE_DIR, BUILD_DIR, JOBS, CTEST_JOBS, BUILD_TYPE, CTEST_TIMEOUT,
# MQTT_INBOX_CROSS_CTEST_EXCLUDE, MQTT_INBOX_CROSS_CMAKE_ARGS (see the scripts' --help).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOURCE_DIR="${SOURCE_DIR:-$ROOT}"
JOBS="${JOBS:-2}"
# Tests at once in the combined pass (test_all): more than the cores, since the integration
# cases mostly wait while the unit tests compute.
CTEST_JOBS="${CTEST_JOBS:-3}"
BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}"
CTEST_TIMEOUT="${CTEST_TIMEOUT:-300}"
CROSS_CMAKE_ARGS=()
CROSS_PACKAGE=0
CROSS_FIRMWARE=0

# ---------------------------------------------------------------- options --
DO_INSTALL=1 DO_TESTS=1 DO_INTEGRATION=1 DO_CLEAN=0 ALL_INTEGRATION=0
# shellcheck disable=SC2034  # DO_INSTALL is read by the sourcing script
cross_parse_args() {  # cross_parse_args SCRIPT "$@"
  local script="$1" arg; shift
  for arg in "$@"; do
    case "$arg" in
      --no-install) DO_INSTALL=0 ;;
      --no-tests) DO_TESTS=0 ;;
      --unit-only) DO_INTEGRATION=0 ;;
      --all-integration) ALL_INTEGRATION=1 ;;
      --clean) DO_CLEAN=1 ;;
      -h|--help) sed -n '2,/^set -euo/p' "$script" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) cross_arg "$arg" || { echo "unknown argument: $arg" >&2; exit 2; } ;;
    esac
  done
}

# ----------------------------------------------------------------- stages --
log() { printf '\n=== [%s] %s\n' "$CROSS_NAME" "$*"; }
SUMMARY=()
T0=$SECONDS
stage() {  # stage NAME FUNCTION: run and time it
  local name="$1"; shift
  log "stage $name"
  local t0=$SECONDS
  "$@"
  local dt=$((SECONDS - t0))
  SUMMARY+=("$(printf '%-10s %4ds' "$name" "$dt")")
  log "stage $name done in ${dt}s"
}
summary() {
  log "summary"
  printf '  %s\n' "${SUMMARY[@]}"
  printf '  %-10s %4ds\n' total $((SECONDS - T0))
}

# -------------------------------------------------------------------- apt --
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "not root and no sudo" >&2; exit 1; }
  SUDO=(sudo)
fi
apt_get() {
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@"
}

is_installed() {  # is_installed PKG[:ARCH]
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

# apt_install_missing PKG...: installs those given (all missing) after an apt-get
# update, and aborts if apt would remove any installed package.
apt_install_missing() {
  echo "missing: $*"
  # Always refresh the lists (a fresh machine has none for a new architecture;
  # multiarch also needs the same version of each Multi-Arch: same package for both
  # architectures).
  if ! apt_get update -q; then
    # e.g. one mirror index failing its size/hash check: the simulation below
    # still shows whether what is needed can be installed consistently.
    echo "WARNING: apt-get update reported errors (above); continuing" >&2
  fi
  local sim
  sim="$(LC_ALL=C apt-get -s --no-install-recommends install "$@" 2>&1)" || {
    echo "$sim" >&2; echo "apt cannot resolve the packages" >&2; exit 1; }
  if grep -q '^Remv ' <<<"$sim"; then
    grep '^Remv ' <<<"$sim" >&2
    echo "ABORT: installing $* would remove the packages above." >&2
    exit 1
  fi
  if grep -qE '^Inst [^ ]+ \[' <<<"$sim"; then
    echo "note: these installed packages are upgraded (multiarch needs equal versions):"
    grep -E '^Inst [^ ]+ \[' <<<"$sim" | awk '{print "  " $2 " " $3}'
  fi
  apt_get --no-install-recommends install "$@"
}

# ---------------------------------------------------------- configure/build --
configure() {
  if [ "$DO_CLEAN" = 1 ]; then rm -rf "$BUILD_DIR"; fi
  local gen=() tests=ON launcher=() labels=""
  # Only the test programs that run here are built: the unit tests and, unless
  # --all-integration, the guarantee's own integration cases (tests/README.md).
  [ "$ALL_INTEGRATION" = 1 ] || labels="unit;integration-core"
  # --no-tests: a device build, the library and the programs only (the test suite is
  # most of the compile time and nothing of it goes into a package).
  [ "$DO_TESTS" = 1 ] || tests=OFF
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null; then
    gen=(-G Ninja)
  fi
  # shellcheck disable=SC2086
  cmake -S "$SOURCE_DIR" -B "$BUILD_DIR" "${gen[@]}" \
    -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
    "${CROSS_CMAKE_ARGS[@]}" \
    -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
    "${launcher[@]}" \
    -DMQTT_INBOX_BUILD_TESTS=$tests "-DMQTT_INBOX_TEST_LABELS=$labels" \
    -DMQTT_INBOX_BUILD_EXAMPLES=ON \
    -DMQTT_INBOX_BUILD_BENCH=OFF \
    ${MQTT_INBOX_CROSS_CMAKE_ARGS:-}
}

build() { cmake --build "$BUILD_DIR" -j "$JOBS"; }

# The .debs, and the service package's checks on this machine: Depends against what the
# programs load, Type= against their libsystemd linkage, the units, the postinst, the
# programs' --help under qemu.
package() {
  local emulator=()
  [ -n "${MQTT_INBOX_TEST_EMULATOR:-}" ] && emulator=("-DEMULATOR=${MQTT_INBOX_TEST_EMULATOR// /;}")
  cmake -DBUILD="$BUILD_DIR" -DWORK="$BUILD_DIR/packages" "${emulator[@]}" \
    -P "$SOURCE_DIR/tests/package/service_deb_arch_test.cmake"
  ls -l "$BUILD_DIR"/packages/out/*.deb
}

# The firmware build for the target (docs/packaging.md#the-firmware-build).
firmware() {
  "$SOURCE_DIR/scripts/firmware.sh" --toolchain "$TOOLCHAIN" --triplet "$TRIPLET" \
    "$BUILD_DIR-firmware"
}

# ----------------------------------------------------------------- verify --
VERIFY_BAD=0
verify() {
  VERIFY_BAD=0
  local n=0 f desc
  # Every ELF we built (executables, shared libraries, objects).
  while IFS= read -r -d '' f; do
    desc="$(file -b "$f")"
    case "$desc" in ELF*) ;; *) continue ;; esac
    n=$((n + 1))
    # shellcheck disable=SC2254
    case "$desc" in
      $CROSS_ELF_GLOB) ;;
      *) echo "NOT $CROSS_ARCH: $f: $desc" >&2; VERIFY_BAD=1 ;;
    esac
  done < <(find "$BUILD_DIR" -path "$BUILD_DIR/CMakeFiles" -prune -o \
             -type f \( -perm -u+x -o -name '*.so*' -o -name '*.o' \) -print0)
  # Static libraries we built: every member must be of the target's format.
  while IFS= read -r -d '' f; do
    n=$((n + 1))
    if "$TRIPLET-objdump" -f "$f" 2>/dev/null | grep 'file format' \
         | grep -qv "$CROSS_OBJDUMP_FORMAT"; then
      echo "NOT $CROSS_ARCH: $f" >&2; VERIFY_BAD=1
    fi
  done < <(find "$BUILD_DIR" -path "$BUILD_DIR/CMakeFiles" -prune -o -type f -name '*.a' -print0)
  echo "checked $n ELF files and static libraries built in $BUILD_DIR"
  # Every external library on a link line (imported targets from config files, e.g.
  # spdlog and GTest, never show up in the cache).
  local linkfiles=()
  [ -f "$BUILD_DIR/build.ninja" ] && linkfiles+=("$BUILD_DIR/build.ninja")
  while IFS= read -r -d '' f; do linkfiles+=("$f"); done \
    < <(find "$BUILD_DIR" -name link.txt -print0)
  if [ ${#linkfiles[@]} -gt 0 ]; then
    for f in $(grep -ohE '(^|[ =])/[^ ]+\.(so|a)(\.[0-9]+)*' "${linkfiles[@]}" \
                 | sed 's/^[ =]//' | grep -v "^$BUILD_DIR/" | sort -u); do
      verify_linked_lib "$f"
    done
  fi
  verify_extra
  [ "$VERIFY_BAD" = 0 ] || { echo "verify FAILED" >&2; exit 1; }
}

# ------------------------------------------------------------------- test --
# Tests that start a *target* program themselves (crash and poison tests
# exec crash_consumer) need that program run under qemu too: without
# binfmt_misc the host kernel cannot exec an ARM binary. The fixture does that
# when it honours MQTT_INBOX_TEST_EMULATOR (exported by cross_main). With a
# fixture that does not, and no binfmt handler, the suites of the test sources
# that start children (they use support/child_consumer.h, Child or
# built_program) are left out by default.
# MQTT_INBOX_CROSS_CTEST_EXCLUDE (even set to "") overrides the default.
default_exclude() {
  if [ -e "/proc/sys/fs/binfmt_misc/$CROSS_QEMU" ] \
     || grep -rqs MQTT_INBOX_TEST_EMULATOR "$SOURCE_DIR/tests"; then
    return
  fi
  local files suites
  files="$(grep -rlE --include='*.cpp' 'child_consumer\.h|\bChild\b|built_program' \
             "$SOURCE_DIR/tests" 2>/dev/null || true)"
  [ -n "$files" ] || return 0
  # shellcheck disable=SC2086
  suites="$(grep -ohE '^(TYPED_)?TEST(_F|_P)?\( *[A-Za-z0-9_]+' $files \
            | sed -E 's/.*\( *//' | sort -u | paste -sd'|' -)"
  [ -n "$suites" ] && echo "(^|/)($suites)\."
}

TEST_FAILED=()
run_ctest() {  # run_ctest [-j N] [ctest args...]: -j N replaces -j$JOBS
  local exclude_re exclude=() jobs="$JOBS"
  if [ "${1:-}" = -j ]; then jobs="$2"; shift 2; fi
  exclude_re="${MQTT_INBOX_CROSS_CTEST_EXCLUDE-$(default_exclude)}"
  if [ -n "$exclude_re" ]; then
    echo "not run under qemu: tests matching '$exclude_re'" \
         "(they exec target programs; see docs/cross-compiling.md)"
    exclude=(-E "$exclude_re")
  fi
  ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout "$CTEST_TIMEOUT" \
    -j "$jobs" "${exclude[@]}" "$@"
}

# The project labels its tests "unit" and "integration" (the latter start a
# mosquitto). Without labels everything runs in the unit stage.
has_label() {
  # (not piped into grep -q: with pipefail, ctest's SIGPIPE would fail the test)
  local labels
  labels="$(ctest --test-dir "$BUILD_DIR" --print-labels 2>/dev/null || true)"
  grep -qx "  $1" <<<"$labels"
}

test_unit() {
  if has_label integration; then
    run_ctest -LE integration || TEST_FAILED+=(unit)
  else
    run_ctest || TEST_FAILED+=(unit)
  fi
}

# The unit tests and the core integration cases in one ctest pass, side by side: under
# qemu the unit tests are CPU-bound and the integration cases mostly wait (a broker, a
# child, a backoff), so each fills what the other leaves idle. Two passes took 426 s and
# 302 s one after the other on 2 cores (CI, main 2746535).
test_all() {
  command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || {
    echo "mosquitto is not installed; the unit tests only" >&2; test_unit; return; }
  echo "unit tests and the cases labelled 'integration-core' under qemu, -j$CTEST_JOBS" \
       "(--all-integration runs every integration case, in a pass of its own)"
  run_ctest -j "$CTEST_JOBS" -L '^(unit|integration-core)$' || TEST_FAILED+=(unit+integration)
}

test_integration() {
  if ! has_label integration && ! has_label integration-core; then
    echo "no tests labelled 'integration' (already run with the unit stage)"
    return
  fi
  command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || {
    echo "mosquitto is not installed; skipping integration tests" >&2; return; }
  # Under qemu every case costs 5-20 times its native time: where the project labels its
  # guarantee's own cases "integration-core", only those run, unless --all-integration.
  if [ "$ALL_INTEGRATION" = 0 ] && has_label integration-core; then
    echo "integration under qemu: the cases labelled 'integration-core'" \
         "(--all-integration runs every one)"
    run_ctest -L '^integration-core$' || TEST_FAILED+=(integration)
  else
    run_ctest -L integration || TEST_FAILED+=(integration)
  fi
}

# ------------------------------------------------------------------- main --
cross_main() {
  cross_before_build
  local qemu_bin
  qemu_bin="$(command -v "$CROSS_QEMU" || true)"
  if [ -n "$qemu_bin" ]; then
    export MQTT_INBOX_TEST_EMULATOR="$qemu_bin -L $CROSS_QEMU_ROOT"
  fi
  stage configure configure
  stage build build
  stage verify verify
  [ "$CROSS_PACKAGE" = 1 ] && stage package package
  [ "$CROSS_FIRMWARE" = 1 ] && stage firmware firmware
  if [ "$DO_TESTS" = 1 ]; then
    if [ "$DO_INTEGRATION" = 1 ] && [ "$ALL_INTEGRATION" = 0 ] && has_label integration-core; then
      stage tests test_all
    else
      stage unit-tests test_unit
      [ "$DO_INTEGRATION" = 1 ] && stage integration test_integration
    fi
  fi
  summary
  if [ ${#TEST_FAILED[@]} -gt 0 ]; then
    echo "FAILED under $CROSS_QEMU: ${TEST_FAILED[*]} tests" >&2
    exit 1
  fi
}

#!/usr/bin/env bash
# Cross-build mqtt-inbox for aarch64 (arm64) with Debian multiarch and run its
# tests under qemu-aarch64.
#
#   scripts/cross-aarch64.sh [--no-install] [--deps-only] [--no-tests]
#                            [--unit-only] [--clean]
#
# Stages (each prints its duration):
#   deps       dpkg --add-architecture arm64; install g++-aarch64-linux-gnu,
#              qemu-user and the arm64 -dev packages, only those missing.
#              Aborts if apt would remove any installed package.
#   configure  cmake with toolchains/aarch64-linux-gnu.cmake into $BUILD_DIR
#   build      library, examples and tests (-j$JOBS)
#   verify     every built ELF and every library recorded in CMakeCache.txt
#              must be aarch64, none x86-64
#   test       ctest under qemu-aarch64: the unit tests, then the integration
#              tests (they start the host's /usr/sbin/mosquitto on 127.0.0.1;
#              the test binary runs under qemu, the broker natively)
#
# Environment:
#   SOURCE_DIR  project to build       (default: <repo>)
#   BUILD_DIR   build folder           (default: <repo>/build-aarch64)
#   JOBS        parallel build jobs    (default: 2)
#   BUILD_TYPE  CMAKE_BUILD_TYPE       (default: RelWithDebInfo)
#   CTEST_TIMEOUT  per-test timeout, s (default: 300; qemu is ~5-20x slower)
#   MQTT_INBOX_CROSS_CTEST_EXCLUDE  regex of test names not to run under qemu
#   MQTT_INBOX_CROSS_CMAKE_ARGS     extra cmake configure arguments
#
# Idempotent: re-running skips installed packages and re-uses the build folder.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOURCE_DIR="${SOURCE_DIR:-$ROOT}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-aarch64}"
JOBS="${JOBS:-2}"
BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}"
CTEST_TIMEOUT="${CTEST_TIMEOUT:-300}"
TOOLCHAIN="$ROOT/toolchains/aarch64-linux-gnu.cmake"
ARCH=arm64
TRIPLET=aarch64-linux-gnu

DO_INSTALL=1 DO_TESTS=1 DO_INTEGRATION=1 DO_CLEAN=0 DEPS_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --no-install) DO_INSTALL=0 ;;
    --deps-only) DEPS_ONLY=1 ;;
    --no-tests) DO_TESTS=0 ;;
    --unit-only) DO_INTEGRATION=0 ;;
    --clean) DO_CLEAN=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { printf '\n=== [cross-aarch64] %s\n' "$*"; }
SUMMARY=()
stage() {  # stage NAME FUNCTION: run and time it
  local name="$1"; shift
  log "stage $name"
  local t0=$SECONDS
  "$@"
  local dt=$((SECONDS - t0))
  SUMMARY+=("$(printf '%-10s %4ds' "$name" "$dt")")
  log "stage $name done in ${dt}s"
}

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "not root and no sudo" >&2; exit 1; }
  SUDO=(sudo)
fi
apt_get() {
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@"
}

# ---------------------------------------------------------------- deps --
HOST_PKGS=(g++-aarch64-linux-gnu qemu-user cmake make pkg-config file mosquitto)
TARGET_PKGS=(libsqlite3-dev libsqlitecpp-dev libpaho-mqttpp-dev libpaho-mqtt-dev
             libspdlog-dev libfmt-dev libgtest-dev libssl-dev libbenchmark-dev)
# Header-only build dependencies, architecture independent.
INDEP_PKGS=(nlohmann-json3-dev libcli11-dev)

is_installed() {  # is_installed PKG[:ARCH]
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

deps() {
  if ! dpkg --print-foreign-architectures | grep -qx "$ARCH" \
     && [ "$(dpkg --print-architecture)" != "$ARCH" ]; then
    echo "enabling the $ARCH architecture"
    "${SUDO[@]}" dpkg --add-architecture "$ARCH"
  fi
  local want=() p
  for p in "${HOST_PKGS[@]}" "${INDEP_PKGS[@]}"; do is_installed "$p" || want+=("$p"); done
  for p in "${TARGET_PKGS[@]}"; do is_installed "$p:$ARCH" || want+=("$p:$ARCH"); done
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
  echo "missing: ${want[*]}"
  # Always refresh the lists when something is missing (a fresh machine has
  # none for the new architecture; multiarch also needs the same version of
  # each Multi-Arch: same package for both architectures).
  if ! apt_get update -q; then
    # e.g. one mirror index failing its size/hash check: the simulation below
    # still shows whether what is needed can be installed consistently.
    echo "WARNING: apt-get update reported errors (above); continuing" >&2
  fi
  local sim
  sim="$(LC_ALL=C apt-get -s --no-install-recommends install "${want[@]}" 2>&1)" || {
    echo "$sim" >&2; echo "apt cannot resolve the cross packages" >&2; exit 1; }
  if grep -q '^Remv ' <<<"$sim"; then
    echo "$sim" | grep '^Remv ' >&2
    echo "ABORT: installing the $ARCH packages would remove the packages above." >&2
    exit 1
  fi
  if grep -qE '^Inst [^ ]+ \[' <<<"$sim"; then
    echo "note: these installed packages are upgraded (multiarch needs equal versions):"
    grep -E '^Inst [^ ]+ \[' <<<"$sim" | awk '{print "  " $2 " " $3}'
  fi
  apt_get --no-install-recommends install "${want[@]}"
}

# ----------------------------------------------------------- configure --
configure() {
  if [ "$DO_CLEAN" = 1 ]; then rm -rf "$BUILD_DIR"; fi
  local gen=()
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null; then
    gen=(-G Ninja)
  fi
  # shellcheck disable=SC2086
  cmake -S "$SOURCE_DIR" -B "$BUILD_DIR" "${gen[@]}" \
    -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
    -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
    -DMQTT_INBOX_BUILD_TESTS=ON \
    -DMQTT_INBOX_BUILD_EXAMPLES=ON \
    ${MQTT_INBOX_CROSS_CMAKE_ARGS:-}
}

build() {
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

# -------------------------------------------------------------- verify --
verify() {
  local bad=0 n=0 f desc
  # Every ELF we built (executables, shared and static libraries' objects).
  while IFS= read -r -d '' f; do
    desc="$(file -b "$f")"
    case "$desc" in
      ELF*) ;;
      current\ ar\ archive*) continue ;;
      *) continue ;;
    esac
    n=$((n + 1))
    case "$desc" in
      *"ARM aarch64"*) ;;
      *) echo "NOT aarch64: $f: $desc" >&2; bad=1 ;;
    esac
  done < <(find "$BUILD_DIR" -path "$BUILD_DIR/CMakeFiles" -prune -o \
             -type f \( -perm -u+x -o -name '*.so*' -o -name '*.o' \) -print0)
  # Static libraries we built: every member must be elf64-littleaarch64.
  while IFS= read -r -d '' f; do
    n=$((n + 1))
    if "$TRIPLET-objdump" -f "$f" 2>/dev/null | grep 'file format' \
         | grep -qv 'elf64-littleaarch64'; then
      echo "NOT aarch64: $f" >&2; bad=1
    fi
  done < <(find "$BUILD_DIR" -path "$BUILD_DIR/CMakeFiles" -prune -o -type f -name '*.a' -print0)
  echo "checked $n ELF files and static libraries built in $BUILD_DIR"
  # Every library path the configure step found.
  local libs
  libs="$(grep -E '^[A-Za-z0-9_]+(_LIBRARY|_LIBRARIES|_LIBRARY_RELEASE)[A-Z_]*:FILEPATH=/' \
            "$BUILD_DIR/CMakeCache.txt" | sed 's/^[^=]*=//' | sort -u || true)"
  for f in $libs; do
    [ -e "$f" ] || continue
    desc="$(file -bL "$f")"
    echo "  cache: $f -> ${desc%%,*}"
    case "$desc" in
      *"ARM aarch64"*|*"ASCII text"*) ;;
      *) echo "NOT aarch64: $f: $desc" >&2; bad=1 ;;
    esac
  done
  if grep -n "/$(dpkg-architecture -qDEB_BUILD_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)/" \
       "$BUILD_DIR/CMakeCache.txt" | grep -v -E 'CMAKE_(AR|RANLIB|LINKER|NM|OBJ|STRIP|READELF|ADDR2LINE|DLLTOOL|MAKE_PROGRAM|COMMAND|CTEST|CPACK)|_EXECUTABLE|QEMU|INTERNAL' ; then
    echo "CMakeCache.txt mentions host multiarch paths (see above)" >&2; bad=1
  fi
  # Every external library on a link line (imported targets from config
  # files, e.g. spdlog and GTest, never show up in the cache).
  local linkfiles=()
  if [ -f "$BUILD_DIR/build.ninja" ]; then linkfiles+=("$BUILD_DIR/build.ninja"); fi
  while IFS= read -r -d '' f; do linkfiles+=("$f"); done \
    < <(find "$BUILD_DIR" -name link.txt -print0)
  if [ ${#linkfiles[@]} -gt 0 ]; then
    for f in $(grep -ohE '(^|[ =])/[^ ]+\.(so|a)(\.[0-9]+)*' "${linkfiles[@]}" \
                 | sed 's/^[ =]//' | grep -v "^$BUILD_DIR/" | sort -u); do
      [ -e "$f" ] || continue
      desc="$(file -bL "$f")"
      case "$desc" in
        *"ARM aarch64"*) echo "  linked: $f" ;;
        *"ar archive"*)
          # a static library: check its first member
          if "$TRIPLET-objdump" -f "$f" 2>/dev/null | grep -q 'elf64-littleaarch64'; then
            echo "  linked: $f (static, aarch64)"
          else echo "NOT aarch64: $f" >&2; bad=1; fi ;;
        *) echo "NOT aarch64: $f: $desc" >&2; bad=1 ;;
      esac
    done
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
  [ "$bad" = 0 ] || { echo "verify FAILED" >&2; exit 1; }
}

# ---------------------------------------------------------------- test --
# Tests that start a *target* program themselves (crash and poison tests
# exec crash_consumer) need that program run under qemu too: without
# binfmt_misc the host kernel cannot exec an ARM binary. The fixture does that
# when it honours MQTT_INBOX_TEST_EMULATOR (exported below). With a fixture
# that does not, and no binfmt handler, the suites of the test sources that
# start children (they use support/child_consumer.h, Child or
# built_program) are left out by default.
# MQTT_INBOX_CROSS_CTEST_EXCLUDE (even set to "") overrides the default.
QEMU_BIN="$(command -v qemu-aarch64 || true)"
if [ -n "$QEMU_BIN" ]; then
  export MQTT_INBOX_TEST_EMULATOR="$QEMU_BIN -L /"
fi
default_exclude() {
  if [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] \
     || grep -rqs MQTT_INBOX_TEST_EMULATOR "$SOURCE_DIR/tests"; then
    return
  fi
  local files suites
  files="$(grep -lE 'child_consumer\.h|\bChild\b|built_program' "$SOURCE_DIR"/tests/*.cpp 2>/dev/null || true)"
  [ -n "$files" ] || return 0
  # shellcheck disable=SC2086
  suites="$(grep -ohE '^(TYPED_)?TEST(_F|_P)?\( *[A-Za-z0-9_]+' $files \
            | sed -E 's/.*\( *//' | sort -u | paste -sd'|' -)"
  [ -n "$suites" ] && echo "(^|/)($suites)\."
}

TEST_FAILED=()
run_ctest() {
  local exclude_re exclude=()
  exclude_re="${MQTT_INBOX_CROSS_CTEST_EXCLUDE-$(default_exclude)}"
  if [ -n "$exclude_re" ]; then
    echo "not run under qemu: tests matching '$exclude_re'" \
         "(they exec target programs; see docs/cross-compiling.md)"
    exclude=(-E "$exclude_re")
  fi
  ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout "$CTEST_TIMEOUT" \
    -j "$JOBS" "${exclude[@]}" "$@"
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

test_integration() {
  if ! has_label integration; then
    echo "no tests labelled 'integration' (already run with the unit stage)"
    return
  fi
  command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || {
    echo "mosquitto is not installed; skipping integration tests" >&2; return; }
  run_ctest -L integration || TEST_FAILED+=(integration)
}

T0=$SECONDS
[ "$DO_INSTALL" = 1 ] && stage deps deps
if [ "$DEPS_ONLY" = 1 ]; then printf '  %s\n' "${SUMMARY[@]}"; exit 0; fi
stage configure configure
stage build build
stage verify verify
if [ "$DO_TESTS" = 1 ]; then
  stage unit-tests test_unit
  [ "$DO_INTEGRATION" = 1 ] && stage integration test_integration
fi
log "summary"
printf '  %s\n' "${SUMMARY[@]}"
printf '  %-10s %4ds\n' total $((SECONDS - T0))
if [ ${#TEST_FAILED[@]} -gt 0 ]; then
  echo "FAILED under qemu-aarch64: ${TEST_FAILED[*]} tests" >&2
  exit 1
fi

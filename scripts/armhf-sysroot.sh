#!/usr/bin/env bash
# Build a Debian bookworm armhf sysroot with mmdebstrap, cross-build mqtt-inbox
# against it with toolchains/arm-linux-gnueabihf.cmake, and (optionally) run
# the tests under qemu-arm -L <sysroot>.
#
#   scripts/armhf-sysroot.sh [--no-install] [--sysroot-only] [--no-tests]
#                            [--unit-only] [--rebuild-sysroot] [--clean]
#
# Unlike scripts/cross-aarch64.sh this does not use multiarch (dpkg
# --add-architecture armhf): the armhf packages are unpacked into a separate
# directory, so nothing of the host's package set changes.
#
# Stages (each prints its duration):
#   deps       install mmdebstrap, g++-arm-linux-gnueabihf, qemu-user (if missing)
#   sysroot    mmdebstrap --arch=armhf --variant=extract --include=<-dev pkgs>
#              bookworm <SYSROOT> <the Debian mirror(s) apt uses here>.
#              Skipped when SYSROOT already holds the same package list.
#   configure  cmake -DCMAKE_TOOLCHAIN_FILE=toolchains/arm-linux-gnueabihf.cmake
#              -DMQTT_INBOX_SYSROOT=<SYSROOT>
#   build      library, examples, tests
#   verify     the built ELF files are 32-bit ARM, the linked libraries come
#              from the sysroot
#   test       ctest under qemu-arm (unit tests, then integration tests)
#
# Environment:
#   SYSROOT      sysroot folder (default: <repo>/build-armhf-sysroot)
#   BUILD_DIR    build folder   (default: <repo>/build-armhf)
#   SOURCE_DIR   project        (default: <repo>)
#   JOBS         build jobs     (default: 2)
#   BUILD_TYPE   (default: RelWithDebInfo)
#   CTEST_TIMEOUT                   per-test timeout in s (default: 300)
#   MQTT_INBOX_ARMHF_MIRRORS        override the apt source lines given to
#                                   mmdebstrap, separated by '|', e.g.
#                                   "deb http://mirror/debian bookworm main"
#   MQTT_INBOX_CROSS_CTEST_EXCLUDE  regex of tests not to run under qemu
#   MQTT_INBOX_CROSS_CMAKE_ARGS     extra cmake configure arguments
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOURCE_DIR="${SOURCE_DIR:-$ROOT}"
SYSROOT="${SYSROOT:-$ROOT/build-armhf-sysroot}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-armhf}"
JOBS="${JOBS:-2}"
BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}"
CTEST_TIMEOUT="${CTEST_TIMEOUT:-300}"
TOOLCHAIN="$ROOT/toolchains/arm-linux-gnueabihf.cmake"
TRIPLET=arm-linux-gnueabihf
SUITE=bookworm

DO_INSTALL=1 DO_TESTS=1 DO_INTEGRATION=1 DO_CLEAN=0 SYSROOT_ONLY=0 REBUILD=0
for arg in "$@"; do
  case "$arg" in
    --no-install) DO_INSTALL=0 ;;
    --sysroot-only) SYSROOT_ONLY=1 ;;
    --no-tests) DO_TESTS=0 ;;
    --unit-only) DO_INTEGRATION=0 ;;
    --rebuild-sysroot) REBUILD=1 ;;
    --clean) DO_CLEAN=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

# Target packages unpacked into the sysroot. libc6-dev and libstdc++-12-dev
# are needed because, with --sysroot, the cross compiler takes the C library
# and the C++ headers from the sysroot; the header-only libraries are needed
# because the host's /usr/include is not searched either.
SYSROOT_PKGS=(libc6-dev libstdc++-12-dev libgcc-12-dev
              libsqlite3-dev libsqlitecpp-dev libpaho-mqttpp-dev libpaho-mqtt-dev
              libspdlog-dev libfmt-dev libgtest-dev libssl-dev
              nlohmann-json3-dev libcli11-dev)
HOST_PKGS=(mmdebstrap g++-arm-linux-gnueabihf qemu-user cmake make pkg-config file mosquitto)

log() { printf '\n=== [armhf-sysroot] %s\n' "$*"; }
SUMMARY=()
stage() {
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

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "not root and no sudo" >&2; exit 1; }
  SUDO=(sudo)
fi

is_installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

deps() {
  local want=() p
  for p in "${HOST_PKGS[@]}"; do is_installed "$p" || want+=("$p"); done
  if [ ${#want[@]} -eq 0 ]; then echo "all packages present"; return; fi
  echo "missing: ${want[*]}"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  local sim
  sim="$(LC_ALL=C apt-get -s --no-install-recommends install "${want[@]}" 2>&1)" || {
    echo "$sim" >&2; exit 1; }
  if grep -q '^Remv ' <<<"$sim"; then
    grep '^Remv ' <<<"$sim" >&2
    echo "ABORT: installing ${want[*]} would remove the packages above" >&2; exit 1
  fi
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y --no-install-recommends \
    install "${want[@]}"
}

# The Debian mirrors apt is configured with on this machine, as mmdebstrap
# source lines, one per suite: "deb <uri> <suite> main". No host name is
# hard-coded here; whatever apt uses is reused.
debian_sources() {
  if [ -n "${MQTT_INBOX_ARMHF_MIRRORS:-}" ]; then
    tr '|' '\n' <<<"$MQTT_INBOX_ARMHF_MIRRORS"
    return
  fi
  apt-get indextargets --format '$(ORIGIN)|$(REPO_URI)|$(RELEASE)|$(COMPONENT)' \
      'Identifier: Packages' 2>/dev/null \
    | awk -F'|' -v s="$SUITE" '$1 == "Debian" && ($3 == s || index($3, s "-") == 1) {
        print $2 "|" $3 "|" $4 }' \
    | sort -u \
    | awk -F'|' '{ comps[$1 "|" $2] = comps[$1 "|" $2] " " $3 }
                 END { for (k in comps) { split(k, a, "|"); print "deb " a[1] " " a[2] comps[k] } }' \
    | sort
}

SYSROOT_STAMP="$SYSROOT/.mqtt-inbox-sysroot"
sysroot_id() { printf '%s %s armhf\n' "$SUITE" "${SYSROOT_PKGS[*]}"; }

run_mmdebstrap() {  # run_mmdebstrap OUTDIR SOURCE-LINE...
  local out="$1"; shift
  local include
  include="$(IFS=,; echo "${SYSROOT_PKGS[*]}")"
  local cmd=(mmdebstrap --arch=armhf --variant=extract --include="$include"
             "$SUITE" "$out" "$@")
  printf '+'; printf ' %q' "${cmd[@]}"; echo
  "${SUDO[@]}" "${cmd[@]}"
}

sysroot() {
  if [ "$REBUILD" = 0 ] && [ -f "$SYSROOT_STAMP" ] \
     && [ "$(cat "$SYSROOT_STAMP")" = "$(sysroot_id)" ]; then
    echo "sysroot $SYSROOT is up to date ($(du -sh "$SYSROOT" | cut -f1))"
    return
  fi
  local sources=()
  mapfile -t sources < <(debian_sources)
  if [ ${#sources[@]} -eq 0 ]; then
    echo "no Debian $SUITE source found in apt's configuration" >&2
    echo "set MQTT_INBOX_ARMHF_MIRRORS='deb <uri> $SUITE main'" >&2
    exit 1
  fi
  echo "apt sources for the sysroot:"; printf '  %s\n' "${sources[@]}"
  local tmp="$SYSROOT.tmp"
  "${SUDO[@]}" rm -rf "$tmp"
  if ! run_mmdebstrap "$tmp" "${sources[@]}"; then
    # Seen on this project's build machines: the mirror's armhf index of
    # bookworm-security has a different size than its Release file says, so
    # apt (and mmdebstrap's apt) rejects it. Retry with the suites other than
    # -security; the sysroot then lacks the security updates, which only
    # matters for the headers/libraries we link against, not for shipping.
    local fallback=() s
    for s in "${sources[@]}"; do
      case "$s" in *-security*) ;; *) fallback+=("$s") ;; esac
    done
    if [ ${#fallback[@]} -eq ${#sources[@]} ] || [ ${#fallback[@]} -eq 0 ]; then
      echo "mmdebstrap failed" >&2; exit 1
    fi
    echo "mmdebstrap failed with all of apt's suites; retrying without -security" >&2
    "${SUDO[@]}" rm -rf "$tmp"
    run_mmdebstrap "$tmp" "${fallback[@]}"
    sources=("${fallback[@]}")
  fi
  "${SUDO[@]}" rm -rf "$SYSROOT"
  "${SUDO[@]}" mv "$tmp" "$SYSROOT"
  fix_sysroot
  sysroot_id | "${SUDO[@]}" tee "$SYSROOT_STAMP" >/dev/null
  printf '%s\n' "${sources[@]}" | "${SUDO[@]}" tee "$SYSROOT/.mqtt-inbox-sources" >/dev/null
  if [ -n "${SUDO[*]}" ]; then "${SUDO[@]}" chown -R "$(id -u):$(id -g)" "$SYSROOT"; fi
  echo "sysroot: $SYSROOT ($(du -sh "$SYSROOT" | cut -f1))"
}

# Absolute symlinks inside the sysroot (e.g. usr/lib/<triplet>/libfoo.so ->
# /lib/<triplet>/libfoo.so.1) point into the host when the linker follows
# them. Rewrite them relative to the sysroot.
fix_sysroot() {
  local n=0 link target
  while IFS= read -r -d '' link; do
    target="$(readlink "$link")"
    case "$target" in
      /*)
        "${SUDO[@]}" ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$SYSROOT$target")" "$link"
        n=$((n + 1)) ;;
    esac
  done < <(find "$SYSROOT" -type l -print0)
  echo "rewrote $n absolute symlinks to relative ones"
}

configure() {
  if [ "$DO_CLEAN" = 1 ]; then rm -rf "$BUILD_DIR"; fi
  local gen=()
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null; then
    gen=(-G Ninja)
  fi
  # shellcheck disable=SC2086
  cmake -S "$SOURCE_DIR" -B "$BUILD_DIR" "${gen[@]}" \
    -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
    -DMQTT_INBOX_SYSROOT="$SYSROOT" \
    -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
    -DMQTT_INBOX_BUILD_TESTS=ON \
    -DMQTT_INBOX_BUILD_EXAMPLES=ON \
    ${MQTT_INBOX_CROSS_CMAKE_ARGS:-}
}

build() { cmake --build "$BUILD_DIR" -j "$JOBS"; }

verify() {
  local bad=0 n=0 f desc
  while IFS= read -r -d '' f; do
    desc="$(file -b "$f")"
    case "$desc" in ELF*) ;; *) continue ;; esac
    n=$((n + 1))
    case "$desc" in
      *"32-bit LSB"*"ARM, EABI5"*) ;;
      *) echo "NOT armhf: $f: $desc" >&2; bad=1 ;;
    esac
  done < <(find "$BUILD_DIR" -path "$BUILD_DIR/CMakeFiles" -prune -o \
             -type f \( -perm -u+x -o -name '*.so*' \) -print0)
  # Static libraries we built: every member must be elf32-littlearm.
  while IFS= read -r -d '' f; do
    n=$((n + 1))
    if "$TRIPLET-objdump" -f "$f" 2>/dev/null | grep 'file format' \
         | grep -qv 'elf32-littlearm'; then
      echo "NOT armhf: $f" >&2; bad=1
    fi
  done < <(find "$BUILD_DIR" -path "$BUILD_DIR/CMakeFiles" -prune -o -type f -name '*.a' -print0)
  echo "checked $n ELF files and static libraries built in $BUILD_DIR"
  local linkfiles=()
  [ -f "$BUILD_DIR/build.ninja" ] && linkfiles+=("$BUILD_DIR/build.ninja")
  while IFS= read -r -d '' f; do linkfiles+=("$f"); done \
    < <(find "$BUILD_DIR" -name link.txt -print0)
  if [ ${#linkfiles[@]} -gt 0 ]; then
    for f in $(grep -ohE '(^|[ =])/[^ ]+\.(so|a)(\.[0-9]+)*' "${linkfiles[@]}" \
                 | sed 's/^[ =]//' | grep -v "^$BUILD_DIR/" | sort -u); do
      case "$f" in
        "$SYSROOT"/*) echo "  linked: ${f#"$SYSROOT"}  (sysroot)" ;;
        *) echo "NOT from the sysroot: $f" >&2; bad=1 ;;
      esac
    done
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
QEMU_BIN="$(command -v qemu-arm || true)"
if [ -n "$QEMU_BIN" ]; then
  export MQTT_INBOX_TEST_EMULATOR="$QEMU_BIN -L $SYSROOT"
fi
default_exclude() {
  if [ -e /proc/sys/fs/binfmt_misc/qemu-arm ] \
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
stage sysroot sysroot
if [ "$SYSROOT_ONLY" = 1 ]; then summary; exit 0; fi
stage configure configure
stage build build
stage verify verify
if [ "$DO_TESTS" = 1 ]; then
  stage unit-tests test_unit
  [ "$DO_INTEGRATION" = 1 ] && stage integration test_integration
fi
summary
if [ ${#TEST_FAILED[@]} -gt 0 ]; then
  echo "FAILED under qemu-arm: ${TEST_FAILED[*]} tests" >&2
  exit 1
fi

#!/usr/bin/env bash
# The firmware build (docs/packaging.md#the-firmware-build): the libraries of a device
# image, configured with the one switch -DMQTT_INBOX_FIRMWARE=ON, installed into a prefix,
# and a C program linked against that prefix both ways, with what it needs at run time.
#
#   scripts/firmware.sh [--toolchain FILE] [--triplet T] [BUILD_DIR]
#
# BUILD_DIR defaults to <repo>/build-firmware (cross: <repo>/build-firmware-<triplet>).
# Stages (each prints its duration):
#   configure  cmake -DMQTT_INBOX_FIRMWARE=ON [-DCMAKE_TOOLCHAIN_FILE=FILE]
#   build      the static and shared libraries (-j$JOBS)
#   install    into BUILD_DIR/prefix
#   link       docs/c-api.md's minimal program (examples/c/minimal.c) with the page's two
#              lines: shared, `cc ... $(pkg-config --cflags --libs mqtt_inbox) -Wl,-rpath`,
#              and static, `cc ... $(pkg-config --cflags --libs mqtt_inbox_static)`
#   check      the build left out what it leaves out: the shared library and both programs
#              need no libsystemd and no PostgreSQL client library, the static program no
#              libmqtt_inbox*.so; prints each program's NEEDED libraries and (natively, or
#              under qemu with the target's loader) its ldd list, and the stripped sizes
# A cross build (--toolchain, --triplet) uses <triplet>-gcc and the target's pkg-config
# files (Debian multiarch: /usr/lib/<triplet>/pkgconfig). Nothing is run on the target
# but the loader's --list. Environment: JOBS (2).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-2}"
TOOLCHAIN="" TRIPLET="" BUILD_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --toolchain) TOOLCHAIN="$2"; shift 2 ;;
    --triplet) TRIPLET="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown argument: $1" >&2; exit 2 ;;
    *) BUILD_DIR="$1"; shift ;;
  esac
done
if [ -z "$BUILD_DIR" ]; then
  BUILD_DIR="$ROOT/build-firmware${TRIPLET:+-$TRIPLET}"
fi
PREFIX="$BUILD_DIR/prefix"
CC=cc READELF=readelf STRIP=strip
if [ -n "$TRIPLET" ]; then
  CC="$TRIPLET-gcc" READELF="$TRIPLET-readelf" STRIP="$TRIPLET-strip"
fi

T0=$SECONDS
step() {  # step NAME COMMAND...: runs it and prints how long it took
  local name="$1" t0=$SECONDS; shift
  printf '\n--- firmware: %s\n' "$name"
  "$@"
  echo "--- firmware: $name took $((SECONDS - t0))s"
}

configure() {
  local args=(-DMQTT_INBOX_FIRMWARE=ON -DMQTT_INBOX_WARNINGS_AS_ERRORS=ON)
  [ -n "$TOOLCHAIN" ] && args+=(-DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN")
  command -v ninja >/dev/null && [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && args+=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD_DIR" "${args[@]}" | grep -E "mqtt-inbox|Build files" || true
}
build() { cmake --build "$BUILD_DIR" -j "$JOBS"; }
install() {
  rm -rf "$PREFIX"
  cmake --install "$BUILD_DIR" --prefix "$PREFIX" >/dev/null
  find "$PREFIX" -name '*.a' -o -name '*.so*' -o -name '*.pc' | sed "s|^$PREFIX/|  |" | sort
}

pc() {  # pc ARGS...: pkg-config for the target, with the prefix's .pc files first
  local dir
  dir="$(dirname "$(find "$PREFIX" -name mqtt_inbox.pc | head -1)")"
  if [ -n "$TRIPLET" ]; then
    PKG_CONFIG_LIBDIR="/usr/lib/$TRIPLET/pkgconfig:/usr/share/pkgconfig" \
      PKG_CONFIG_PATH="$dir" pkg-config "$@"
  else
    PKG_CONFIG_PATH="$dir" pkg-config "$@"
  fi
}

link() {
  local src="$ROOT/examples/c/minimal.c" out="$BUILD_DIR/programs"
  mkdir -p "$out"
  # The two lines of docs/c-api.md#build.
  # shellcheck disable=SC2046
  "$CC" -std=c99 -Wall -Wextra -Werror -pedantic "$src" $(pc --cflags --libs mqtt_inbox) \
    -Wl,-rpath,"$(pc --variable=libdir mqtt_inbox)" -o "$out/minimal_shared"
  # shellcheck disable=SC2046
  "$CC" -std=c99 -Wall -Wextra -Werror -pedantic "$src" $(pc --cflags --libs mqtt_inbox_static) \
    -o "$out/minimal_static"
  ls -l "$out"
}

needed() { "$READELF" -d "$1" | awk '/NEEDED/ {gsub(/[][]/, "", $NF); print $NF}'; }

BAD=0
refuse() {  # refuse FILE REGEX WHY
  local hits
  hits="$(needed "$1" | grep -E "$2" || true)"
  if [ -n "$hits" ]; then
    echo "FAIL: ${1#"$BUILD_DIR"/} needs $(echo "$hits" | paste -sd' ') ($3)" >&2
    BAD=1
  fi
}

ldd_list() {  # ldd_list PROGRAM: the libraries the loader would load, natively or under qemu
  if [ -z "$TRIPLET" ]; then
    ldd "$1"
  else
    local qemu loader
    qemu="qemu-${TRIPLET%%-*}"
    loader="$(ls /lib/ld-linux-"${TRIPLET%%-*}"*.so.* 2>/dev/null | head -1 || true)"
    if command -v "$qemu" >/dev/null && [ -n "$loader" ]; then
      "$qemu" -L / "$loader" --list "$1"
    else
      echo "  (no $qemu or target loader: NEEDED above only)"
    fi
  fi
}

check() {
  local lib so prog
  so="$(find "$PREFIX" -name 'libmqtt_inbox.so.*.*.*' | head -1)"
  for lib in "$so" "$(find "$PREFIX" -name 'libmqtt_inbox_core.so.*.*.*' | head -1)" \
             "$BUILD_DIR/programs/minimal_shared" "$BUILD_DIR/programs/minimal_static"; do
    refuse "$lib" '^libsystemd|^libpq|^libpqxx' "the firmware build leaves them out"
  done
  refuse "$BUILD_DIR/programs/minimal_static" '^libmqtt_inbox' "it is linked statically"
  if ! needed "$BUILD_DIR/programs/minimal_shared" | grep -q '^libmqtt_inbox\.so'; then
    echo "FAIL: minimal_shared does not need libmqtt_inbox.so" >&2
    BAD=1
  fi
  for prog in minimal_shared minimal_static; do
    echo "$prog NEEDED: $(needed "$BUILD_DIR/programs/$prog" | paste -sd' ')"
    echo "$prog ldd:"
    ldd_list "$BUILD_DIR/programs/$prog" | sed 's/^/  /'
  done
  echo "stripped sizes (bytes):"
  for f in "$so" "$BUILD_DIR/programs/minimal_shared" "$BUILD_DIR/programs/minimal_static"; do
    local t="$BUILD_DIR/strip.tmp" mode=--strip-all
    case "$f" in *.so*) mode=--strip-unneeded ;; esac
    cp "$f" "$t" && "$STRIP" $mode "$t" && printf '  %-24s %9d\n' "$(basename "$f")" "$(stat -c %s "$t")"
    rm -f "$t"
  done
  [ "$BAD" = 0 ]
}

step configure configure
step build build
step install install
step link link
step check check
echo "--- firmware: total $((SECONDS - T0))s (${TRIPLET:-host})"

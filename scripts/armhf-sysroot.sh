#!/usr/bin/env bash
# Build a Debian bookworm armhf sysroot with mmdebstrap, cross-build mqtt-inbox
# against it with toolchains/arm-linux-gnueabihf.cmake, and (optionally) run
# the tests under qemu-arm -L <sysroot>.
#
#   scripts/armhf-sysroot.sh [--no-install] [--sysroot-only] [--no-tests]
#                            [--unit-only] [--all-integration] [--rebuild-sysroot] [--clean]
#
# Unlike scripts/cross-aarch64.sh this does not use multiarch (dpkg
# --add-architecture armhf): the armhf packages are unpacked into a separate
# directory, so nothing of the host's package set changes. The steps both share
# (configure, build, verify, tests under qemu) are in scripts/cross-lib.sh.
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
#   test       ctest under qemu-arm (unit tests, then the integration tests
#              labelled core; every one with --all-integration)
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

# shellcheck source=scripts/cross-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cross-lib.sh"

CROSS_NAME=armhf-sysroot
CROSS_ARCH=armhf
SYSROOT="${SYSROOT:-$ROOT/build-armhf-sysroot}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-armhf}"
TOOLCHAIN="$ROOT/toolchains/arm-linux-gnueabihf.cmake"
TRIPLET=arm-linux-gnueabihf
SUITE=bookworm
CROSS_ELF_GLOB='*32-bit LSB*ARM, EABI5*'
CROSS_OBJDUMP_FORMAT=elf32-littlearm
CROSS_QEMU=qemu-arm
CROSS_QEMU_ROOT="$SYSROOT"
CROSS_CMAKE_ARGS=(-DMQTT_INBOX_SYSROOT="$SYSROOT")

SYSROOT_ONLY=0 REBUILD=0
cross_arg() {
  case "$1" in
    --sysroot-only) SYSROOT_ONLY=1 ;;
    --rebuild-sysroot) REBUILD=1 ;;
    *) return 1 ;;
  esac
}
cross_parse_args "$0" "$@"

# Target packages unpacked into the sysroot. libc6-dev and libstdc++-12-dev
# are needed because, with --sysroot, the cross compiler takes the C library
# and the C++ headers from the sysroot; the header-only libraries are needed
# because the host's /usr/include is not searched either.
SYSROOT_PKGS=(libc6-dev libstdc++-12-dev libgcc-12-dev
              libsqlite3-dev libsqlitecpp-dev libpaho-mqttpp-dev libpaho-mqtt-dev
              libspdlog-dev libfmt-dev libgtest-dev libssl-dev
              nlohmann-json3-dev libcli11-dev)
HOST_PKGS=(mmdebstrap g++-arm-linux-gnueabihf qemu-user cmake make pkg-config file mosquitto)

deps() {
  local want=() p
  for p in "${HOST_PKGS[@]}"; do is_installed "$p" || want+=("$p"); done
  if [ ${#want[@]} -eq 0 ]; then echo "all packages present"; return; fi
  apt_install_missing "${want[@]}"
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

cross_before_build() {
  [ "$DO_INSTALL" = 1 ] && stage deps deps
  stage sysroot sysroot
  if [ "$SYSROOT_ONLY" = 1 ]; then summary; exit 0; fi
}

# Every library on a link line must come from the sysroot.
verify_linked_lib() {
  case "$1" in
    "$SYSROOT"/*) echo "  linked: ${1#"$SYSROOT"}  (sysroot)" ;;
    *) echo "NOT from the sysroot: $1" >&2; VERIFY_BAD=1 ;;
  esac
}
verify_extra() { :; }

cross_main

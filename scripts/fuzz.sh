#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded time on a copy of
# its seed corpus (tests/fuzz/corpus/<target>). A crash fails the run and leaves the
# input in $FUZZ_ARTIFACTS; add it to the corpus folder so it becomes a regression test
# (tests/fuzz/CMakeLists.txt replays every corpus file in the ordinary build).
#
#   scripts/fuzz.sh               FUZZ_SECONDS (default 20) per target
#   scripts/fuzz.sh --build-only  builds them, runs nothing (scripts/test.sh builds them
#                                 in the background while other stages run)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/lib.sh"
SECONDS_PER_TARGET="${FUZZ_SECONDS:-20}"
BUILD="$ROOT/build-fuzz"
ARTIFACTS="${FUZZ_ARTIFACTS:-$BUILD/artifacts}"

BUILD_ONLY=0
[ "${1:-}" = "--build-only" ] && BUILD_ONLY=1
install_packages "${MQTT_INBOX_FUZZ_PACKAGES[@]}" "${MQTT_INBOX_PACKAGES[@]}"
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMQTT_INBOX_BUILD_FUZZERS=ON -DMQTT_INBOX_BUILD_TESTS=OFF -DMQTT_INBOX_BUILD_EXAMPLES=OFF \
  -DMQTT_INBOX_BUILD_TOOLS=OFF -DMQTT_INBOX_BUILD_BENCH=OFF \
  "-DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" >/dev/null
targets=(message_id properties_json ledger_decode)
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${targets[@]/#/fuzz_}"
[ "$BUILD_ONLY" = 1 ] && exit 0

mkdir -p "$ARTIFACTS"
for t in "${targets[@]}"; do
  work="$(mktemp -d)"
  echo "--- fuzz_$t for ${SECONDS_PER_TARGET}s"
  "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=1024 \
    -max_len=65536 -artifact_prefix="$ARTIFACTS/$t-" -print_final_stats=1 \
    "$work" "$ROOT/tests/fuzz/corpus/$t" 2>&1 | grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|ERROR|SUMMARY" || true
  rc=${PIPESTATUS[0]}
  rm -rf "$work"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz_$t found a crash; inputs in $ARTIFACTS" >&2
    exit 1
  fi
done

#!/usr/bin/env bash
# Footprint of mqtt-inbox (issue 7 part 5, issue 29): stripped sizes for x86-64 and
# aarch64, peak RSS of examples/ledger_consumer idle and while draining N queued messages,
# the measured effect of the knobs that shrink it, and the C++ and the C consumer
# (examples/c/ledger_consumer.c) side by side as VmRSS, RssAnon and Pss, with where the
# anonymous memory is. Prints the tables docs/packaging.md#footprint shows.
#
#   scripts/footprint.sh [--no-cross] [--no-build] [--only-sizes] [--only-c] [--firmware]
#
# --only-c: only the side-by-side table of the C++ and C consumers (and an idle mosquitto).
# --firmware: only the idle memory of docs/c-api.md's minimal C program (examples/c/
#   minimal.c) on the firmware build (scripts/firmware.sh into $FIRMWARE_BUILD, made if
#   missing), linked shared and static, each on a new and on an existing database: VmRSS,
#   RssAnon and Pss, where the RssAnon is (per library, heap, thread arenas, stacks), and an
#   idle mosquitto's beside them. The figures of docs/packaging.md#footprint.
#
# Builds (own folders, -j$JOBS, tests/bench/tools off):
#   $BUILD_PREFIX-x86     RelWithDebInfo (the default build type)  -> installed to $WORK/prefix
#   $BUILD_PREFIX-x86-os  MinSizeRel (-Os)
#   $BUILD_PREFIX-arm     RelWithDebInfo, toolchains/aarch64-linux-gnu.cmake   (unless --no-cross)
#   $BUILD_PREFIX-arm-os  MinSizeRel, aarch64                                   (unless --no-cross)
#   $WORK/knobs           a private copy of ledger_consumer.cpp, built against $WORK/prefix
#                         with find_package(mqtt_inbox), that reads two extra knobs from
#                         the environment: FP_CACHE_KIB (InboxOptions::cache_size_kib)
#                         and FP_MMAP_SIZE (PRAGMA mmap_size, not exposed by the library);
#                         linked once static (mqtt_inbox::mqtt_inbox) and once shared
#                         (mqtt_inbox::mqtt_inbox_shared).
# RSS runs: a private mosquitto on a free 127.0.0.1 port (persistence true,
# max_queued_messages 0, user root). For each configuration: start the consumer once
# (creates the persistent session; its VmHWM after IDLE_S seconds is the idle figure),
# stop it, publish N credits with examples/publisher while it is offline, start it again
# and read VmHWM from /proc/<pid>/status once all N ledger rows are committed.
#
# Environment: N (20000), JOBS (2), IDLE_S (5), WORK (/tmp/mqtt-inbox-footprint),
#              BUILD_PREFIX (<repo>/build-footprint), FIRMWARE_BUILD (<repo>/build-firmware),
#              RUNS (3: --firmware takes each figure's median of that many runs)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib.sh
. "$ROOT/scripts/lib.sh"
N="${N:-20000}"
JOBS="${JOBS:-2}"
IDLE_S="${IDLE_S:-5}"
WORK="${WORK:-/tmp/mqtt-inbox-footprint}"
BUILD_PREFIX="${BUILD_PREFIX:-$ROOT/build-footprint}"
DO_CROSS=1 DO_BUILD=1 DO_RSS=1 ONLY_C=0 FIRMWARE=0
for arg in "$@"; do
  case "$arg" in
    --no-cross) DO_CROSS=0 ;;
    --no-build) DO_BUILD=0 ;;
    --only-sizes) DO_RSS=0 ;;
    --only-c) ONLY_C=1 ;;
    --firmware) FIRMWARE=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done
mkdir -p "$WORK"

# A firmware build: without the PostgreSQL store (the default of a cross build; on a host
# build it links libpqxx and libpq, which bring GnuTLS, Kerberos and LDAP into every
# program: docs/packaging.md#footprint measures what that costs).
COMMON_ARGS=(-G Ninja -DMQTT_INBOX_BUILD_TESTS=OFF -DMQTT_INBOX_BUILD_BENCH=OFF
             -DMQTT_INBOX_BUILD_TOOLS=OFF -DMQTT_INBOX_BUILD_EXAMPLES=ON
             -DMQTT_INBOX_INSTALL=ON -DMQTT_INBOX_WITH_POSTGRES=OFF)
build() {  # build DIR BUILD_TYPE [cmake args...]
  local dir="$1" type="$2"; shift 2
  cmake -S "$ROOT" -B "$dir" "${COMMON_ARGS[@]}" -DCMAKE_BUILD_TYPE="$type" "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS" --target mqtt_inbox_core mqtt_inbox mqtt_inbox_core_shared \
    mqtt_inbox_shared ledger_consumer publisher c_ledger_consumer
}

if [ "$ONLY_C" = 1 ]; then DO_CROSS=0; fi
if [ "$FIRMWARE" = 1 ]; then DO_CROSS=0 DO_BUILD=0 ONLY_C=1; fi
if [ "$DO_BUILD" = 1 ]; then
  build "$BUILD_PREFIX-x86" RelWithDebInfo
  rm -rf "$WORK/prefix" && cmake --install "$BUILD_PREFIX-x86" --prefix "$WORK/prefix" >/dev/null
  [ "$ONLY_C" = 1 ] || build "$BUILD_PREFIX-x86-os" MinSizeRel
  if [ "$DO_CROSS" = 1 ]; then
    build "$BUILD_PREFIX-arm" RelWithDebInfo -DCMAKE_TOOLCHAIN_FILE="$ROOT/toolchains/aarch64-linux-gnu.cmake"
    build "$BUILD_PREFIX-arm-os" MinSizeRel -DCMAKE_TOOLCHAIN_FILE="$ROOT/toolchains/aarch64-linux-gnu.cmake"
  fi
fi

# --------------------------------------------------------------------- sizes --
# .a: strip --strip-debug (a fully stripped archive cannot be linked);
# .so: strip --strip-unneeded; executables: strip --strip-all.
stripped() {  # stripped STRIP FILE -> bytes
  local s="$1" f="$2" t="$WORK/strip.tmp" mode=--strip-all
  [ -f "$f" ] || { echo "-"; return 0; }
  case "$f" in *.a) mode=--strip-debug ;; *.so*) mode=--strip-unneeded ;; esac
  cp "$f" "$t" && "$s" $mode "$t" && stat -c %s "$t" && rm -f "$t"
}
size_row() {  # size_row LABEL STRIP DIR
  local label="$1" s="$2" d="$3"
  [ -d "$d" ] || return 0
  printf '| %-24s | %9s | %9s | %9s | %9s | %10s | %10s |\n' "$label" \
    "$(stripped "$s" "$d/libmqtt_inbox_core.a")" "$(stripped "$s" "$d/libmqtt_inbox.a")" \
    "$(stripped "$s" "$(readlink -f "$d/libmqtt_inbox_core.so")")" \
    "$(stripped "$s" "$(readlink -f "$d/libmqtt_inbox.so")")" \
    "$(stripped "$s" "$d/examples/ledger_consumer")" "$(stripped "$s" "$d/examples/c_ledger_consumer")"
}
if [ "$FIRMWARE" = 0 ]; then
echo
echo "Stripped sizes, bytes (ledger_consumer links libmqtt_inbox*.a and SQLiteCpp statically,"
echo "the Debian shared libraries sqlite3, paho, spdlog, fmt, libstdc++ dynamically)"
echo
echo "| build                    | core .a   | mqtt .a   | core .so  | mqtt .so  | ledger_consumer | c_ledger_consumer |"
echo "|---|---|---|---|---|---|---|"
size_row "x86-64 -O2 (RelWithDebInfo)" strip "$BUILD_PREFIX-x86"
size_row "x86-64 -Os (MinSizeRel)" strip "$BUILD_PREFIX-x86-os"
if [ "$DO_CROSS" = 1 ]; then
  size_row "aarch64 -O2 (RelWithDebInfo)" aarch64-linux-gnu-strip "$BUILD_PREFIX-arm"
  size_row "aarch64 -Os (MinSizeRel)" aarch64-linux-gnu-strip "$BUILD_PREFIX-arm-os"
fi
fi
[ "$DO_RSS" = 1 ] || exit 0

# ------------------------------------------------------------- knob variant --
if [ "$ONLY_C" = 0 ]; then
mkdir -p "$WORK/knobs"
sed -e 's|^  if (normal_sync) store.synchronous = mqtt_inbox::Synchronous::kNormal;|&\
  if (const char* e = std::getenv("FP_CACHE_KIB")) store.cache_size_kib = std::atoi(e);|' \
    -e 's|^  inbox->with_connection(\[\](SQLite::Database\& db) { ledger::create_tables(db); });|&\
  if (const char* e = std::getenv("FP_MMAP_SIZE"))\
    inbox->with_connection([e](SQLite::Database\& db) { db.exec(std::string("PRAGMA mmap_size = ") + e); });|' \
    -e 's|^#include <cstdio>|&\n#include <cstdlib>|' \
    "$ROOT/examples/ledger_consumer.cpp" > "$WORK/knobs/ledger_knobs.cpp"
grep -q FP_CACHE_KIB "$WORK/knobs/ledger_knobs.cpp" && grep -q FP_MMAP_SIZE "$WORK/knobs/ledger_knobs.cpp" \
  || { echo "footprint: could not patch ledger_consumer.cpp for the knobs" >&2; exit 1; }
cat > "$WORK/knobs/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(ledger_knobs CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(mqtt_inbox REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
foreach(v "" _shared)
  add_executable(ledger_knobs\${v} ledger_knobs.cpp)
  target_include_directories(ledger_knobs\${v} PRIVATE $ROOT/examples)
  target_link_libraries(ledger_knobs\${v} PRIVATE mqtt_inbox::mqtt_inbox\${v} CLI11::CLI11
    nlohmann_json::nlohmann_json)
endforeach()
EOF
cmake -S "$WORK/knobs" -B "$WORK/knobs/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$WORK/prefix" >/dev/null
cmake --build "$WORK/knobs/build" -j "$JOBS" >/dev/null
fi

# ------------------------------------------------------------------- broker --
BROKER_PID=""
start_broker() {  # start_broker [extra mosquitto.conf lines...]
  stop_broker
  PORT="$(free_port)"
  local dir="$WORK/broker-$PORT"
  rm -rf "$dir" && mkdir -p "$dir"
  write_mosquitto_conf "$PORT" "$dir"
  for line in "$@"; do echo "$line" >> "$dir/mosquitto.conf"; done
  /usr/sbin/mosquitto -c "$dir/mosquitto.conf" &
  BROKER_PID=$!
  for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
  BROKER="tcp://127.0.0.1:$PORT"
}
stop_broker() {
  if [ -n "$BROKER_PID" ]; then kill "$BROKER_PID" 2>/dev/null || true; wait "$BROKER_PID" 2>/dev/null || true; fi
  BROKER_PID=""
}
CONSUMER_PID=""
cleanup() {
  [ -n "$CONSUMER_PID" ] && kill "$CONSUMER_PID" 2>/dev/null || true
  stop_broker
}
trap cleanup EXIT

hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }
stop_consumer() {
  kill -TERM "$CONSUMER_PID" 2>/dev/null || true
  wait "$CONSUMER_PID" 2>/dev/null || true
  CONSUMER_PID=""
}

# measure LABEL BINARY [VAR=value...]: one idle + one drain run; prints a table row.
measure() {
  local label="$1" bin="$2"; shift 2
  local tag; tag="$(echo "$label" | tr -c 'A-Za-z0-9\n' '_')"
  local db="$WORK/$tag.db" cid="fp-$tag-$RANDOM" topic="credits/$tag"
  rm -f "$db" "$db-wal" "$db-shm"
  local args=(--broker "$BROKER" --client-id "$cid" --topic "$topic" --db "$db" --log-level warn)
  # 1. idle: connected, subscribed, nothing to do
  env "$@" "$bin" "${args[@]}" >/dev/null 2>"$WORK/$tag.idle.err" &
  CONSUMER_PID=$!
  sleep "$IDLE_S"
  local idle; idle="$(hwm_kib "$CONSUMER_PID")"
  stop_consumer
  # 2. queue N while the consumer is offline
  "$BUILD_PREFIX-x86/examples/publisher" --broker "$BROKER" --topic "$topic" --count "$N" \
    --duplicates 0 --id-prefix "$tag" --client-id "pub-$cid" --window 200 >"$WORK/$tag.pub" 2>&1
  # 3. drain
  local t0; t0="$(date +%s.%N)"
  env "$@" "$bin" "${args[@]}" >"$WORK/$tag.out" 2>"$WORK/$tag.err" &
  CONSUMER_PID=$!
  local rows=0 hwm=0 deadline=$((SECONDS + 600))
  while [ "$rows" -lt "$N" ] && [ $SECONDS -lt $deadline ]; do
    sleep 0.5
    hwm="$(hwm_kib "$CONSUMER_PID")"
    rows="$(sqlite3 "$db" "SELECT count(*) FROM ledger_entries" 2>/dev/null || echo 0)"
  done
  local t1; t1="$(date +%s.%N)"
  hwm="$(hwm_kib "$CONSUMER_PID")"
  stop_consumer
  local db_kib; db_kib=$(( $(stat -c %s "$db") / 1024 ))
  printf '| %-40s | %8s | %8s | %7s | %6.1f | %9s |\n' "$label" "$idle" "$hwm" "$rows" \
    "$(echo "$t1 - $t0" | bc)" "$db_kib"
}

if [ "$ONLY_C" = 0 ]; then
echo
echo "Peak RSS (VmHWM, KiB) of ledger_consumer, x86-64, N=$N credits queued while offline"
echo
echo "| configuration                            | idle KiB | drain KiB | rows    | drain s | db KiB    |"
echo "|---|---|---|---|---|---|"
start_broker
KN="$WORK/knobs/build"
measure "baseline (defaults, static libmqtt_inbox)" "$BUILD_PREFIX-x86/examples/ledger_consumer"
measure "libmqtt_inbox shared" "$KN/ledger_knobs_shared"
measure "cache_size_kib=256" "$KN/ledger_knobs" FP_CACHE_KIB=256
measure "cache_size_kib=8192" "$KN/ledger_knobs" FP_CACHE_KIB=8192
measure "PRAGMA mmap_size=64 MiB (private)" "$KN/ledger_knobs" FP_MMAP_SIZE=67108864
measure "-Os (MinSizeRel)" "$BUILD_PREFIX-x86-os/examples/ledger_consumer"
start_broker "max_inflight_messages 1000"
measure "broker max_inflight_messages 1000" "$BUILD_PREFIX-x86/examples/ledger_consumer"
stop_broker
fi

# ------------------------------------------------- C++ and C side by side --
# VmRSS counts every resident page, most of them shared library code that other
# processes share too; RssAnon is what this process alone made (heap, stacks, the
# libraries' written data); Pss shares each shared page among the processes mapping it.
status_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
pss_kib() { awk '$1 == "Pss:" {print $2}' "/proc/$1/smaps_rollup"; }
# anon_breakdown PID: where RssAnon is, KiB per kind of mapping (from /proc/PID/smaps).
# A glibc malloc arena of a thread is a 64 MiB-aligned anonymous mapping (HEAP_MAX_SIZE
# on 64-bit); a thread stack is an anonymous 8 MiB mapping (RLIMIT_STACK); an unnamed
# mapping right after a library's is that library's .bss.
anon_breakdown() {
  local line start end name kind lastfile_end=-1 f1 f2
  declare -A kib=()
  while read -r f1 f2 _ _ _ name; do
    if [[ "$f1" =~ ^([0-9a-f]+)-([0-9a-f]+)$ ]]; then
      start=$((16#${BASH_REMATCH[1]})); end=$((16#${BASH_REMATCH[2]}))
      if [ "$name" = "[heap]" ]; then kind="main heap (brk)"
      elif [ "$name" = "[stack]" ]; then kind="main thread stack"
      elif [[ "$name" == /* ]]; then kind="libraries: written data (relocations, .data)"
      elif [ -n "$name" ]; then kind="other $name"
      elif [ "$start" -eq "$lastfile_end" ]; then kind="libraries: .bss"
      elif [ $((start % 67108864)) -eq 0 ]; then kind="malloc arenas of threads"
      elif [ $((end - start)) -eq 8388608 ] || [ $((end - start)) -eq 8392704 ]; then kind="thread stacks"
      else kind="other anonymous mmap (large allocations)"
      fi
      if [[ "$name" == /* ]]; then lastfile_end=$end; else lastfile_end=-1; fi
    elif [ "$f1" = "Anonymous:" ]; then
      kib[$kind]=$(( ${kib[$kind]:-0} + f2 ))
    fi
  done < "/proc/$1/smaps"
  for kind in "${!kib[@]}"; do
    if [ "${kib[$kind]}" -gt 0 ]; then printf '  %-48s %6d KiB\n' "$kind" "${kib[$kind]}"; fi
  done | sort -k1,1
}

# ----------------------------------------------------------------- firmware --
# The minimal C program of docs/c-api.md on the firmware build, idle, linked shared and
# static, on a new and then on the same (existing) database.
if [ "$FIRMWARE" = 1 ]; then
  FW="${FIRMWARE_BUILD:-$ROOT/build-firmware}"
  RUNS="${RUNS:-3}"
  if [ ! -x "$FW/programs/minimal_static" ]; then "$ROOT/scripts/firmware.sh" "$FW"; fi
  # by_library PID: where RssAnon is, per file mapping (written data of each library) and
  # per kind of anonymous mapping (anon_breakdown's kinds), largest first.
  by_library() {
    local start end name kind lastfile_end=-1 f1 f2
    declare -A kib=()
    while read -r f1 f2 _ _ _ name; do
      if [[ "$f1" =~ ^([0-9a-f]+)-([0-9a-f]+)$ ]]; then
        start=$((16#${BASH_REMATCH[1]})); end=$((16#${BASH_REMATCH[2]}))
        if [ "$name" = "[heap]" ]; then kind="main heap (brk)"
        elif [ "$name" = "[stack]" ]; then kind="main thread stack"
        elif [[ "$name" == /* ]]; then kind="written data of ${name##*/}"
        elif [ -n "$name" ]; then kind="other $name"
        elif [ "$start" -eq "$lastfile_end" ]; then kind="libraries: .bss"
        elif [ $((start % 67108864)) -eq 0 ]; then kind="malloc arenas of threads"
        elif [ $((end - start)) -eq 8388608 ] || [ $((end - start)) -eq 8392704 ]; then kind="thread stacks"
        else kind="other anonymous mmap (large allocations)"
        fi
        if [[ "$name" == /* ]]; then lastfile_end=$end; else lastfile_end=-1; fi
      elif [ "$f1" = "Anonymous:" ]; then
        kib[$kind]=$(( ${kib[$kind]:-0} + f2 ))
      fi
    done < "/proc/$1/smaps"
    for kind in "${!kib[@]}"; do
      if [ "${kib[$kind]}" -gt 0 ]; then printf '%6d KiB  %s\n' "${kib[$kind]}" "$kind"; fi
    done | sort -rn
  }
  median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  # idle_once PROGRAM DB: one idle run; prints "vmrss rssanon pss", keeps the breakdown.
  idle_once() {
    local prog="$1" db="$2" tag pid
    tag="$(basename "$prog")_$(basename "$db" .db)"
    "$prog" "$BROKER" "$db" "fp-$tag-$RANDOM" >/dev/null 2>"$WORK/$tag.err" &
    pid=$!
    sleep "$IDLE_S"
    echo "$(status_kib "$pid" VmRSS) $(status_kib "$pid" RssAnon) $(pss_kib "$pid")"
    by_library "$pid" > "$WORK/$tag.anon"
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  }
  start_broker
  echo
  echo "docs/c-api.md's minimal program on the firmware build ($FW), idle ${IDLE_S} s,"
  echo "connected and subscribed; KiB, the median of $RUNS runs"
  echo
  echo "| program | database | VmRSS | RssAnon | Pss |"
  echo "|---|---|---:|---:|---:|"
  for prog in minimal_shared minimal_static; do
    for which in new existing; do
      : > "$WORK/runs"
      for _ in $(seq 1 "$RUNS"); do
        db="$WORK/fw-$prog.db"
        if [ "$which" = new ]; then rm -f "$db" "$db-wal" "$db-shm" "$db.lock"; fi
        [ "$which" = existing ] && [ ! -f "$db" ] && idle_once "$FW/programs/$prog" "$db" >/dev/null
        idle_once "$FW/programs/$prog" "$db" >> "$WORK/runs"
      done
      printf '| %s | %s | %s | %s | %s |\n' "$prog" "$which" \
        "$(awk '{print $1}' "$WORK/runs" | median)" "$(awk '{print $2}' "$WORK/runs" | median)" \
        "$(awk '{print $3}' "$WORK/runs" | median)"
      cp "$WORK/${prog}_fw-$prog.anon" "$WORK/fw-$prog-$which.anon"
    done
  done
  printf '| %s | | %s | %s | %s |\n' "mosquitto 2.0 (the broker), idle" \
    "$(status_kib "$BROKER_PID" VmRSS)" "$(status_kib "$BROKER_PID" RssAnon)" "$(pss_kib "$BROKER_PID")"
  stop_broker
  for f in "$WORK"/fw-minimal_*-*.anon; do
    echo
    echo "Idle RssAnon of $(basename "$f" .anon | sed 's/^fw-//') (the last run), by mapping:"
    cat "$f"
  done
  exit 0
fi

# measure_mem LABEL BINARY [VAR=value...]: idle and drain, VmRSS / RssAnon / Pss.
measure_mem() {
  local label="$1" bin="$2"; shift 2
  local tag; tag="mem_$(echo "$label" | tr -c 'A-Za-z0-9\n' '_')"
  local db="$WORK/$tag.db" cid="fp-$tag-$RANDOM" topic="credits/$tag"
  rm -f "$db" "$db-wal" "$db-shm" "$db.lock"
  local args=(--broker "$BROKER" --client-id "$cid" --topic "$topic" --db "$db")
  case "$(basename "$bin")" in c_*) ;; *) args+=(--log-level warn) ;; esac
  env "$@" "$bin" "${args[@]}" >/dev/null 2>"$WORK/$tag.idle.err" &
  CONSUMER_PID=$!
  sleep "$IDLE_S"
  local pid=$CONSUMER_PID
  local i_rss i_anon i_pss
  i_rss="$(status_kib "$pid" VmRSS)"; i_anon="$(status_kib "$pid" RssAnon)"; i_pss="$(pss_kib "$pid")"
  anon_breakdown "$pid" > "$WORK/$tag.anon"
  stop_consumer
  "$BUILD_PREFIX-x86/examples/publisher" --broker "$BROKER" --topic "$topic" --count "$N" \
    --duplicates 0 --id-prefix "$tag" --client-id "pub-$cid" --window 200 >"$WORK/$tag.pub" 2>&1
  env "$@" "$bin" "${args[@]}" >"$WORK/$tag.out" 2>"$WORK/$tag.err" &
  CONSUMER_PID=$!
  local rows=0 anon=0 pss=0 a p deadline=$((SECONDS + 600))
  while [ "$rows" -lt "$N" ] && [ $SECONDS -lt $deadline ]; do
    sleep 0.5
    a="$(status_kib "$CONSUMER_PID" RssAnon)"; if [ "${a:-0}" -gt "$anon" ]; then anon=$a; fi
    p="$(pss_kib "$CONSUMER_PID")"; if [ "${p:-0}" -gt "$pss" ]; then pss=$p; fi
    rows="$(sqlite3 "$db" "SELECT count(*) FROM ledger_entries" 2>/dev/null || echo 0)"
  done
  local hwm; hwm="$(status_kib "$CONSUMER_PID" VmHWM)"
  stop_consumer
  printf '| %-34s | %7s | %7s | %7s | %8s | %8s | %8s | %6s |\n' "$label" "$i_rss" "$i_anon" \
    "$i_pss" "$hwm" "$anon" "$pss" "$rows"
}

echo
echo "The C++ and the C consumer side by side, x86-64 RelWithDebInfo, KiB. Idle after"
echo "${IDLE_S} s; drain: N=$N credits queued while offline (VmHWM, and the highest RssAnon"
echo "and Pss seen, sampled every 0.5 s)."
echo
echo "| program                            | idle VmRSS | idle RssAnon | idle Pss | drain VmHWM | drain RssAnon | drain Pss | rows |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
start_broker
measure_mem "ledger_consumer (C++)" "$BUILD_PREFIX-x86/examples/ledger_consumer"
measure_mem "c_ledger_consumer (C)" "$BUILD_PREFIX-x86/examples/c_ledger_consumer"
measure_mem "c_ledger_consumer, arena_max=1" "$BUILD_PREFIX-x86/examples/c_ledger_consumer" \
  GLIBC_TUNABLES=glibc.malloc.arena_max=1
printf '| %-34s | %7s | %7s | %7s | %8s | %8s | %8s | %6s |\n' "mosquitto (the broker, idle)" \
  "$(status_kib "$BROKER_PID" VmRSS)" "$(status_kib "$BROKER_PID" RssAnon)" "$(pss_kib "$BROKER_PID")" \
  "" "" "" ""
stop_broker
for f in "$WORK"/mem_*.anon; do
  echo
  echo "Idle RssAnon of $(basename "$f" .anon | sed 's/^mem_//'), by mapping:"
  cat "$f"
done

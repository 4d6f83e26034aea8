#!/usr/bin/env bash
# Runs the mqtt-inbox benchmarks (issue 8; results explained in docs/benchmarks.md).
#
#   scripts/bench.sh [--quick] [--n N] [--rounds R] [--prefill M] [--skip-scale]
#                    [--skip-micro] [--dir DIR] [--out FILE]
#
# Installs missing Debian packages (as root or with sudo), builds bench/ in Release into
# build-bench, starts its own mosquitto on a free 127.0.0.1 port (persistence on,
# max_queued_messages 0: nothing is dropped), runs every measurement interleaved so that
# drift hits all of them alike, prints the ratios, and stops everything it started.
# Every result is one JSON object per line, collected in --out
# (default build-bench/bench-results.jsonl).
#
# The databases go to --dir (default build-bench/run, i.e. the repository's file system,
# never tmpfs: an fsync on tmpfs costs nothing and would void the FULL numbers).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-bench}
N=20000            # messages per throughput run (drain and live)
ROUNDS=1           # interleaved rounds of the throughput block
LAT_COUNT=3000     # messages of each latency run at 200 msg/s (15 s)
PREFILL=10000000   # retained ids for the scale test
SCALE_N=3000       # messages of each FULL scale run
WEAR_N=2000        # messages of each flash-wear run (FULL)
SKIP_SCALE=0
SKIP_MICRO=0
DIR=""
OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) N=2000; LAT_COUNT=1000; PREFILL=1000000; SCALE_N=1000; WEAR_N=500; shift ;;
    --n) N=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --prefill) PREFILL=$2; shift 2 ;;
    --skip-scale) SKIP_SCALE=1; shift ;;
    --skip-micro) SKIP_MICRO=1; shift ;;
    --dir) DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
DIR=${DIR:-$BUILD/run}
OUT=${OUT:-$BUILD/bench-results.jsonl}

T_ALL=$SECONDS
T_STAGE=$SECONDS
stage() {  # prints how long the previous stage took, then the new stage's name
  local now=$SECONDS
  [[ -n ${STAGE_NAME:-} ]] && printf '    [stage %-28s %4d s]\n' "$STAGE_NAME" $((now - T_STAGE))
  STAGE_NAME=$1
  T_STAGE=$now
  [[ -n $1 ]] && echo "== $1"
  return 0
}

# --- processes we start, stopped on any exit ------------------------------------------
PIDS=()
WORK=""
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  [[ -n $WORK && -d $WORK ]] && rm -rf "$WORK"
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- packages ---------------------------------------------------------------------------
stage "packages"
PKGS=(build-essential cmake pkg-config libsqlite3-dev libsqlitecpp-dev libpaho-mqttpp-dev
      libpaho-mqtt-dev libspdlog-dev libssl-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev mosquitto)
MISSING=()
ARCH=$(dpkg --print-architecture)
installed() {  # multi-arch packages need the :arch qualifier when several are installed
  dpkg-query -W -f='${Status}' "$1:$ARCH" 2>/dev/null | grep -q "install ok installed" ||
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
for p in "${PKGS[@]}"; do
  installed "$p" || MISSING+=("$p")
done
if [[ ${#MISSING[@]} -gt 0 ]]; then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  echo "installing: ${MISSING[*]}"
  $SUDO apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${MISSING[@]}"
fi

# --- build --------------------------------------------------------------------------------
stage "build (Release, -j2)"
if grep -q 'add_subdirectory(bench)' "$ROOT/CMakeLists.txt"; then
  SRC=$ROOT
  BIN=$BUILD
  EXTRA=(-DMQTT_INBOX_BUILD_BENCH=ON -DMQTT_INBOX_BUILD_TESTS=OFF -DMQTT_INBOX_BUILD_EXAMPLES=OFF
         -DMQTT_INBOX_BUILD_TOOLS=OFF)
  BENCH_BIN=$BIN/bench
else
  # The top level does not add bench/ yet: build it through a small wrapper project.
  SRC=$BUILD/wrapper-src
  BIN=$BUILD/wrapper
  mkdir -p "$SRC"
  cat >"$SRC/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(mqtt_inbox_bench_wrapper LANGUAGES C CXX)
add_subdirectory("$ROOT" mqtt_inbox)
add_subdirectory("$ROOT/bench" bench)
EOF
  EXTRA=()
  BENCH_BIN=$BIN/bench
fi
cmake -S "$SRC" -B "$BIN" -DCMAKE_BUILD_TYPE=Release "${EXTRA[@]}" >/dev/null
cmake --build "$BIN" -j2 --target bench_raw_sqlite bench_publisher bench_consumer bench_core \
  bench_micro nodelay_preload >/dev/null

# --- broker -------------------------------------------------------------------------------
stage "broker"
mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/run.XXXXXX")
: >"$OUT"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
PORT=""
for _ in $(seq 1 50); do
  p=$((20000 + RANDOM % 40000))
  if port_free "$p"; then PORT=$p; break; fi
done
[[ -n $PORT ]] || { echo "no free port" >&2; exit 1; }
mkdir -p "$WORK/mosquitto"
{
  echo "listener $PORT 127.0.0.1"
  echo "allow_anonymous true"
  echo "persistence true"
  echo "persistence_location $WORK/mosquitto/"
  echo "max_queued_messages 0"
  echo "log_dest file $WORK/mosquitto/mosquitto.log"
  [[ $(id -u) -eq 0 ]] && echo "user root"
} >"$WORK/mosquitto.conf"
mosquitto -c "$WORK/mosquitto.conf" &
PIDS+=($!)
for _ in $(seq 1 100); do port_free "$PORT" || break; sleep 0.1; done
port_free "$PORT" && { echo "mosquitto did not start" >&2; cat "$WORK/mosquitto/mosquitto.log" >&2; exit 1; }
BROKER=tcp://127.0.0.1:$PORT
echo "mosquitto $(mosquitto -h 2>/dev/null | head -1 | awk '{print $3}') on $BROKER"

# --- helpers ------------------------------------------------------------------------------
RUN_ID=0
record() {  # keeps the JSON lines of a program's stdout, adding the round
  local line
  while IFS= read -r line; do
    [[ $line == \{* ]] || { echo "$line"; continue; }
    echo "${line%\}},\"round\":${ROUND:-0}}" >>"$OUT"
  done
}
jget() {  # jget FILTER FIELD: FIELD of the last JSON line in $OUT whose text holds FILTER
  grep -F -- "$1" "$OUT" | tail -1 | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}
javg() {  # javg FILTER FIELD: mean of FIELD over all lines holding FILTER
  grep -F -- "$1" "$OUT" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" |
    awk '{s+=$1; n++} END {if (n) printf "%.6g", s/n; else print "nan"}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "nan" }'; }

# consume MODE SYNC PHASE LABEL COUNT [RATE] [EXTRA...]
# drain: session made, COUNT published while offline, then the consumer drains them.
# live:  consumer connected first, then the publisher runs (at RATE, 0 = full speed).
consume() {
  local mode=$1 sync=$2 phase=$3 label=$4 count=$5 rate=${6:-0}
  shift 6 || shift $#
  local extra=("$@")
  RUN_ID=$((RUN_ID + 1))
  local cid="bench-$RUN_ID-$label" topic="bench/$RUN_ID/credits" db="$WORK/$label-$RUN_ID.db"
  local common=(--mode "$mode" --sync "$sync" --broker "$BROKER" --topic "$topic"
                --client-id "$cid" --db "$db" --count "$count" --label "$label")
  "$BENCH_BIN/bench_consumer" "${common[@]}" --phase setup
  if [[ $phase == drain ]]; then
    "$BENCH_BIN/bench_publisher" --broker "$BROKER" --topic "$topic" --count "$count" \
      --client-id "pub-$RUN_ID" --label "pub_$label" --seed "$RUN_ID" 2>&1 >/dev/null
    "$BENCH_BIN/bench_consumer" "${common[@]}" --phase run "${extra[@]}" | record
  else
    local ready="$WORK/ready-$RUN_ID"
    "${PRELOAD_ENV[@]}" "$BENCH_BIN/bench_consumer" "${common[@]}" --phase run \
      --ready-file "$ready" "${extra[@]}" >"$WORK/out-$RUN_ID" &
    local cpid=$!
    PIDS+=($cpid)
    for _ in $(seq 1 300); do [[ -e $ready ]] && break; sleep 0.05; done
    "${PRELOAD_ENV[@]}" "$BENCH_BIN/bench_publisher" --broker "$BROKER" --topic "$topic" \
      --count "$count" --rate "$rate" --client-id "pub-$RUN_ID" --label "pub_$label" \
      --seed "$RUN_ID" 2>&1 >/dev/null
    wait "$cpid"
    record <"$WORK/out-$RUN_ID"
  fi
  rm -f "$db" "$db-wal" "$db-shm"
}
PRELOAD_ENV=(env)

echo "N=$N rounds=$ROUNDS latency_count=$LAT_COUNT prefill=$PREFILL dir=$WORK out=$OUT"

# --- 1-4: throughput, interleaved ---------------------------------------------------------
for ROUND in $(seq 1 "$ROUNDS"); do
  stage "round $ROUND: raw FULL"
  "$BENCH_BIN/bench_raw_sqlite" --db "$WORK/raw.db" --sync full --count "$N" --label raw_full | record
  stage "round $ROUND: ceiling drain+live"
  consume ceiling full drain ceiling_drain "$N" 0
  consume ceiling full live ceiling_live "$N" 0
  stage "round $ROUND: inbox FULL drain"
  consume inbox full drain inbox_full_drain "$N" 0
  stage "round $ROUND: inbox FULL live"
  consume inbox full live inbox_full_live "$N" 0
  stage "round $ROUND: raw NORMAL"
  "$BENCH_BIN/bench_raw_sqlite" --db "$WORK/raw.db" --sync normal --count "$N" --label raw_normal | record
  stage "round $ROUND: inbox NORMAL drain+live"
  consume inbox normal drain inbox_normal_drain "$N" 0
  consume inbox normal live inbox_normal_live "$N" 0
done
ROUND=0

# --- 5: latency at a paced 200 msg/s ------------------------------------------------------
stage "latency 200 msg/s"
consume ceiling full live lat_ceiling "$LAT_COUNT" 200 --latency
consume inbox full live lat_inbox_full "$LAT_COUNT" 200 --latency
consume inbox normal live lat_inbox_normal "$LAT_COUNT" 200 --latency
PRELOAD_ENV=(env "LD_PRELOAD=$BENCH_BIN/libnodelay_preload.so")
consume ceiling full live lat_ceiling_nodelay "$LAT_COUNT" 200 --latency
consume inbox normal live lat_inbox_normal_nodelay "$LAT_COUNT" 200 --latency
PRELOAD_ENV=(env)

# --- 6: scale -----------------------------------------------------------------------------
if [[ $SKIP_SCALE -eq 0 ]]; then
  stage "scale: prefill $PREFILL ids"
  "$BENCH_BIN/bench_core" --db "$WORK/scale.db" --prefill "$PREFILL" --keep --sync normal \
    --count 10 --label prefill >/dev/null
  stage "scale: empty vs $PREFILL (interleaved)"
  for r in 1 2; do
    "$BENCH_BIN/bench_core" --db "$WORK/empty.db" --sync full --count "$SCALE_N" --label scale_empty_full | record
    "$BENCH_BIN/bench_core" --db "$WORK/scale.db" --prefill "$PREFILL" --reuse --keep --sync full \
      --count "$SCALE_N" --label scale_big_full | record
    "$BENCH_BIN/bench_core" --db "$WORK/empty.db" --sync normal --count "$N" --label scale_empty_normal | record
    "$BENCH_BIN/bench_core" --db "$WORK/scale.db" --prefill "$PREFILL" --reuse --keep --sync normal \
      --count "$N" --label scale_big_normal | record
  done
  rm -f "$WORK"/scale.db*
fi

# --- 7: flash wear (FULL) -----------------------------------------------------------------
stage "flash wear levers (FULL)"
W=(--sync full --count "$WEAR_N")
"$BENCH_BIN/bench_raw_sqlite" --db "$WORK/w.db" "${W[@]}" --label wear_raw_min | record
"$BENCH_BIN/bench_raw_sqlite" --db "$WORK/w.db" "${W[@]}" --rowid 1 --label wear_raw_rowid | record
"$BENCH_BIN/bench_raw_sqlite" --db "$WORK/w.db" "${W[@]}" --id blob16 --label wear_raw_blob16 | record
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --label wear_core_default | record
for ps in 1024 2048 8192; do
  "$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --page-size "$ps" --label "wear_core_page$ps" | record
done
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --id seq --label wear_core_seqid | record
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --no-metadata --label wear_core_nometa | record
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --autocheckpoint 100 --label wear_core_ckpt100 | record
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --autocheckpoint 10000 --label wear_core_ckpt10000 | record
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --page-size 1024 --no-metadata \
  --label wear_core_page1024_nometa | record

# --- 8: micro-benchmarks ------------------------------------------------------------------
if [[ $SKIP_MICRO -eq 0 ]]; then
  stage "micro-benchmarks"
  (cd "$WORK" && TMPDIR=$WORK "$BENCH_BIN/bench_micro" --benchmark_min_time=0.3 --benchmark_color=false) | record
fi
stage ""

# --- summary ------------------------------------------------------------------------------
RAW_F=$(javg '"label":"raw_full"' msgs_per_s)
RAW_N=$(javg '"label":"raw_normal"' msgs_per_s)
CEIL_D=$(javg '"label":"ceiling_drain"' msgs_per_s)
CEIL_L=$(javg '"label":"ceiling_live"' msgs_per_s)
IF_D=$(javg '"label":"inbox_full_drain"' msgs_per_s)
IF_L=$(javg '"label":"inbox_full_live"' msgs_per_s)
IN_D=$(javg '"label":"inbox_normal_drain"' msgs_per_s)
IN_L=$(javg '"label":"inbox_normal_live"' msgs_per_s)
echo
echo "== throughput (msg/s, mean of $ROUNDS round(s), N=$N)"
printf '  %-22s %10.0f\n' "raw SQLite FULL" "$RAW_F" "raw SQLite NORMAL" "$RAW_N" \
  "ceiling drain" "$CEIL_D" "ceiling live" "$CEIL_L" "inbox FULL drain" "$IF_D" \
  "inbox FULL live" "$IF_L" "inbox NORMAL drain" "$IN_D" "inbox NORMAL live" "$IN_L"
echo "== ratios"
echo "  inbox FULL / raw FULL      drain $(ratio "$IF_D" "$RAW_F")  live $(ratio "$IF_L" "$RAW_F")  (goal >= 0.9)"
echo "  inbox NORMAL / raw NORMAL  drain $(ratio "$IN_D" "$RAW_N")  live $(ratio "$IN_L" "$RAW_N")"
echo "  inbox FULL / ceiling       drain $(ratio "$IF_D" "$CEIL_D")  live $(ratio "$IF_L" "$CEIL_L")"
echo "  inbox NORMAL / ceiling     drain $(ratio "$IN_D" "$CEIL_D")  live $(ratio "$IN_L" "$CEIL_L")"
echo "== latency at 200 msg/s (ms): p50 / p99 / max"
for l in lat_ceiling lat_ceiling_nodelay lat_inbox_full lat_inbox_normal lat_inbox_normal_nodelay; do
  printf '  %-26s total %6s / %6s / %7s   transport %6s / %6s   claim %6s / %6s\n' "$l" \
    "$(jget "\"label\":\"$l\"" latency_p50_ms)" "$(jget "\"label\":\"$l\"" latency_p99_ms)" \
    "$(jget "\"label\":\"$l\"" latency_max_ms)" "$(jget "\"label\":\"$l\"" transport_p50_ms)" \
    "$(jget "\"label\":\"$l\"" transport_p99_ms)" "$(jget "\"label\":\"$l\"" claim_p50_ms)" \
    "$(jget "\"label\":\"$l\"" claim_p99_ms)"
done
if [[ $SKIP_SCALE -eq 0 ]]; then
  SE_F=$(javg '"label":"scale_empty_full"' msgs_per_s); SB_F=$(javg '"label":"scale_big_full"' msgs_per_s)
  SE_N=$(javg '"label":"scale_empty_normal"' msgs_per_s); SB_N=$(javg '"label":"scale_big_normal"' msgs_per_s)
  echo "== scale ($PREFILL retained ids vs empty, Consumer::handle)"
  echo "  FULL   empty $(printf %.0f "$SE_F")  retained $(printf %.0f "$SB_F")  ratio $(ratio "$SB_F" "$SE_F")  (goal >= 0.9)"
  echo "  NORMAL empty $(printf %.0f "$SE_N")  retained $(printf %.0f "$SB_N")  ratio $(ratio "$SB_N" "$SE_N")"
fi
echo "== flash wear per message (FULL): write_bytes / WAL bytes / WAL frames / db bytes / fsyncs"
grep -F '"label":"wear_' "$OUT" | while IFS= read -r line; do
  l=$(sed -n 's/.*"label":"\([^"]*\)".*/\1/p' <<<"$line")
  printf '  %-26s %8.0f %8.0f %6.2f %7.0f %5.2f\n' "$l" \
    "$(jget "\"label\":\"$l\"" proc_write_bytes_per_msg)" "$(jget "\"label\":\"$l\"" vfs_wal_bytes_per_msg)" \
    "$(jget "\"label\":\"$l\"" vfs_wal_frames_per_msg)" "$(jget "\"label\":\"$l\"" vfs_db_bytes_per_msg)" \
    "$(jget "\"label\":\"$l\"" wal_syncs_per_msg)"
done
echo "total $((SECONDS - T_ALL)) s; results in $OUT"

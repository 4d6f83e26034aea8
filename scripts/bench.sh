#!/usr/bin/env bash
# Runs the mqtt-inbox benchmarks (issues 8 and 14; results explained in docs/benchmarks.md).
#
#   scripts/bench.sh [--quick] [--n N] [--rounds R] [--prefill M] [--skip-scale]
#                    [--skip-micro] [--skip-extra] [--sync full|normal] [--dir DIR]
#                    [--out FILE] [--relay-only] [--relay-rounds R]
#                    [--pg | --skip-pg | --pg-only] [--pg-sync on|off]
#                    [--fleet | --fleet-only] [--fleet-members "1 2 4"] [--fleet-slots K]
#                    [--fleet-accounts A]
#
# --pg (the default) also runs the PostgreSQL comparison (issue 30): the library on
# PostgreSQL, the minimal raw libpqxx transaction and a hand-written Paho + libpqxx consumer,
# N credits each, in interleaved rounds, against a private PostgreSQL 15 cluster the script
# starts (as the `postgres` user when run as root; socket in a temporary folder, no TCP;
# data folder under --dir; fsync = on, synchronous_commit = on). --skip-pg leaves it out;
# --pg-only runs it alone (e.g. scripts/bench.sh --pg-only --n 5000 --rounds 4).
# --pg-sync off starts the cluster with synchronous_commit = off instead: a diagnostic
# (COMMIT no longer waits for its WAL flush, so what is left is the round trips and the
# work of each consumer), never the reference.
#
# --fleet adds the fleet's throughput (issue 31) to the PostgreSQL rounds: 1, 2 and 4
# bench_fleet_consumer processes (--fleet-members; each a Fleet member with the library's
# defaults and bench_pg_consumer's handler) on one group of --fleet-slots client-id slots
# (default 8) draining one backlog of N credits on the shared subscription. The members
# join and settle first (each serves its even share, connected); the backlog is then
# published while a lock on the ledger's accounts table holds every member's first
# transaction, and released at once: the fleet's rate runs from its first applied credit
# to its last (commit times on CLOCK_MONOTONIC, merged), start-up excluded. Every round is
# checked (N ledger entries, N distinct ids, N claims, the amounts' sum, every member's
# counters and clean stop); a round that fails gives no figure and is counted as failed.
# Every member must get a share: --fleet-members at most --fleet-slots.
# --fleet-only runs it alone, with, in the same rounds, the single consumers to put it
# beside: the PostgreSQL comparison's three and the SQLite library consumer (FULL)
# (e.g. scripts/bench.sh --fleet-only --n 3000 --rounds 4). Not in the default run.
# --fleet-accounts A: the fleet's credits go to A accounts (default 1000; 10, as the single
# consumers' credits, is a hot-row diagnostic: members crediting one account wait in turn).
#
# --relay-only runs the outbox relay's stage alone (ledger credits whose handler enqueues
# one event each, relayed: a steady 200 msg/s and a burst, woken by each commit and by the
# poll alone; WAL frames per credit and commit-to-PUBACK latency).
#
# Installs missing Debian packages (as root or with sudo), builds bench/ in Release into
# build-bench, starts its own mosquitto brokers on free 127.0.0.1 ports (persistence on,
# max_queued_messages 0: nothing is dropped; one with the default in-flight window of 20,
# one with 100), runs every measurement interleaved so that drift hits all of them alike,
# prints the comparison table (library vs hand-written consumer vs the Paho limit vs the
# minimal raw transaction, medians of R rounds) and the other figures, and stops everything
# it started.
# Every result is one JSON object per line, collected in --out
# (default build-bench/bench-results.jsonl).
#
# The databases go to --dir (default build-bench/run, i.e. the repository's file system,
# never tmpfs: an fsync on tmpfs costs nothing and would void the FULL numbers).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-bench}
N=20000            # messages per throughput run (drain and live)
ROUNDS=8           # interleaved rounds of the comparison (medians; a multiple of 4 runs each order alike)
LAT_COUNT=3000     # messages of each latency run at 200 msg/s (15 s)
PREFILL=10000000   # retained ids for the scale test
SCALE_N=3000       # messages of each FULL scale run
WEAR_N=2000        # messages of each flash-wear run (FULL)
SKIP_SCALE=0
SKIP_MICRO=0
SKIP_EXTRA=0       # live runs, latency, window sweep, the outbox relay
RELAY_ONLY=0       # the outbox relay's stage alone
RELAY_ROUNDS=2     # interleaved rounds of the relay's four runs (medians)
PG=1               # the PostgreSQL comparison (issue 30)
PG_ONLY=0          # ... alone
PG_SYNC=on         # its synchronous_commit (off: a diagnostic only)
FLEET=0            # the fleet's throughput (issue 31), in the PostgreSQL rounds
FLEET_ONLY=0       # ... alone, with the single consumers beside it
FLEET_MEMBERS="1 2 4"  # fleet sizes, processes
FLEET_SLOTS=8      # the group's client-id slots (4 members hold 2 each)
FLEET_LEASE_MS=2000  # the lease (only start-up and the stop depend on it)
FLEET_ACCOUNTS=1000  # accounts of the fleet's credits (with the single consumers' 10, members
                     # often credit one account at once and wait for each other's row lock)
SYNCS="full normal"  # synchronous modes of the comparison
DIR=""
OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) N=2000; ROUNDS=4; LAT_COUNT=600; PREFILL=1000000; SCALE_N=600; WEAR_N=400; shift ;;
    --relay-only) RELAY_ONLY=1; shift ;;
    --relay-rounds) RELAY_ROUNDS=$2; shift 2 ;;
    --pg) PG=1; shift ;;
    --skip-pg) PG=0; shift ;;
    --pg-only) PG=1; PG_ONLY=1; shift ;;
    --pg-sync) PG_SYNC=$2; shift 2 ;;
    --fleet) PG=1; FLEET=1; shift ;;
    --fleet-only) PG=1; PG_ONLY=1; FLEET=1; FLEET_ONLY=1; shift ;;
    --fleet-members) FLEET_MEMBERS=$2; shift 2 ;;
    --fleet-slots) FLEET_SLOTS=$2; shift 2 ;;
    --fleet-accounts) FLEET_ACCOUNTS=$2; shift 2 ;;
    --n) N=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --prefill) PREFILL=$2; shift 2 ;;
    --skip-scale) SKIP_SCALE=1; shift ;;
    --skip-micro) SKIP_MICRO=1; shift ;;
    --skip-extra) SKIP_EXTRA=1; shift ;;
    --sync) SYNCS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,53p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
DIR=${DIR:-$BUILD/run}
for w in $FLEET_MEMBERS; do
  [[ $w -ge 1 && $w -le $FLEET_SLOTS ]] ||
    { echo "--fleet-members: $w is not 1..--fleet-slots ($FLEET_SLOTS)" >&2; exit 2; }
done
if [[ $RELAY_ONLY -eq 1 ]]; then ROUNDS=0; SKIP_SCALE=1; SKIP_MICRO=1; SKIP_EXTRA=1; PG=0; fi
PG_ROUNDS=$ROUNDS  # the PostgreSQL comparison's rounds (--rounds)
if [[ $PG_ONLY -eq 1 ]]; then ROUNDS=0; SKIP_SCALE=1; SKIP_MICRO=1; SKIP_EXTRA=1; fi
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
PG_DATA=""  # the PostgreSQL cluster's data folder once started (section 1b)
PG_SOCK=""
PG_BIN=""
as_pg() {  # runs a PostgreSQL server program: initdb and postgres refuse to run as root
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  [[ -n ${PG_DATA:-} ]] && as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m immediate -w stop \
    >/dev/null 2>&1
  [[ -n ${PG_SOCK:-} && -d $PG_SOCK ]] && rm -rf "$PG_SOCK"
  [[ -n $WORK && -d $WORK ]] && rm -rf "$WORK"
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- packages ---------------------------------------------------------------------------
stage "packages"
PKGS=(build-essential cmake pkg-config libsqlite3-dev libsqlitecpp-dev libpaho-mqttpp-dev
      libpaho-mqtt-dev libspdlog-dev libssl-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev mosquitto)
[[ $PG -eq 1 ]] && PKGS+=(libpqxx-dev postgresql-15)
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
SRC=$ROOT
BIN=$BUILD
EXTRA=(-DMQTT_INBOX_BUILD_BENCH=ON -DMQTT_INBOX_BUILD_TESTS=OFF -DMQTT_INBOX_BUILD_EXAMPLES=OFF
       -DMQTT_INBOX_BUILD_TOOLS=OFF)
BENCH_BIN=$BIN/bench
cmake -S "$SRC" -B "$BIN" -DCMAKE_BUILD_TYPE=Release "${EXTRA[@]}" >/dev/null
TARGETS=(bench_publisher)
[[ $PG_ONLY -eq 0 ]] && TARGETS+=(bench_consumer bench_raw_sqlite bench_core bench_micro nodelay_preload
                                  handwritten_consumer)
[[ $PG -eq 1 ]] && TARGETS+=(bench_raw_pg bench_pg_consumer handwritten_pg_consumer)
[[ $FLEET -eq 1 ]] && TARGETS+=(bench_fleet_consumer)
[[ $FLEET_ONLY -eq 1 ]] && TARGETS+=(bench_consumer)
cmake --build "$BIN" -j2 --target "${TARGETS[@]}" >/dev/null

# --- brokers ------------------------------------------------------------------------------
stage "brokers"
mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/run.XXXXXX")
: >"$OUT"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# start_broker NAME INFLIGHT: a mosquitto with max_inflight_messages INFLIGHT (its window of
# unacknowledged QoS 1 messages towards each subscriber); prints its URI.
start_broker() {
  local name=$1 inflight=$2 port="" p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if port_free "$p"; then port=$p; break; fi
  done
  [[ -n $port ]] || { echo "no free port" >&2; exit 1; }
  mkdir -p "$WORK/$name"
  {
    echo "listener $port 127.0.0.1"
    echo "allow_anonymous true"
    echo "persistence true"
    echo "persistence_location $WORK/$name/"
    echo "max_queued_messages 0"
    echo "max_inflight_messages $inflight"
    echo "log_dest file $WORK/$name/mosquitto.log"
    [[ $(id -u) -eq 0 ]] && echo "user root"
  } >"$WORK/$name.conf"
  mosquitto -c "$WORK/$name.conf" &
  PIDS+=($!)
  for _ in $(seq 1 100); do port_free "$port" || break; sleep 0.1; done
  port_free "$port" && { echo "mosquitto did not start" >&2; cat "$WORK/$name/mosquitto.log" >&2; exit 1; }
  BROKER_URI=tcp://127.0.0.1:$port
}
start_broker mosquitto 20
BROKER=$BROKER_URI
BROKER_PID=${PIDS[-1]}  # its CPU time is read by the fleet's runs
start_broker mosquitto100 100
BROKER100=$BROKER_URI
echo "mosquitto $(mosquitto -h 2>/dev/null | head -1 | awk '{print $3}') on $BROKER (window 20)" \
  "and $BROKER100 (window 100)"

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
jvals() {  # jvals FILTER FIELD: FIELD of every line holding FILTER, one per line
  grep -F -- "$1" "$OUT" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}
javg() {  # javg FILTER FIELD: mean of FIELD over all lines holding FILTER
  jvals "$1" "$2" | awk '{s+=$1; n++} END {if (n) printf "%.6g", s/n; else print "nan"}'
}
median() {  # median of the numbers on stdin
  sort -g | awk '{v[n++]=$1} END {if (!n) print "nan"; else if (n%2) printf "%.6g", v[(n-1)/2];
                                  else printf "%.6g", (v[n/2-1]+v[n/2])/2}'
}
jmed() { jvals "$1" "$2" | median; }  # jmed FILTER FIELD: median over all lines holding FILTER
# rmed LABEL_A LABEL_B: median over rounds of (msgs_per_s of A / msgs_per_s of B) in the
# same round: a ratio taken within a round, so drift between rounds cancels out.
rratios() {  # rratios LABEL_A LABEL_B: msgs_per_s of A / of B per round, one a line
  local r a b
  for r in $(seq 1 "$ROUNDS"); do
    a=$(grep -F -- "\"label\":\"$1\"" "$OUT" | grep -F "\"round\":$r}" | tail -1 |
        sed -n 's/.*"msgs_per_s":\([^,}]*\).*/\1/p')
    b=$(grep -F -- "\"label\":\"$2\"" "$OUT" | grep -F "\"round\":$r}" | tail -1 |
        sed -n 's/.*"msgs_per_s":\([^,}]*\).*/\1/p')
    [[ -n $a && -n $b ]] && awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.6g\n", a / b }'
  done
}
rmed() { rratios "$1" "$2" | median; }
r3() { printf '%.3f' "$(rmed "$1" "$2")"; }  # r3 LABEL_A LABEL_B: rmed to 3 decimals
# rspread LABEL_A LABEL_B: the per-round ratios' quartiles and how many rounds reach 1:
# "q1 0.93 .. q3 1.05, 5 of 9 rounds >= 1". Disks and shared hosts move single rounds by
# +-15 %; a median with its quartiles says how far to trust it.
rspread() {
  rratios "$1" "$2" | sort -g | awk '{v[n++] = $1; if ($1 >= 1) up++}
    END { if (!n) { print "no rounds"; exit }
          q1 = v[int((n - 1) / 4)]; q3 = v[int(3 * (n - 1) / 4 + 0.5)]
          printf "quartiles %.3f .. %.3f, %d of %d rounds >= 1", q1, q3, up, n }'
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
  local broker=${CONSUME_BROKER:-$BROKER}
  local common=(--sync "$sync" --broker "$broker" --topic "$topic"
                --client-id "$cid" --db "$db" --count "$count" --label "$label")
  local prog=("$BENCH_BIN/bench_consumer" --mode "$mode")
  [[ $mode == handwritten ]] && prog=("$BENCH_BIN/handwritten_consumer")
  "${prog[@]}" "${common[@]}" --phase setup
  if [[ $phase == drain ]]; then
    "$BENCH_BIN/bench_publisher" --broker "$broker" --topic "$topic" --count "$count" \
      --client-id "pub-$RUN_ID" --label "pub_$label" --seed "$RUN_ID" 2>&1 >/dev/null
    quiet_disk
    "${prog[@]}" "${common[@]}" --phase run "${extra[@]}" | record
  else
    local ready="$WORK/ready-$RUN_ID"
    "${PRELOAD_ENV[@]}" "${prog[@]}" "${common[@]}" --phase run \
      --ready-file "$ready" "${extra[@]}" >"$WORK/out-$RUN_ID" &
    local cpid=$!
    PIDS+=($cpid)
    for _ in $(seq 1 300); do [[ -e $ready ]] && break; sleep 0.05; done
    "${PRELOAD_ENV[@]}" "$BENCH_BIN/bench_publisher" --broker "$broker" --topic "$topic" \
      --count "$count" --rate "$rate" --client-id "pub-$RUN_ID" --label "pub_$label" \
      --seed "$RUN_ID" 2>&1 >/dev/null
    wait "$cpid"
    record <"$WORK/out-$RUN_ID"
  fi
  rm -f "$db" "$db-wal" "$db-shm" "$db.work"
}
PRELOAD_ENV=(env)
# Before each timed drain: the page cache still holds what the last run wrote (its
# database and WAL, deleted or not) and the kernel writes it back in the background,
# where it would queue in front of the next run's fsyncs. sync(1) writes it out first, so
# every run starts on a quiet disk whatever ran before it.
quiet_disk() { sync; }

echo "N=$N rounds=$ROUNDS latency_count=$LAT_COUNT prefill=$PREFILL dir=$WORK out=$OUT"

# --- 0: the PostgreSQL cluster (issue 30) -------------------------------------------------
# A private PostgreSQL cluster (initdb into the run folder: the repository's file system,
# never tmpfs; unix socket in a temporary folder, no TCP; fsync = on, synchronous_commit =
# on, the rest initdb's defaults) for the PostgreSQL comparison: per round of section 1,
# after the SQLite consumers, in a Latin-square order, three drains of N credits, each into
# a database of its own made for the run:
#   raw    bench_raw_pg: BEGIN; claim INSERT ... ON CONFLICT DO NOTHING; the credit's upsert
#          and ledger entry; COMMIT, in a libpqxx loop (no MQTT): the limit;
#   hand   handwritten_pg_consumer: Paho C++ + libpqxx, the same transaction in the message
#          callback, the PUBACK after it;
#   inbox  bench_pg_consumer: the library (Inbox::open("postgresql://..."), Consumer with a
#          PgHandler doing the same credit, Subscriber, Pruner), library defaults.
# Before each timed run: CHECKPOINT and sync(1), so no run inherits the previous one's dirty
# pages or a checkpoint half-way.
if [[ $PG -eq 1 ]]; then
  stage "PostgreSQL cluster"
  PG_BIN=/usr/lib/postgresql/15/bin
  [[ -x $PG_BIN/postgres ]] || PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [[ -x $PG_BIN/postgres ]] || { echo "PostgreSQL server not found (postgresql-15)" >&2; exit 1; }
  chmod 711 "$WORK"  # the postgres user must reach its folder inside ours
  mkdir -p "$WORK/pg"
  PG_SOCK=$(mktemp -d /tmp/mqtt_inbox_bench_pg.XXXXXX)
  if [[ $(id -u) -eq 0 ]]; then chown postgres: "$WORK/pg" "$PG_SOCK"; fi
  as_pg "$PG_BIN/initdb" -D "$WORK/pg/data" -U postgres -A trust -E UTF8 --locale=C \
    --no-instructions >"$WORK/pg/initdb.log" 2>&1 ||
    { cat "$WORK/pg/initdb.log" >&2; exit 1; }
  PG_DATA=$WORK/pg/data
  # With the fleet: track_wal_io_timing, so pg_stat_wal says how long the WAL's fsyncs took
  # in each fleet run (the disk's state then: this virtual disk switches between ~0.2 and
  # ~3.7 ms per flush); two clock reads per WAL write and sync.
  PG_OPTS="-c listen_addresses= -c unix_socket_directories=$PG_SOCK -c port=5432 -c fsync=on -c synchronous_commit=$PG_SYNC -c full_page_writes=on"
  [[ $FLEET -eq 1 ]] && PG_OPTS+=" -c track_wal_io_timing=on"
  as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$WORK/pg/postgres.log" -w -t 60 -o "$PG_OPTS" \
    start >/dev/null ||
    { cat "$WORK/pg/postgres.log" >&2; exit 1; }
  pg_uri() { echo "postgresql:///$1?host=$PG_SOCK&port=5432&user=postgres"; }
  pg_sql() { "$PG_BIN/psql" -X -q -A -t -d "$(pg_uri postgres)" -c "$1"; }
  echo "PostgreSQL $(pg_sql 'SHOW server_version') in $PG_DATA (socket $PG_SOCK):" \
    "fsync=$(pg_sql 'SHOW fsync') synchronous_commit=$(pg_sql 'SHOW synchronous_commit')" \
    "wal_sync_method=$(pg_sql 'SHOW wal_sync_method')" \
    "shared_buffers=$(pg_sql 'SHOW shared_buffers')"
  pg_quiet() { pg_sql CHECKPOINT; sync; }
  pg_run() {  # pg_run WHICH: one drain of N credits into a new database
    RUN_ID=$((RUN_ID + 1))
    local label=${1}_pg db=bench_$RUN_ID
    pg_sql "CREATE DATABASE $db"
    local uri
    uri=$(pg_uri "$db")
    if [[ $1 == raw ]]; then
      pg_quiet
      "$BENCH_BIN/bench_raw_pg" --uri "$uri" --count "$N" --label "$label" | record
    else
      local prog=("$BENCH_BIN/bench_pg_consumer")
      [[ $1 == hand ]] && prog=("$BENCH_BIN/handwritten_pg_consumer")
      local common=(--broker "$BROKER" --topic "bench/$RUN_ID/credits" --client-id
                    "bench-$RUN_ID-$label" --uri "$uri" --count "$N" --label "$label")
      "${prog[@]}" "${common[@]}" --phase setup
      "$BENCH_BIN/bench_publisher" --broker "$BROKER" --topic "bench/$RUN_ID/credits" \
        --count "$N" --client-id "pub-$RUN_ID" --label "pub_$label" --seed "$RUN_ID" 2>&1 >/dev/null
      pg_quiet
      "${prog[@]}" "${common[@]}" --phase run | record
    fi
    # The business rows, checked: N credits, each once.
    local rows
    rows=$("$PG_BIN/psql" -X -q -A -t -d "$uri" -c "SELECT count(*) FROM ledger_entries")
    [[ $rows == "$N" ]] || echo "WARNING: $label: $rows ledger entries, expected $N" >&2
    pg_sql "DROP DATABASE $db"
  }
  # fleet_run W: W bench_fleet_consumer members drain N credits on one shared subscription
  # (section 1c). Records the fleet's JSON line only if every check of the round passed.
  FLEET_FAILED=0
  fleet_fail() {  # fleet_fail LABEL REASON: the round gives no figure
    FLEET_FAILED=$((FLEET_FAILED + 1))
    echo "FLEET ROUND FAILED: $1 (round ${ROUND:-0}): $2" >&2
    echo "{\"bench\":\"fleet_failed\",\"label\":\"$1\",\"reason\":\"${2//\"/}\",\"round\":${ROUND:-0}}" >>"$OUT"
  }
  cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6}' /proc/stat; }  # total idle
  # proc_cpu PID: its CPU time and that of its children it has reaped (utime + stime +
  # cutime + cstime), clock ticks: for the postmaster, every backend that has exited.
  proc_cpu() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13 + $14 + $15}'; }
  fleet_run() {
    local w=$1
    RUN_ID=$((RUN_ID + 1))
    local label=fleet${w}_pg db=bench_$RUN_ID group=fleet$RUN_ID topic=bench/$RUN_ID/credits
    local f=$WORK/fleet$RUN_ID
    pg_sql "CREATE DATABASE $db"
    local uri psql_db
    uri=$(pg_uri "$db")
    psql_db=("$PG_BIN/psql" -X -q -A -t -d "$uri")
    "${psql_db[@]}" -c "CREATE TABLE accounts (account TEXT PRIMARY KEY, balance BIGINT NOT NULL);
      CREATE TABLE ledger_entries (id BIGSERIAL PRIMARY KEY, message_id TEXT NOT NULL,
        account TEXT NOT NULL, amount BIGINT NOT NULL)"
    local pids=() i
    for i in $(seq 1 "$w"); do
      "$BENCH_BIN/bench_fleet_consumer" --phase run --broker "$BROKER" --topic "$topic" \
        --group "$group" --slots "$FLEET_SLOTS" --lease-ms "$FLEET_LEASE_MS" --members "$w" \
        --uri "$uri" --label "${label}_m$i" --ready-file "$f-ready-$i" \
        --times-file "$f-times-$i" >"$f-out-$i" 2>"$f-err-$i" &
      pids+=($!)
      PIDS+=($!)
    done
    # stop_members: SIGTERM to the members still running, then wait for each
    stop_members() {
      local p rc=0
      for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
      for p in "${pids[@]}"; do wait "$p" || rc=$?; done
      return $rc
    }
    local ready=0
    for _ in $(seq 1 600); do
      ready=0
      for i in $(seq 1 "$w"); do [[ -e $f-ready-$i ]] && ready=$((ready + 1)); done
      [[ $ready -eq $w ]] && break
      sleep 0.1
    done
    if [[ $ready -ne $w ]]; then
      stop_members || true
      fleet_fail "$label" "$ready of $w members settled in 60 s: $(cat "$f"-err-* | head -3 | tr '\n' ' ')"
      pg_sql "DROP DATABASE $db WITH (FORCE)"
      return 0
    fi
    # The gate: a transaction holding the accounts table, so every member's first credit
    # waits in its handler while the backlog is published; cancelled once it is.
    "$PG_BIN/psql" -X -q -d "$uri&application_name=fleet_gate" \
      -c "BEGIN; LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(600)" \
      >/dev/null 2>&1 &
    local gate=$!
    PIDS+=($gate)
    local locked=0
    for _ in $(seq 1 100); do
      locked=$("${psql_db[@]}" -c "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a
        USING (pid) WHERE a.application_name = 'fleet_gate' AND l.granted
        AND l.mode = 'AccessExclusiveLock' AND l.relation = 'accounts'::regclass")
      [[ $locked == 1 ]] && break
      sleep 0.05
    done
    "$BENCH_BIN/bench_publisher" --broker "$BROKER" --topic "$topic" --count "$N" \
      --accounts "$FLEET_ACCOUNTS" --client-id "pub-$RUN_ID" --label "pub_$label" \
      --seed "$RUN_ID" 2>&1 >/dev/null
    pg_quiet
    local wal0 cpu0 load0 rows=0 t0=$SECONDS
    wal0=$(pg_sql "SELECT wal_sync || ' ' || wal_write || ' ' || wal_sync_time FROM pg_stat_wal")
    cpu0=$(cpu_ticks)
    load0=$(cut -d' ' -f1 /proc/loadavg)
    local postmaster srv0 mq0
    postmaster=$(head -1 "$PG_DATA/postmaster.pid")
    srv0=$(proc_cpu "$postmaster")
    mq0=$(proc_cpu "$BROKER_PID")
    pg_sql "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
            WHERE application_name = 'fleet_gate'" >/dev/null
    wait "$gate" 2>/dev/null || true
    while [[ $((SECONDS - t0)) -lt 300 ]]; do
      rows=$("${psql_db[@]}" -c "SELECT count(*) FROM ledger_entries") || rows=0
      [[ $rows -ge $N ]] && break
      sleep 0.2
    done
    local cpu1
    cpu1=$(cpu_ticks)
    sleep 0.5  # a credit applied twice would show now
    local stopped=0
    stop_members || stopped=$?
    local wal1 srv1 mq1 members_cpu
    wal1=$(pg_sql "SELECT wal_sync || ' ' || wal_write || ' ' || wal_sync_time FROM pg_stat_wal")
    sleep 0.2  # the members' backends reaped by the postmaster
    srv1=$(proc_cpu "$postmaster")
    mq1=$(proc_cpu "$BROKER_PID")
    members_cpu=$(sed -n 's/.*"cpu_s":\([^,}]*\).*/\1/p' "$f"-out-* | awk '{s += $1} END {print s + 0}')
    # The checks: the business state, the claims, every member's counters and stop.
    local expect_sum check why=""
    expect_sum=$(awk -v n="$N" 'BEGIN { s = 0; for (i = 0; i < n; i++) s += i % 1000 + 1; print s }')
    check=$("${psql_db[@]}" -F ' ' -c "SELECT (SELECT count(*) FROM ledger_entries),
      (SELECT count(DISTINCT message_id) FROM ledger_entries),
      (SELECT coalesce(sum(amount), 0) FROM ledger_entries),
      (SELECT coalesce(sum(balance), 0) FROM accounts),
      (SELECT count(*) FROM mqtt_inbox.inbox_processed)") || check="the query failed"
    [[ $check == "$N $N $expect_sum $expect_sum $N" ]] ||
      why="entries, distinct ids, amounts, balances, claims = $check; expected $N $N $expect_sum $expect_sum $N"
    [[ $stopped -eq 0 ]] || why="${why:+$why; }a member exited with $stopped"
    local processed=0 p
    for i in $(seq 1 "$w"); do
      p=$(sed -n 's/.*"processed":\([0-9]*\).*/\1/p' "$f-out-$i")
      processed=$((processed + ${p:-0}))
      grep -q '"dead_lettered":0,' "$f-out-$i" || why="${why:+$why; }member $i: dead letters or no counters"
      grep -q '"stopped_ok":true' "$f-out-$i" || why="${why:+$why; }member $i did not stop cleanly"
    done
    [[ $processed -eq $N ]] || why="${why:+$why; }members processed $processed"
    local line=""
    line=$("$BENCH_BIN/bench_fleet_consumer" --phase merge --count "$N" --label "$label" \
      "$f"-times-* 2>&1) || why="${why:+$why; }$line"
    if [[ -n $why ]]; then
      fleet_fail "$label" "$why"
    else
      set -- $wal0 $wal1 $cpu0 $cpu1
      local extra
      extra=$(awk -v n="$N" -v s0="$1" -v w0="$2" -v st0="$3" -v s1="$4" -v w1="$5" -v st1="$6" \
        -v t0="$7" -v i0="$8" -v t1="$9" -v i1="${10}" -v l="$load0" -v hz="$(getconf CLK_TCK)" -v sv="$((srv1 - srv0))" \
        -v mq="$((mq1 - mq0))" -v mc="$members_cpu" 'BEGIN {
          printf ",\"wal_syncs_per_msg\":%.4f,\"wal_writes_per_msg\":%.4f,\"cpu_busy\":%.3f,\"load_before\":%s",
            (s1 - s0) / n, (w1 - w0) / n, (t1 > t0) ? 1 - (i1 - i0) / (t1 - t0) : 0, l
          printf ",\"cpu_us_per_msg_server\":%.1f,\"cpu_us_per_msg_members\":%.1f,\"cpu_us_per_msg_broker\":%.1f",
            sv / hz * 1e6 / n, mc * 1e6 / n, mq / hz * 1e6 / n
          if (s1 > s0) printf ",\"wal_sync_ms\":%.3f", (st1 - st0) / (s1 - s0) }')
      echo "${line%\}}$extra}" | record
      echo "  $label: $(sed -n 's/.*"msgs_per_s":\([^,]*\).*/\1/p' <<<"$line") msg/s," \
        "applied per member $(sed -n 's/.*"applied_per_member":"\([^"]*\)".*/\1/p' <<<"$line")$extra"
    fi
    pg_sql "DROP DATABASE $db WITH (FORCE)"
  }
fi

# --- 1: the comparison (issue 14): four consumers in interleaved rounds -------------------
# Per round and per synchronous mode: the minimal raw transaction (in-process, no MQTT), the
# hand-written consumer (bench/handwritten_consumer.cpp) and the library (Inbox + Consumer +
# Subscriber with the ledger example's handler, library defaults), each draining N queued
# credits; the clock runs from 5 % of the stream to its end. A fourth reference, the Paho
# limit (handwritten_consumer --synthetic: the raw transaction in Paho's message callback,
# the payload not even read), is the least work a consumer that commits before its PUBACK
# through Paho can do: what the raw loop does not pay is Paho's work between two callbacks
# (the PUBACK, the next PUBLISH's receipt), docs/benchmarks.md.
# The order changes from round to round along a balanced Latin square: over 4 rounds each
# of the four runs once in each position and once right after each of the other three,
# so that disk drift and what the previous run left behind hit all of them alike.
RAW_MIN=(--shape minimal)
comparison_run() {  # comparison_run WHICH SYNC
  case $1 in
    raw)
      quiet_disk
      "$BENCH_BIN/bench_raw_sqlite" --db "$WORK/raw.db" "${RAW_MIN[@]}" --sync "$2" --count "$N" \
        --label "raw_min_$2" | record ;;
    hand) consume handwritten "$2" drain "hand_$2" "$N" 0 ;;
    limit) consume handwritten "$2" drain "paho_limit_$2" "$N" 0 --synthetic ;;
    inbox) consume inbox "$2" drain "inbox_${2}_drain" "$N" 0 ;;
  esac
}
ORDERS=("raw limit inbox hand" "limit hand raw inbox" "hand inbox limit raw"
        "inbox raw hand limit")
PG_ORDERS=("raw hand inbox" "hand inbox raw" "inbox raw hand")
ALL_ROUNDS=$ROUNDS
[[ $PG -eq 1 && $PG_ROUNDS -gt $ALL_ROUNDS ]] && ALL_ROUNDS=$PG_ROUNDS
for ROUND in $(seq 1 "$ALL_ROUNDS"); do
  order=${ORDERS[$(((ROUND - 1) % 4))]}
  if [[ $ROUND -le $ROUNDS ]]; then
    for sync in $SYNCS; do
      stage "round $ROUND: $sync: ${order// /, }"
      for which in $order; do comparison_run "$which" "$sync"; done
    done
  fi
  if [[ $PG -eq 1 && $ROUND -le $PG_ROUNDS ]]; then
    order=${PG_ORDERS[$(((ROUND - 1) % 3))]}
    stage "round $ROUND: PostgreSQL: ${order// /, }"
    for which in $order; do pg_run "$which"; done
  fi
  # 1c: the fleet (issue 31), after the PostgreSQL comparison of the round; with
  # --fleet-only the SQLite library consumer (FULL) too, so that the run holds the single
  # consumers to compare with. The order rotates by one each round.
  if [[ $FLEET -eq 1 && $ROUND -le $PG_ROUNDS ]]; then
    runs=()
    [[ $FLEET_ONLY -eq 1 ]] && runs+=(sqlite)
    for w in $FLEET_MEMBERS; do runs+=("$w"); done
    k=$(((ROUND - 1) % ${#runs[@]}))
    runs=("${runs[@]:k}" "${runs[@]:0:k}")
    stage "round $ROUND: fleet: ${runs[*]}"
    for which in "${runs[@]}"; do
      if [[ $which == sqlite ]]; then
        consume inbox full drain sqlite_inbox_full "$N" 0
      else
        fleet_run "$which"
      fi
    done
  fi
done
ROUND=0

# --- 2-4: transport ceiling, live streams, the in-flight window ---------------------------
if [[ $SKIP_EXTRA -eq 0 ]]; then
  stage "ceiling, live streams"
  consume ceiling full drain ceiling_drain "$N" 0
  consume ceiling full live ceiling_live "$N" 0
  consume inbox full live inbox_full_live "$N" 0
  consume inbox normal live inbox_normal_live "$N" 0
  # The transport around a commit-like wait: the bare callback busy for 180 us (stays on
  # the CPU), asleep for 180 us, or writing ~3.4 WAL frames' worth and fdatasyncing them
  # (a FULL commit's I/O without SQLite). The gap from one callback's return to the next
  # one's entry is what any Paho consumer pays per message on top of its commit.
  stage "transport around a wait (ceiling --work)"
  for w in spin:180 sleep:180 fsync:14000; do
    consume ceiling full drain "work_${w%%:*}" "$N" 0 --work "$w"
  done
  # Paho runs the callbacks one at a time, so a larger window only hides network latency.
  stage "in-flight window 20 vs 100 (inbox drain)"
  for r in 1 2; do
    for sync in normal full; do
      consume inbox "$sync" drain "window20_$sync" "$N" 0
      CONSUME_BROKER=$BROKER100 consume inbox "$sync" drain "window100_$sync" "$N" 0
    done
  done
fi

# --- 5: latency at a paced 200 msg/s ------------------------------------------------------
if [[ $SKIP_EXTRA -eq 0 ]]; then
stage "latency 200 msg/s"
consume ceiling full live lat_ceiling "$LAT_COUNT" 200 --latency
consume inbox full live lat_inbox_full "$LAT_COUNT" 200 --latency
consume inbox normal live lat_inbox_normal "$LAT_COUNT" 200 --latency
PRELOAD_ENV=(env "LD_PRELOAD=$BENCH_BIN/libnodelay_preload.so")
consume ceiling full live lat_ceiling_nodelay "$LAT_COUNT" 200 --latency
consume inbox normal live lat_inbox_normal_nodelay "$LAT_COUNT" 200 --latency
PRELOAD_ENV=(env)
fi

# --- 5b: the outbox relay -----------------------------------------------------------------
# Each credit's handler enqueues one event in its claim transaction, which the relay
# publishes until its PUBACK (bench_consumer --emit-topic, as ledger_consumer
# --emit-topic), FULL: a steady 200 msg/s (LAT_COUNT credits) and a burst (N credits
# queued while the consumer was offline, then drained), each with the relay woken by the
# commits that enqueue and with its 200 ms poll alone (--relay-poll-only), in rounds
# whose order alternates. WAL frames per credit count the relay's marks up to its stop.
RELAY_N=$N
if [[ $SKIP_EXTRA -eq 0 || $RELAY_ONLY -eq 1 ]]; then
  stage "outbox relay: steady 200 msg/s and a burst of $RELAY_N, woken and polled"
  for ROUND in $(seq 1 "$RELAY_ROUNDS"); do
    order="wake poll"
    [[ $((ROUND % 2)) -eq 0 ]] && order="poll wake"
    for w in $order; do
      flags=(--emit-topic "bench/events")
      [[ $w == poll ]] && flags+=(--relay-poll-only)
      consume inbox full live "relay_steady_$w" "$LAT_COUNT" 200 "${flags[@]}"
      consume inbox full drain "relay_burst_$w" "$RELAY_N" 0 "${flags[@]}"
    done
  done
  ROUND=0
fi

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

if [[ $RELAY_ONLY -eq 0 && $PG_ONLY -eq 0 ]]; then
# --- 7: pages per commit: what each part of the claim row costs ---------------------------
# Raw loop, NORMAL (the frames a commit writes do not depend on the fsync), N messages:
# the minimal shape, then one part added at a time, then the shape of schema version 3.
stage "pages per commit (raw loop, NORMAL)"
P=(--sync normal --count "$N")
R=("$BENCH_BIN/bench_raw_sqlite" --db "$WORK/p.db")
"${R[@]}" "${P[@]}" --shape minimal --label parts_minimal | record
"${R[@]}" "${P[@]}" --shape minimal --received-at 1 --label parts_received_at | record
"${R[@]}" "${P[@]}" --shape minimal --received-at 1 --index 1 --label parts_received_at_index | record
"${R[@]}" "${P[@]}" --shape minimal --metadata 1 --label parts_metadata | record
"${R[@]}" "${P[@]}" --shape minimal --auto-vacuum incremental --label parts_auto_vacuum | record
"${R[@]}" "${P[@]}" --shape minimal --rowid 1 --label parts_rowid_table | record
"${R[@]}" "${P[@]}" --shape minimal --received-at 1 --metadata 1 --auto-vacuum incremental \
  --label parts_library_v4 | record
"${R[@]}" "${P[@]}" --shape inbox --label parts_schema_v3 | record

# --- 8: flash wear (FULL) -----------------------------------------------------------------
stage "flash wear levers (FULL)"
W=(--sync full --count "$WEAR_N")
"$BENCH_BIN/bench_raw_sqlite" --db "$WORK/w.db" "${W[@]}" --shape minimal --label wear_raw_min | record
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --label wear_core_default | record
for ps in 1024 2048; do
  "$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --page-size "$ps" --label "wear_core_page$ps" | record
done
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --metadata --label wear_core_metadata | record
"$BENCH_BIN/bench_core" --db "$WORK/w.db" "${W[@]}" --autocheckpoint 100 --label wear_core_ckpt100 | record

fi  # RELAY_ONLY

# --- 9: micro-benchmarks ------------------------------------------------------------------
if [[ $SKIP_MICRO -eq 0 ]]; then
  stage "micro-benchmarks"
  (cd "$WORK" && TMPDIR=$WORK "$BENCH_BIN/bench_micro" --benchmark_min_time=0.3 --benchmark_color=false) | record
fi
stage ""

# --- summary ------------------------------------------------------------------------------
lab() { echo "\"label\":\"$1\""; }
echo
if [[ $ROUNDS -gt 0 ]]; then
echo "== comparison (issue 14): drain of N=$N queued credits, median of $ROUNDS interleaved rounds"
echo "   (÷ raw = median over rounds of the ratio within the round; WAL = bytes SQLite wrote to"
echo "   the WAL through the counting VFS, frame headers included, per message; frames = WAL"
echo "   bytes / (page size + 24); fsync = WAL + database syncs per message; ÷ Paho = the median"
echo "   ratio to the Paho limit, the raw transaction in Paho's callback with nothing else)"
printf '  %-37s %6s %9s %7s %8s %9s %7s %6s %6s\n' consumer sync "msg/s" "÷ raw" "÷ Paho" "WAL B" \
  "÷ min" frames fsync
for sync in $SYNCS; do
  RAWB=$(jmed "$(lab "raw_min_$sync")" vfs_wal_bytes_per_msg)
  for pair in "raw_min_$sync:minimal raw transaction (no MQTT)" \
              "paho_limit_$sync:Paho limit (raw txn in the callback)" \
              "hand_$sync:hand-written (Paho C++ + SQLiteCpp)" \
              "inbox_${sync}_drain:mqtt-inbox (library defaults)"; do
    l=${pair%%:*}
    name=${pair#*:}
    paho="-"
    [[ $l != raw_min_* ]] && paho=$(r3 "$l" "paho_limit_$sync")
    printf '  %-37s %6s %9.0f %7.3f %8s %9.0f %7s %6.2f %6.2f\n' "$name" "$sync" \
      "$(jmed "$(lab "$l")" msgs_per_s)" "$(rmed "$l" "raw_min_$sync")" "$paho" \
      "$(jmed "$(lab "$l")" vfs_wal_bytes_per_msg)" \
      "$(ratio "$(jmed "$(lab "$l")" vfs_wal_bytes_per_msg)" "$RAWB")" \
      "$(jmed "$(lab "$l")" vfs_wal_frames_per_msg)" "$(jmed "$(lab "$l")" fsyncs_per_msg)"
  done
done
for sync in $SYNCS; do
  echo "  $sync: inbox / hand-written $(r3 "inbox_${sync}_drain" "hand_$sync")" \
    "(goal >= 1; $(rspread "inbox_${sync}_drain" "hand_$sync")),"
  echo "        inbox / raw $(r3 "inbox_${sync}_drain" "raw_min_$sync")$([[ $sync == full ]] &&
    echo ' (goal >= 0.8, aim 0.9)'), hand-written / raw $(r3 "hand_$sync" "raw_min_$sync")"
  echo "        Paho limit / raw $(r3 "paho_limit_$sync" "raw_min_$sync")," \
    "inbox / Paho limit $(r3 "inbox_${sync}_drain" "paho_limit_$sync")," \
    "hand-written / Paho limit $(r3 "hand_$sync" "paho_limit_$sync")"
  echo "    per round, msg/s raw / Paho limit / hand-written / inbox (inbox ÷ hand-written):"
  for r in $(seq 1 "$ROUNDS"); do
    v=()
    for l in "raw_min_$sync" "paho_limit_$sync" "hand_$sync" "inbox_${sync}_drain"; do
      v+=("$(grep -F -- "\"label\":\"$l\"" "$OUT" | grep -F "\"round\":$r}" | tail -1 |
             sed -n 's/.*"msgs_per_s":\([^,}]*\).*/\1/p')")
    done
    printf '      round %d: %6.0f / %6.0f / %6.0f / %6.0f  (%s)\n' "$r" "${v[0]:-0}" "${v[1]:-0}" \
      "${v[2]:-0}" "${v[3]:-0}" "$(ratio "${v[3]:-0}" "${v[2]:-0}")"
  done
done
fi  # ROUNDS
if [[ $PG -eq 1 && $PG_ROUNDS -gt 0 ]]; then
  echo "== PostgreSQL (issue 30): drain of N=$N queued credits, median of $PG_ROUNDS interleaved"
  echo "   rounds, synchronous_commit = $PG_SYNC, fsync = on (÷ raw = median over rounds of the ratio"
  echo "   within the round; txn = BEGIN to COMMIT returned per message, p50 / p99 in us;"
  echo "   between = p50 us from one COMMIT's return to the next BEGIN: PUBACK, next PUBLISH,"
  echo "   parsing; WAL = bytes of WAL the server wrote per message, pg_current_wal_lsn over"
  echo "   the timed span)"
  printf '  %-40s %9s %7s %17s %8s %7s\n' consumer "msg/s" "÷ raw" "txn p50 / p99" between \
    "WAL B"
  for pair in "raw_pg:minimal raw transaction (libpqxx, no MQTT)" \
              "hand_pg:hand-written (Paho C++ + libpqxx)" \
              "inbox_pg:mqtt-inbox on PostgreSQL (defaults)"; do
    l=${pair%%:*}
    printf '  %-40s %9.0f %7.3f %8.0f / %6.0f %8s %7.0f\n' "${pair#*:}" \
      "$(jmed "$(lab "$l")" msgs_per_s)" "$(ROUNDS=$PG_ROUNDS rmed "$l" raw_pg)" \
      "$(jmed "$(lab "$l")" txn_p50_us)" "$(jmed "$(lab "$l")" txn_p99_us)" \
      "$(printf %.0f "$(jmed "$(lab "$l")" between_p50_us)")" \
      "$(jmed "$(lab "$l")" wal_bytes_per_msg)"
  done
  echo "  raw COMMIT round trip alone: p50 $(jmed "$(lab raw_pg)" commit_p50_us) us," \
    "p99 $(jmed "$(lab raw_pg)" commit_p99_us) us"
  echo "  inbox / hand-written $(ROUNDS=$PG_ROUNDS r3 inbox_pg hand_pg)" \
    "(goal >= 1; $(ROUNDS=$PG_ROUNDS rspread inbox_pg hand_pg)),"
  echo "  inbox / raw $(ROUNDS=$PG_ROUNDS r3 inbox_pg raw_pg) (goal >= 0.8)," \
    "hand-written / raw $(ROUNDS=$PG_ROUNDS r3 hand_pg raw_pg)"
  if [[ $ROUNDS -gt 0 && $SYNCS == *full* ]]; then
    echo "  SQLite FULL in this run, for comparison: raw $(printf %.0f "$(jmed "$(lab raw_min_full)" msgs_per_s)")," \
      "hand-written $(printf %.0f "$(jmed "$(lab hand_full)" msgs_per_s)")," \
      "mqtt-inbox $(printf %.0f "$(jmed "$(lab inbox_full_drain)" msgs_per_s)") msg/s"
  fi
  echo "  per round, msg/s raw / hand-written / inbox (inbox ÷ hand-written), and the raw"
  echo "  loop's COMMIT p50 in us (the disk's state in that round):"
  for r in $(seq 1 "$PG_ROUNDS"); do
    v=()
    for l in raw_pg hand_pg inbox_pg; do
      v+=("$(grep -F -- "\"label\":\"$l\"" "$OUT" | grep -F "\"round\":$r}" | tail -1 |
             sed -n 's/.*"msgs_per_s":\([^,}]*\).*/\1/p')")
    done
    c=$(grep -F -- '"label":"raw_pg"' "$OUT" | grep -F "\"round\":$r}" | tail -1 |
        sed -n 's/.*"commit_p50_us":\([^,}]*\).*/\1/p')
    printf '    round %d: %6.0f / %6.0f / %6.0f  (%s)  COMMIT %6.0f us\n' "$r" "${v[0]:-0}" \
      "${v[1]:-0}" "${v[2]:-0}" "$(ratio "${v[2]:-0}" "${v[1]:-0}")" "${c:-0}"
  done
fi
if [[ $FLEET -eq 1 && $PG_ROUNDS -gt 0 ]]; then
  echo "== fleet (issue 31): N=$N credits on one shared subscription of $FLEET_SLOTS slots, drained by"
  echo "   1 .. 4 member processes (bench_fleet_consumer) on one PostgreSQL, synchronous_commit ="
  echo "   $PG_SYNC; msg/s = first to last applied credit, median of the rounds that passed their"
  echo "   checks; ÷ 1 = median over rounds of the ratio to one member in the same round; syncs ="
  echo "   the server's WAL fsyncs (pg_stat_wal) per credit; CPU = share of the machine's"
  echo "   $(nproc) cores busy over the drain; load = the 1-minute load before it"
  echo "   server / members / broker = CPU µs per credit of the PostgreSQL server (its backends,"
  echo "   reaped), the member processes (ready to stop) and mosquitto, over the run"
  printf '  %-36s %8s %7s %8s %6s %6s %20s %s\n' run "msg/s" "÷ 1" "÷ hand" syncs CPU \
    "server/members/brkr" "rounds (failed)"
  for w in $FLEET_MEMBERS; do
    l=fleet${w}_pg
    printf '  %-36s %8.0f %7.3f %8.3f %6.3f %6.2f %6.0f/%6.0f/%6.0f %d (%d)\n' "fleet, $w member process(es)" \
      "$(jmed "$(lab "$l")" msgs_per_s)" "$(ROUNDS=$PG_ROUNDS rmed "$l" fleet1_pg)" \
      "$(ROUNDS=$PG_ROUNDS rmed "$l" hand_pg)" "$(jmed "$(lab "$l")" wal_syncs_per_msg)" \
      "$(jmed "$(lab "$l")" cpu_busy)" "$(jmed "$(lab "$l")" cpu_us_per_msg_server)" \
      "$(jmed "$(lab "$l")" cpu_us_per_msg_members)" "$(jmed "$(lab "$l")" cpu_us_per_msg_broker)" \
      "$(grep -cF -- "\"bench\":\"fleet\",\"label\":\"$l\"" "$OUT")" \
      "$(grep -cF -- "\"bench\":\"fleet_failed\",\"label\":\"$l\"" "$OUT")"
  done
  # The SQLite library consumer (FULL) of the same rounds: --fleet-only's, or the comparison's.
  SQLITE_LABEL=sqlite_inbox_full
  [[ $FLEET_ONLY -eq 0 ]] && SQLITE_LABEL=inbox_full_drain
  for pair in "hand_pg:hand-written PostgreSQL (one process)" "inbox_pg:mqtt-inbox on PostgreSQL, one Subscriber" \
              "raw_pg:minimal raw PostgreSQL transaction" "$SQLITE_LABEL:mqtt-inbox on SQLite FULL (one process)"; do
    l=${pair%%:*}
    grep -qF -- "$(lab "$l")" "$OUT" || continue
    printf '  %-36s %8.0f %7s %8.3f\n' "${pair#*:}" "$(jmed "$(lab "$l")" msgs_per_s)" - \
      "$(ROUNDS=$PG_ROUNDS rmed "$l" hand_pg)"
  done
  echo "  per round, msg/s of $(for w in $FLEET_MEMBERS; do printf 'fleet%s / ' "$w"; done)hand-written PG / SQLite;"
  echo "  the mean WAL fsync of each fleet run (the disk's state) and the load before them:"
  for r in $(seq 1 "$PG_ROUNDS"); do
    v=""
    for l in $(for w in $FLEET_MEMBERS; do echo "fleet${w}_pg"; done) hand_pg "$SQLITE_LABEL"; do
      x=$(grep -F -- "\"label\":\"$l\"" "$OUT" | grep -F "\"round\":$r}" | grep -v fleet_failed | tail -1 |
          sed -n 's/.*"msgs_per_s":\([^,}]*\).*/\1/p') || x=""
      v+="$(printf '%6.0f' "${x:-0}") / "
    done
    ms=""
    for w in $FLEET_MEMBERS; do
      x=$(grep -F -- "\"label\":\"fleet${w}_pg\"" "$OUT" | grep -F "\"round\":$r}" | tail -1 |
          sed -n 's/.*"wal_sync_ms":\([^,}]*\).*/\1/p') || x=""
      ms+="${x:--} / "
    done
    printf '    round %d: %s (WAL fsync ms %s; load %s)\n' "$r" "${v% / }" "${ms% / }" \
      "$(jvals "\"round\":$r}" load_before | sort -g | sed -n '1p;$p' | paste -sd- -)"
  done
  [[ $FLEET_FAILED -gt 0 ]] && echo "  $FLEET_FAILED fleet round(s) FAILED their checks (above); they give no figure"
fi
if [[ $SKIP_EXTRA -eq 0 ]]; then
  echo "== transport ceiling and live streams (msg/s, one run each)"
  printf '  %-24s %10.0f\n' "ceiling drain" "$(jget "$(lab ceiling_drain)" msgs_per_s)" \
    "ceiling live" "$(jget "$(lab ceiling_live)" msgs_per_s)" \
    "inbox FULL live" "$(jget "$(lab inbox_full_live)" msgs_per_s)" \
    "inbox NORMAL live" "$(jget "$(lab inbox_normal_live)" msgs_per_s)"
  echo "== the transport around a commit-like wait (ceiling with --work; one run each)"
  for l in work_spin work_sleep work_fsync; do
    printf '  %-12s %-12s msg/s %8.0f   work p50 %7.1f us   gap p50 %6.1f us (mean %.1f)\n' "$l" \
      "$(jget "$(lab "$l")" work)" "$(jget "$(lab "$l")" msgs_per_s)" \
      "$(jget "$(lab "$l")" work_p50_us)" "$(jget "$(lab "$l")" gap_p50_us)" \
      "$(jget "$(lab "$l")" gap_mean_us)"
  done
  echo "== in-flight window (broker max_inflight_messages), inbox drain, median of 2 (msg/s)"
  for sync in full normal; do
    w20=$(jmed "$(lab "window20_$sync")" msgs_per_s)
    w100=$(jmed "$(lab "window100_$sync")" msgs_per_s)
    printf '  %-6s window 20 %8.0f   window 100 %8.0f   100/20 %s\n' "$sync" "$w20" "$w100" \
      "$(ratio "$w100" "$w20")"
  done
echo "== latency at 200 msg/s (ms): p50 / p99 / max"
for l in lat_ceiling lat_ceiling_nodelay lat_inbox_full lat_inbox_normal lat_inbox_normal_nodelay; do
  printf '  %-26s total %6s / %6s / %7s   transport %6s / %6s   claim %6s / %6s\n' "$l" \
    "$(jget "\"label\":\"$l\"" latency_p50_ms)" "$(jget "\"label\":\"$l\"" latency_p99_ms)" \
    "$(jget "\"label\":\"$l\"" latency_max_ms)" "$(jget "\"label\":\"$l\"" transport_p50_ms)" \
    "$(jget "\"label\":\"$l\"" transport_p99_ms)" "$(jget "\"label\":\"$l\"" claim_p50_ms)" \
    "$(jget "\"label\":\"$l\"" claim_p99_ms)"
done
fi
if [[ $SKIP_EXTRA -eq 0 || $RELAY_ONLY -eq 1 ]]; then
  echo "== outbox relay, FULL: steady = 200 msg/s, $LAT_COUNT credits; burst = $RELAY_N queued credits"
  echo "   drained; median of $RELAY_ROUNDS rounds. Latency in ms (p50 / p99 over the last PUBACKs,"
  echo "   up to 1,024); WAL frames per credit from 5 % of the credits to the relay's stop (the"
  echo "   credit, its event, the relay's marks); marks = mark_sent transactions per credit"
  printf '  %-22s %17s %17s %12s %7s %7s\n' run "commit->PUBACK" "publish->PUBACK" \
    "WAL frames" marks acked
  for l in relay_steady_wake relay_steady_poll relay_burst_wake relay_burst_poll; do
    printf '  %-22s %8s / %6s %8s / %6s %12s %7s %7s\n' "$l" \
      "$(jmed "$(lab "$l")" relay_commit_to_puback_p50_ms)" \
      "$(jmed "$(lab "$l")" relay_commit_to_puback_p99_ms)" \
      "$(jmed "$(lab "$l")" relay_puback_p50_ms)" "$(jmed "$(lab "$l")" relay_puback_p99_ms)" \
      "$(printf %.2f "$(jmed "$(lab "$l")" relay_wal_frames_per_credit)")" \
      "$(printf %.3f "$(jmed "$(lab "$l")" relay_marks_per_credit)")" \
      "$(jmed "$(lab "$l")" relay_acked)"
  done
fi
if [[ $SKIP_SCALE -eq 0 ]]; then
  SE_F=$(javg '"label":"scale_empty_full"' msgs_per_s); SB_F=$(javg '"label":"scale_big_full"' msgs_per_s)
  SE_N=$(javg '"label":"scale_empty_normal"' msgs_per_s); SB_N=$(javg '"label":"scale_big_normal"' msgs_per_s)
  echo "== scale ($PREFILL retained ids vs empty, Consumer::handle)"
  echo "  FULL   empty $(printf %.0f "$SE_F")  retained $(printf %.0f "$SB_F")  ratio $(ratio "$SB_F" "$SE_F")  (goal >= 0.9)"
  echo "  NORMAL empty $(printf %.0f "$SE_N")  retained $(printf %.0f "$SB_N")  ratio $(ratio "$SB_N" "$SE_N")"
fi
if [[ $RELAY_ONLY -eq 0 && $PG_ONLY -eq 0 ]]; then
echo "== pages per commit (raw loop, NORMAL, N=$N): WAL frames per message, and / minimal"
PM=$(jget "$(lab parts_minimal)" vfs_wal_frames_per_msg)
grep -F '"label":"parts_' "$OUT" | while IFS= read -r line; do
  l=$(sed -n 's/.*"label":"\([^"]*\)".*/\1/p' <<<"$line")
  f=$(jget "$(lab "$l")" vfs_wal_frames_per_msg)
  printf '  %-26s %6.2f  %s\n' "$l" "$f" "$(ratio "$f" "$PM")"
done
echo "== flash wear per message (FULL): write_bytes / WAL bytes / WAL frames / db bytes / fsyncs"
grep -F '"label":"wear_' "$OUT" | while IFS= read -r line; do
  l=$(sed -n 's/.*"label":"\([^"]*\)".*/\1/p' <<<"$line")
  printf '  %-26s %8.0f %8.0f %6.2f %7.0f %5.2f\n' "$l" \
    "$(jget "\"label\":\"$l\"" proc_write_bytes_per_msg)" "$(jget "\"label\":\"$l\"" vfs_wal_bytes_per_msg)" \
    "$(jget "\"label\":\"$l\"" vfs_wal_frames_per_msg)" "$(jget "\"label\":\"$l\"" vfs_db_bytes_per_msg)" \
    "$(jget "\"label\":\"$l\"" fsyncs_per_msg)"
done
fi  # RELAY_ONLY
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (cores: $(nproc))"
echo "total $((SECONDS - T_ALL)) s; results in $OUT"

#!/usr/bin/env bash
# The main job, twice: an MQTT QoS 1 consumer applies a stream full of duplicates,
# malformed messages and crashes exactly once (one process, SQLite); then a fleet of three
# does it on one PostgreSQL under a shared subscription while one dies for good.
#
#   scripts/demo.sh [all|single|fleet]     (default all: the single run, then the fleet)
#
# It installs what is missing, builds, and runs the parts; each ends with "exactly-once:
# OK" (or FAILED, keeping its logs), and the script exits non-zero if either failed. Every
# process it started is stopped on exit.
#
# The single run starts mosquitto on a free 127.0.0.1 port (sessions kept, queues never
# dropped), starts examples/event_consumer (the second hop) and examples/ledger_consumer
# --emit-topic events/credited (the first: each applied credit enqueues one event in its
# transaction, and its outbox relay publishes it), publishes credits with duplicates and
# malformed messages, SIGKILLs the ledger consumer twice and the event consumer once
# mid-stream, each at a different moment, and restarts them, waits for both hops to drain,
# and checks the balances and that every applied credit had exactly one effect downstream.
#
# The fleet run (docs/fleet.md) starts a private PostgreSQL cluster (as the postgres user
# when run as root, socket in its run folder, no TCP) and a broker of its own, three
# ledger_consumer --fleet-group workers, publishes credits with duplicates, SIGKILLs one
# worker for good a third into the stream and restarts another (SIGTERM, start) at two
# thirds, checks the ledger in PostgreSQL against what was published, and says how soon the
# dead worker's slots were served again and how much the broker had parked in them.
#
# Environment: COUNT (unique credits, default 2500), DUPLICATES (fraction, default 0.25),
# MALFORMED (default 12), RATE (msgs/s, default 800), MQTT_VERSION (3.1.1, the
# programs' default, or 5; default 3.1.1: the outbox relay then carries each event's id in
# its JSON, tests/crash/two_hop_test.cpp runs both); for the fleet run FLEET_COUNT
# (default 3000), FLEET_RATE (default 1000), FLEET_SLOTS (default 6), FLEET_LEASE_MS
# (default 2000: short, so the demo is; the program's default is 10000), KEEP_LOGS=1 (keep
# the fleet run's folder: workers' logs, the broker's, PostgreSQL's).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/lib.sh"
COUNT="${COUNT:-2500}"
DUPLICATES="${DUPLICATES:-0.25}"
MALFORMED="${MALFORMED:-12}"
RATE="${RATE:-800}"
MQTT_VERSION="${MQTT_VERSION:-3.1.1}"
FLEET_COUNT="${FLEET_COUNT:-3000}"
FLEET_RATE="${FLEET_RATE:-1000}"
FLEET_SLOTS="${FLEET_SLOTS:-6}"
FLEET_LEASE_MS="${FLEET_LEASE_MS:-2000}"
BUILD="$ROOT/build-demo"

# The single run: one ledger consumer and one event consumer, SQLite, crashes.
demo_single() {
  WORK="$(mktemp -d /tmp/mqtt-inbox-demo.XXXXXX)"
  BROKER_PID="" CONSUMER_PID="" EVENTS_PID="" PUBLISHER_PID=""
  cleanup() {
    for pid in $PUBLISHER_PID $CONSUMER_PID $EVENTS_PID $BROKER_PID; do
      kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
  }
  trap cleanup EXIT

  PORT="$(free_port)"
  write_mosquitto_conf "$PORT" "$WORK"
  mosquitto -c "$WORK/mosquitto.conf" >"$WORK/mosquitto.stderr" 2>&1 &
  BROKER_PID=$!
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
  BROKER="tcp://127.0.0.1:$PORT"
  DB="$WORK/ledger.db"
  EVENTS_DB="$WORK/events.db"
  echo "broker $BROKER (pid $BROKER_PID), databases $DB and $EVENTS_DB (kept only if the run fails)"

  wait_subscribed() {
    # "consuming:" comes after the SUBACK (or from a session that holds the filters).
    for _ in $(seq 1 100); do grep -q "consuming: " "$1" && break; sleep 0.1; done
  }
  RUN=0
  start_consumer() {
    RUN=$((RUN + 1))
    "$BUILD/examples/ledger_consumer" --broker "$BROKER" --client-id demo-ledger --topic 'credits/#' \
      --db "$DB" --mqtt-version "$MQTT_VERSION" --log-level debug \
      --emit-topic events/credited >"$WORK/consumer-$RUN.log" 2>&1 &
    CONSUMER_PID=$!
    echo "ledger consumer run $RUN started (pid $CONSUMER_PID)"
  }
  EVENTS_RUN=0
  start_events() {
    EVENTS_RUN=$((EVENTS_RUN + 1))
    "$BUILD/examples/event_consumer" --broker "$BROKER" --client-id demo-events --topic 'events/#' \
      --db "$EVENTS_DB" --mqtt-version "$MQTT_VERSION" --log-level debug \
      >"$WORK/events-$EVENTS_RUN.log" 2>&1 &
    EVENTS_PID=$!
    echo "event consumer run $EVENTS_RUN started (pid $EVENTS_PID)"
  }
  applied() { sqlite3 "$DB" "SELECT count(*) FROM ledger_entries" 2>/dev/null || echo 0; }
  events_applied() { sqlite3 "$EVENTS_DB" "SELECT count(*) FROM event_sources" 2>/dev/null || echo 0; }

  # The first runs create the persistent sessions, so nothing published later is missed:
  # the second hop first, so it is subscribed before the first event is relayed.
  start_events
  wait_subscribed "$WORK/events-$EVENTS_RUN.log"
  start_consumer
  wait_subscribed "$WORK/consumer-$RUN.log"

  "$BUILD/examples/publisher" --broker "$BROKER" --topic credits/demo --count "$COUNT" \
    --duplicates "$DUPLICATES" --malformed "$MALFORMED" --rate "$RATE" --seed 42 \
    --mqtt-version "$MQTT_VERSION" >"$WORK/publisher.out" 2>&1 &
  PUBLISHER_PID=$!

  # Crashes in the middle of the stream: SIGKILL, no goodbye, no PUBACK for whatever was
  # in flight (credits to the ledger consumer, events to the event consumer, and the
  # relay's own publishes); then a restart with the same client id and database. The ledger
  # consumer dies after a third and two thirds of the credits, the event consumer later,
  # after half of the events (the events lag behind the credits).
  wait_for() { for _ in $(seq 1 600); do [ "$($1)" -ge "$2" ] && break; sleep 0.05; done; }
  kill_and_restart() { kill -9 "$1"; wait "$1" 2>/dev/null || true; sleep 0.3; "$2"; }
  for crash in 1 2; do
    wait_for applied $((COUNT * crash / 3))
    echo "SIGKILL ledger consumer run $RUN after $(applied) credits applied, $(events_applied) events"
    kill_and_restart "$CONSUMER_PID" start_consumer
  done
  wait_for events_applied $((COUNT / 2))
  echo "SIGKILL event consumer run $EVENTS_RUN after $(events_applied) events applied"
  kill_and_restart "$EVENTS_PID" start_events

  wait "$PUBLISHER_PID"; PUBLISHER_PID=""
  cat "$WORK/publisher.out"
  read -r UNIQUE DUPS MAL TOTAL < <(sed -n 's/^publisher: unique=\([0-9]*\) duplicates=\([0-9]*\) malformed=\([0-9]*\) total_amount=\([0-9]*\)$/\1 \2 \3 \4/p' "$WORK/publisher.out")

  echo "waiting for the stream to drain..."
  for _ in $(seq 1 1200); do
    dl=$(sqlite3 "$DB" "SELECT count(*) FROM inbox_dead_letters" 2>/dev/null || echo 0)
    [ "$(applied)" -ge "$UNIQUE" ] && [ "$dl" -ge "$MAL" ] && break
    sleep 0.1
  done
  UNIQUE_APPLIED=$(applied)
  for _ in $(seq 1 1200); do [ "$(events_applied)" -ge "$UNIQUE_APPLIED" ] && break; sleep 0.1; done
  sleep 1  # let late redeliveries and re-sends arrive: they must be skipped, not applied
  kill -TERM "$CONSUMER_PID"; wait "$CONSUMER_PID" || true; CONSUMER_PID=""
  kill -TERM "$EVENTS_PID"; wait "$EVENTS_PID" || true; EVENTS_PID=""

  q() { sqlite3 "$DB" "$1"; }
  ENTRIES=$(q "SELECT count(*) FROM ledger_entries")
  DISTINCT=$(q "SELECT count(DISTINCT message_id) FROM ledger_entries")
  BALANCE=$(q "SELECT coalesce(sum(balance), 0) FROM accounts")
  DEAD=$(q "SELECT count(*) FROM inbox_dead_letters")
  SKIPPED=$(cat "$WORK"/consumer-*.log | grep -c ': duplicate$' || true)
  DELIVERED=$(cat "$WORK"/consumer-*.log | grep -c "consumer 'ledger': message on" || true)
  # The second hop, against the first: one event row per applied credit, for the same
  # source ids, and per account as many events as credits, adding up to the balance.
  e() { sqlite3 "$EVENTS_DB" "ATTACH DATABASE '$DB' AS up; $1"; }
  EVENTS=$(e "SELECT count(*) FROM event_sources")
  EV_DISTINCT=$(e "SELECT count(DISTINCT source_message_id) FROM event_sources")
  EV_MATCHED=$(e "SELECT count(*) FROM event_sources s JOIN up.ledger_entries l
    ON l.message_id = s.source_message_id AND l.account = s.account AND l.amount = s.amount
    WHERE s.message_id = s.source_message_id || '/credited'")
  ACCOUNTS=$(q "SELECT count(*) FROM accounts")
  EV_ACCOUNTS=$(e "SELECT count(*) FROM event_accounts")
  EV_ACCOUNTS_OK=$(e "SELECT count(*) FROM event_accounts s JOIN up.accounts a USING (account)
    WHERE s.total = a.balance
    AND s.events = (SELECT count(*) FROM up.ledger_entries l WHERE l.account = s.account)")
  EV_DEAD=$(e "SELECT count(*) FROM inbox_dead_letters")
  EV_SKIPPED=$(cat "$WORK"/events-*.log | grep -c ': duplicate$' || true)
  SENT=$(q "SELECT count(*) FROM outbox_messages WHERE state = 'sent'")

  echo
  echo "===== mqtt-inbox demo: $RUN ledger consumer runs, 2 of them SIGKILLed mid-stream;"
  echo "      $EVENTS_RUN event consumer runs, 1 of them SIGKILLed mid-stream"
  printf '%-44s %s\n' "unique credit events published" "$UNIQUE"
  printf '%-44s %s\n' "duplicates re-sent by the publisher" "$DUPS"
  printf '%-44s %s\n' "malformed messages published" "$MAL"
  printf '%-44s %s\n' "deliveries that reached the consumer" "$DELIVERED"
  printf '%-44s %s\n' "duplicates delivered and skipped" "$SKIPPED"
  printf '%-44s %s\n' "  beyond the publisher's re-sends (redeliveries)" "$((SKIPPED - DUPS))"
  printf '%-44s %s\n' "credits applied (ledger rows / distinct ids)" "$ENTRIES / $DISTINCT"
  printf '%-44s %s\n' "dead letters" "$DEAD"
  q "SELECT '  ' || reason || ': ' || count(*) FROM inbox_dead_letters GROUP BY reason ORDER BY reason"
  printf '%-44s %s\n' "expected total balance" "$TOTAL"
  printf '%-44s %s\n' "actual total balance" "$BALANCE"
  echo "----- second hop: one event per applied credit (transactional outbox)"
  printf '%-44s %s\n' "events relayed (outbox rows sent)" "$SENT"
  printf '%-44s %s\n' "duplicate events delivered and skipped" "$EV_SKIPPED"
  printf '%-44s %s\n' "events applied (rows / distinct source ids)" "$EVENTS / $EV_DISTINCT"
  printf '%-44s %s\n' "  matching an applied credit" "$EV_MATCHED"
  printf '%-44s %s\n' "accounts with events = credits, sum = balance" "$EV_ACCOUNTS_OK of $ACCOUNTS"
  e "SELECT printf('  %-12s credits %5d   events %5d', a.account,
       (SELECT count(*) FROM up.ledger_entries l WHERE l.account = a.account),
       coalesce((SELECT events FROM event_accounts s WHERE s.account = a.account), 0))
     FROM up.accounts a ORDER BY a.account"
  printf '%-44s %s\n' "event dead letters" "$EV_DEAD"

  if [ "$ENTRIES" = "$UNIQUE" ] && [ "$DISTINCT" = "$UNIQUE" ] && [ "$BALANCE" = "$TOTAL" ] &&
     [ "$DEAD" -ge "$MAL" ] && [ "$SKIPPED" -ge "$DUPS" ] &&
     [ "$EVENTS" = "$ENTRIES" ] && [ "$EV_DISTINCT" = "$ENTRIES" ] && [ "$EV_MATCHED" = "$ENTRIES" ] &&
     [ "$EV_ACCOUNTS" = "$ACCOUNTS" ] && [ "$EV_ACCOUNTS_OK" = "$ACCOUNTS" ] && [ "$EV_DEAD" = 0 ]; then
    # More dead letters than malformed messages is possible and correct: a message without
    # an id that was dead-lettered but not yet acked when a SIGKILL hit comes back and,
    # having no id to recognise it by, gets a second row.
    echo "exactly-once: OK"
  else
    echo "exactly-once: FAILED (logs in $WORK)"
    trap - EXIT; cleanup
    return 1
  fi
  rm -rf "$WORK"
}

# The fleet run (issue 31, docs/fleet.md): three ledger_consumer processes on one private
# PostgreSQL, sharing $share/demo/credits/# over FLEET_SLOTS client-id slots (fleet-0 ..),
# each with its own log and client-id lock folder, as on hosts of their own. Worker b is
# SIGKILLed for good a third into the stream; worker c is stopped (SIGTERM) and started
# again two thirds into it. Then: every credit applied exactly once, and how soon b's
# slots (and what the broker had parked in their sessions) were served by a survivor.
demo_fleet() {
  WORK="$(mktemp -d /tmp/mqtt-inbox-fleet.XXXXXX)"
  chmod 711 "$WORK"  # the postgres user must reach its folders inside
  pg_bin=/usr/lib/postgresql/15/bin  # global: the EXIT trap stops the cluster with it
  [ -x "$pg_bin/postgres" ] || pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -x "$pg_bin/postgres" ] || { echo "PostgreSQL server not found (postgresql-15)" >&2; return 1; }
  as_pg() {  # initdb and postgres refuse to run as root
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
  }
  declare -g -A WPID=()
  PG_DATA="" BROKER_PID="" PUBLISHER_PID=""
  fleet_cleanup() {
    for pid in $PUBLISHER_PID "${WPID[@]}" $BROKER_PID; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "$PG_DATA" ] && as_pg "$pg_bin/pg_ctl" -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1
    return 0
  }
  trap 'fleet_cleanup; echo "fleet run: logs kept in $WORK"' EXIT

  # A private PostgreSQL cluster: initdb into the run folder, socket in it, no TCP.
  mkdir -p "$WORK/pg" "$WORK/sock"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$WORK/pg" "$WORK/sock"
  as_pg "$pg_bin/initdb" -D "$WORK/pg/data" -U postgres -A trust -E UTF8 --locale=C \
    --no-instructions >"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log" >&2; return 1; }
  PG_DATA="$WORK/pg/data"
  as_pg "$pg_bin/pg_ctl" -D "$PG_DATA" -l "$WORK/pg/postgres.log" -w -t 60 \
    -o "-c listen_addresses= -c unix_socket_directories=$WORK/sock -c port=5432" start >/dev/null ||
    { cat "$WORK/pg/postgres.log" >&2; return 1; }
  local db="postgresql:///ledger?host=$WORK/sock&port=5432&user=postgres"
  "$pg_bin/psql" -X -q -d "postgresql:///postgres?host=$WORK/sock&port=5432&user=postgres" \
    -c "CREATE DATABASE ledger"
  pg() { "$pg_bin/psql" -X -q -A -t -d "$db" -c "$1" 2>/dev/null; }

  # The broker, as above, logging every PUBLISH it sends (with the client id it sends to).
  local port; port="$(free_port)"
  write_mosquitto_conf "$port" "$WORK"
  echo "log_type all" >>"$WORK/mosquitto.conf"
  mosquitto -c "$WORK/mosquitto.conf" >"$WORK/mosquitto.stderr" 2>&1 &
  BROKER_PID=$!
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  local broker="tcp://127.0.0.1:$port"
  echo "broker $broker, PostgreSQL $(pg 'SHOW server_version') (socket in $WORK/sock, no TCP)"
  echo "$FLEET_SLOTS client-id slots fleet-0..fleet-$((FLEET_SLOTS - 1)) on \$share/demo/credits/#, lease $FLEET_LEASE_MS ms"

  start_worker() {  # start_worker NAME: one fleet member, its own log and lock folder
    mkdir -p "$WORK/locks-$1"
    "$BUILD/examples/ledger_consumer" --broker "$broker" --client-id fleet --topic 'credits/#' \
      --db "$db" --mqtt-version "$MQTT_VERSION" --fleet-group demo --fleet-slots "$FLEET_SLOTS" \
      --fleet-lease-ms "$FLEET_LEASE_MS" --client-id-lock-dir "$WORK/locks-$1" \
      --log-level debug >"$WORK/worker-$1.log" 2>&1 &
    WPID[$1]=$!
  }
  # held NAME: the slots a member holds, from its log (took, gave back, lost).
  held() {
    awk '/: took slot [0-9]+ / { split($0, a, "took slot "); split(a[2], b, " "); h[b[1]] = 1 }
         /: gave slot [0-9]+ back/ { split($0, a, "gave slot "); split(a[2], b, " "); h[b[1]] = 0 }
         /: slot [0-9]+ is no longer held/ { split($0, a, ": slot "); split(a[2], b, " "); h[b[1]] = 0 }
         /FLEET LEASE LOST/ { for (k in h) h[k] = 0 }
         END { for (k in h) if (h[k]) print k }' "$WORK/worker-$1.log" | sort -n | paste -sd' ' -
  }
  members() { pg "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND objid = 2147483647"; }
  # settled N: N members, each holding its even share, and every slot's session subscribed.
  settled() {
    [ "$(members)" = "$1" ] || return 1
    [ "$(pg "SELECT count(*) FROM (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
          AND objsubid = 2 AND objid <> 2147483647 GROUP BY pid HAVING count(*) >= $((FLEET_SLOTS / $1))) s")" = "$1" ] || return 1
    for i in $(seq 0 $((FLEET_SLOTS - 1))); do
      grep -q "consuming: client 'fleet-$i'" "$WORK"/worker-*.log || return 1
    done
  }
  wait_settled() { for _ in $(seq 1 300); do settled "$1" && return 0; sleep 0.1; done; return 1; }
  show_fleet() { for w in "$@"; do printf '  worker %-3s pid %-8s slots %s\n' "$w" "${WPID[$w]}" "$(held "$w")"; done; }
  applied() { local n; n=$(pg "SELECT count(*) FROM ledger_entries"); echo "${n:-0}"; }
  wait_for() { for _ in $(seq 1 1200); do [ "$(applied)" -ge "$1" ] && break; sleep 0.05; done; }
  ms_of() { date -d "$1" +%s%3N; }  # a log line's "[YYYY-mm-dd HH:MM:SS.mmm]" stamp

  start_worker a; start_worker b; start_worker c
  wait_settled 3 || { echo "the three workers did not settle"; return 1; }
  echo "three workers started, the slots spread over them:"
  show_fleet a b c

  "$BUILD/examples/publisher" --broker "$broker" --topic credits/fleet --count "$FLEET_COUNT" \
    --duplicates "$DUPLICATES" --malformed 0 --rate "$FLEET_RATE" --seed 31 --id-prefix fleet \
    --mqtt-version "$MQTT_VERSION" >"$WORK/publisher.out" 2>&1 &
  PUBLISHER_PID=$!
  echo "publishing $FLEET_COUNT credits with $DUPLICATES duplicates at $FLEET_RATE msgs/s"

  # 1. b dies for good: SIGKILL, no goodbye, its in-flight credits unacked.
  wait_for $((FLEET_COUNT / 3))
  local dead; dead="$(held b)"
  local before_kill=() k
  for k in $dead; do before_kill+=("$(cat "$WORK"/worker-[ac].log | grep -c "consuming: client 'fleet-$k'" || true)"); done
  local broker_line; broker_line=$(wc -l <"$WORK/mosquitto.log")
  local killed_at; killed_at=$(date +%s%3N)
  kill -9 "${WPID[b]}"; wait "${WPID[b]}" 2>/dev/null || true
  echo "SIGKILL worker b (slots $dead) after $(applied) credits applied; it stays dead"
  # Served again: a survivor's new "consuming: client 'fleet-K'" line for each of b's slots.
  local served_ms=0 taker="" n i=0
  for _ in $(seq 1 600); do
    local all=1; i=0
    for k in $dead; do
      n=$(cat "$WORK"/worker-[ac].log | grep -c "consuming: client 'fleet-$k'" || true)
      [ "$n" -gt "${before_kill[$i]}" ] || all=0
      i=$((i + 1))
    done
    [ "$all" = 1 ] && break
    sleep 0.05
  done
  # When (from the log lines' stamps): the lease taken ("took slot"), then the session
  # connected and subscribed ("consuming", after the SUBACK, which may wait behind the
  # parked messages the broker sends at once on the connect).
  stamp_after() {  # stamp_after PATTERN LOG: ms from the kill to PATTERN's last line in LOG
    local line; line=$(grep "$1" "$2" | tail -1 || true)
    [ -n "$line" ] || return 1
    local t; t=$(ms_of "$(echo "$line" | sed 's/^\[\([^]]*\)\].*/\1/')")
    [ "$t" -ge "$killed_at" ] || return 1
    echo $((t - killed_at))
  }
  local taken_ms=0 took con w
  for k in $dead; do
    for w in a c; do
      con=$(stamp_after "consuming: client 'fleet-$k'" "$WORK/worker-$w.log") || continue
      took=$(stamp_after "took slot $k (" "$WORK/worker-$w.log") || took="?"
      taker+="fleet-$k by $w (lease taken after $took ms, consuming after $con ms), "
      [ "$con" -gt "$served_ms" ] && served_ms=$con
      [ "$took" != "?" ] && [ "$took" -gt "$taken_ms" ] && taken_ms=$took
    done
  done
  echo "  b's slots served again: ${taker%, }"

  # 2. c restarts: SIGTERM (its slots are given back at once), then a new process.
  wait_for $((FLEET_COUNT * 2 / 3))
  local c_slots; c_slots="$(held c)"
  kill -TERM "${WPID[c]}"; local rc=0; wait "${WPID[c]}" || rc=$?
  echo "SIGTERM worker c (slots $c_slots) after $(applied) credits applied: exit status $rc; starting it again"
  start_worker c2

  wait "$PUBLISHER_PID"; PUBLISHER_PID=""
  local unique dups total
  read -r unique dups _ total < <(sed -n 's/^publisher: unique=\([0-9]*\) duplicates=\([0-9]*\) malformed=\([0-9]*\) total_amount=\([0-9]*\)$/\1 \2 \3 \4/p' "$WORK/publisher.out")
  echo "publisher done: $unique credits, $dups duplicates; waiting for the fleet to drain..."
  for _ in $(seq 1 1200); do [ "$(applied)" -ge "$unique" ] && break; sleep 0.1; done
  wait_settled 2 || echo "  (the two remaining workers did not settle evenly)"
  sleep 1  # late redeliveries and re-sends must be skipped, not applied
  echo "at the end:"
  show_fleet a c2
  local stopped_ok=1
  for w in a c2; do
    kill -TERM "${WPID[$w]}"; wait "${WPID[$w]}" || stopped_ok=0; unset "WPID[$w]"
  done

  # What the broker had parked for b's slots: the in-flight credits (redelivered with
  # DUP=1 to the new holder) and b's turns of the round robin while the slots were dark
  # (1 in FLEET_SLOTS of what arrived between b's disconnect and the new connect).
  local inflight=0 parked=0 from to arrived
  for k in $dead; do
    from=$(awk -v s="$broker_line" -v id="fleet-$k" 'NR > s && $0 ~ ("[Cc]lient " id "[ ,]") &&
      /(closed its connection|disconnecting|disconnected)/ { print NR; exit }' "$WORK/mosquitto.log")
    to=$(awk -v s="${from:-$broker_line}" -v id="as fleet-$k " 'NR > s && index($0, id) { print NR; exit }' "$WORK/mosquitto.log")
    [ -n "$from" ] && [ -n "$to" ] || continue
    arrived=$(sed -n "${from},${to}p" "$WORK/mosquitto.log" | grep -c "Received PUBLISH from publisher" || true)
    # the redeliveries come first, before the queued turns (DUP=0)
    inflight=$((inflight + $(awk -v s="$to" -v id="Sending PUBLISH to fleet-$k (d" 'NR > s && index($0, id) {
      if (index($0, id "1")) n++; else exit } END { print n + 0 }' "$WORK/mosquitto.log")))
    parked=$((parked + arrived / FLEET_SLOTS))
  done

  local entries distinct balance claims dead_letters skipped accounts_ok accounts
  entries=$(pg "SELECT count(*) FROM ledger_entries")
  distinct=$(pg "SELECT count(DISTINCT message_id) FROM ledger_entries")
  balance=$(pg "SELECT coalesce(sum(balance), 0) FROM accounts")
  claims=$(pg "SELECT count(*) FROM mqtt_inbox.inbox_processed WHERE consumer_name = 'ledger'")
  dead_letters=$(pg "SELECT count(*) FROM mqtt_inbox.inbox_dead_letters")
  accounts=$(pg "SELECT count(*) FROM accounts")
  accounts_ok=$(pg "SELECT count(*) FROM accounts a WHERE a.balance =
    (SELECT sum(amount) FROM ledger_entries l WHERE l.account = a.account)")
  skipped=$(cat "$WORK"/worker-*.log | grep -c ': duplicate$' || true)

  echo
  echo "===== mqtt-inbox fleet demo: 3 workers on one PostgreSQL, b SIGKILLed for good, c restarted"
  printf '%-44s %s\n' "unique credit events published" "$unique"
  printf '%-44s %s\n' "duplicates re-sent by the publisher" "$dups"
  printf '%-44s %s\n' "duplicates delivered and skipped" "$skipped"
  printf '%-44s %s\n' "credits applied (ledger rows / distinct ids)" "$entries / $distinct"
  printf '%-44s %s\n' "claims in the inbox" "$claims"
  printf '%-44s %s\n' "dead letters" "$dead_letters"
  printf '%-44s %s\n' "expected total balance" "$total"
  printf '%-44s %s\n' "actual total balance" "$balance"
  printf '%-44s %s\n' "accounts whose balance = sum of entries" "$accounts_ok of $accounts"
  printf '%-44s %s\n' "b's slots ($dead) taken by survivors after" "$taken_ms ms (lease $FLEET_LEASE_MS ms)"
  printf '%-44s %s\n' "  and connected, subscribed again after" "$served_ms ms"
  printf '%-44s %s\n' "  parked in them, drained by the survivors" "~$((inflight + parked)) messages: $inflight in flight at the kill (DUP=1), ~$parked queued turns"

  if [ "$entries" = "$unique" ] && [ "$distinct" = "$unique" ] && [ "$claims" = "$unique" ] &&
     [ "$balance" = "$total" ] && [ "$dead_letters" = 0 ] && [ "$skipped" -ge "$dups" ] &&
     [ "$accounts_ok" = "$accounts" ] && [ -n "$taker" ] && [ "$stopped_ok" = 1 ]; then
    echo "exactly-once: OK"
  else
    echo "exactly-once: FAILED (logs in $WORK)"
    return 1
  fi
  trap - EXIT
  fleet_cleanup
  if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs kept in $WORK"; else rm -rf "$WORK"; fi
}

# Each part runs in a process of its own (scripts/demo.sh --run-part NAME): its traps, its
# exit on the first failed command (set -e), and its clean-up stay its own.
if [ "${1:-}" = "--run-part" ]; then
  "demo_$2"
  exit 0
fi

PART="${1:-all}"
case "$PART" in
  all) PARTS=(single fleet) ;;
  single | fleet) PARTS=("$PART") ;;
  *) echo "usage: scripts/demo.sh [all|single|fleet]" >&2; exit 2 ;;
esac

stage deps install_packages "${MQTT_INBOX_PACKAGES[@]}"
# The fleet needs the PostgreSQL store: ON, also in a build folder configured before
# libpqxx-dev was installed.
stage build bash -c "cmake -S '$ROOT' -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMQTT_INBOX_BUILD_TESTS=OFF -DMQTT_INBOX_WITH_POSTGRES=ON >/dev/null && \
  cmake --build '$BUILD' -j 2 --target ledger_consumer event_consumer publisher"

FAILED=()
for part in "${PARTS[@]}"; do
  case "$part" in
    single) label="single consumer run" ;;
    fleet) label="fleet run" ;;
  esac
  stage "$label" "$ROOT/scripts/demo.sh" --run-part "$part" || FAILED+=("$label")
done
print_stage_summary
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "exactly-once: FAILED in: ${FAILED[*]} (its logs are kept, named above)"
  exit 1
fi
RAN="${PARTS[*]/single/single consumer run}"
RAN="${RAN/fleet/fleet run}"
echo "exactly-once: OK (${RAN/run fleet/run, fleet})"

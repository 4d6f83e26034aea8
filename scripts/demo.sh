#!/usr/bin/env bash
# The main job: an MQTT QoS 1 consumer applies a stream full of duplicates, malformed
# messages and crashes exactly once, on a real mosquitto and a real SQLite file, and
# passes one event per applied credit on to a second consumer, exactly once too.
#
#   scripts/demo.sh
#
# It installs what is missing, builds, starts mosquitto on a free 127.0.0.1 port (sessions
# kept, queues never dropped), starts examples/event_consumer (the second hop) and
# examples/ledger_consumer --emit-topic events/credited (the first: each applied credit
# enqueues one event in its transaction, and its outbox relay publishes it), publishes
# credits with duplicates and malformed messages, SIGKILLs the ledger consumer twice and
# the event consumer once mid-stream, each at a different moment, and restarts them,
# waits for both hops to drain, checks the balances and that every applied credit had
# exactly one effect downstream, and prints "exactly-once: OK" (or exits non-zero). Every
# process it started is stopped on exit.
#
# Environment: COUNT (unique credits, default 2500), DUPLICATES (fraction, default 0.25),
# MALFORMED (default 12), RATE (msgs/s, default 800), MQTT_VERSION (3.1.1, the
# programs' default, or 5; default 3.1.1: the outbox relay then carries each event's id in
# its JSON, tests/crash/two_hop_test.cpp runs both).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/lib.sh"
COUNT="${COUNT:-2500}"
DUPLICATES="${DUPLICATES:-0.25}"
MALFORMED="${MALFORMED:-12}"
RATE="${RATE:-800}"
MQTT_VERSION="${MQTT_VERSION:-3.1.1}"
BUILD="$ROOT/build-demo"

stage deps install_packages "${MQTT_INBOX_PACKAGES[@]}"
stage build bash -c "cmake -S '$ROOT' -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMQTT_INBOX_BUILD_TESTS=OFF >/dev/null && cmake --build '$BUILD' -j 2 --target ledger_consumer event_consumer publisher"

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
print_stage_summary

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
  exit 1
fi
rm -rf "$WORK"

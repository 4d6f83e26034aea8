#!/usr/bin/env bash
# What the broker does with a dead member of a shared subscription (issue 31's facts,
# measured again on the broker installed here; docs/brokers-and-tls.md#shared-subscriptions).
#
#   scripts/shared-subscription-facts.sh
#
# For MQTT 3.1.1 and 5, with durable and with clean sessions: two members A and B of
# $share/g/t/# (mosquitto_sub, QoS 1) on a private mosquitto (127.0.0.1, free port,
# max_queued_messages 0). 10 messages while both live (p1); A frozen with SIGSTOP, so that
# its share of the next 10 (p2) stays in flight unacked; A killed for good; 10 more (p3);
# then A comes back with its client id (in the last run: after its MQTT 5 session expired). Prints who got what, and the DUP flag on A's return.
# Needs mosquitto and mosquitto-clients (scripts/test.sh installs both).
set -euo pipefail
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
cd "$WORK"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
count() { grep -c "^$1-" "$2" || true; }
publish() {  # publish PREFIX VERSION
  for i in $(seq 1 10); do mosquitto_pub -h 127.0.0.1 -p "$PORT" -q 1 -V "$2" -t t/x -m "$1-$i"; done
}

run() {  # run VERSION DURABLE [SESSION_EXPIRY_S]: with an expiry, A returns after it
  local v="$1" durable="$2" expiry="${3:-}" dur=()
  PORT="$(free_port)"
  printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\n' \
    "$PORT" > m.conf
  mosquitto -c m.conf > broker.log 2>&1 & local broker=$!
  sleep 0.4
  if [ "$durable" = 1 ]; then
    if [ "$v" = mqttv5 ]; then dur=(-c -x "${expiry:-600}"); else dur=(-c); fi
  fi
  local sub=(-h 127.0.0.1 -p "$PORT" -q 1 -V "$v" -t '$share/g/t/#' -F '%p')
  mosquitto_sub "${sub[@]}" "${dur[@]}" -i A > A1.out 2>&1 & local a=$!
  mosquitto_sub "${sub[@]}" "${dur[@]}" -i B > B.out 2>&1 & local b=$!
  sleep 0.5
  publish p1 "$v"; sleep 0.5
  kill -STOP "$a"; publish p2 "$v"; sleep 0.5
  kill -9 "$a"; wait "$a" 2>/dev/null || true; sleep 1.5
  publish p3 "$v"; sleep 1
  if [ -n "$expiry" ]; then sleep "$expiry"; fi
  mosquitto_sub "${sub[@]}" "${dur[@]}" -i A -d > A2.out 2>&1 & local a2=$!
  sleep 1.5
  kill "$a2" "$b" 2>/dev/null || true; kill "$broker"; wait "$a2" "$b" "$broker" 2>/dev/null || true
  printf '| %-8s | %-20s | %2s | %2s | %2s of 10 | %2s of 10 | %2s | %2s | %2s |\n' "$v" \
    "$([ "$durable" = 1 ] && echo "durable${expiry:+, expires ${expiry} s}" || echo clean)" "$(count p1 A1.out)" "$(count p1 B.out)" \
    "$(count p2 B.out)" "$(count p3 B.out)" "$(count p2 A2.out)" "$(count p3 A2.out)" \
    "$(grep -c 'received PUBLISH (d1' A2.out || true)"
}

echo "$(mosquitto -h 2>&1 | head -1)"
echo
echo "| MQTT     | session | p1 to A | p1 to B | p2 to B (A frozen) | p3 to B (A dead) | A back: p2 | A back: p3 | of them DUP=1 |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for v in mqttv311 mqttv5; do
  for d in 1 0; do run "$v" "$d"; done
done
run mqttv5 1 2

# Shared helpers for the scripts/ entry points. Sourced, not run.

# Host packages the project builds and tests with (Debian 12). libsystemd-dev: sd_notify
# and the journal sink (optional for the library); systemd: systemd-analyze verify and
# systemd-sysusers for the unit and package tests (nothing is started). postgresql-15 and
# libpqxx-dev: the tests' private PostgreSQL clusters (tests/support/postgres.h; they use
# no TCP port, so the cluster the package may start on 5432 does not matter to them).
# clang-format: the ctest format_check (.clang-format; Debian 12's is clang-format 14).
MQTT_INBOX_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libsqlite3-dev sqlite3 libsqlitecpp-dev
  libpaho-mqtt-dev libpaho-mqttpp-dev libspdlog-dev libssl-dev openssl
  googletest libgtest-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev
  mosquitto mosquitto-clients
  rabbitmq-server
  postgresql-15 libpqxx-dev
  libsystemd-dev systemd
  clang-format
)
# The fuzzers' compiler (scripts/fuzz.sh; libFuzzer needs clang).
MQTT_INBOX_FUZZ_PACKAGES=(clang libclang-rt-14-dev)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# install_packages PKG...: installs the ones that are missing, with one apt-get update.
install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# stage NAME CMD...: runs CMD, prints its duration, and records it for the summary.
STAGE_SUMMARY=()
stage() {
  local name="$1"; shift
  local t0=$SECONDS
  printf '\n===== stage: %s\n' "$name"
  "$@"
  local rc=$?
  local dt=$((SECONDS - t0))
  STAGE_SUMMARY+=("$(printf '%-28s %4ds  %s' "$name" "$dt" "$([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")")")
  printf '===== stage %s: %ds (%s)\n' "$name" "$dt" "$([ $rc -eq 0 ] && echo ok || echo "failed $rc")"
  return $rc
}

print_stage_summary() {
  printf '\n===== stage durations\n'
  for line in "${STAGE_SUMMARY[@]}"; do echo "$line"; done
}

# free_port: a TCP port on 127.0.0.1 nobody listens on.
free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}

# write_mosquitto_conf PORT DIR: a broker config that keeps sessions and never drops
# queued messages (docs/guarantees.md section 2).
write_mosquitto_conf() {
  local port="$1" dir="$2"
  {
    echo "listener $port 127.0.0.1"
    echo "allow_anonymous true"
    echo "persistence true"
    echo "persistence_location $dir/"
    echo "max_queued_messages 0"
    echo "log_dest file $dir/mosquitto.log"
    # As root mosquitto drops to the 'mosquitto' user, which cannot write $dir.
    [ "$(id -u)" -eq 0 ] && echo "user root"
  } > "$dir/mosquitto.conf"
}

#!/usr/bin/env bash
# Start a throwaway PostgreSQL for the test suite (installing Debian's server if missing) and print the
# SQLAlchemy URL to use. Usage: url=$(bash .ci/postgres.sh /tmp/some-dir [port]); stop: .ci/postgres.sh stop DIR
set -euo pipefail
if [ "${1:-}" = "stop" ]; then
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$bindir/pg_ctl" -D "$2" -m fast stop >/dev/null || true
  else "$bindir/pg_ctl" -D "$2" -m fast stop >/dev/null || true; fi
  exit 0
fi
root="${1:?data directory}"
port="${2:-55432}"
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  export DEBIAN_FRONTEND=noninteractive
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq >&2
  $SUDO apt-get install -y -qq postgresql >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi
# PostgreSQL refuses to run as root: run it as the 'postgres' system user when we are root.
run() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
mkdir -p "$root"
chmod 755 "$(dirname "$root")"
if [ "$(id -u)" = 0 ]; then chown postgres "$root"; fi
if [ ! -f "$root/PG_VERSION" ]; then
  run "$bindir/initdb" -D "$root" -U postgres --auth=trust >/dev/null
fi
run "$bindir/pg_ctl" -D "$root" -o "-p $port -k $root -c listen_addresses=127.0.0.1 -c max_connections=200" \
  -l "$root/server.log" -w start >/dev/null
run "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres labeldp_test 2>/dev/null || true
echo "postgresql+psycopg://postgres@127.0.0.1:$port/labeldp_test"

#!/bin/sh
# Entry point of the Debian-built PostgreSQL image (deploy/images/postgres.Dockerfile). On an empty data
# directory: initdb with POSTGRES_USER as the superuser (password from POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE,
# never printed), POSTGRES_DB created, /docker-entrypoint-initdb.d/*.sql run — all on a server that listens on no
# TCP port and a private socket directory, so `pg_isready` (default socket) fails until the real server starts.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE"); fi
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
  echo "postgres-entrypoint: set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE" >&2
  exit 1
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  umask 077
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=scram-sha-256 --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  init_socket=$(mktemp -d)
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=$init_socket" start >/dev/null
  export PGPASSWORD="$POSTGRES_PASSWORD" PGHOST="$init_socket" PGUSER="$POSTGRES_USER"
  if [ "$POSTGRES_DB" != postgres ]; then
    psql -v ON_ERROR_STOP=1 -q -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  for script in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$script" ] || continue
    echo "postgres-entrypoint: running $script"
    psql -v ON_ERROR_STOP=1 -q -d "$POSTGRES_DB" -f "$script"
  done
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  unset PGPASSWORD PGHOST PGUSER
  rmdir "$init_socket"
  echo "postgres-entrypoint: database cluster initialized"
fi

if [ "${1:-}" = postgres ]; then
  shift
  exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"

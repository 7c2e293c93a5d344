#!/usr/bin/env bash
# PostgreSQL for the store tests: a throwaway cluster under .services/postgres,
# listening on 127.0.0.1:55432 only (unix socket inside the cluster's folder),
# trust auth, database strata_test with pg_trgm. Reuses a cluster that is
# already running from an earlier run.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PORT=55432
DB=strata_test

pg_bindir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

# Debian's postgresql package has no command on PATH to test for; the
# versioned server binaries are the sign that it is installed.
if [ -z "$(pg_bindir)" ]; then ensure_packages "postgresql-server-missing:postgresql"; fi
BIN="$(pg_bindir)"
# pg_trgm ships with the server on Debian 12; older layouts split it into -contrib.
if [ ! -f "$("$BIN/pg_config" --pkglibdir 2>/dev/null || echo "$BIN/../lib")/pg_trgm.so" ]; then
  ensure_packages "pg-trgm-missing:postgresql-contrib"
fi

# The server refuses to run as root: as root, run it as the postgres user.
as_pg() {
  # From /, which the postgres user can always enter (the checkout may be private).
  if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

ROOT="$SERVICES_DIR/postgres"
mkdir -p "$ROOT"
[ "$(id -u)" = 0 ] && chown postgres: "$ROOT"
# A checkout under a private home (e.g. /root) is not reachable by the postgres
# user; keep the cluster in /var/tmp then, one per checkout.
if ! as_pg test -w "$ROOT"; then
  ROOT="/var/tmp/strata-postgres-$(printf '%s' "$STRATA_ROOT" | md5sum | cut -c1-12)"
  mkdir -p "$ROOT" && chown postgres: "$ROOT"
  echo "postgres cannot reach $SERVICES_DIR; using $ROOT"
fi
DATA="$ROOT/data"
SOCKETS="$ROOT/run"
LOG="$ROOT/postgres.log"

ready() { "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; }

# Whatever answers on the port is reused: this checkout's cluster from an earlier
# run, or another checkout's (both are throwaway test clusters with trust auth).
if ready; then
  echo "postgres already running on 127.0.0.1:$PORT"
else
  # A half-made or other-version cluster is thrown away: it only ever holds test data.
  if [ -d "$DATA" ] && [ "$(cat "$DATA/PG_VERSION" 2>/dev/null)" != "$(basename "$(dirname "$BIN")")" ]; then
    rm -rf "$DATA"
  fi
  if [ ! -d "$DATA" ]; then
    as_pg mkdir -p "$SOCKETS"
    as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-locale >/dev/null
    cat >>"$DATA/postgresql.conf" <<CONF
# strata test cluster
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCKETS'
max_connections = 200
# Throwaway data: durability is not worth the disk flushes here.
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
  fi
  as_pg mkdir -p "$SOCKETS"
  as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
  wait_for 30 ready
fi

psql_admin() { PGOPTIONS="-c client_min_messages=warning" "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres "$@"; }
if [ "$(psql_admin -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]; then
  psql_admin -d postgres -c "CREATE DATABASE $DB"
fi
psql_admin -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS pg_trgm" >/dev/null

export_env STRATA_POSTGRES_URL "postgres://postgres@127.0.0.1:$PORT/$DB"
# The restart tests start a private cluster of their own with these binaries.
export_env STRATA_POSTGRES_BIN "$BIN"

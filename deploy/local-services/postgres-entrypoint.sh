#!/bin/sh
# The official postgres image's contract, as deploy/compose.yaml uses it: POSTGRES_USER,
# POSTGRES_DB, POSTGRES_PASSWORD_FILE; an empty volume is initialised once (scram-sha-256 for
# every network client), then PostgreSQL runs as the postgres user.
set -eu
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ "$(id -u)" = 0 ]; then
  chown postgres:postgres "$PGDATA" /run/postgresql
  chmod 0700 "$PGDATA"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pw=$(mktemp) && chown postgres "$pw"
    cat "${POSTGRES_PASSWORD_FILE:?POSTGRES_PASSWORD_FILE is required}" > "$pw"
    setpriv --reuid postgres --regid postgres --init-groups \
      initdb --username="$user" --pwfile="$pw" --auth-local=trust --auth-host=scram-sha-256 \
      --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
    rm -f "$pw"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    [ "$db" = postgres ] || echo "CREATE DATABASE \"$db\" OWNER \"$user\";" \
      | setpriv --reuid postgres --regid postgres --init-groups postgres --single -D "$PGDATA" postgres >/dev/null
  fi
  exec setpriv --reuid postgres --regid postgres --init-groups "$0" "$@"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"

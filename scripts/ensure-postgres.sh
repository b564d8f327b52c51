#!/usr/bin/env bash
# Starts the machine's Postgres cluster if nothing answers on the test
# server's address. Does nothing when Postgres is already up, or when this
# machine has no Debian cluster to start (the tests then explain what to do).
set -euo pipefail
host=${PGHOST:-127.0.0.1}
port=${PGPORT:-5432}
if pg_isready -q -h "$host" -p "$port" 2>/dev/null; then
  exit 0
fi
if ! command -v pg_ctlcluster >/dev/null || [ ! -d /etc/postgresql ]; then
  echo "ensure-postgres: nothing answers on $host:$port and there is no Debian cluster to start" >&2
  exit 0
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
echo "ensure-postgres: starting Postgres $version" >&2
pg_ctlcluster --skip-systemctl-redirect "$version" main start
for _ in $(seq 1 30); do
  pg_isready -q -h "$host" -p "$port" && exit 0
  sleep 1
done
echo "ensure-postgres: Postgres did not come up on $host:$port within 30s" >&2
exit 1

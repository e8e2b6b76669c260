#!/usr/bin/env bash
# Entry point of the PostgreSQL standby container: the first time (no data folder yet) it
# clones the primary with pg_basebackup -R, which writes standby.signal and the connection to
# the primary (primary_conninfo, primary_slot_name) into the clone; then it hands over to its
# arguments, the image's own entrypoint (compose.yaml: command). Later starts skip the clone
# and the standby resumes streaming where it stopped.
#
# Environment: PGDATA, PRIMARY_HOST, PRIMARY_PORT (5432), REPLICATION_USER,
# REPLICATION_PASSWORD, REPLICATION_SLOT (standby).
set -euo pipefail
: "${PGDATA:?}" "${PRIMARY_HOST:?}" "${REPLICATION_USER:?}" "${REPLICATION_PASSWORD:?}"
PRIMARY_PORT=${PRIMARY_PORT:-5432}
REPLICATION_SLOT=${REPLICATION_SLOT:-standby}

# PostgreSQL's tools refuse to run as root.
as_postgres() {
    if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [[ ! -s $PGDATA/PG_VERSION ]]; then
    parent=$(dirname "$PGDATA")
    clone=$PGDATA.clone
    mkdir -p "$parent"
    [[ $(id -u) == 0 ]] && chown postgres: "$parent"
    until as_postgres "$(command -v pg_isready)" -q -h "$PRIMARY_HOST" -p "$PRIMARY_PORT" -t 2; do
        echo "standby: waiting for the primary $PRIMARY_HOST:$PRIMARY_PORT" >&2
        sleep 2
    done
    echo "standby: cloning $PRIMARY_HOST:$PRIMARY_PORT into $PGDATA" >&2
    # Cloned aside and renamed when complete: a clone cut short is never taken for a data
    # folder (it is started over at the next start).
    rm -rf "$clone"
    export PGPASSWORD=$REPLICATION_PASSWORD
    as_postgres "$(command -v pg_basebackup)" -h "$PRIMARY_HOST" -p "$PRIMARY_PORT" \
        -U "$REPLICATION_USER" -w -D "$clone" -R -X stream -S "$REPLICATION_SLOT" -c fast
    unset PGPASSWORD
    mv "$clone" "$PGDATA"
fi

exec "$@"

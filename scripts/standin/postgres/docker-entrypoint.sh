#!/usr/bin/env bash
# Entry point of localhost/postgres-standin:15 (scripts/local-base-images.sh), a stand-in for
# the official postgres:15 image made from Debian's postgresql-15 where no registry is
# reachable. It does the part of the official docker-entrypoint.sh that compose.yaml and
# deploy/postgres rely on, in the same way:
#   - `postgres ...` (or only flags) as root: PGDATA and /var/run/postgresql are made owned
#     by postgres, then the script runs itself again as postgres;
#   - an empty PGDATA: initdb with POSTGRES_USER (postgres) and POSTGRES_PASSWORD (SCRAM),
#     then a temporary server on the unix socket only, started with the same arguments,
#     POSTGRES_DB created if it is not "postgres", and /docker-entrypoint-initdb.d/* run in
#     name order (*.sh executed when executable, sourced otherwise; *.sql through psql),
#     then that server is stopped;
#   - finally exec of the arguments.
# Not done (unused here): POSTGRES_HOST_AUTH_METHOD, POSTGRES_INITDB_WALDIR, *.sql.gz/xz/zst,
# the pg_hba.conf line the official image adds to PGDATA (compose.yaml sets hba_file).
set -Eeo pipefail

if [[ ${1:-} == -* ]]; then set -- postgres "$@"; fi

if [[ ${1:-} == postgres ]]; then
    : "${PGDATA:?PGDATA must be set}"
    if [[ $(id -u) == 0 ]]; then
        mkdir -p "$PGDATA" /var/run/postgresql
        chown postgres: "$PGDATA" /var/run/postgresql
        chmod 700 "$PGDATA"
        chmod 3777 /var/run/postgresql
        exec runuser -u postgres -- "${BASH_SOURCE[0]}" "$@"
    fi
    if [[ ! -s $PGDATA/PG_VERSION ]]; then
        : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set for a new database (as with the official image)}"
        export POSTGRES_USER=${POSTGRES_USER:-postgres}
        POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
        # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of words, as in the official image
        initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
            --auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA" $POSTGRES_INITDB_ARGS
        # The temporary server: the caller's arguments, but reachable on the unix socket only.
        shift
        pg_ctl -D "$PGDATA" -w -o "$(printf '%q ' "$@" -c listen_addresses= -p 5432)" start
        export PGPORT=5432 PGHOST=/var/run/postgresql PGUSER=$POSTGRES_USER
        if [[ $POSTGRES_DB != postgres ]]; then
            psql -v ON_ERROR_STOP=1 --no-psqlrc --dbname postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
        fi
        for f in /docker-entrypoint-initdb.d/*; do
            [[ -e $f ]] || continue
            case $f in
                *.sh)
                    if [[ -x $f ]]; then echo "entrypoint: running $f"; "$f"
                    else echo "entrypoint: sourcing $f"; # shellcheck disable=SC1090
                        . "$f"; fi ;;
                *.sql) echo "entrypoint: running $f"
                    psql -v ON_ERROR_STOP=1 --no-psqlrc --dbname "$POSTGRES_DB" -f "$f" ;;
                *) echo "entrypoint: ignoring $f" ;;
            esac
        done
        pg_ctl -D "$PGDATA" -m fast -w stop
        unset PGPORT PGHOST PGUSER
        set -- postgres "$@"
        echo "entrypoint: PostgreSQL init process complete; ready for start up."
    fi
fi

exec "$@"

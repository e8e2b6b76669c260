#!/usr/bin/env bash
# Runs once, when the primary's data folder is created (mounted into
# /docker-entrypoint-initdb.d; the image's entrypoint runs it with a server listening on its
# unix socket only). Creates the collector's role and database, the replication role, and
# the standby's replication slot. Passwords come from the environment (compose.yaml takes
# them from .env) and reach SQL as psql variables, quoted by psql (:'name').
# No `set -e` here: the entrypoint may source this file; ON_ERROR_STOP and `:?` stop it.
: "${COLLECTOR_DB_PASSWORD:?COLLECTOR_DB_PASSWORD must be set}"
: "${REPLICATION_PASSWORD:?REPLICATION_PASSWORD must be set}"

psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" --dbname postgres \
    -v collector_password="$COLLECTOR_DB_PASSWORD" \
    -v replication_password="$REPLICATION_PASSWORD" <<'SQL'
CREATE ROLE collector LOGIN PASSWORD :'collector_password';
-- Owned by collector: `collector migrate` creates its tables in the public schema.
CREATE DATABASE collector OWNER collector;
CREATE ROLE replicator LOGIN REPLICATION PASSWORD :'replication_password';
SELECT pg_create_physical_replication_slot('standby');
SQL

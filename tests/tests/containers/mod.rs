//! The container files checked without a container engine: `compose.yaml` (validated by
//! `docker-compose`, then its resolved form), `deploy/caddy/Caddyfile` (`caddy validate`,
//! `caddy fmt`), ClickHouse's and Keeper's XML under `deploy/`, PostgreSQL 15 run with
//! `deploy/postgres`'s files (a primary and a streaming standby), the `Dockerfile` and
//! `.dockerignore` (built when a Docker engine answers, else checked statically with the
//! dependency layer replayed by `cargo metadata`), and the licence notices. One test per fact;
//! the image itself is built and run by `containers_engine/`.
//!
//! Needs `docker-compose`, `caddy` and PostgreSQL 15 (`scripts/check-containers.sh` installs
//! them) and root (PostgreSQL runs as the `postgres` user).
//!
//! One file per subject: [`compose`], [`clickhouse_users`], [`monitoring`], [`caddy`],
//! [`clickhouse`], [`edge`], [`image`] (the Dockerfile), [`postgres`].

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use collector_tests::common::containers::compose::{
    docker_compose, duration_s, placeholder_env, rel_to_root, Compose, Service, ONE_SHOTS,
    PASSWORDS,
};
use collector_tests::common::containers::deploy_files::{
    each_replica_config, files_under, grants_of, ipv4_net, keeper_xml, password_env, shape,
    with_users_xml, yaml_file,
};
use collector_tests::common::containers::dockerfile::{self, copy_words, Dockerignore};
use collector_tests::common::containers::scratch_pg::{ScratchPg, PG_BIN};
use collector_tests::common::containers::xml::{self, find, find_all, own_text, tag, text};
use collector_tests::common::containers::{
    assert_no_problems, docker_engine_answers, output, run_ok,
};
use collector_tests::common::root;

mod caddy;
mod clickhouse;
mod clickhouse_users;
mod compose;
mod edge;
mod image;
mod monitoring;
mod postgres;

/// What the drain may take beyond `COLLECTOR_DRAIN_GRACE`: in-flight requests (10 s) and the
/// writer's last flush (10 s), docs/edge.md "Drain".
const DRAIN_EXTRA_S: f64 = 20.0;
/// Services that may publish a port on the host's loopback (monitoring); caddy publishes the
/// public one. No ClickHouse server: its `default` user is reached from inside only.
const LOOPBACK_PORTS: [&str; 2] = ["grafana", "prometheus"];
/// ClickHouse's users (deploy/clickhouse/users.xml): the serving collectors' write user, the
/// one-shot commands' migrate user, and Grafana's.
const CH_WRITER: &str = "collector";
const CH_MIGRATE: &str = "migrate";
const CH_READER: &str = "dashboard";
/// The one-shots of the collector image (logging in as [`CH_MIGRATE`]).
const COLLECTOR_ONE_SHOTS: [&str; 3] = ["migrate", "retention", "seed"];

fn c() -> &'static Compose {
    Compose::resolved()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

//! What the container checks share (`tests/tests/containers/`, the static checks, and
//! `tests/tests/containers_engine/`, the image and compose services on podman):
//!
//! - [`compose`]: `compose.yaml` as `docker-compose config` resolves it;
//! - [`deploy_files`]: readers of `deploy/`'s YAML and XML (users and grants, replica configs);
//! - [`dockerfile`]: the `Dockerfile`'s stages and `.dockerignore`'s rule;
//! - [`xml`]: path lookups in ClickHouse's XML files (`roxmltree`);
//! - [`scratch_pg`]: throw-away PostgreSQL 15 servers run with `deploy/postgres`'s files;
//! - [`engine`]: podman, its settings for this machine, and the image's containers;
//! - [`engine_compose`]: the part of `compose.yaml` that runs under podman here;
//! - [`traffic`]: beacons to the containers, rows in ClickHouse, the spool metric;
//! - [`zk`]: ZooKeeper's client protocol, for who may read the replication metadata.
pub mod compose;
pub mod deploy_files;
pub mod dockerfile;
pub mod engine;
pub mod engine_compose;
pub mod scratch_pg;
pub mod traffic;
pub mod xml;
pub mod zk;

use std::process::{Command, Output};

/// Panics with every problem, one a line, when there is any.
#[track_caller]
pub fn assert_no_problems(problems: Vec<String>) {
    assert!(problems.is_empty(), "\n  {}", problems.join("\n  "));
}

/// Runs `cmd` to its end and returns what it printed; panics naming the program when it
/// cannot be started (not installed).
pub fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {:?} (scripts/check-containers.sh installs it): {e}",
            cmd.get_program()
        )
    })
}

/// Runs `cmd` and panics with its status, stdout and stderr unless it exits 0; returns its
/// stdout.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether a Docker engine answers `docker info` within 10 s (then the Dockerfile is built;
/// else checked statically).
pub fn docker_engine_answers() -> bool {
    Command::new("timeout")
        .args(["10", "docker", "info"])
        .output()
        .is_ok_and(|o| o.status.success())
}

//! The image and the compose services for real, with podman: the image built from the
//! unchanged `Dockerfile` (base images made locally by `scripts/local-base-images.sh`, no
//! registry), its configuration, size, backtraces and licence notices; the image run as
//! compose.yaml runs a collector against a loopback stack of its own (three replicas); and the
//! services of compose.yaml this machine can run, started by `docker-compose` on podman's
//! Docker API socket. Keeper, the ClickHouse 25.3 servers and Caddy are not run (no images for
//! them here): `containers/` checks them statically.
//!
//! Every test is `#[ignore]`d: `scripts/check-containers.sh --engine` runs them (`--ignored
//! --test-threads=1`) at the end of `scripts/test.sh`, never beside the other tests. Where
//! podman cannot run containers they fail; they do not pass.
//!
//! One file per subject: [`image`], [`run`] (the image run as compose runs it), [`compose`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use collector_tests::common::containers::compose::{duration_s, Compose};
use collector_tests::common::containers::engine::{
    wait_for, Podman, Project, BASE_IMAGE, IMAGE, NPROC, PG_STANDIN,
};
use collector_tests::common::containers::engine_compose::{
    derive, ApiService, HealthTicker, Local,
};
use collector_tests::common::containers::traffic::{
    answers_200, clickhouse, clickhouse_as, interserver_fetch, select1_as, send_beacons,
    spool_records, stored_once,
};
use collector_tests::common::containers::zk::{self, NO_AUTH};
use collector_tests::common::containers::{output, run_ok};
use collector_tests::common::{root, Ch26Server, Stack};

mod compose;
mod image;
mod run;

const SECOND: Duration = Duration::from_secs(1);

/// podman with the image built (once per run).
fn podman() -> &'static Podman {
    let podman = Podman::get();
    podman.image();
    podman
}

/// compose.yaml's stop_grace_period of collector-a, in whole seconds.
fn stop_grace() -> u64 {
    let grace = Compose::resolved()
        .service("collector-a")
        .str("stop_grace_period")
        .unwrap_or("10s");
    duration_s(grace) as u64
}

/// `podman stop` (or `docker-compose stop`, `stop`) of container `name` within compose's
/// stop_grace_period: it must exit 0 (drained, not killed) before that runs out.
fn stopped_in_grace(name: &str, stop: impl FnOnce()) {
    let grace = stop_grace();
    let start = Instant::now();
    stop();
    let took = start.elapsed();
    let rc = Podman::get().inspect(name, "{{.State.ExitCode}}");
    eprintln!("note: {name} stopped in {took:.1?} (stop_grace_period {grace} s), exit status {rc}");
    assert_eq!(
        rc, "0",
        "{name} exit status after SIGTERM (want 0: drained)"
    );
    assert!(
        took < Duration::from_secs(grace),
        "{name} took {took:?} to stop, not within {grace} s"
    );
}

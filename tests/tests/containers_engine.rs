//! The image and the compose services for real, with podman: the image built from the
//! unchanged `Dockerfile` (base images made locally by `scripts/local-base-images.sh`, no
//! registry), its configuration, size, backtraces and licence notices; the image run as
//! compose.yaml runs a collector against a loopback stack of its own (three replicas); and the
//! services of compose.yaml this machine can run, started by `docker-compose` on podman's
//! Docker API socket. Keeper, the ClickHouse 25.3 servers and Caddy are not run (no images for
//! them here): `containers.rs` checks them statically.
//!
//! Every test is `#[ignore]`d: `scripts/check-containers.sh --engine` runs them (`--ignored
//! --test-threads=1`) at the end of `scripts/test.sh`, never beside the other tests. Where
//! podman cannot run containers they fail; they do not pass.

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

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn podman_runs_a_container_with_runc_and_host_network() {
    let podman = Podman::get();
    let info = podman.run(&[
        "info",
        "--format",
        "{{.Host.OCIRuntime.Name}} {{.Store.GraphDriverName}}",
    ]);
    assert!(
        info.starts_with("runc "),
        "podman's runtime and storage driver: {info} (want runc)"
    );
    podman.run(&["run", "--rm", "--network", "host", BASE_IMAGE, "true"]);
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn image_builds_from_the_unchanged_dockerfile() {
    let podman = podman();
    let id = podman.run(&["image", "inspect", "--format", "{{.Id}}", IMAGE]);
    assert!(!id.is_empty(), "no image {IMAGE} after the build");
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn image_runs_as_uid_10001_with_probe_healthcheck_sigterm_and_spool_volume() {
    let podman = podman();
    let field = |f: &str| podman.run(&["image", "inspect", "--format", f, IMAGE]);
    assert_eq!(field("{{.Config.User}}"), "10001:10001", "USER");
    assert_eq!(
        field("{{json .Config.Healthcheck.Test}}"),
        r#"["CMD","/usr/local/bin/collector","probe"]"#,
        "HEALTHCHECK"
    );
    assert_eq!(field("{{.Config.StopSignal}}"), "SIGTERM", "STOPSIGNAL");
    assert_eq!(
        field("{{json .Config.Volumes}}"),
        r#"{"/var/lib/collector/spool":{}}"#,
        "VOLUME"
    );
    assert_eq!(
        field("{{json .Config.Entrypoint}}"),
        r#"["/usr/local/bin/collector"]"#,
        "ENTRYPOINT"
    );
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn image_is_its_base_and_the_binary_only_without_build_tools() {
    let podman = podman();
    let size_of = |image: &str| -> i64 {
        podman
            .run(&["image", "inspect", "--format", "{{.Size}}", image])
            .parse()
            .unwrap()
    };
    let (size, base) = (size_of(IMAGE), size_of(BASE_IMAGE));
    let run = |args: &[&str]| {
        let mut all = vec!["run", "--rm", "--network", "host", "--entrypoint"];
        all.extend_from_slice(args);
        podman.run(&all)
    };
    let bin: i64 = run(&["stat", IMAGE, "-c", "%s", "/usr/local/bin/collector"])
        .parse()
        .unwrap();
    let probe =
        "for t in cc gcc ld cargo rustc rustup make git curl; do command -v $t || true; done";
    let tools = run(&["sh", IMAGE, "-c", probe]);
    eprintln!(
        "note: image {} MB: base {} MB + collector binary {} MB + {} kB",
        size / 1_000_000,
        base / 1_000_000,
        bin / 1_000_000,
        (size - base - bin) / 1000
    );
    // Small: at most 5 MB beside the base and the binary (no build stage left over), and at
    // most 40 MiB added to the base (issue 39's goal).
    assert!(
        size - base - bin <= 5_000_000,
        "{} bytes beyond the base and the binary, more than 5 MB",
        size - base - bin
    );
    assert!(
        size - base <= 40 * 1_048_576,
        "adds {} MiB to its base, more than 40",
        (size - base) / 1_048_576
    );
    assert!(
        tools.is_empty(),
        "build tools in the runtime image: {tools}"
    );
}

/// The bytes of the file `path` inside the image (`cat` as its entrypoint); fails naming the
/// path when the image has no such file.
fn file_in_image(path: &str) -> Vec<u8> {
    let out = output(&mut podman().cmd(&[
        "run",
        "--rm",
        "--network",
        "host",
        "--entrypoint",
        "cat",
        IMAGE,
        path,
    ]));
    assert!(out.status.success(), "no {path} in the image");
    out.stdout
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn image_binary_keeps_compressed_line_tables_for_backtraces() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("collector-from-image");
    std::fs::write(&bin, file_in_image("/usr/local/bin/collector")).unwrap();
    let sections = run_ok(
        std::process::Command::new("readelf")
            .args(["-S", "-W"])
            .arg(&bin),
    );
    for s in [".debug_line", ".debug_info"] {
        let compressed = regex::Regex::new(&format!(r"\{s} .* C "))
            .unwrap()
            .is_match(&sections);
        assert!(
            compressed,
            "no compressed {s} section in the image's binary:\n{sections}"
        );
    }
    let symbols = run_ok(std::process::Command::new("nm").arg("-C").arg(&bin));
    let addr = symbols
        .lines()
        .find_map(|l| {
            l.split_once(' ')
                .filter(|(_, rest)| rest.get(2..) == Some("collector::main"))
                .map(|(a, _)| a.to_owned())
        })
        .expect("no symbol collector::main in the image's binary");
    let where_ = run_ok(
        std::process::Command::new("addr2line")
            .args(["-f", "-C", "-e"])
            .arg(&bin)
            .arg(format!("0x{addr}")),
    );
    eprintln!(
        "note: collector::main at 0x{addr}: {}",
        where_.replace('\n', " ")
    );
    let line = regex::Regex::new(r"collector/src/main\.rs:[0-9]").unwrap();
    assert!(line.is_match(&where_), "0x{addr} (collector::main) resolves to {where_:?}, not to collector/src/main.rs and a line");
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn image_carries_the_licence_notices_of_the_repository() {
    for f in ["LICENSE", "collector/THIRD-PARTY-LICENSES"] {
        let name = f.rsplit('/').next().unwrap();
        let path = format!("/usr/share/doc/collector/{name}");
        let got = file_in_image(&path);
        let want = std::fs::read(root().join(f)).unwrap();
        assert!(
            got == want,
            "{path} in the image ({} bytes) is not {f} ({} bytes)",
            got.len(),
            want.len()
        );
    }
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn bad_setting_exits_2_with_its_one_line_error_in_podman_logs() {
    let podman = podman();
    let project = Project::new("bad");
    let name = format!("{}-bad", project.name);
    podman.try_run(&[
        "run",
        "--name",
        &name,
        "--network",
        "host",
        "-e",
        "COLLECTOR_BATCH_MAX_ROWS=many",
        IMAGE,
    ]);
    let rc = podman.inspect(&name, "{{.State.ExitCode}}");
    let (_, out, err) = podman.try_run(&["logs", &name]);
    let lines: Vec<&str> = out.lines().chain(err.lines()).collect();
    assert_eq!(
        rc, "2",
        "exit status of a collector with a bad setting; its log: {lines:?}"
    );
    assert_eq!(lines.len(), 1, "lines in podman logs, want 1: {lines:?}");
    assert!(
        lines[0].contains("COLLECTOR_BATCH_MAX_ROWS"),
        "the error does not name the setting: {}",
        lines[0]
    );
}

/// The image run against a loopback stack: its containers, ports and spool volume.
struct Run<'a> {
    podman: &'static Podman,
    project: &'a Project,
    stack: &'a Stack,
    /// Public port -> operations port, per collector container.
    admin: BTreeMap<u16, u16>,
    ports: Vec<u16>,
    volume: String,
}

impl Run<'_> {
    fn stack_env(&self, key: &str) -> String {
        let env = self.stack.env().expect("the stack's stack.env");
        env.get(key)
            .unwrap_or_else(|| panic!("no {key} in stack.env"))
            .to_owned()
    }

    /// The collector's settings for the containers (the loopback stack).
    fn collector_env(&self) -> Vec<String> {
        let db = format!("COLLECTOR_DATABASE_URL={}", self.stack_env("DATABASE_URL"));
        let ch = format!(
            "COLLECTOR_CLICKHOUSE_URLS={}",
            self.stack_env("CLICKHOUSE_URLS")
        );
        let mut out = vec![];
        for e in [db, ch, "COLLECTOR_DRAIN_GRACE=5s".to_owned()] {
            out.push("-e".to_owned());
            out.push(e);
        }
        out
    }

    /// A collector command in a throw-away container (tmpfs spool, as compose); its stdout.
    fn one_shot(&self, args: &[&str]) -> String {
        let mut all = run_read_only(&["--rm"]);
        all.extend(["--tmpfs".to_owned(), "/var/lib/collector/spool".to_owned()]);
        all.extend(self.collector_env());
        all.push(IMAGE.to_owned());
        all.extend(args.iter().map(|a| a.to_string()));
        self.podman
            .run(&all.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// The image as compose.yaml runs a collector (read-only root, no capabilities,
    /// no-new-privileges; here also no tmpfs on /tmp, /run: nothing but the spool writable),
    /// on the spool volume, listening on 127.0.0.1:`port`.
    fn start_collector(&self, name: &str, port: u16) {
        let mut all = run_read_only(&["-d", "--name", name]);
        for a in [
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges:true",
            "-v",
        ] {
            all.push(a.to_owned());
        }
        all.push(format!("{}:/var/lib/collector/spool", self.volume));
        all.extend(self.collector_env());
        all.extend(["-e".into(), format!("COLLECTOR_LISTEN=127.0.0.1:{port}")]);
        all.extend([
            "-e".into(),
            format!("COLLECTOR_ADMIN_LISTEN=127.0.0.1:{}", self.admin[&port]),
        ]);
        all.push(IMAGE.to_owned());
        self.podman
            .run(&all.iter().map(String::as_str).collect::<Vec<_>>());
    }

    fn name(&self, n: usize) -> String {
        format!("{}-{n}", self.project.name)
    }
}

/// `podman run` with `first` (`--rm`, or `-d --name NAME`), on the host network, its root
/// read-only without podman's own tmpfs mounts (compose.yaml's `read_only: true`).
fn run_read_only(first: &[&str]) -> Vec<String> {
    let mut all = vec!["run".to_owned()];
    all.extend(first.iter().map(|a| a.to_string()));
    all.extend(
        [
            "--network",
            "host",
            "--read-only",
            "--read-only-tmpfs=false",
        ]
        .map(String::from),
    );
    all
}

/// `collector migrate` and `sites add` from the image against the loopback stack.
fn migrate_and_sites(run: &Run) {
    run.one_shot(&["migrate"]);
    for key in ["engine-a", "engine-b"] {
        run.one_shot(&["sites", "add", "--key", key]);
    }
    let list = run.one_shot(&["sites", "list"]);
    let keys: Vec<&str> = list.lines().filter_map(|l| l.split('\t').next()).collect();
    for key in ["engine-a", "engine-b"] {
        assert!(
            keys.contains(&key),
            "`collector sites list` from the image does not show {key}: {list}"
        );
    }
}

/// The HEALTHCHECK fails while the settings store was never reachable (a closed port).
fn healthcheck_fails_without_store(run: &Run) {
    let ports = stack::ports::alloc(2).unwrap();
    let name = format!("{}-nostore", run.project.name);
    run.podman.run(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        "host",
        "--read-only",
        "--read-only-tmpfs=false",
        "-e",
        &format!(
            "COLLECTOR_DATABASE_URL=postgres://collector@127.0.0.1:{}/collector",
            ports[1]
        ),
        "-e",
        &format!(
            "COLLECTOR_CLICKHOUSE_URLS={}",
            run.stack_env("CLICKHOUSE_URLS")
        ),
        "-e",
        &format!("COLLECTOR_LISTEN=127.0.0.1:{}", ports[0]),
        IMAGE,
    ]);
    let healthz = format!("http://127.0.0.1:{}/healthz", ports[0]);
    wait_for(
        &format!("the collector without a settings store to listen ({healthz})"),
        60 * SECOND,
        SECOND / 2,
        || answers_200(&healthz),
    );
    // Three times over several seconds: a store never reached keeps the check failing.
    for attempt in 1..=3 {
        let (ok, out, err) = run.podman.try_run(&["healthcheck", "run", &name]);
        assert!(
            !ok,
            "podman healthcheck run passed (try {attempt}) without a settings store: {out}{err}"
        );
        std::thread::sleep(2 * SECOND);
    }
    run.podman.run(&["rm", "-f", "-v", &name]);
}

/// The HEALTHCHECK passes once sites are loaded (within 90 s).
fn healthcheck_passes(run: &Run) {
    run.podman.run(&["volume", "create", &run.volume]);
    let name = run.name(1);
    run.start_collector(&name, run.ports[0]);
    wait_for(
        &format!("podman healthcheck run {name} to pass"),
        90 * SECOND,
        SECOND,
        || {
            let (ok, out, err) = run.podman.try_run(&["healthcheck", "run", &name]);
            if ok {
                Ok(())
            } else {
                Err(format!("{out}{err}"))
            }
        },
    );
    assert_eq!(
        run.podman.inspect(&name, "{{.State.Health.Status}}"),
        "healthy",
        "{name}'s health status"
    );
}

/// uid 10001 and what its process can write: the root filesystem is mounted read-only, and of
/// all mounts and the image's usual folders only the spool volume takes a new file (plus the
/// engine's per-container IPC mounts /dev/shm and /dev/mqueue, in memory, as on Docker).
fn confinement(run: &Run) {
    let name = run.name(1);
    let pid = run.podman.inspect(&name, "{{.State.Pid}}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for id in ["Uid:", "Gid:"] {
        let line = status.lines().find(|l| l.starts_with(id)).unwrap();
        let ids: Vec<&str> = line.split_whitespace().skip(1).collect();
        assert_eq!(ids, ["10001"; 4], "{name}'s process {pid}: {line}");
    }
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root_mount = mountinfo
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"));
    let options = root_mount
        .and_then(|f| f.get(5).map(|o| o.to_string()))
        .unwrap_or_default();
    assert!(
        options.starts_with("ro"),
        "{name}'s / is mounted {options:?}, not read-only"
    );
    let probe = r#"for d in $(awk "{ print \$5 }" /proc/self/mountinfo) / /tmp /var/tmp /run /var/lib/collector \
                 /usr/local/bin /etc /root /home /var/cache /var/log; do
            [ -d "$d" ] || continue
            f="$d/.write-check.$$"
            if touch "$f" 2>/dev/null; then rm -f "$f"; echo "$d"; fi
        done | sort -u"#;
    let writable = run.podman.run(&["exec", &name, "sh", "-c", probe]);
    let writable: Vec<&str> = writable.lines().collect();
    assert_eq!(
        writable,
        ["/dev/mqueue", "/dev/shm", "/var/lib/collector/spool"],
        "what uid 10001 can write in {name}"
    );
}

/// Every beacon sent to the container is stored once in ClickHouse (within 60 s).
fn beacons_land(run: &Run) {
    let ids = send_beacons(run.ports[0], "engine-a", 100);
    let url = run.stack_env("CH1_URL");
    wait_for(
        "100 measurements of site engine-a in ClickHouse, each once under FINAL",
        60 * SECOND,
        SECOND,
        || stored_once(&url, "engine-a", &ids),
    );
}

/// With every replica stopped, beacons are acknowledged and spooled; the container is
/// removed; a new one on the same volume delivers each of them once when the replicas return.
fn spool_survives(run: &Run) {
    let (second, third) = (run.name(2), run.name(3));
    run.podman.run(&["rm", &run.name(1)]); // the spool volume is named: it stays
    run.start_collector(&second, run.ports[1]);
    let readyz = format!("http://127.0.0.1:{}/readyz", run.ports[1]);
    wait_for(
        &format!("{second} ready ({readyz})"),
        90 * SECOND,
        SECOND,
        || answers_200(&readyz),
    );
    let replicas = run.stack.replicas();
    for r in &replicas {
        r.stop().expect("stopping a replica");
    }
    let ids = send_beacons(run.ports[1], "engine-b", 150);
    let spooled = spool_records(run.admin[&run.ports[1]]).unwrap();
    assert!(spooled >= 150.0, "all replicas stopped, 150 answered 202: collector_spool_records {spooled}, want at least 150");
    stopped_in_grace(&second, || {
        run.podman
            .run(&["stop", "-t", &stop_grace().to_string(), &second]);
    });
    run.podman.run(&["rm", &second]);
    let (exists, _, _) = run.podman.try_run(&["container", "exists", &second]);
    assert!(!exists, "{second} still exists after podman rm");
    run.start_collector(&third, run.ports[2]);
    let healthz = format!("http://127.0.0.1:{}/healthz", run.ports[2]);
    wait_for(
        &format!("{third} to answer /healthz"),
        60 * SECOND,
        SECOND,
        || answers_200(&healthz),
    );
    let url = run.stack_env("CH1_URL");
    assert!(
        clickhouse(&url, "SELECT 1").is_err(),
        "ClickHouse answers before it was started again"
    );
    for r in &replicas {
        r.start().expect("starting a replica again");
    }
    wait_for(
        "150 measurements of site engine-b in ClickHouse, each once under FINAL",
        180 * SECOND,
        SECOND,
        || stored_once(&url, "engine-b", &ids),
    );
    let admin = run.admin[&run.ports[2]];
    wait_for(
        &format!("collector_spool_records 0 on {third}"),
        60 * SECOND,
        SECOND,
        || match spool_records(admin)? {
            0.0 => Ok(()),
            n => Err(format!("{n} records")),
        },
    );
    stopped_in_grace(&third, || {
        run.podman
            .run(&["stop", "-t", &stop_grace().to_string(), &third]);
    });
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn image_runs_as_compose_runs_a_collector_against_a_loopback_stack() {
    let podman = podman();
    let project = Project::new("run");
    // The loopback stack: PostgreSQL, ZooKeeper and three ClickHouse replicas (as compose.yaml).
    let stack = Stack::own(3);
    let ports = stack::ports::alloc(6).expect("loopback ports");
    let run = Run {
        podman,
        project: &project,
        stack: &stack,
        admin: (0..3).map(|i| (ports[i], ports[i + 3])).collect(),
        ports: ports[..3].to_vec(),
        volume: format!("{}-spool", project.name),
    };
    migrate_and_sites(&run);
    healthcheck_fails_without_store(&run);
    healthcheck_passes(&run);
    confinement(&run);
    beacons_land(&run);
    let first = run.name(1);
    stopped_in_grace(&first, || {
        podman.run(&["stop", "-t", &stop_grace().to_string(), &first]);
    });
    spool_survives(&run);
}

/// compose.yaml's services on podman's API socket: the project, its derived file, the ports.
struct Services<'a> {
    podman: &'static Podman,
    project: &'a Project,
    api: &'a ApiService,
    file: std::path::PathBuf,
    ports: BTreeMap<String, u16>,
    stack: &'a Stack,
}

impl Services<'_> {
    /// `docker-compose -p PROJECT -f FILE ARGS` on the API socket.
    fn compose(&self, args: &[&str]) -> std::process::Command {
        let file = self.file.display().to_string();
        let mut all = vec!["-p", &self.project.name, "-f", &file];
        all.extend_from_slice(args);
        self.api.compose(&all)
    }

    /// The container of service `service` (docker-compose v1's name).
    fn container(&self, service: &str) -> String {
        format!("{}_{service}_1", self.project.name)
    }

    /// psql as `postgres` inside service `service`'s container, on its loopback port.
    fn psql(&self, service: &str, db: &str, sql: &str) -> String {
        let port = self.ports[service].to_string();
        let c = self.container(service);
        self.podman.run(&[
            "exec",
            "-u",
            "postgres",
            &c,
            "psql",
            "-qtA",
            "-h",
            "/var/run/postgresql",
            "-p",
            &port,
            "-U",
            "postgres",
            "-d",
            db,
            "-c",
            sql,
        ])
    }
}

/// The value of `var` in compose.yaml's resolved environment of service `service` (the
/// placeholder .env of the checks: every password `check`).
fn compose_env(service: &str, var: &str) -> String {
    let env = Compose::resolved().service(service).env();
    env.get(var)
        .cloned()
        .unwrap_or_else(|| panic!("no {var} in {service}'s environment in compose.yaml"))
}

/// The SHA-256 of `password` in lower-case hex, as users.xml takes it.
fn sha256_hex(password: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(password.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The ClickHouse users of compose.yaml's collector-image services and their passwords (from
/// .env, here the placeholder `check`, which `credentials` writes into their password files):
/// the collectors' write user `collector` and the one-shots' `migrate`.
fn compose_clickhouse_users() -> [(&'static str, String); 2] {
    [
        (
            "collector",
            compose_env("credentials", "CLICKHOUSE_COLLECTOR_PASSWORD"),
        ),
        (
            "migrate",
            compose_env("credentials", "CLICKHOUSE_MIGRATE_PASSWORD"),
        ),
    ]
}

/// The collectors log in to ClickHouse as `collector`, the one-shots as `migrate`, each with
/// its password from .env. The loopback replicas are ClickHouse 18.16, whose users.xml has no
/// grants: each gets those users (the same passwords, by their SHA-256, from loopback) from
/// the stack's users template; `default` stays for the checks' own queries. Their queries
/// alone go to system.query_log (log_queries). (The grants are checked on 26.x:
/// [`write_user_is_confined`].)
fn clickhouse_collector_users(stack: &Stack) {
    for (user, password) in compose_clickhouse_users() {
        let started = Instant::now();
        for r in stack.replicas() {
            r.add_user(user, &sha256_hex(&password), &["log_queries=1"])
                .unwrap_or_else(|e| panic!("adding user {user} to a replica: {e}"));
        }
        for r in stack.replicas() {
            let url = r.url();
            wait_for(
                &format!("replica {} to let `{user}` in", r.i()),
                60 * SECOND,
                SECOND / 2,
                || select1_as(&url, user, &password),
            );
            assert!(
                select1_as(&url, user, &format!("not-{password}")).is_err(),
                "replica {} takes a wrong password",
                r.i()
            );
        }
        eprintln!(
            "note: user {user} on the 3 replicas in {:.1?}",
            started.elapsed()
        );
    }
}

/// Before the loopback replicas start: each gets, as `chI/config.d/hardening.xml`, what
/// deploy/clickhouse/cluster.xml adds to compose's replicas ([`stack::server_config::hardening_xml`]):
/// interserver credentials (user `interserver`) and a ZooKeeper digest identity, with compose's
/// values of CLICKHOUSE_INTERSERVER_PASSWORD and CLICKHOUSE_KEEPER_IDENTITY.
fn harden_replicas(dir: &std::path::Path, replicas: usize) {
    use stack::server_config::{hardening_xml, Value};
    let password = compose_env("clickhouse-r1", "CLICKHOUSE_INTERSERVER_PASSWORD");
    let identity = compose_env("clickhouse-r1", "CLICKHOUSE_KEEPER_IDENTITY");
    let text = hardening_xml(
        stack::users::Root::Yandex,
        Value::Text(&password),
        Value::Text(&identity),
    );
    for i in 1..=replicas {
        let conf_d = dir.join(format!("ch{i}/config.d"));
        std::fs::create_dir_all(&conf_d).unwrap();
        std::fs::write(conf_d.join("hardening.xml"), &text).unwrap();
    }
}

/// `docker-compose up -d`: the services in dependency order, each condition
/// (service_healthy, service_completed_successfully) waited for as on Docker (600 s at most).
fn compose_up(s: &Services) {
    let file = s.file.display().to_string();
    let out = output(
        std::process::Command::new("timeout")
            .args([
                "600",
                "docker-compose",
                "-p",
                &s.project.name,
                "-f",
                &file,
                "up",
                "-d",
                "--no-build",
            ])
            .env("DOCKER_HOST", format!("unix://{}", s.api.socket.display())),
    );
    if out.status.success() {
        return;
    }
    let filter = format!("label=com.docker.compose.project={}", s.project.name);
    let ps = s
        .podman
        .try_run(&[
            "ps",
            "-a",
            "--filter",
            &filter,
            "--format",
            "{{.Names}} {{.Status}}",
        ])
        .1;
    let mut logs = String::new();
    for c in ps.lines().filter_map(|l| l.split_whitespace().next()) {
        let (_, out, err) = s.podman.try_run(&["logs", "--tail", "8", c]);
        logs.push_str(&format!("--- podman logs {c}\n{out}{err}"));
    }
    panic!(
        "docker-compose up failed ({}):\n{}{}\n{ps}\n{logs}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// credentials, migrate, retention and seed exit 0; site demo registered; the password files 0600 uid
/// 10001.
fn one_shots_done(s: &Services) {
    // seed may still run: nothing waits for it.
    for service in ["credentials", "migrate", "retention", "seed"] {
        let c = s.container(service);
        let out = output(
            std::process::Command::new("timeout")
                .args(["60", "podman", "wait", &c])
                .env("CONTAINERS_CONF", s.podman.conf_file()),
        );
        let status = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(out.status.success(), "{service} did not exit within 60 s");
        assert_eq!(status, "0", "{service}'s exit status");
    }
    let sites = s.psql("postgres-primary", "collector", "SELECT key FROM sites");
    assert!(
        sites.lines().any(|l| l == "demo"),
        "site demo is not registered: {sites:?}"
    );
    // The password files, the collectors' and the one-shots' (each in a volume of its own):
    // the collector's uid alone may read them.
    for volume in ["collector-secrets", "migrate-secrets"] {
        let volume = format!("{}-{volume}:/s:ro", s.project.name);
        let stat = s.podman.run(&[
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            &volume,
            "--entrypoint",
            "stat",
            IMAGE,
            "-c",
            "%n: owner %u, mode %a, %s bytes",
            "/s/clickhouse-password",
        ]);
        assert!(
            stat.contains("owner 10001, mode 600,"),
            "the password file in {volume}: {stat}"
        );
    }
}

/// postgres-standby, cloned by standby-entrypoint.sh, streams from postgres-primary.
fn standby_streams(s: &Services) {
    let streaming = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'";
    wait_for(
        "postgres-standby streaming from postgres-primary",
        60 * SECOND,
        SECOND,
        || match s.psql("postgres-primary", "postgres", streaming).as_str() {
            "1" => Ok(()),
            n => Err(format!("{n} streaming")),
        },
    );
    let recovery = s.psql("postgres-standby", "postgres", "SELECT pg_is_in_recovery()");
    assert_eq!(recovery, "t", "postgres-standby is not in recovery");
}

/// collector-a and collector-b healthy; beacons to each land in ClickHouse, inserted as
/// ClickHouse's `collector` (only its queries are logged).
fn collectors_deliver(s: &Services) -> Vec<String> {
    let mut ids = vec![];
    for service in ["collector-a", "collector-b"] {
        let c = s.container(service);
        wait_for(
            &format!("{service} healthy"),
            90 * SECOND,
            SECOND,
            || match s.podman.inspect(&c, "{{.State.Health.Status}}").as_str() {
                "healthy" => Ok(()),
                other => Err(other.to_owned()),
            },
        );
        let user = s.podman.inspect(&c, "{{.Config.User}}");
        let ro = s.podman.inspect(&c, "{{.HostConfig.ReadonlyRootfs}}");
        eprintln!("note: {service}: healthy; user {user}, read-only root {ro}");
        ids.extend(send_beacons(s.ports[service], "demo", 50));
    }
    let urls: Vec<String> = s.stack.replicas().iter().map(|r| r.url()).collect();
    wait_for(
        "100 measurements of site demo in ClickHouse, each once under FINAL",
        60 * SECOND,
        SECOND,
        || stored_once(&urls[0], "demo", &ids),
    );
    let (mut inserted, mut created) = (0, 0);
    for url in &urls {
        clickhouse(url, "SYSTEM FLUSH LOGS").unwrap();
        let sql = "SELECT sum(written_rows) FROM system.query_log \
                   WHERE user = 'collector' AND type = 2 AND query LIKE 'INSERT INTO %measurements%'";
        let n: i64 = clickhouse(url, sql).unwrap().parse().unwrap();
        // `migrate` made the table as `migrate`; the collectors made nothing.
        let sql =
            "SELECT countIf(user = 'migrate'), countIf(user = 'collector') FROM system.query_log \
                   WHERE type = 2 AND query LIKE 'CREATE TABLE%measurements%'";
        let made = clickhouse(url, sql).unwrap();
        let (by_migrate, by_collector) = made.split_once('\t').unwrap_or(("0", "?"));
        eprintln!("note: {url}: {n} rows inserted as collector; CREATE TABLE as migrate {by_migrate}, as collector {by_collector}");
        assert_eq!(by_collector, "0", "{url}: the collectors made the table");
        inserted += n;
        created += by_migrate.parse::<i64>().unwrap();
    }
    assert!(
        inserted >= ids.len() as i64,
        "{inserted} rows inserted as collector, want at least {}",
        ids.len()
    );
    assert!(
        created >= 1,
        "no CREATE TABLE of measurements ran as migrate"
    );
    ids
}

/// Issue 52, 5: the replicas' interserver port answers a part fetch without compose's
/// interserver credentials (or with a wrong password) 401, and with them something else (the
/// part asked for does not exist); the collectors' rows `ids` (inserted into r1 and r2) reach
/// every replica, r3 by fetches alone, through it (60 s at most). Then [`zookeeper_is_closed`].
fn replication_is_closed(s: &Services, ids: &[String]) {
    let password = compose_env("clickhouse-r1", "CLICKHOUSE_INTERSERVER_PASSWORD");
    let user = stack::server_config::INTERSERVER_USER;
    for r in s.stack.replicas() {
        let port = r.interserver_port();
        let bare = interserver_fetch(port, None).unwrap();
        let wrong = interserver_fetch(port, Some((user, "not-the-password"))).unwrap();
        let right = interserver_fetch(port, Some((user, &password))).unwrap();
        eprintln!(
            "note: replica {} interserver port: without credentials {bare:?}; wrong {wrong:?}; right {right:?}",
            r.i()
        );
        assert_eq!(
            bare.0,
            401,
            "replica {}: a fetch without credentials",
            r.i()
        );
        assert_eq!(
            wrong.0,
            401,
            "replica {}: a fetch with a wrong password",
            r.i()
        );
        assert_ne!(
            right.0,
            401,
            "replica {}: a fetch with the credentials",
            r.i()
        );
    }
    for r in s.stack.replicas() {
        let url = r.url();
        wait_for(
            &format!("the collectors' {} rows on replica {}", ids.len(), r.i()),
            60 * SECOND,
            SECOND,
            || stored_once(&url, "demo", ids),
        );
    }
    zookeeper_is_closed(s);
}

/// A ZooKeeper client without the replicas' digest (compose's CLICKHOUSE_KEEPER_IDENTITY) gets
/// NOAUTH listing the replicas of the table `migrate` made or creating a node among them, as
/// one with a wrong digest does; with it, it lists r1, r2, r3.
fn zookeeper_is_closed(s: &Services) {
    let identity = compose_env("clickhouse-r1", "CLICKHOUSE_KEEPER_IDENTITY");
    let url = s.stack.replica(1).url();
    let sql = "SELECT zookeeper_path FROM system.replicas WHERE database = 'collector' AND table = 'measurements'";
    let path = clickhouse(&url, sql).unwrap();
    assert!(
        path.starts_with("/clickhouse/tables/"),
        "the table's ZooKeeper path: {path:?}"
    );
    let replicas = format!("{path}/replicas");
    let port = s.stack.zookeeper().port();
    let mut anonymous = zk::Session::open(port).unwrap();
    let listed = anonymous.children(&replicas).unwrap();
    let created = anonymous.create(&format!("{replicas}/intruder")).unwrap();
    let mut wrong = zk::Session::open(port).unwrap();
    wrong
        .add_digest("clickhouse:not-the-password")
        .unwrap()
        .unwrap();
    let wrong_listed = wrong.children(&replicas).unwrap();
    let mut own = zk::Session::open(port).unwrap();
    own.add_digest(&identity).unwrap().unwrap();
    let own_listed = own.children(&replicas).unwrap().map(|mut v| {
        v.sort();
        v
    });
    eprintln!("note: ZooKeeper {replicas}: without the digest list {listed:?}, create {created:?}; wrong digest {wrong_listed:?}; with it {own_listed:?}");
    assert_eq!(
        listed,
        Err(NO_AUTH),
        "listing {replicas} without the digest"
    );
    assert_eq!(
        created,
        Err(NO_AUTH),
        "creating a node under {replicas} without the digest"
    );
    assert_eq!(
        wrong_listed,
        Err(NO_AUTH),
        "listing {replicas} with a wrong digest"
    );
    assert_eq!(own_listed, Ok(vec!["r1".into(), "r2".into(), "r3".into()]));
}

/// Issue 52, 5: the write user `collector` as deploy/clickhouse/users.xml ships it (the one
/// template, stack/src/deploy.rs; here from loopback, its password compose's by SHA-256) on a
/// ClickHouse 26.x server, which has grants (the loopback replicas, 18.16, have none): with a
/// table `migrate` made in `collector`, its INSERT and SELECT work and its `DROP TABLE`,
/// `TRUNCATE` and `ALTER ... DELETE` are refused (ACCESS_DENIED); `migrate` may drop it.
fn write_user_is_confined() {
    use stack::users::{Password, LOOPBACK};
    let [(writer, writer_pw), (migrate, migrate_pw)] = compose_clickhouse_users();
    let dashboard_pw = compose_env("clickhouse-r1", "CLICKHOUSE_DASHBOARD_PASSWORD");
    let hex = [&migrate_pw, &writer_pw, &dashboard_pw].map(|p| sha256_hex(p));
    let passwords = stack::deploy::Passwords {
        migrate: Password::Sha256Hex(&hex[0]),
        collector: Password::Sha256Hex(&hex[1]),
        dashboard: Password::Sha256Hex(&hex[2]),
    };
    let users = stack::deploy::users(passwords, &LOOPBACK);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let profiles = [stack::users::DASHBOARD_PROFILE];
    let server = runtime.block_on(Ch26Server::start_with(&[], &profiles, &users));
    let url = server.url.as_str();
    let table = "collector.write_check";
    for sql in [
        "CREATE DATABASE IF NOT EXISTS collector".to_owned(),
        format!("CREATE TABLE {table} (x UInt8) ENGINE = ReplacingMergeTree ORDER BY x"),
    ] {
        clickhouse_as(url, migrate, &migrate_pw, &sql).unwrap();
    }
    let insert = clickhouse_as(
        url,
        writer,
        &writer_pw,
        &format!("INSERT INTO {table} VALUES (7)"),
    );
    assert_eq!(insert.as_deref(), Ok(""), "the write user's INSERT");
    let count = clickhouse_as(
        url,
        writer,
        &writer_pw,
        &format!("SELECT count() FROM {table}"),
    );
    assert_eq!(count.as_deref(), Ok("1"), "the write user's SELECT");
    for sql in [
        format!("DROP TABLE {table}"),
        format!("TRUNCATE TABLE {table}"),
        format!("ALTER TABLE {table} DELETE WHERE 1"),
    ] {
        let answer = clickhouse_as(url, writer, &writer_pw, &sql);
        eprintln!("note: 26.x, the write user's {sql}: {answer:?}");
        assert!(
            answer.as_ref().is_err_and(|e| e.contains("ACCESS_DENIED")),
            "the write user's {sql:?} must be refused (ACCESS_DENIED): {answer:?}"
        );
    }
    let dropped = clickhouse_as(url, migrate, &migrate_pw, &format!("DROP TABLE {table}"));
    assert_eq!(dropped.as_deref(), Ok(""), "`migrate` drops the table");
}

/// `docker-compose down -v` of the project when dropped.
struct Down<'a>(&'a Services<'a>);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = self.0.compose(&["down", "-v", "--timeout", "10"]).output();
    }
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn compose_services_run_on_podmans_docker_api() {
    let podman = podman();
    let stack = Stack::own_prepared(3, |dir| harden_replicas(dir, 3));
    let project = Project::new("compose");
    let dir = tempfile::tempdir().unwrap();
    let api = ApiService::start(podman, &dir.path().join("podman.sock"));
    let version = run_ok(&mut api.compose(&["version", "--short"]));
    eprintln!(
        "note: docker-compose {} on podman's API socket",
        version.trim()
    );
    clickhouse_collector_users(&stack);
    let p = stack::ports::alloc(6).expect("loopback ports");
    let names = [
        "postgres-primary",
        "postgres-standby",
        "collector-a",
        "collector-b",
        "collector-a-admin",
        "collector-b-admin",
    ];
    let ports: BTreeMap<String, u16> = names.iter().map(|n| n.to_string()).zip(p).collect();
    let local = Local {
        image: IMAGE.into(),
        postgres_image: PG_STANDIN.into(),
        volume_prefix: project.name.clone(),
        nofile: podman.nofile,
        nproc: NPROC,
        ports: ports.clone(),
        clickhouse: stack
            .replicas()
            .iter()
            .map(|r| (format!("clickhouse-r{}", r.i()), r.url()))
            .collect(),
    };
    let derived = derive(&Compose::resolved().doc, &local);
    // As JSON (which YAML reads): serde_yaml writes the string `no` (restart) unquoted, which
    // docker-compose's YAML 1.1 parser reads as false.
    let file = dir.path().join("compose.engine.json");
    std::fs::write(&file, serde_json::to_string_pretty(&derived).unwrap()).unwrap();
    let services = Services {
        podman,
        project: &project,
        api: &api,
        file,
        ports,
        stack: &stack,
    };
    let _down = Down(&services);
    let _ticker = HealthTicker::start(&project.name);
    compose_up(&services);
    one_shots_done(&services);
    standby_streams(&services);
    let ids = collectors_deliver(&services);
    // What issue 52, 5 added to this check, timed.
    let started = Instant::now();
    replication_is_closed(&services, &ids);
    write_user_is_confined();
    eprintln!(
        "note: interserver, ZooKeeper and write-user checks took {:.1?}",
        started.elapsed()
    );
    let c = services.container("collector-a");
    stopped_in_grace(&c, || {
        run_ok(&mut services.compose(&["stop", "collector-a"]));
    });
}

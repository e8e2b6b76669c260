//! The image run as compose runs a collector, against a loopback stack: migrate, healthcheck,
//! confinement, beacons, the spool.

use super::*;

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

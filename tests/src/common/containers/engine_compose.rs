//! The part of `compose.yaml` that runs on this machine (podman, no image registry, no network
//! but loopback), and what runs it: podman's Docker API socket for `docker-compose`, and a
//! ticker that runs the containers' health checks (podman runs them from systemd timers, and
//! this machine has no systemd).

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_yaml::{Mapping, Value};

use super::compose::{mount_of, Service, COLLECTOR_IMAGE};
use super::engine::{wait_for, Podman};

/// The services of compose.yaml run here, in dependency order.
pub const ENGINE_SERVICES: [&str; 8] = [
    "postgres-primary",
    "postgres-standby",
    "credentials",
    "migrate",
    "retention",
    "seed",
    "collector-a",
    "collector-b",
];
const POSTGRES_SERVICES: [&str; 2] = ["postgres-primary", "postgres-standby"];
const POSTGRES_PORT: &str = "5432";

/// What [`derive`] changes: the images, loopback ports and URLs of this machine.
pub struct Local {
    /// The collector image the checks built.
    pub image: String,
    /// The postgres:15 stand-in.
    pub postgres_image: String,
    /// Prefix of every named volume.
    pub volume_prefix: String,
    /// The host's nofile hard limit.
    pub nofile: u64,
    /// nproc beside it.
    pub nproc: u64,
    /// Loopback port per PostgreSQL service and collector, `NAME-admin` for a collector's
    /// operations listener.
    pub ports: BTreeMap<String, u16>,
    /// The loopback replica's URL per ClickHouse service (`clickhouse-rN`).
    pub clickhouse: BTreeMap<String, String>,
}

/// The compose document of [`ENGINE_SERVICES`] of the resolved `compose`, changed only where
/// this machine needs it, everything else (commands, entrypoints, environment, health
/// checks, stop_grace_period, read_only, cap_drop, security_opt, mounts, restart, depends_on
/// among these services) kept as compose.yaml has it:
///
/// - network_mode host (but where it is none), no networks or ports: every server listens on
///   127.0.0.1 on its own port, and service names in URLs and variables become those loopback
///   addresses; the ClickHouse services become the loopback replicas;
/// - depends_on entries on services not started here (ClickHouse) are dropped;
/// - images: the collector image built by the checks (no `build`), the postgres:15 stand-in;
/// - named volumes prefixed, so that they never meet a real stack's volumes on this machine;
/// - ulimits nofile lowered to the host's hard limit, and nproc beside it.
pub fn derive(compose: &Value, local: &Local) -> Value {
    let mut hosts: Vec<(String, String)> = POSTGRES_SERVICES
        .iter()
        .map(|n| {
            (
                format!("{n}:{POSTGRES_PORT}"),
                format!("127.0.0.1:{}", local.ports[*n]),
            )
        })
        .collect();
    for (n, url) in &local.clickhouse {
        hosts.insert(0, (format!("http://{n}:8123"), url.clone()));
    }
    let rewrite = |v: &str| {
        hosts
            .iter()
            .fold(v.to_owned(), |acc, (a, b)| acc.replace(a, b))
    };
    let mut services = Mapping::new();
    let mut volumes = Mapping::new();
    for name in ENGINE_SERVICES {
        let mut svc = compose["services"][name].as_mapping().cloned().expect(name);
        svc.remove("networks");
        svc.remove("ports");
        if svc.get("network_mode").and_then(Value::as_str) != Some("none") {
            svc.insert("network_mode".into(), "host".into());
        }
        let deps: Mapping = svc
            .get("depends_on")
            .and_then(Value::as_mapping)
            .map(|d| {
                d.iter()
                    .filter(|(k, _)| ENGINE_SERVICES.contains(&k.as_str().unwrap_or("")))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        if deps.is_empty() {
            svc.remove("depends_on");
        } else {
            svc.insert("depends_on".into(), Value::Mapping(deps));
        }
        let image = svc
            .get("image")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if image == COLLECTOR_IMAGE {
            svc.remove("build");
            svc.insert("image".into(), local.image.clone().into());
        } else if image.starts_with("postgres:") {
            svc.insert("image".into(), local.postgres_image.clone().into());
        }
        let mut env: BTreeMap<String, String> = Service(&Value::Mapping(svc.clone()))
            .env()
            .into_iter()
            .map(|(k, v)| (k, rewrite(&v)))
            .collect();
        local_ports(name, &mut svc, &mut env, local);
        svc.insert("environment".into(), serde_yaml::to_value(env).unwrap());
        lower_ulimits(&mut svc, local);
        prefix_volumes(&mut svc, &mut volumes, &local.volume_prefix);
        services.insert(name.into(), Value::Mapping(svc));
    }
    let mut out = Mapping::new();
    out.insert("services".into(), Value::Mapping(services));
    out.insert("volumes".into(), Value::Mapping(volumes));
    if let Some(v) = compose.get("version") {
        out.insert("version".into(), v.clone());
    }
    Value::Mapping(out)
}

/// PostgreSQL on its loopback port (command, health check, the standby's primary); a
/// collector's listeners on its loopback ports.
fn local_ports(name: &str, svc: &mut Mapping, env: &mut BTreeMap<String, String>, local: &Local) {
    if POSTGRES_SERVICES.contains(&name) {
        let port = local.ports[name].to_string();
        let mut command: Vec<Value> = svc["command"].as_sequence().cloned().unwrap_or_default();
        for w in [
            "-c",
            &format!("port={port}"),
            "-c",
            "listen_addresses=127.0.0.1",
        ] {
            command.push(w.into());
        }
        svc.insert("command".into(), Value::Sequence(command));
        let mut hc = svc["healthcheck"].as_mapping().cloned().unwrap_or_default();
        let test: Vec<Value> = hc["test"]
            .as_sequence()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|w| {
                if w.as_str() == Some(POSTGRES_PORT) {
                    Value::from(port.clone())
                } else {
                    w
                }
            })
            .collect();
        hc.insert("test".into(), Value::Sequence(test));
        svc.insert("healthcheck".into(), Value::Mapping(hc));
        if env.contains_key("PRIMARY_HOST") {
            env.insert("PRIMARY_HOST".into(), "127.0.0.1".into());
            env.insert(
                "PRIMARY_PORT".into(),
                local.ports["postgres-primary"].to_string(),
            );
        }
    } else if let Some(port) = local.ports.get(name) {
        env.insert("COLLECTOR_LISTEN".into(), format!("127.0.0.1:{port}"));
        env.insert(
            "COLLECTOR_ADMIN_LISTEN".into(),
            format!("127.0.0.1:{}", local.ports[&format!("{name}-admin")]),
        );
    }
}

/// nofile at most the host's hard limit; podman then sets only the ulimits given, and its
/// own nproc is refused here, so nproc is added.
fn lower_ulimits(svc: &mut Mapping, local: &Local) {
    let Some(mut ulimits) = svc.get("ulimits").and_then(Value::as_mapping).cloned() else {
        return;
    };
    if let Some(nofile) = ulimits.get("nofile").and_then(Value::as_mapping).cloned() {
        let lowered: Mapping = nofile
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value::from(v.as_u64().unwrap_or(0).min(local.nofile)),
                )
            })
            .collect();
        ulimits.insert("nofile".into(), Value::Mapping(lowered));
    }
    if !ulimits.contains_key("nproc") {
        let mut nproc = Mapping::new();
        nproc.insert("soft".into(), local.nproc.into());
        nproc.insert("hard".into(), local.nproc.into());
        ulimits.insert("nproc".into(), Value::Mapping(nproc));
    }
    svc.insert("ulimits".into(), Value::Mapping(ulimits));
}

/// Named volumes renamed `PREFIX-NAME`, and declared with that name.
fn prefix_volumes(svc: &mut Mapping, volumes: &mut Mapping, prefix: &str) {
    let Some(list) = svc.get("volumes").and_then(Value::as_sequence).cloned() else {
        return;
    };
    let mut out = vec![];
    for v in list {
        let m = mount_of(&v);
        if m.kind != "volume" || m.source.is_empty() {
            out.push(v);
            continue;
        }
        let new = format!("{prefix}-{}", m.source);
        let mut decl = Mapping::new();
        decl.insert("name".into(), new.clone().into());
        volumes.insert(new.clone().into(), Value::Mapping(decl));
        out.push(match v {
            Value::Mapping(mut long) => {
                long.insert("source".into(), new.into());
                Value::Mapping(long)
            }
            short => Value::from(format!(
                "{new}{}",
                &short.as_str().unwrap_or("")[m.source.len()..]
            )),
        });
    }
    svc.insert("volumes".into(), Value::Sequence(out));
}

/// `podman system service` on a socket of its own, for docker-compose; stopped when dropped.
pub struct ApiService {
    child: Child,
    /// The socket.
    pub socket: PathBuf,
}

impl ApiService {
    /// Starts the service on `socket` and waits (30 s at most) until it answers `/_ping`.
    pub fn start(podman: &Podman, socket: &Path) -> ApiService {
        let _ = std::fs::remove_file(socket);
        let child = podman
            .cmd(&[
                "system",
                "service",
                "--time=0",
                &format!("unix://{}", socket.display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("podman system service");
        let service = ApiService {
            child,
            socket: socket.to_owned(),
        };
        wait_for(
            &format!("podman's API socket {} to answer /_ping", socket.display()),
            Duration::from_secs(30),
            Duration::from_millis(200),
            || ping(socket),
        );
        service
    }

    /// `docker-compose ARGS` on this socket.
    pub fn compose(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("docker-compose");
        cmd.env("DOCKER_HOST", format!("unix://{}", self.socket.display()))
            .args(args);
        cmd
    }
}

impl Drop for ApiService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ping(socket: &Path) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut s = UnixStream::connect(socket).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok();
    s.write_all(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(answer.lines().next().unwrap_or("").to_owned())
    }
}

/// Stands in for the systemd timers podman would use to run health checks: every 2 s,
/// `podman healthcheck run` on each running container of the compose project, so that the
/// health status compose's depends_on conditions wait for is kept current. Stops when dropped.
pub struct HealthTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HealthTicker {
    /// Starts ticking for the containers labelled with compose project `project`.
    pub fn start(project: &str) -> HealthTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let filter = format!("label=com.docker.compose.project={project}");
        let thread = std::thread::spawn(move || {
            let podman = Podman::get();
            while !flag.load(Ordering::Relaxed) {
                let (_, names, _) =
                    podman.try_run(&["ps", "--filter", &filter, "--format", "{{.Names}}"]);
                for c in names.lines() {
                    podman.try_run(&["healthcheck", "run", c]);
                }
                // The interval of the health checks podman's timers would run.
                std::thread::sleep(Duration::from_secs(2));
            }
        });
        HealthTicker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HealthTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

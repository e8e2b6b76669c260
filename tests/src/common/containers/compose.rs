//! `compose.yaml` as `docker-compose config` resolves it (anchors merged, variables
//! interpolated, bind-mount paths absolute), read with `serde_yaml`: its services, their
//! environment, mounts and dependencies, and the passwords it takes from `.env`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_yaml::Value;

use crate::common::root;

/// The passwords `compose.yaml` takes from `.env` (`deploy/env.example`), each required.
pub const PASSWORDS: [&str; 9] = [
    "POSTGRES_PASSWORD",
    "COLLECTOR_DB_PASSWORD",
    "REPLICATION_PASSWORD",
    "GRAFANA_ADMIN_PASSWORD",
    "CLICKHOUSE_MIGRATE_PASSWORD",
    "CLICKHOUSE_COLLECTOR_PASSWORD",
    "CLICKHOUSE_DASHBOARD_PASSWORD",
    "CLICKHOUSE_INTERSERVER_PASSWORD",
    "CLICKHOUSE_KEEPER_PASSWORD",
];
/// Services that run once and exit; every other service must be restarted by the engine.
pub const ONE_SHOTS: [&str; 5] = [
    "credentials",
    "caddy-volumes",
    "migrate",
    "retention",
    "seed",
];
/// The collector's image as compose builds it (every collector-image service has `build`).
pub const COLLECTOR_IMAGE: &str = "collector:latest";

/// Writes an env file with every password set to `check`, but `leave_out`.
pub fn placeholder_env(path: &Path, leave_out: Option<&str>) {
    let text: String = PASSWORDS
        .iter()
        .filter(|v| Some(**v) != leave_out)
        .map(|v| format!("{v}=check\n"))
        .collect();
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// `docker-compose ARGS` on the repository's `compose.yaml` with the passwords of `env_file`
/// only (not the caller's environment, not a real `.env`).
pub fn docker_compose(env_file: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new("docker-compose");
    for v in PASSWORDS {
        cmd.env_remove(v);
    }
    cmd.arg("--env-file")
        .arg(env_file)
        .arg("--project-directory")
        .arg(root())
        .arg("-f")
        .arg(root().join("compose.yaml"))
        .args(args);
    cmd.output().unwrap_or_else(|e| {
        panic!("running docker-compose (scripts/check-containers.sh installs it): {e}")
    })
}

/// The resolved compose file (`docker-compose config` with placeholder passwords), and the
/// services by role.
pub struct Compose {
    /// The whole document.
    pub doc: Value,
    /// The long-running services of the collector image, sorted.
    pub collectors: Vec<String>,
    /// The ClickHouse server services, sorted.
    pub clickhouse: Vec<String>,
    /// The ClickHouse Keeper services, sorted.
    pub keepers: Vec<String>,
}

impl Compose {
    /// The resolved `compose.yaml`, made once per test binary; panics with docker-compose's
    /// error when it does not resolve.
    pub fn resolved() -> &'static Compose {
        static COMPOSE: OnceLock<Compose> = OnceLock::new();
        COMPOSE.get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary folder");
            let env = dir.path().join("env");
            placeholder_env(&env, None);
            let out = docker_compose(&env, &["config"]);
            assert!(
                out.status.success(),
                "docker-compose config failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Compose::parse(&String::from_utf8_lossy(&out.stdout))
        })
    }

    /// A compose document from its text.
    pub fn parse(text: &str) -> Compose {
        let doc: Value = serde_yaml::from_str(text).expect("docker-compose config prints YAML");
        let (mut collectors, mut clickhouse, mut keepers) = (vec![], vec![], vec![]);
        for (name, svc) in services_of(&doc) {
            let image = svc.str("image").unwrap_or("");
            if image == COLLECTOR_IMAGE && !ONE_SHOTS.contains(&name) {
                collectors.push(name.to_owned());
            } else if image.starts_with("clickhouse/clickhouse-server") {
                clickhouse.push(name.to_owned());
            } else if image.starts_with("clickhouse/clickhouse-keeper") {
                keepers.push(name.to_owned());
            }
        }
        Compose {
            doc,
            collectors,
            clickhouse,
            keepers,
        }
    }

    /// Every service, sorted by name.
    pub fn services(&self) -> Vec<(&str, Service<'_>)> {
        services_of(&self.doc)
    }

    /// Service `name`, if compose has it.
    pub fn get(&self, name: &str) -> Option<Service<'_>> {
        self.doc["services"].get(name).map(Service)
    }

    /// Service `name`; panics naming it when compose has none.
    pub fn service(&self, name: &str) -> Service<'_> {
        self.get(name)
            .unwrap_or_else(|| panic!("compose.yaml has no service {name}"))
    }
}

/// The services of a compose document, sorted by name.
fn services_of(doc: &Value) -> Vec<(&str, Service<'_>)> {
    let mut out: Vec<_> = doc["services"]
        .as_mapping()
        .expect("compose has services")
        .iter()
        .map(|(k, v)| (k.as_str().expect("a service name"), Service(v)))
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out
}

/// One service of the resolved compose file.
#[derive(Clone, Copy)]
pub struct Service<'a>(pub &'a Value);

/// A volume or bind mount of a service.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    /// `volume` or `bind`.
    pub kind: &'static str,
    /// The volume's name, or the host path.
    pub source: String,
    /// The path inside the container.
    pub target: String,
    /// Mounted read-only (`:ro`, or `read_only: true`).
    pub read_only: bool,
}

impl<'a> Service<'a> {
    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key)
    }

    /// The string value of `key`, if set and a string.
    pub fn str(&self, key: &str) -> Option<&'a str> {
        self.0.get(key).and_then(Value::as_str)
    }

    /// The string items of the list `key` (empty when unset).
    pub fn list(&self, key: &str) -> Vec<String> {
        match self.0.get(key) {
            Some(Value::Sequence(s)) => s.iter().map(scalar).collect(),
            Some(v) => vec![scalar(v)],
            None => vec![],
        }
    }

    /// Its environment, map or `KEY=VALUE` list form; a variable without value is "".
    pub fn env(&self) -> BTreeMap<String, String> {
        match self.0.get("environment") {
            Some(Value::Mapping(m)) => m.iter().map(|(k, v)| (scalar(k), scalar(v))).collect(),
            Some(Value::Sequence(s)) => s
                .iter()
                .map(|e| {
                    let e = scalar(e);
                    match e.split_once('=') {
                        Some((k, v)) => (k.to_owned(), v.to_owned()),
                        None => (e, String::new()),
                    }
                })
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// The condition under which it depends on `dep`, if it does.
    pub fn depends_condition(&self, dep: &str) -> Option<&'a str> {
        self.0
            .get("depends_on")?
            .get(dep)?
            .get("condition")?
            .as_str()
    }

    /// Every mount, short or long syntax.
    pub fn mounts(&self) -> Vec<Mount> {
        let Some(Value::Sequence(vols)) = self.0.get("volumes") else {
            return vec![];
        };
        vols.iter().map(mount_of).collect()
    }

    /// The bind mounts as target -> host path relative to the repository.
    pub fn binds(&self) -> BTreeMap<String, String> {
        self.mounts()
            .into_iter()
            .filter(|m| m.kind == "bind")
            .map(|m| (m.target, rel_to_root(&m.source)))
            .collect()
    }
}

/// One entry of a service's `volumes`.
pub fn mount_of(v: &Value) -> Mount {
    if let Value::Mapping(_) = v {
        return Mount {
            kind: if v.get("type").and_then(Value::as_str) == Some("bind") {
                "bind"
            } else {
                "volume"
            },
            source: v.get("source").map(scalar).unwrap_or_default(),
            target: v.get("target").map(scalar).unwrap_or_default(),
            read_only: v.get("read_only").and_then(Value::as_bool).unwrap_or(false),
        };
    }
    let s = scalar(v);
    let parts: Vec<&str> = s.split(':').collect();
    let source = parts[0].to_owned();
    let target = parts.get(1).unwrap_or(&parts[0]).to_string();
    let bind = source.starts_with(['/', '.', '~']);
    Mount {
        kind: if bind { "bind" } else { "volume" },
        source,
        target,
        read_only: s.ends_with(":ro"),
    }
}

/// A scalar as text (strings as they are, numbers and booleans printed, null as "").
pub fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => String::new(),
        other => serde_yaml::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

/// A host path (absolute, or relative to the repository) relative to the repository, with
/// `.` and `..` resolved lexically.
pub fn rel_to_root(path: &str) -> String {
    let root = root();
    let mut out = PathBuf::new();
    for part in root.join(path).components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            p => out.push(p),
        }
    }
    match out.strip_prefix(&root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
        Ok(rel) => rel.display().to_string(),
        Err(_) => out.display().to_string(),
    }
}

/// Seconds in a compose / humantime duration such as `40s`, `1m30s`, `500ms`, `1.5s`.
pub fn duration_s(value: &str) -> f64 {
    let re = regex::Regex::new(r"(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)").unwrap();
    let compact: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    let mut joined = String::new();
    let mut total = 0.0;
    for c in re.captures_iter(value) {
        joined.push_str(&c[1]);
        joined.push_str(&c[2]);
        let unit = match &c[2] {
            "us" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            _ => 3600.0,
        };
        total += c[1].parse::<f64>().unwrap() * unit;
    }
    assert!(
        !joined.is_empty() && joined == compact,
        "not a duration: {value:?}"
    );
    total
}

//! podman on this machine for the image checks (`tests/tests/containers_engine/`): its
//! settings, the local base images, the image built once per run from the unchanged
//! `Dockerfile`, and the containers of one test, removed when it ends.
//!
//! Every container uses host networking and listens on 127.0.0.1 only (no bridge network:
//! this machine sends no traffic to other addresses).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{output, run_ok};
use crate::common::root;

/// The image the checks build.
pub const IMAGE: &str = "localhost/collector:check";
/// The builder stage's last image, tagged so that its layers stay cached between runs.
pub const BUILDER_IMAGE: &str = "localhost/collector-builder:check";
/// The postgres:15 stand-in `scripts/local-base-images.sh` makes.
pub const PG_STANDIN: &str = "localhost/postgres-standin:15";
/// The runtime image's base.
pub const BASE_IMAGE: &str = "docker.io/library/debian:bookworm-slim";
/// nproc of every container (runc cannot set the host's own hard limit here).
pub const NPROC: u64 = 4096;

/// podman with its settings for this machine ([`Podman::get`]).
pub struct Podman {
    conf: PathBuf,
    /// nofile of every container: the host's hard limit.
    pub nofile: u64,
}

/// What the one build of the image took and saw.
pub struct Build {
    /// Wall-clock seconds of `podman build`.
    pub seconds: u64,
    /// Steps podman took from its layer cache.
    pub cached_steps: usize,
}

impl Podman {
    /// Podman's settings, written once per run: runc and cgroupfs (no systemd here), ulimits
    /// within the host's hard limits (this VM refuses podman's defaults, which are above them).
    /// The file replaces the system ones (`CONTAINERS_CONF`), so it repeats Debian's defaults.
    /// Panics when `podman info` fails: a check that cannot run here does not pass.
    pub fn get() -> &'static Podman {
        static PODMAN: OnceLock<Podman> = OnceLock::new();
        PODMAN.get_or_init(|| {
            let (_, hard) = rlimit::Resource::NOFILE.get().expect("getrlimit NOFILE");
            let nofile = if hard == rlimit::INFINITY { 1_048_576 } else { hard };
            // One file per machine, written again by every run: a static is never dropped, so
            // a temporary folder would outlive the run.
            let conf = std::env::temp_dir().join("collector-check-containers.conf");
            let text = format!(
                "[containers]\ndefault_capabilities = [\"CHOWN\", \"DAC_OVERRIDE\", \"FOWNER\", \"FSETID\", \"KILL\", \
                 \"NET_BIND_SERVICE\",\n  \"SETFCAP\", \"SETGID\", \"SETPCAP\", \"SETUID\", \"SYS_CHROOT\"]\n\
                 default_sysctls = [\"net.ipv4.ping_group_range=0 0\"]\n\
                 default_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc={NPROC}:{NPROC}\"]\n\
                 [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n"
            );
            std::fs::write(&conf, text).unwrap_or_else(|e| panic!("{}: {e}", conf.display()));
            let podman = Podman { conf, nofile };
            let info = output(&mut podman.cmd(&["info"]));
            assert!(
                info.status.success(),
                "podman does not work on this machine (podman info failed): the image and compose checks cannot run\n{}",
                String::from_utf8_lossy(&info.stderr)
            );
            let start = Instant::now();
            run_ok(&mut Command::new(root().join("scripts/local-base-images.sh")));
            eprintln!("note: base images ready in {} s (scripts/local-base-images.sh)", start.elapsed().as_secs());
            podman
        })
    }

    /// The `CONTAINERS_CONF` file every podman process of this run uses.
    pub fn conf_file(&self) -> PathBuf {
        self.conf.clone()
    }

    /// `podman ARGS` with this run's settings.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", self.conf_file()).args(args);
        cmd
    }

    /// `podman ARGS` run to its end: its stdout and stderr, less the error line podman
    /// prints for every container with a HEALTHCHECK (it cannot make the systemd timer that
    /// would run the check; the checks run `podman healthcheck run` instead).
    pub fn try_run(&self, args: &[&str]) -> (bool, String, String) {
        let out: Output = output(&mut self.cmd(args));
        let err: String = String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| !l.contains("systemd connection"))
            .map(|l| format!("{l}\n"))
            .collect();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            err,
        )
    }

    /// `podman ARGS`; panics with its output unless it exits 0; its stdout, trimmed.
    pub fn run(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.try_run(args);
        assert!(ok, "podman {} failed:\n{out}{err}", args.join(" "));
        out.trim().to_owned()
    }

    /// `podman inspect --format FORMAT NAME`, trimmed.
    pub fn inspect(&self, name: &str, format: &str) -> String {
        self.run(&["inspect", "--format", format, name])
    }

    /// The image, built once per run ([`build`]); when that build failed, every later call
    /// fails with its message instead of building again.
    pub fn image(&self) -> &'static Build {
        static BUILD: OnceLock<Result<Build, String>> = OnceLock::new();
        let built = BUILD.get_or_init(|| {
            let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build(self)));
            if let Ok(b) = &built {
                eprintln!(
                    "note: image build {} s, {} steps from podman's layer cache",
                    b.seconds, b.cached_steps
                );
            }
            built.map_err(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            })
        });
        match built {
            Ok(b) => b,
            Err(why) => panic!("the image build of this run failed: {why}"),
        }
    }
}

/// `podman build --format docker` of the unchanged Dockerfile, at low priority (the machine is
/// shared), with host network for the RUN steps (crates.io); the docker format keeps
/// HEALTHCHECK. Between runs podman's layer cache skips the dependency layer while the
/// manifests and Cargo.lock are unchanged; beyond that the builder's RUN steps get cargo's
/// download cache and /src/target from `COLLECTOR_IMAGE_CACHE` (default
/// /var/cache/collector-images; bind mounts during RUN only), one build at a time (flock: the
/// dependency step deletes the collector's outputs in that shared target folder).
fn build(podman: &Podman) -> Build {
    let base = std::env::var("COLLECTOR_IMAGE_CACHE")
        .unwrap_or_else(|_| "/var/cache/collector-images".into());
    let cache = Path::new(&base).join("cargo");
    for d in ["registry", "git", "target"] {
        std::fs::create_dir_all(cache.join(d)).unwrap();
    }
    let _lock = stack::process::Flock::exclusive(&cache.join(".lock"), 3600)
        .expect("the image cache's lock");
    let log_path =
        std::env::temp_dir().join(format!("collector-image-build.{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).unwrap();
    let mount = |d: &str, to: &str| format!("{}:{to}", cache.join(d).display());
    let (nofile, nproc) = (
        format!("nofile={0}:{0}", podman.nofile),
        format!("nproc={NPROC}:{NPROC}"),
    );
    let start = Instant::now();
    let status = Command::new("nice")
        .args([
            "-n",
            "10",
            "podman",
            "build",
            "--format",
            "docker",
            "--network",
            "host",
        ])
        .args(["--ulimit", &nofile, "--ulimit", &nproc])
        .args(["-v", &mount("registry", "/usr/local/cargo/registry")])
        .args(["-v", &mount("git", "/usr/local/cargo/git")])
        .args(["-v", &mount("target", "/src/target"), "-t", IMAGE])
        .arg(root())
        .env("CONTAINERS_CONF", podman.conf_file())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .status()
        .expect("podman build");
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(40).collect();
    assert!(
        status.success(),
        "podman build of the Dockerfile failed ({status}); last lines of {}:\n{}",
        log_path.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    // Disk: the builder stage's last image is tagged (its layers stay cached), then the
    // images of earlier builds (untagged, made FROM the local base images) are pruned.
    if let Some(id) = builder_image_id(&text) {
        podman.run(&["tag", &id, BUILDER_IMAGE]);
    }
    podman.run(&[
        "image",
        "prune",
        "-f",
        "--filter",
        "label=collector.local-base",
    ]);
    let _ = std::fs::remove_file(&log_path);
    Build {
        seconds: start.elapsed().as_secs(),
        cached_steps: text
            .lines()
            .filter(|l| l.starts_with("--> Using cache"))
            .count(),
    }
}

/// The id of the builder stage's last layer in `podman build`'s output: the last `--> ID`
/// line between `[1/2] STEP` and the first `[2/2]` line.
fn builder_image_id(log: &str) -> Option<String> {
    let mut in_builder = false;
    let mut id = None;
    for line in log.lines() {
        if line.starts_with("[1/2] STEP") {
            in_builder = true;
        } else if line.starts_with("[2/2]") {
            break;
        } else if in_builder && line.starts_with("--> ") {
            id = line.split_whitespace().last().map(str::to_owned);
        }
    }
    id
}

/// The containers and volumes of one test, named `PREFIX-...` or `PREFIX_..._1` (compose);
/// removed, with their volumes, when dropped.
pub struct Project {
    /// The prefix of every name.
    pub name: String,
}

impl Project {
    /// A project named after the test and this process.
    pub fn new(test: &str) -> Project {
        Project {
            name: format!("collector-check-{}-{test}", std::process::id()),
        }
    }

    /// Removes every container and volume of the project.
    pub fn remove_all(&self) {
        let podman = Podman::get();
        let (_, names, _) = podman.try_run(&["ps", "-a", "--format", "{{.Names}}"]);
        for c in names.lines().filter(|n| {
            n.starts_with(&format!("{}-", self.name)) || n.starts_with(&format!("{}_", self.name))
        }) {
            podman.try_run(&["rm", "-f", "-v", c]);
        }
        let (_, vols, _) = podman.try_run(&["volume", "ls", "-q"]);
        for v in vols
            .lines()
            .filter(|v| v.starts_with(&format!("{}-", self.name)))
        {
            podman.try_run(&["volume", "rm", "-f", v]);
        }
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// Polls `check` every `every` until it gives `Ok`; panics after `limit` naming `what` and
/// the last `Err`.
pub fn wait_for<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if start.elapsed() >= limit => {
                panic!(
                    "gave up after {:?} (limit {limit:?}) waiting for {what}; last seen: {e}",
                    start.elapsed()
                )
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}

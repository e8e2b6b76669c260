//! The tools the benchmark runs, installed when missing: the stack's packages
//! (`scripts/stack.sh install`), wrk, nginx and taskset (apt), linux-perf (apt, optional),
//! and oha built from its crates.io source with `-Z` lines taken in order.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{fail, Context, Result};

/// The oha release the benchmark builds.
pub const OHA_VERSION: &str = "1.16.0";

/// The line of oha's `src/request_generator.rs` that picks a `-Z` line at random.
const OHA_RANDOM: &str =
    "BodyGenerator::Random(choices) => choices.choose(rng).cloned().unwrap_or_default(),";
/// Its replacement: the lines in order, so that ids never repeat (bench writes more lines
/// than requests).
const OHA_IN_ORDER: &str = "BodyGenerator::Random(choices) => {
                // collector bench: lines in order, so that ids never repeat
                let _ = rng;
                static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                if choices.is_empty() { Bytes::new() } else {
                    choices[NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % choices.len()].clone()
                }
            }";

/// Where oha is built (BENCH_TOOLS_DIR, else ~/.cache/collector-bench).
pub fn tools_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BENCH_TOOLS_DIR") {
        return dir.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or("/root".into())).join(".cache")
        });
    cache.join("collector-bench")
}

/// The patched oha binary.
pub fn oha_bin() -> PathBuf {
    tools_dir().join("bin/oha")
}

/// Runs `cmd` with its output on stderr; errors name the command.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().context(|| format!("running {cmd:?}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(fail(format!("{cmd:?} failed ({status})")))
    }
}

/// `cmd`'s stdout as text; errors name the command.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        return Err(fail(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `name` is an executable in PATH.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

fn sudo(args: &[&str]) -> Command {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = Command::new(if root { args[0] } else { "sudo" });
    cmd.args(if root { &args[1..] } else { args });
    cmd
}

/// apt-get install `packages` without starting any service (a policy-rc.d that says no,
/// removed again).
pub fn apt_install(packages: &[&str]) -> Result<()> {
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let added = !policy.exists();
    if added {
        run(&mut sudo(&["sh", "-c", "printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d"]))?;
    }
    let mut install = vec![
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "apt-get",
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
    ];
    install.extend_from_slice(packages);
    let result =
        run(&mut sudo(&["apt-get", "update", "-qq"])).and_then(|()| run(&mut sudo(&install)));
    if added {
        let _ = run(&mut sudo(&["rm", "-f", "/usr/sbin/policy-rc.d"]));
    }
    result.map_err(|e| fail(format!("apt-get install {}: {e}", packages.join(" "))))
}

/// perf is installed and may record here.
pub fn perf_usable() -> bool {
    on_path("perf")
        && Command::new("perf")
            .args([
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-o",
                "/dev/null",
                "--",
                "true",
            ])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// Installs what is missing: the stack's packages, wrk, nginx, taskset, perf (`with_perf`,
/// optional), and oha.
pub fn install(root: &Path, with_perf: bool) -> Result<()> {
    crate::section("installing what is missing");
    run(Command::new(root.join("scripts/stack.sh")).arg("install"))?;
    let mut need = vec![];
    for (bin, package) in [
        ("wrk", "wrk"),
        ("nginx", "nginx"),
        ("taskset", "util-linux"),
    ] {
        if !on_path(bin) {
            need.push(package);
        }
    }
    if with_perf && !on_path("perf") {
        if let Err(e) = apt_install(&["linux-perf"]) {
            crate::note(&format!(
                "linux-perf could not be installed ({e}): no profile"
            ));
        }
    }
    if !need.is_empty() {
        apt_install(&need)?;
    }
    ensure_oha()
}

/// Builds oha OHA_VERSION from its crates.io source with the in-order patch, once (a stamp
/// file marks it done).
fn ensure_oha() -> Result<()> {
    let tools = tools_dir();
    let stamp = tools.join(format!("oha-{OHA_VERSION}-in-order.stamp"));
    if oha_bin().is_file() && stamp.is_file() {
        return Ok(());
    }
    crate::section(&format!(
        "building oha {OHA_VERSION} with -Z lines in order (once; about 4 minutes on 2 cores)"
    ));
    let fetch = tools.join("fetch");
    let src = tools.join("oha-src");
    let _ = std::fs::remove_dir_all(&fetch);
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(fetch.join("src"))
        .context(|| format!("creating {}", fetch.display()))?;
    let manifest = format!(
        "[package]\nname = \"fetch-oha\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n[dependencies]\noha = \"={OHA_VERSION}\"\n\n[workspace]\n"
    );
    write(&fetch.join("Cargo.toml"), &manifest)?;
    write(&fetch.join("src/lib.rs"), "")?;
    run(Command::new("cargo")
        .args(["fetch", "-q", "--manifest-path"])
        .arg(fetch.join("Cargo.toml")))?;
    let found = oha_source()?;
    run(Command::new("cp").arg("-r").arg(&found).arg(&src))?;
    run(Command::new("chmod").args(["-R", "u+w"]).arg(&src))?;
    let file = src.join("src/request_generator.rs");
    let text = std::fs::read_to_string(&file).context(|| file.display().to_string())?;
    if !text.contains(OHA_RANDOM) {
        return Err(fail(format!(
            "{}: oha source changed, cannot apply the in-order -Z patch",
            file.display()
        )));
    }
    write(&file, &text.replace(OHA_RANDOM, OHA_IN_ORDER))?;
    run(Command::new("cargo")
        .args(["install", "-q", "--locked", "--force", "--path"])
        .arg(&src)
        .arg("--root")
        .arg(&tools)
        .arg("--target-dir")
        .arg(tools.join("target")))?;
    if !oha_bin().is_file() {
        return Err(fail(format!(
            "oha build failed: no {}",
            oha_bin().display()
        )));
    }
    let _ = std::fs::remove_dir_all(tools.join("target"));
    let _ = std::fs::remove_dir_all(&fetch);
    write(&stamp, "")
}

/// The unpacked source of oha in cargo's registry.
fn oha_source() -> Result<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or("/root".into())).join(".cargo")
        });
    let registry = home.join("registry/src");
    let name = format!("oha-{OHA_VERSION}");
    std::fs::read_dir(&registry)
        .context(|| registry.display().to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(&name))
        .find(|p| p.is_dir())
        .ok_or_else(|| {
            fail(format!(
                "no {name} under {} after cargo fetch",
                registry.display()
            ))
        })
}

/// Writes `text` to `path`; the error names the path.
pub fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).context(|| format!("writing {}", path.display()))
}

/// `cargo build --release -p collector --bin collector` (with `features`).
pub fn build_collector(root: &Path, features: Option<&str>) -> Result<()> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root).args([
        "build",
        "-q",
        "--release",
        "-p",
        "collector",
        "--bin",
        "collector",
    ]);
    if let Some(f) = features {
        cmd.args(["--features", f]);
    }
    run(&mut cmd)
}

/// The first line of `cmd`'s output (stdout, else stderr), or "" when it cannot run.
pub fn first_line(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

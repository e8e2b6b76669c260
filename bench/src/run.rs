//! One run of the load benchmarks (full, quick, ablation): the logs folder, the stack and the
//! run's [`Bench`] context (the sites, nginx, the collector and the load generators' wrappers
//! are in [`crate::harness`]). Everything started is stopped on the way out: processes when
//! their handles drop, then the stack; the logs of a successful run move to
//! `target/bench-last`, a failed run's stay and are named.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{fail, Context, Result};
use crate::harness::Bench;
use crate::procs;
use crate::results::Results;
use crate::servers::{Backends, ClickHouse};
use crate::{note, section, tools, Mode, Plan};

/// Brings the stack down (and purges it) when dropped.
struct StackGuard(PathBuf);

impl Drop for StackGuard {
    fn drop(&mut self) {
        if let Err(e) = stack::Stack::down(&self.0, true) {
            eprintln!("bench: stopping the stack in {}: {e}", self.0.display());
        }
        procs::register_stack(None);
    }
}

/// The cargo target folder (CARGO_TARGET_DIR, else ROOT/target).
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// A fresh `/tmp/collector-bench.XXXXXX`.
pub fn work_dir() -> Result<PathBuf> {
    let dir = tempfile::Builder::new()
        .prefix("collector-bench.")
        .tempdir_in("/tmp")
        .context(|| "creating /tmp/collector-bench.*".into())?;
    Ok(dir.keep())
}

/// Installs, builds, runs `plan` and reports; cleans up on every way out.
pub fn run(root: &Path, plan: Plan) -> Result<()> {
    tools::install(root, plan.mode != Mode::Quick)?;
    let target = target_dir(root);
    if plan.mode == Mode::Ablation {
        // Built first, so that target/release/collector is the shipped build afterwards.
        section(
            "building the collector without the spool append (release, feature bench-no-append)",
        );
        tools::build_collector(root, Some("bench-no-append"))?;
        let (from, to) = (
            target.join("release/collector"),
            target.join("release/collector-no-append"),
        );
        std::fs::copy(&from, &to)
            .context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    if std::env::var_os("BENCH_SKIP_BUILD").is_some() && target.join("release/collector").is_file()
    {
        // For a machine short of disk or time: the release build already there is measured.
        note("BENCH_SKIP_BUILD: measuring the release build already in target/release");
    } else {
        section("building the collector (release)");
        tools::build_collector(root, None)?;
    }
    let work = work_dir()?;
    procs::register_work(Some(&work));
    procs::raise_nofile();
    let outcome = with_stack(root, &work, plan, target.join("release/collector"));
    finish(root, &work, outcome.is_ok());
    procs::register_work(None);
    outcome
}

fn with_stack(root: &Path, work: &Path, plan: Plan, bin: PathBuf) -> Result<()> {
    let dir = work.join("stack");
    section(&format!("starting the stack in {}", dir.display()));
    procs::register_stack(Some(&dir));
    let _guard = StackGuard(dir.clone());
    let stack = stack::Stack::up(
        &dir,
        stack::UpOptions {
            replicas: Some(2),
            ch26: Some(false),
            ..Default::default()
        },
    )?;
    let env = stack.env()?;
    let need = |k: &str| {
        env.get(k)
            .map(str::to_owned)
            .ok_or_else(|| fail(format!("{}/stack.env has no {k}", dir.display())))
    };
    let generic = vec![
        (format!("{}/", root.display()), String::new()),
        (work.display().to_string(), "DIR".into()),
        (tools::tools_dir().display().to_string(), "TOOLS".into()),
    ];
    let mut b = Bench::new(
        root,
        work,
        plan,
        Results::in_dir(work, generic),
        Backends {
            database_url: need("DATABASE_URL")?,
            clickhouse_urls: need("CLICKHOUSE_URLS")?,
        },
        [
            ClickHouse {
                url: need("CH1_URL")?,
            },
            ClickHouse {
                url: need("CH2_URL")?,
            },
        ],
        bin,
    );
    b.results
        .command("scripts/stack.sh up DIR/stack --replicas 2")?;
    let pinned = procs::pin_stack(&dir, &[1], procs::Share::Idle)?;
    b.results.command(&format!(
        "taskset -a -p -c 1 PID; chrt -a -i -p 0 PID; echo 19 > /proc/PID/autogroup   # each of the stack's {} processes (ClickHouse, ZooKeeper, PostgreSQL) on the load generator's core, run only when it idles",
        pinned.len()
    ))?;
    b.bootstrap_sites()?;
    b.machine()?;
    crate::steps::run(&mut b)
}

/// Success: the logs move to target/bench-last; failure: perf.data goes, the rest stays.
fn finish(root: &Path, work: &Path, ok: bool) {
    for junk in [
        "spool",
        "spool-no-append",
        "bodies.txt",
        "nginx/tmp",
        "stack",
    ] {
        let p = work.join(junk);
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
    }
    if ok {
        let last = target_dir(root).join("bench-last");
        let _ = std::fs::remove_dir_all(&last);
        match std::fs::rename(work, &last)
            .or_else(|_| tools::run(Command::new("mv").arg(work).arg(&last)))
        {
            Ok(()) => eprintln!("logs: {}", last.display()),
            Err(e) => eprintln!(
                "logs: {} (moving them to {} failed: {e})",
                work.display(),
                last.display()
            ),
        }
    } else {
        let _ = std::fs::remove_file(work.join("perf.data"));
        eprintln!("\nbench: failed; logs kept in {}", work.display());
    }
}

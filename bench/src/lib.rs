//! The collector's benchmarks next to nginx answering `return 204` (`scripts/bench.sh` runs
//! this crate's binary). The method, measured figure by figure, is in docs/benchmarks.md.
//!
//! Layout, in the order a run uses it:
//! - [`tools`]: what is installed or built first (apt, oha with `-Z` in order, the collector).
//! - [`run`]: one run: the stack (the `stack` crate) and the logs folder; stopped on every
//!   way out. [`harness`]: the run's context the steps measure through: nginx and the
//!   collector on core 0, wrk and oha on core 1.
//! - [`steps`]: the measurements (a) to (g) and the profile; [`ablation`]: the spool
//!   append's share; [`storage`]: the read side (docs/queries.md on v1's and v2's layouts).
//! - [`servers`] (the collector, nginx, ClickHouse over HTTP), [`load`] (wrk and oha, and
//!   what they print), [`probes`] (time to visibility, idle connections), [`procs`]
//!   (processes, signals, `/proc`), [`profile`] (perf), [`results`] and [`report`] (the tables
//!   and docs/benchmarks.md).

pub mod ablation;
pub mod error;
pub mod harness;
pub mod load;
pub mod probes;
pub mod procs;
pub mod profile;
pub mod report;
pub mod results;
pub mod run;
pub mod servers;
pub mod shards;
pub mod steps;
pub mod storage;
pub mod tools;

use std::time::{SystemTime, UNIX_EPOCH};

pub use error::{Error, Result};

/// What a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// About 15 minutes: every figure, a profile; writes docs/benchmarks.md.
    Full,
    /// About 2 minutes: a few seconds per step, 200 idle connections, no profile; prints
    /// the table and leaves docs/ alone.
    Quick,
    /// The spool append's share of a request: the release build, the same build without the
    /// append (feature bench-no-append) and nginx, interleaved; writes its section.
    Ablation,
    /// The read side: docs/queries.md's queries on v1's and v2's layouts, on 18.16 and on
    /// 26.x, and the user-agent derivation's cost; writes its sections.
    Storage,
    /// One shard against two: the single-beacon rate of one release build writing to one
    /// shard and to two, interleaved; writes its section.
    Shards,
}

/// The lengths and sizes of a mode's steps.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The mode.
    pub mode: Mode,
    /// Length of each throughput run, seconds.
    pub tp_secs: u64,
    /// Connection counts of the throughput runs.
    pub tp_conns: Vec<u32>,
    /// Length of each latency run, seconds.
    pub lat_secs: u64,
    /// Connections of the first latency run: a closed pool, as a proxy in front would hold
    /// (every one of them taken while a sync stalls, the load generator stops sending).
    pub lat_conns: u32,
    /// Connections of the second latency run, at the same rate: [`WIDE_CONNS`].
    pub lat_wide_conns: u32,
    /// Length of the run at 70 % load, seconds (0: none).
    pub soak_secs: u64,
    /// Visibility probes sent during it, at most.
    pub probes: u64,
    /// Idle keep-alive connections held (0: none).
    pub idle_conns: u64,
    /// Length of the perf profile, seconds (0: none).
    pub profile_secs: u64,
    /// Warm-up per server, seconds.
    pub warmup_secs: u64,
    /// Registered sites, bench-01..bench-NN.
    pub sites: u32,
}

impl Plan {
    /// The plan of `mode` (bench.sh's figures).
    pub fn of(mode: Mode) -> Plan {
        let (tp_secs, tp_conns, lat_secs, soak_secs, probes, idle_conns, profile_secs, warmup_secs) =
            match mode {
                Mode::Ablation => (15, vec![64, 256], 20, 0, 0, 0, 10, 3),
                Mode::Shards => (15, vec![64], 0, 0, 0, 0, 0, 3),
                Mode::Full | Mode::Storage => (20, vec![16, 64, 256], 30, 300, 200, 10_000, 15, 5),
                Mode::Quick => (3, vec![32], 5, 15, 10, 200, 0, 1),
            };
        Plan {
            mode,
            tp_secs,
            tp_conns,
            lat_secs,
            lat_conns: 64,
            lat_wide_conns: WIDE_CONNS,
            soak_secs,
            probes,
            idle_conns,
            profile_secs,
            warmup_secs,
            sites: 20,
        }
    }
}

/// Connections of the second latency run: the largest count of the throughput runs; its rate
/// is 70 % of the collector's best over as many. Over 64 connections at about 21,000 requests/s, a 40 ms sync
/// stall takes every connection within 3 ms, oha stops sending, and what it then sends late
/// it counts from when it should have sent (latency correction): at 70 % load the stall comes
/// back about 2.3 times over while the backlog drains at the 30 % left (docs/benchmarks.md,
/// "Reading (issue 53: the tail)"). Over 256, requests keep arriving through a stall four
/// times as long (about 12 ms at that rate), as browsers' requests do, which wait for no one,
/// and the collector's group fills meanwhile. Why not the arrivals of 50 or 100 ms (1,100 to
/// 2,200 connections): at 1,116 connections and 22,302 requests/s asked (a quick run), the
/// collector answered 19,397/s at a p50 of 149 ms, and oha, one thread on the core it shares
/// with the stack, gave nginx a p99 of 125 ms: a measure of many connections and of oha, not
/// of a sync stall.
pub const WIDE_CONNS: u32 = 256;

/// Runs `mode`; `rows` is the storage mode's row count (None: 10,000,000).
pub fn main_run(mode: Mode, rows: Option<u64>) -> Result<()> {
    procs::on_signal_cleanup();
    let root = repo_root()?;
    match mode {
        Mode::Storage => storage::run(&root, rows.unwrap_or(storage::ROWS)),
        _ => run::run(&root, Plan::of(mode)),
    }
}

/// The repository: the nearest folder above the binary's working directory with
/// `scripts/bench/beacon.lua`. Errors: none found.
fn repo_root() -> Result<std::path::PathBuf> {
    let cwd =
        std::env::current_dir().map_err(|e| error::fail(format!("the working directory: {e}")))?;
    cwd.ancestors()
        .find(|d| d.join("scripts/bench/beacon.lua").is_file())
        .map(|d| d.to_path_buf())
        .ok_or_else(|| {
            error::fail(format!(
                "no scripts/bench/beacon.lua above {}: run from the repository",
                cwd.display()
            ))
        })
}

/// Prints a section heading on stderr.
pub fn section(text: &str) {
    eprintln!("\n== {text}");
}

/// Prints an indented note on stderr.
pub fn note(text: &str) {
    eprintln!("   {text}");
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `secs` since the epoch as (year, month, day, hour, minute), UTC; past the year 9999 (beyond
/// the `time` crate) the epoch.
pub fn civil(secs: u64) -> (i64, u32, u32, u32, u32) {
    let t = i64::try_from(secs)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    (
        i64::from(t.year()),
        u32::from(u8::from(t.month())),
        u32::from(t.day()),
        u32::from(t.hour()),
        u32::from(t.minute()),
    )
}

/// Today, `YYYY-MM-DD` (UTC).
pub fn today() -> String {
    let (y, m, d, _, _) = civil(now_ms() / 1000);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Now, `YYYY-MM-DD HH:MM UTC`.
pub fn now_utc() -> String {
    let (y, m, d, h, min) = civil(now_ms() / 1000);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02} UTC")
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil(0), (1970, 1, 1, 0, 0));
        assert_eq!(super::civil(1_796_947_200), (2026, 12, 11, 0, 0));
        assert_eq!(super::civil(1_709_210_096), (2024, 2, 29, 12, 34));
    }
}

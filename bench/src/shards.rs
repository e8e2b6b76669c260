//! One shard against two (issue 49, contract v5 §3): the single-beacon rate of the same
//! release build writing to one shard (`COLLECTOR_CLICKHOUSE_URLS`, every site on shard
//! `default`) and to two (`COLLECTOR_CLICKHOUSE_SHARDS`, the sites placed over both by the hash,
//! so a spool and a writer each, and one `fdatasync` per shard and group commit), in
//! interleaved rounds at each connection count; writes its section of docs/benchmarks.md.
//!
//! The two-shard collector reads its sites from a PostgreSQL database of its own
//! (`collector_shards`: the same site keys, placed over two shards), so that the one-shard
//! collector's sites stay on `default`. Its two shards are the stack's two replicas, each a
//! shard of one: the collector cannot tell (and the cost measured is the intake's).

use std::process::Command;
use std::time::Duration;

use crate::error::{fail, Result};
use crate::harness::Bench;
use crate::report::fmt;
use crate::servers::Collector;
use crate::{note, section};

/// Interleaved rounds.
const ROUNDS: u32 = 3;
/// The two-shard rate over the one-shard rate, at least (issue 49: within 10 %).
const GOAL: f64 = 0.9;
/// The second PostgreSQL database.
const DATABASE: &str = "collector_shards";

/// Runs the comparison after the warm-up, with the one-shard collector running.
pub fn run(b: &mut Bench, one: Collector) -> Result<()> {
    let url = sharded_sites(b)?;
    let shards = format!("default={};b={}", b.ch[0].url, b.ch[1].url);
    b.results.command(&format!(
        "same, COLLECTOR_DATABASE_URL=.../{DATABASE} COLLECTOR_CLICKHOUSE_SHARDS=default=CH1;b=CH2 COLLECTOR_SPOOL_DIR=DIR/spool-shards collector serve"
    ))?;
    let bin = b.bin.clone();
    let two = b.start_collector(
        &bin,
        "spool-shards",
        "collector-shards.log",
        &[
            ("COLLECTOR_DATABASE_URL", &url),
            ("COLLECTOR_CLICKHOUSE_SHARDS", &shards),
        ],
    )?;
    let lua = b.lua.clone();
    let w = b.wrk(&two.url(), 16, b.plan.warmup_secs, 1, &lua)?;
    note(&format!(
        "two shards: {:.1} req/s, {} errors (warm-up)",
        w.rps(),
        w.errors
    ));
    let conns_list = b.plan.tp_conns.clone();
    section(&format!(
        "shards: wrk {}s at {conns_list:?} connections, 1 beacon per request, one shard / two, {ROUNDS} rounds",
        b.plan.tp_secs
    ));
    let mut best = [0.0f64; 2];
    for round in 1..=ROUNDS {
        for &conns in &conns_list {
            for (i, collector) in [&one, &two].into_iter().enumerate() {
                let rps = one_run(b, collector, conns)?;
                b.results.put(
                    &format!("shards_run_{round}_{conns}_{}", i + 1),
                    format!("{rps:.1}"),
                )?;
                best[i] = best[i].max(rps);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    one.stop();
    two.stop();
    let ratio = best[1] / best[0].max(1e-9);
    let text = format!(
        "## Shards: one against two (issue 49)\n\n\
         `scripts/bench.sh --shards`: the same release build on core 0, wrk on core 1, one beacon per request, \
         {ROUNDS} interleaved rounds of {}s at {conns_list:?} connections; the best error-free run of each.\n\n\
         | | req/s |\n| --- | --- |\n| one shard (`COLLECTOR_CLICKHOUSE_URLS`) | {} |\n| two shards (`COLLECTOR_CLICKHOUSE_SHARDS`, sites over both) | {} |\n| two over one (goal ≥ {GOAL}) | {ratio:.2} |\n\n",
        b.plan.tp_secs,
        fmt(best[0], 0, ""),
        fmt(best[1], 0, ""),
    );
    println!("{text}");
    let doc = b.root.join("docs/benchmarks.md");
    crate::report::write_section(&doc, &text, "shards")?;
    println!("wrote the shards section of {}", doc.display());
    Ok(())
}

/// One wrk run against `collector` after its spool drained; its requests/s, 0 when any
/// answer was not a 202.
fn one_run(b: &mut Bench, collector: &Collector, conns: u32) -> Result<f64> {
    collector.wait_drained()?;
    let before = collector.metrics()?;
    let lua = b.lua.clone();
    let w = b.wrk(&collector.url(), conns, b.plan.tp_secs, 1, &lua)?;
    let after = collector.metrics()?;
    let non202 = after.intake_other - before.intake_other;
    note(&format!(
        "{} c={conns}: {:.1} req/s, errors={}, non-202={non202}",
        collector.log.display(),
        w.rps(),
        w.errors
    ));
    Ok(if w.errors == 0 && non202 == 0.0 {
        w.rps()
    } else {
        0.0
    })
}

/// Makes the database `collector_shards` with the sites bench-01.. placed over the shards
/// `default` and `b` by the hash (`collector sites add` under `COLLECTOR_CLICKHOUSE_SHARDS`);
/// returns its URL.
fn sharded_sites(b: &mut Bench) -> Result<String> {
    let admin = &b.backends.database_url;
    let url = match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{DATABASE}"),
        None => return Err(fail(format!("DATABASE_URL {admin} names no database"))),
    };
    let created = Command::new("psql")
        .args([
            admin.as_str(),
            "-qc",
            &format!("CREATE DATABASE {DATABASE}"),
        ])
        .status()
        .map_err(|e| fail(format!("psql: {e}")))?;
    if !created.success() {
        return Err(fail(format!(
            "psql {admin}: CREATE DATABASE {DATABASE} failed"
        )));
    }
    let shards = format!("default={};b={}", b.ch[0].url, b.ch[1].url);
    let mut steps: Vec<Vec<String>> = vec![vec!["migrate".into()]];
    steps.extend((1..=b.plan.sites).map(|i| {
        vec![
            "sites".into(),
            "add".into(),
            "--key".into(),
            format!("bench-{i:02}"),
        ]
    }));
    for (n, step) in steps.iter().enumerate() {
        let mut cmd = Command::new(&b.bin);
        cmd.args(step).env("COLLECTOR_DATABASE_URL", &url);
        // migrate as the one shard (the stack's cluster has one); the sites over two.
        if n == 0 {
            cmd.env("COLLECTOR_CLICKHOUSE_URLS", &b.backends.clickhouse_urls);
        } else {
            cmd.env("COLLECTOR_CLICKHOUSE_SHARDS", &shards);
        }
        let out = cmd.output().map_err(|e| fail(format!("{step:?}: {e}")))?;
        if !out.status.success() {
            return Err(fail(format!(
                "collector {}: {}",
                step.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
    }
    let listed = Command::new(&b.bin)
        .args(["sites", "list"])
        .env("COLLECTOR_DATABASE_URL", &url)
        .env("COLLECTOR_CLICKHOUSE_SHARDS", &shards)
        .output()
        .map_err(|e| fail(format!("sites list: {e}")))?;
    let text = String::from_utf8_lossy(&listed.stdout);
    let on_b = text.lines().filter(|l| l.ends_with("shard=b")).count();
    note(&format!(
        "{DATABASE}: {} sites, {on_b} on shard b",
        b.plan.sites
    ));
    if on_b == 0 || on_b == b.plan.sites as usize {
        return Err(fail(format!(
            "the hash put every site on one shard:\n{text}"
        )));
    }
    Ok(url)
}

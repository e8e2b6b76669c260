//! The measurements of a full or quick run, in order: warm-up, (a) throughput and (c) CPU
//! at max, the profile, (b) latency at 70 %, (f) visibility and (g) inserts during a run at
//! 70 %, (d) peak RSS and the collector's health, (e) idle connections; then the table.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::error::{fail, Result};
use crate::harness::{format_cmd, Bench};
use crate::load::{self, Wrk};
use crate::procs;
use crate::servers::{Collector, Metrics, Nginx};
use crate::{note, report, section, Mode};

/// The best error-free run of one server at one batch size.
#[derive(Debug, Clone, Copy, Default)]
struct Best {
    rps: f64,
    conns: Option<u32>,
    cpu100k: Option<f64>,
}

/// Starts nginx and the collector, warms up, and runs the mode's steps.
pub fn run(b: &mut Bench) -> Result<()> {
    let nginx = b.start_nginx()?;
    section("starting the collector on core 0");
    b.results.command("taskset -c 0 env COLLECTOR_CLIENT_RATE=0 COLLECTOR_SITE_RATE=0 COLLECTOR_SPOOL_MAX_BYTES=8589934592 COLLECTOR_SPOOL_DIR=DIR/spool COLLECTOR_DRAIN_GRACE=0s COLLECTOR_LISTEN=127.0.0.1:PORT ... collector serve")?;
    let bin = b.bin.clone();
    let collector = b.start_collector(&bin, "spool", "collector.log", &[])?;
    section(&format!("warm-up ({}s each)", b.plan.warmup_secs));
    let lua = b.lua.clone();
    for (name, url) in [("collector:", collector.url()), ("nginx:    ", nginx.url())] {
        let w = b.wrk(&url, 16, b.plan.warmup_secs, 1, &lua)?;
        note(&format!("{name} {:.1} req/s, {} errors", w.rps(), w.errors));
    }
    collector.wait_drained()?;
    match b.plan.mode {
        Mode::Ablation => return crate::ablation::run(b, collector, nginx),
        Mode::Shards => {
            nginx.stop();
            return crate::shards::run(b, collector);
        }
        _ => {}
    }
    let best = throughput(b, &collector, &nginx)?;
    if b.plan.profile_secs > 0 {
        b.profile_run(&collector, best.conns.unwrap_or(64))?;
    }
    let rate = (best.rps * 0.7) as u64;
    b.results.put("lat_rate", rate)?;
    section(&format!(
        "(b) latency: oha open loop at {rate} req/s (70 %), {}s, {} connections",
        b.plan.lat_secs, b.plan.lat_conns
    ));
    let closed = (rate, b.plan.lat_conns);
    b.latency_run("collector", &collector.url(), closed, "lat", &collector)?;
    b.latency_run("nginx", &nginx.url(), closed, "lat", &collector)?;
    wide_latency(b, &collector, &nginx)?;
    soak(b, &collector, rate)?;
    peaks_and_health(b, &collector, &nginx)?;
    collector.stop();
    idle(b)?;
    nginx.stop();
    b.results.put("loadavg_end", procs::loadavg())?;
    report(b)
}

/// (b) again over [`crate::WIDE_CONNS`] connections, at 70 % of the collector's own best over
/// as many (its CPU per request grows with its connections: 70 % of the best at 64 is near
/// the maximum at 256). Skipped, with a note, without such a run (a quick run).
fn wide_latency(b: &mut Bench, collector: &Collector, nginx: &Nginx) -> Result<()> {
    let wide = b.plan.lat_wide_conns;
    let Some(best) = b
        .results
        .opt("tp_collector_1_wide_rps")
        .and_then(|v| v.parse::<f64>().ok())
    else {
        note(&format!(
            "no error-free run at {wide} connections: no second latency run"
        ));
        return Ok(());
    };
    let rate = (best * 0.7) as u64;
    b.results.put("latwide_conns", wide)?;
    b.results.put("latwide_rate", rate)?;
    section(&format!(
        "(b) latency over {wide} connections: oha at {rate} req/s (70 % of the collector's best over {wide}), {}s",
        b.plan.lat_secs
    ));
    let load = (rate, wide);
    b.latency_run("collector", &collector.url(), load, "latwide", collector)?;
    b.latency_run("nginx", &nginx.url(), load, "latwide", collector)
}

/// (a) and (c): wrk at each connection count, 1 and 10 beacons per request, collector and
/// nginx alternating. Returns the collector's best at 1 beacon per request.
fn throughput(b: &mut Bench, collector: &Collector, nginx: &Nginx) -> Result<Best> {
    let conns_list = b.plan.tp_conns.clone();
    section(&format!(
        "(a) throughput: wrk {}s runs at {} connections, 1 and 10 beacons per request",
        b.plan.tp_secs,
        conns_list
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let mut run_n = 0;
    let mut best_collector_1 = Best::default();
    for batch in [1u32, 10] {
        let mut best = [Best::default(), Best::default()];
        for &conns in &conns_list {
            for (i, server) in ["collector", "nginx"].into_iter().enumerate() {
                let (rps, errors, cpu100k) =
                    one_throughput_run(b, collector, nginx, server, conns, batch, &mut run_n)?;
                if errors == 0 && batch == 1 && i == 0 && conns == b.plan.lat_wide_conns {
                    b.results
                        .put("tp_collector_1_wide_rps", format!("{rps:.1}"))?;
                }
                if errors == 0 && rps > best[i].rps {
                    best[i] = Best {
                        rps,
                        conns: Some(conns),
                        cpu100k,
                    };
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        for (i, server) in ["collector", "nginx"].into_iter().enumerate() {
            let r = &mut b.results;
            r.put(
                &format!("tp_{server}_{batch}_rps"),
                format!("{:.1}", best[i].rps),
            )?;
            r.put(
                &format!("tp_{server}_{batch}_beacons"),
                format!("{:.1}", best[i].rps * f64::from(batch)),
            )?;
            r.put(
                &format!("tp_{server}_{batch}_conns"),
                best[i].conns.map_or("-".into(), |c| c.to_string()),
            )?;
        }
        b.results.put(
            &format!("cpu_per_100k_max_{batch}"),
            best[0].cpu100k.map_or("nan".into(), |c| format!("{c:.2}")),
        )?;
        if batch == 1 {
            best_collector_1 = best[0];
        }
    }
    if best_collector_1.rps == 0.0 {
        return Err(fail(
            "no collector run without errors: cannot derive the 70 % rate",
        ));
    }
    Ok(best_collector_1)
}

/// One throughput run; returns its requests/s, errors (a collector answering other than 202
/// or accepting fewer than were sent counts) and the collector's CPU seconds per 100,000.
fn one_throughput_run(
    b: &mut Bench,
    collector: &Collector,
    nginx: &Nginx,
    server: &str,
    conns: u32,
    batch: u32,
    run_n: &mut u32,
) -> Result<(f64, u64, Option<f64>)> {
    let is_collector = server == "collector";
    let (pids, url) = if is_collector {
        (vec![collector.pid()], collector.url())
    } else {
        (nginx.pids(), nginx.url())
    };
    let before = if is_collector {
        collector.wait_drained()?;
        Some(collector.metrics()?)
    } else {
        None
    };
    let cpu0 = Bench::proc_cpu(&pids)?;
    let core0 = procs::core0()?;
    let lua = b.lua.clone();
    let mut w = b.wrk(&url, conns, b.plan.tp_secs, batch, &lua)?;
    let core1 = procs::core0()?;
    let cpu = Bench::proc_cpu(&pids)? - cpu0;
    let (mut extra, mut cpu100k) = (String::new(), None);
    if let Some(before) = before {
        let after = collector.metrics()?;
        let accepted = after.accepted - before.accepted;
        let non202 = after.intake_other - before.intake_other;
        let per100k = cpu / accepted.max(1.0) * 1e5;
        cpu100k = Some(per100k);
        extra = format!(" accepted={accepted} non-202={non202} cpu/100k={per100k:.2}s");
        let expected = w.requests as f64 * f64::from(batch);
        // wrk counts a request cut off at the end of the run too: allow that much slack.
        if non202 > 0.0 || accepted + f64::from(batch * conns) < expected {
            w.errors += non202 as u64 + 1;
            extra += &format!(" (mismatch: {expected} sent)");
        }
    }
    let t = (core1.total - core0.total).max(1e-9);
    let srv = (100.0 * cpu / t).round();
    let irq = (100.0 * (core1.irq - core0.irq) / t).round();
    let other = (100.0 * (core1.busy - core0.busy - cpu - (core1.irq - core0.irq)) / t)
        .round()
        .max(0.0);
    let rps = w.rps();
    note(&format!("{server} batch={batch} c={conns}: {rps:.1} req/s, errors={}, core 0: server {srv}% irq {irq}% others {other}%, wrk CPU {}%{extra}", w.errors, w.gen_cpu));
    *run_n += 1;
    b.results.put(
        &format!("run_{:02}", *run_n),
        format!("server:{server},batch:{batch},conns:{conns},rps:{rps:.1},errors:{},gen_cpu:{},srv_pct:{srv},irq_pct:{irq},other_pct:{other}", w.errors, w.gen_cpu),
    )?;
    Ok((rps, w.errors, cpu100k))
}

/// wrk's `delay()` per request in the paced run, ms.
const DELAY_MS: f64 = 20.0;

/// beacon.lua with `delay()` (DIR/beacon-paced.lua) and the connections that make `rate`
/// with it, from a short calibration run.
fn paced_conns(
    b: &mut Bench,
    collector: &Collector,
    rate: u64,
    long: bool,
) -> Result<(u32, std::path::PathBuf)> {
    // wrk paces each connection with delay(): rate ~ conns / (delay + latency).
    let delay_ms = DELAY_MS;
    let p50 = b.results.num("lat_collector_p50_ms").min(5.0);
    let mut conns = ((rate as f64 * (delay_ms + p50) / 1000.0).ceil() as u32).clamp(1, 480);
    let paced = b.work.join("beacon-paced.lua");
    let lua =
        std::fs::read_to_string(&b.lua).map_err(|e| fail(format!("{}: {e}", b.lua.display())))?;
    crate::tools::write(
        &paced,
        &format!("{lua}\nfunction delay()\n   return {delay_ms}\nend\n"),
    )?;
    // Calibrate: one short paced run, then scale the connections to hit the target rate.
    let calib = b.wrk(&collector.url(), conns, if long { 5 } else { 2 }, 1, &paced)?;
    // At most 480: more would cross COLLECTOR_MAX_IN_FLIGHT (512) if the collector falls behind.
    conns = ((f64::from(conns) * rate as f64 / calib.rps().max(1.0)).ceil() as u32).clamp(1, 480);
    note(&format!("pacing: {:.1} req/s in the calibration run; {conns} connections with delay() of {delay_ms} ms", calib.rps()));
    Ok((conns, paced))
}

/// (f) and (g): wrk paced at `rate` for the soak length while probes measure the time to
/// visibility; INSERTs per second, parts, the replicas' own count of INSERT queries.
fn soak(b: &mut Bench, collector: &Collector, rate: u64) -> Result<()> {
    let (secs, long) = (b.plan.soak_secs, b.plan.soak_secs > 60);
    section(&format!(
        "(f)+(g) {secs}s at {rate} beacons/s with {} probes",
        b.plan.probes
    ));
    // End to end, the database's speed counts: as on a small real host, the stack may use
    // either core with an equal share here (before, it had core 1 when wrk left it idle).
    procs::pin_stack(&b.work.join("stack"), &[0, 1], procs::Share::Equal)?;
    b.results.command(
        "taskset -a -p -c 0,1 PID; chrt -a -o -p 0 PID; echo 0 > /proc/PID/autogroup   # each of the stack's processes, for (f) and (g) only",
    )?;
    collector.wait_drained()?;
    let (conns, paced) = paced_conns(b, collector, rate, long)?;
    let delay_ms = DELAY_MS;
    collector.wait_drained()?;
    for (k, v) in [
        ("soak_secs", secs.to_string()),
        ("soak_target", rate.to_string()),
        ("soak_conns", conns.to_string()),
        ("soak_delay_ms", format!("{delay_ms}")),
    ] {
        b.results.put(k, v)?;
    }
    let ev0 = insert_events(b);
    let before = collector.metrics()?;
    let cpu0 = Bench::proc_cpu(&[collector.pid()])?;
    let t0 = crate::now_ms() / 1000;
    let nonce = b.next_nonce();
    let url = collector.url();
    let w = Wrk {
        url: &url,
        conns,
        secs,
        batch: 1,
        script: &paced,
        nonce: &nonce,
        sites: b.plan.sites,
    };
    b.results.command(&format!(
        "{}   # beacon.lua + delay() of {delay_ms} ms",
        format_cmd(&w.command()).replace(&nonce, "NONCE")
    ))?;
    let out = b.work.join("wrk-soak.txt");
    let wrk = w.start(&out)?;
    std::thread::sleep(Duration::from_secs(if long { 10 } else { 2 }));
    let probe_secs = secs.saturating_sub(if long { 25 } else { 5 });
    b.results.command(&format!("(thread on core 1) probes: POST to the collector, poll CH1_URL, at most {} probes in {probe_secs} s", b.plan.probes))?;
    let (ch, count, sites) = (b.ch[0].clone(), b.plan.probes, b.plan.sites);
    let vis = std::thread::spawn(move || {
        procs::pin_thread(1);
        crate::probes::probes(&url, &ch, count, probe_secs as f64, sites)
    })
    .join()
    .map_err(|_| fail("the probes' thread panicked"))?;
    let w = load::finish(wrk, &out, secs)?;
    let t1 = crate::now_ms() / 1000;
    let cpu = Bench::proc_cpu(&[collector.pid()])? - cpu0;
    let after = collector.metrics()?;
    soak_results(
        b,
        &w,
        &after,
        &before,
        cpu,
        t1.saturating_sub(t0),
        ev0,
        t0,
        t1,
    )?;
    let r = &mut b.results;
    for (k, v) in [
        ("vis_probes", vis.probes.to_string()),
        ("vis_visible", vis.visible.to_string()),
        ("vis_p50_ms", format!("{:.1}", vis.p50_ms)),
        ("vis_p99_ms", format!("{:.1}", vis.p99_ms)),
        ("vis_max_ms", format!("{:.1}", vis.max_ms)),
    ] {
        r.put(k, v)?;
    }
    note(&format!(
        "load: {} beacons/s achieved; accepted={}; inserts={}",
        r.get("soak_rate"),
        after.accepted - before.accepted,
        after.inserts - before.inserts
    ));
    note(&format!("visibility: {} of {} probes, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (non-202 {}, timeouts {}{})", vis.visible, vis.probes, vis.p50_ms, vis.p99_ms, vis.max_ms, vis.non202, vis.timeouts, if vis.errors.is_empty() { String::new() } else { format!(", errors: {}", vis.errors.join("; ")) }));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn soak_results(
    b: &mut Bench,
    w: &load::WrkRun,
    after: &Metrics,
    before: &Metrics,
    cpu: f64,
    secs: u64,
    ev0: u64,
    t0: u64,
    t1: u64,
) -> Result<()> {
    let accepted = after.accepted - before.accepted;
    let inserts = after.inserts - before.inserts;
    let parts = "SELECT count() FROM system.parts WHERE active AND database = 'collector' AND table = 'measurements'";
    let parts1 = b.ch[0].number(parts)?;
    let parts2 = b.ch[1].number(parts)?;
    let ev1 = insert_events(b);
    if b.ch[0].query("SYSTEM FLUSH LOGS").is_err() {
        std::thread::sleep(Duration::from_secs(8));
    }
    let qlog = b.ch[0].number(&format!("SELECT count() FROM system.query_log WHERE type = 'QueryFinish' AND query LIKE 'INSERT INTO%measurements%' AND event_time >= toDateTime({t0}) AND event_time <= toDateTime({})", t1 + 2)).unwrap_or(0);
    let r = &mut b.results;
    r.put("soak_rate", (w.rps()).round())?;
    r.put("soak_errors", w.errors)?;
    r.put(
        "cpu_per_100k_soak",
        format!("{:.2}", cpu / accepted.max(1.0) * 1e5),
    )?;
    r.put(
        "soak_inserts_per_s",
        format!("{:.2}", inserts / secs.max(1) as f64),
    )?;
    r.put("soak_parts_r1", parts1)?;
    r.put("soak_parts_r2", parts2)?;
    r.put(
        "soak_ch_insert_queries",
        format!("{} (collector: {inserts})", ev1.saturating_sub(ev0)),
    )?;
    r.put(
        "soak_query_log",
        if qlog > 0 {
            format!("{qlog} INSERTs on replica 1")
        } else {
            "no INSERT rows (the collector's queries run with log_queries off)".into()
        },
    )
}

/// The replicas' `InsertQuery` event counters, summed (0 for one that does not answer).
fn insert_events(b: &Bench) -> u64 {
    let sql = "SELECT value FROM system.events WHERE event = 'InsertQuery'";
    b.ch.iter().map(|ch| ch.number(sql).unwrap_or(0)).sum()
}

/// (d) peak RSS of the collector and nginx, and the collector's health over the whole load:
/// answers other than 202, shed, insert errors, WARN/ERROR log lines (the most frequent in
/// collector-warnings.txt), replica state changes (failover-times.txt).
fn peaks_and_health(b: &mut Bench, collector: &Collector, nginx: &Nginx) -> Result<()> {
    b.results
        .put("peak_rss_kb", procs::figures(&[collector.pid()])?.hwm_kb)?;
    b.results
        .put("nginx_peak_rss_kb", procs::figures(&nginx.pids())?.hwm_kb)?;
    let h = collector.metrics()?;
    let log = std::fs::read_to_string(&collector.log)
        .map_err(|e| fail(format!("{}: {e}", collector.log.display())))?;
    let (warns, top) = warning_lines(&log);
    b.results.put("health", format!(
        "{} answers other than 202 on intake, {} shed, {} rejected, {} duplicates, {} insert errors, {} batch retries, {} failovers, {} kept aside; {warns} WARN/ERROR log lines",
        h.intake_other, h.shed, h.rejected, h.duplicates, h.insert_errors, h.batches_retried, h.failovers, h.kept_aside
    ))?;
    crate::tools::write(&b.work.join("collector-warnings.txt"), &top)?;
    let switches: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["replica state", "replica down", "replica back"]
                .iter()
                .any(|p| l.contains(p))
        })
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    crate::tools::write(&b.work.join("failover-times.txt"), &switches.join(" "))
}

/// The count of ` WARN `/` ERROR ` lines of a collector log, and the 5 most frequent (as
/// `uniq -c`: count, line without its timestamp, ports masked).
pub fn warning_lines(log: &str) -> (usize, String) {
    let level = regex::Regex::new(r" (WARN|ERROR) ").expect("a valid pattern");
    let port = regex::Regex::new(r"127\.0\.0\.1:[0-9]+").expect("a valid pattern");
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    let mut n = 0;
    for line in log.lines().filter(|l| level.is_match(l)) {
        n += 1;
        let rest = line.split_once(' ').map_or("", |(_, r)| r).trim_start();
        *counts
            .entry(port.replace_all(rest, "127.0.0.1:PORT").into_owned())
            .or_default() += 1;
    }
    let mut top: Vec<_> = counts.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let lines: Vec<String> = top
        .iter()
        .take(5)
        .map(|(l, c)| format!("{c:>7} {l}"))
        .collect();
    (n, lines.join("\n"))
}

/// (e): a fresh collector with `COLLECTOR_HEADER_TIMEOUT=120s`; RSS before and with the idle
/// connections open (a thread on core 1 holds them).
fn idle(b: &mut Bench) -> Result<()> {
    let count = b.plan.idle_conns;
    section(&format!(
        "(e) {count} idle keep-alive connections (fresh collector, COLLECTOR_HEADER_TIMEOUT=120s)"
    ));
    let bin = b.bin.clone();
    let collector = b.start_collector(
        &bin,
        "spool",
        "collector.log",
        &[("COLLECTOR_HEADER_TIMEOUT", "120s")],
    )?;
    let health = format!("http://127.0.0.1:{}/healthz", collector.port);
    for _ in 0..50 {
        let _ = crate::servers::http_status(&health);
    }
    std::thread::sleep(Duration::from_secs(2));
    let rss0 = procs::figures(&[collector.pid()])?.rss_kb;
    b.results.command(&format!(
        "(thread on core 1) {count} connections to PORT, one GET /healthz each, held 120 s"
    ))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let (port, stop2) = (collector.port, stop.clone());
    let holder = std::thread::spawn(move || {
        procs::pin_thread(1);
        crate::probes::hold_idle(port, count, Duration::from_secs(120), stop2, move |i| {
            let _ = tx.send(i);
        })
    });
    let opened = rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|_| fail("the idle connections were not opened within 120 s"))?;
    std::thread::sleep(Duration::from_secs(3));
    let rss1 = procs::figures(&[collector.pid()])?.rss_kb;
    let m = collector.metrics()?;
    stop.store(true, Ordering::SeqCst);
    let held = holder
        .join()
        .map_err(|_| fail("the idle connections' thread panicked"))?;
    b.results.put("idle_conns", count)?;
    b.results.put("idle_open", opened.open)?;
    b.results.put("idle_growth_kb", rss1 as i64 - rss0 as i64)?;
    note(&format!("RSS {} MiB -> {} MiB with {} open (open={} failed={} still_open={}); collector_http_open_connections={}", rss0 / 1024, rss1 / 1024, opened.open, opened.open, opened.failed, held.still_open, m.open_connections));
    collector.stop();
    Ok(())
}

/// Prints the table (and the health); a full run writes docs/benchmarks.md.
fn report(b: &mut Bench) -> Result<()> {
    section(&format!(
        "results ({} run)",
        if b.plan.mode == Mode::Full {
            "full"
        } else {
            "quick"
        }
    ));
    let rows = report::figures(&b.results);
    println!("{}", report::text_table(&rows));
    if b.plan.mode == Mode::Full {
        let doc = b.root.join("docs/benchmarks.md");
        let old = std::fs::read_to_string(&doc).unwrap_or_default();
        crate::tools::write(&doc, &report::document(&b.results, &b.work, &old))?;
        println!("\nwrote {}", doc.display());
    }
    println!("\nhealth: {}", b.results.get("health"));
    let warnings =
        std::fs::read_to_string(b.work.join("collector-warnings.txt")).unwrap_or_default();
    if !warnings.trim().is_empty() {
        println!("most frequent collector warnings:\n{warnings}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured lines of a collector's log (tracing's default format).
    const LOG: &str = "2026-12-01T03:40:01.101Z  INFO collector::app: listening on 127.0.0.1:23001
2026-12-01T03:41:07.552Z  WARN collector::writer: replica http://127.0.0.1:21002 lagging: 3 s
2026-12-01T03:41:09.001Z  WARN collector::writer: replica http://127.0.0.1:21002 lagging: 3 s
2026-12-01T03:42:00.000Z ERROR collector::spool: fdatasync slow: 812 ms
";

    #[test]
    fn warnings_counted_and_grouped() {
        let (n, top) = warning_lines(LOG);
        assert_eq!(n, 3);
        assert_eq!(top, "      2 WARN collector::writer: replica http://127.0.0.1:PORT lagging: 3 s\n      1 ERROR collector::spool: fdatasync slow: 812 ms");
    }
}

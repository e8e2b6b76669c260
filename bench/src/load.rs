//! The load generators: wrk (closed loop, `scripts/bench/beacon.lua`) and oha (open loop,
//! `-Z` bodies written here), each pinned to core 1, and what their outputs say.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::error::{fail, Context, Result};
use crate::procs::Proc;

/// What one wrk run reports (its `done()` line `BENCH_WRK ...`, from beacon.lua).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WrkRun {
    /// Requests completed.
    pub requests: u64,
    /// The run's length, microseconds.
    pub duration_us: u64,
    /// Socket errors (connect, read, write, timeout) and non-2xx answers.
    pub errors: u64,
    /// wrk's own CPU, % of one core over the run.
    pub gen_cpu: u64,
}

impl WrkRun {
    /// Requests per second.
    pub fn rps(&self) -> f64 {
        self.requests as f64 / (self.duration_us.max(1) as f64 / 1e6)
    }
}

/// The `BENCH_WRK key=value ...` line of wrk's output. Errors: no such line, or a field
/// missing or not a number.
pub fn parse_wrk(output: &str) -> Result<WrkRun> {
    let line = output
        .lines()
        .find_map(|l| l.strip_prefix("BENCH_WRK "))
        .ok_or_else(|| fail("no BENCH_WRK line in wrk's output"))?;
    let field = |key: &str| -> Result<u64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| fail(format!("wrk's BENCH_WRK line has no number {key}: {line}")))
    };
    let mut errors = 0;
    for key in ["connect", "read", "write", "status", "timeout"] {
        errors += field(key)?;
    }
    Ok(WrkRun {
        requests: field("requests")?,
        duration_us: field("duration_us")?,
        errors,
        gen_cpu: 0,
    })
}

/// One wrk invocation: `taskset -c 1 wrk -t1 -cCONNS -dSECSs --timeout 5s -s SCRIPT URL --
/// NONCE BATCH SITES`.
#[derive(Debug, Clone)]
pub struct Wrk<'a> {
    /// The target URL.
    pub url: &'a str,
    /// Connections.
    pub conns: u32,
    /// Length, seconds.
    pub secs: u64,
    /// Measurements per request.
    pub batch: u32,
    /// The Lua script.
    pub script: &'a Path,
    /// The run's nonce, 8 hex digits (ids never repeat across runs).
    pub nonce: &'a str,
    /// Registered sites.
    pub sites: u32,
}

impl Wrk<'_> {
    /// The command line.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "1", "wrk", "-t1"])
            .arg(format!("-c{}", self.conns))
            .arg(format!("-d{}s", self.secs))
            .args(["--timeout", "5s", "-s"])
            .arg(self.script)
            .arg(self.url)
            .arg("--")
            .arg(self.nonce)
            .arg(self.batch.to_string())
            .arg(self.sites.to_string());
        cmd
    }

    /// Starts it in the background, output to `out`.
    pub fn start(&self, out: &Path) -> Result<Proc> {
        Proc::spawn("wrk", self.command(), out)
    }

    /// Runs it to the end, output to `out`; parses the result and wrk's CPU share.
    pub fn run(&self, out: &Path) -> Result<WrkRun> {
        finish(self.start(out)?, out, self.secs)
    }
}

/// Waits for a started wrk (at most its length + 60 s) and reads its result from `out`.
pub fn finish(proc: Proc, out: &Path, secs: u64) -> Result<WrkRun> {
    let (_, cpu) = proc.wait_cpu(Duration::from_secs(secs + 60))?;
    let text = std::fs::read_to_string(out).context(|| out.display().to_string())?;
    let mut run = parse_wrk(&text)
        .map_err(|e| fail(format!("wrk failed ({}): {e}\n{text}", out.display())))?;
    run.gen_cpu = (100.0 * cpu / (run.duration_us.max(1) as f64 / 1e6)).round() as u64;
    Ok(run)
}

/// Figures of one oha run (its `--output-format json`), latencies in ms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OhaRun {
    /// Requests per second achieved.
    pub rps: f64,
    /// Latency percentiles and the slowest, ms (NaN when absent).
    pub p50_ms: f64,
    /// p99, ms.
    pub p99_ms: f64,
    /// p99.9, ms.
    pub p999_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
    /// 2xx answers.
    pub ok: u64,
    /// Other answers.
    pub non2xx: u64,
    /// Connection errors and timeouts.
    pub errors: u64,
}

/// An oha JSON result. Errors: not JSON, or no `summary`.
pub fn parse_oha(json: &str) -> Result<OhaRun> {
    let d: serde_json::Value =
        serde_json::from_str(json).map_err(|e| fail(format!("oha's JSON: {e}")))?;
    let summary = d
        .get("summary")
        .ok_or_else(|| fail("oha's JSON has no summary"))?;
    let secs = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let lat = d.get("latencyPercentiles");
    let ms = |k: &str| secs(lat.and_then(|l| l.get(k))) * 1000.0;
    let counts = |key: &str, pick: &dyn Fn(&str) -> bool| -> u64 {
        d.get(key)
            .and_then(|v| v.as_object())
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| pick(k))
                    .filter_map(|(_, v)| v.as_u64())
                    .sum()
            })
            .unwrap_or(0)
    };
    Ok(OhaRun {
        rps: secs(summary.get("requestsPerSec")),
        p50_ms: ms("p50"),
        p99_ms: ms("p99"),
        p999_ms: ms("p99.9"),
        max_ms: secs(summary.get("slowest")) * 1000.0,
        ok: counts("statusCodeDistribution", &|k| k.starts_with('2')),
        non2xx: counts("statusCodeDistribution", &|k| !k.starts_with('2')),
        errors: counts("errorDistribution", &|_| true),
    })
}

/// oha open loop: `RATE` requests/s for `secs` over `conns` connections, bodies from `bodies`.
pub fn oha_command(
    oha: &Path,
    url: &str,
    rate: u64,
    secs: u64,
    conns: u32,
    bodies: &Path,
    json: &Path,
) -> Command {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", "1"])
        .arg(oha)
        .args(["--no-tui", "--worker-threads", "1", "-z"])
        .arg(format!("{secs}s"))
        .arg("-q")
        .arg(rate.to_string())
        .args(["--latency-correction", "-w", "-c"])
        .arg(conns.to_string())
        .args(["-m", "POST", "-T", "text/plain;charset=UTF-8"])
        .args(["-H", "Origin: https://shop01.example"])
        .args([
            "-H",
            "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
        ])
        .arg("-Z")
        .arg(bodies)
        .args(["--output-format", "json", "-o"])
        .arg(json)
        .arg(url);
    cmd
}

const PATHS: [&str; 8] = [
    "/",
    "/products/{a}",
    "/products/{a}?variant={b}",
    "/category/{b}",
    "/search?q=item+{a}",
    "/cart",
    "/checkout/shipping",
    "/account/orders/{a}",
];
const NAV: [&str; 8] = [
    "navigate",
    "navigate",
    "navigate",
    "navigate",
    "reload",
    "back_forward",
    "prerender",
    "restore",
];
const ECT: [&str; 7] = ["4g", "4g", "4g", "4g", "3g", "2g", "slow-2g"];
const WIDTHS: [u32; 12] = [
    360, 375, 390, 412, 414, 768, 1024, 1280, 1366, 1440, 1536, 1920,
];
const REFERRERS: [&str; 4] = [
    "https://www.google.com/",
    "https://www.bing.com/",
    "https://duckduckgo.com/",
    "https://shop{s}.example/",
];

/// One measurement like beacon.lua's (same fields, similar values), as JSON; `site` from 1,
/// `now_ms` the send time in ms since the epoch.
pub fn beacon(rng: &mut fastrand::Rng, id: &str, site: u32, now_ms: u64) -> String {
    let ttfb = 40.0 + rng.f64() * 900.0;
    let fcp = ttfb + rng.f64() * 1500.0;
    let lcp = fcp + rng.f64() * 2500.0;
    let path = PATHS[rng.usize(..PATHS.len())]
        .replace("{a}", &rng.u32(1..=99999).to_string())
        .replace("{b}", &rng.u32(1..=50).to_string());
    let referrer = REFERRERS[rng.usize(..REFERRERS.len())].replace("{s}", &format!("{site:02}"));
    format!(
        "{{\"id\":\"{id}\",\"site\":\"bench-{site:02}\",\"url\":\"https://shop{site:02}.example{path}\",\
         \"ts\":{},\"referrer\":\"{referrer}\",\"navigation_type\":\"{}\",\"ttfb_ms\":{ttfb:.1},\
         \"fcp_ms\":{fcp:.1},\"lcp_ms\":{lcp:.1},\"inp_ms\":{:.1},\"dom_content_loaded_ms\":{:.1},\
         \"load_ms\":{:.1},\"cls\":{:.3},\"viewport_width\":{},\"effective_connection_type\":\"{}\"}}",
        now_ms - rng.u64(0..=3000),
        NAV[rng.usize(..NAV.len())],
        8.0 + rng.f64() * 592.0,
        fcp + rng.f64() * 800.0,
        lcp + rng.f64() * 3000.0,
        rng.f64() * rng.f64() * 0.6,
        WIDTHS[rng.usize(..WIDTHS.len())],
        ECT[rng.usize(..ECT.len())],
    )
}

/// A random version-4 UUID (the probes' ids).
pub fn uuid4(rng: &mut fastrand::Rng) -> String {
    let (a, b) = (rng.u64(..), rng.u64(..));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:x}{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        8 + (b >> 62),
        (b >> 48) & 0xfff,
        b & 0xffff_ffff_ffff
    )
}

/// Writes `n` single-beacon bodies for oha `-Z`, one per line; ids never repeat (nonce +
/// counter).
pub fn write_bodies(path: &Path, n: u64, nonce: &str, sites: u32) -> Result<()> {
    let mut rng = fastrand::Rng::with_seed(u64::from_str_radix(nonce, 16).unwrap_or(0));
    let now_ms = crate::now_ms();
    let mut out = String::with_capacity(n as usize * 520);
    for i in 0..n {
        let id = format!(
            "{nonce}-ffff-4{:03x}-{:x}{:03x}-{:012x}",
            rng.u32(..4096),
            rng.u32(8..=11),
            rng.u32(..4096),
            i + 1
        );
        let site = rng.u32(1..=sites);
        let _ = writeln!(out, "{}", beacon(&mut rng, &id, site, now_ms));
    }
    std::fs::write(path, out).context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured: `wrk -t1 -c32 -d3s -s scripts/bench/beacon.lua` against the collector.
    const WRK: &str = "Running 3s test @ http://127.0.0.1:23456/api/v1/measurements
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.12ms    1.04ms  21.37ms   86.12%
    Req/Sec    10.31k   512.20    11.02k    76.67%
  30812 requests in 3.00s, 2.73MB read
Requests/sec:  10263.78
Transfer/sec:    931.62KB
BENCH_WRK requests=30812 duration_us=3002026 connect=0 read=0 write=0 status=0 timeout=0 p50_us=2971 p99_us=6872 max_us=21370
";

    #[test]
    fn wrk_line_parsed() {
        let r = parse_wrk(WRK).unwrap();
        assert_eq!(r.requests, 30812);
        assert_eq!(r.duration_us, 3002026);
        assert_eq!(r.errors, 0);
        assert!((r.rps() - 10263.8).abs() < 0.1);
        let bad = WRK
            .replace("read=0", "read=3")
            .replace("timeout=0", "timeout=2");
        assert_eq!(parse_wrk(&bad).unwrap().errors, 5);
        assert!(parse_wrk("unable to connect to 127.0.0.1:1 Connection refused").is_err());
        assert!(parse_wrk("BENCH_WRK requests=x").is_err());
    }

    // Captured: oha 1.16.0 `--output-format json` (trimmed of the histogram fields).
    const OHA: &str = r#"{"summary":{"successRate":1.0,"total":5.001,"slowest":0.0213,"fastest":0.0004,"average":0.0011,"requestsPerSec":7180.3,"totalData":0,"sizePerRequest":0,"sizePerSec":0.0},
"responseTimeHistogram":{"0.0004":1},"latencyPercentiles":{"p10":0.0006,"p25":0.0008,"p50":0.00102,"p75":0.0012,"p90":0.0015,"p95":0.0018,"p99":0.00311,"p99.9":0.0101,"p99.99":0.02},
"rps":{"mean":7180.0,"stddev":10.0,"max":7200.0,"min":7100.0,"percentiles":{}},"details":{},
"statusCodeDistribution":{"202":35890,"400":2},"errorDistribution":{"connection closed before message completed":3}}"#;

    #[test]
    fn oha_json_parsed() {
        let r = parse_oha(OHA).unwrap();
        assert_eq!(r.rps, 7180.3);
        assert!((r.p50_ms - 1.02).abs() < 1e-9);
        assert!((r.p99_ms - 3.11).abs() < 1e-9);
        assert!((r.p999_ms - 10.1).abs() < 1e-9);
        assert!((r.max_ms - 21.3).abs() < 1e-9);
        assert_eq!((r.ok, r.non2xx, r.errors), (35890, 2, 3));
        assert!(parse_oha("{}").is_err());
        assert!(parse_oha("oha: error").is_err());
    }

    #[test]
    fn bodies_are_json_with_unique_ids() {
        let mut rng = fastrand::Rng::with_seed(7);
        let b = beacon(&mut rng, "x", 3, 1_700_000_000_000);
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["site"], "bench-03");
        assert!(v["url"]
            .as_str()
            .unwrap()
            .starts_with("https://shop03.example/"));
        let id = uuid4(&mut rng);
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
    }
}

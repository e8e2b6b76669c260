//! Two measuring clients that run on core 1 beside the load: the time from a 202 to a
//! visible row (probes), and idle keep-alive connections held open.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::load::{beacon, uuid4};
use crate::servers::ClickHouse;

/// The probes' summary: time from 202 to the first poll that sees the row, ms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Visibility {
    /// Probes sent.
    pub probes: u64,
    /// Probes whose row was seen.
    pub visible: u64,
    /// Answers other than 202.
    pub non202: u64,
    /// Rows not seen within 30 s.
    pub timeouts: u64,
    /// The first errors (a dropped connection is a finding, not a crash).
    pub errors: Vec<String>,
    /// Nearest-rank p50, ms (NaN without any).
    pub p50_ms: f64,
    /// p99, ms.
    pub p99_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
}

/// Nearest-rank percentile `p` (0..100) of `values`; NaN when empty.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut s = values.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let k = ((p * s.len() as f64 / 100.0).ceil() as usize).clamp(1, s.len()) - 1;
    s[k]
}

/// Sends up to `count` probe beacons to `intake` one at a time for at most `seconds`, and
/// for each polls `ch` every 20 ms (at most 30 s) for its row.
pub fn probes(intake: &str, ch: &ClickHouse, count: u64, seconds: f64, sites: u32) -> Visibility {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let mut rng = fastrand::Rng::new();
    let mut v = Visibility::default();
    let mut seen = vec![];
    let stop_at = Instant::now() + Duration::from_secs_f64(seconds);
    while v.probes < count && Instant::now() < stop_at {
        v.probes += 1;
        let id = uuid4(&mut rng);
        let site = rng.u32(1..=sites);
        let body = beacon(&mut rng, &id, site, crate::now_ms());
        let sent = agent
            .post(intake)
            .set("Content-Type", "text/plain;charset=UTF-8")
            .set("Origin", &format!("https://shop{site:02}.example"))
            .send_string(&body);
        let t202 = Instant::now();
        match sent {
            Ok(r) if r.status() == 202 => {}
            Ok(_) | Err(ureq::Error::Status(..)) => {
                v.non202 += 1;
                continue;
            }
            Err(e) => {
                v.errors.push(format!("post: {e}"));
                continue;
            }
        }
        let sql = format!("SELECT count() FROM collector.measurements WHERE site = 'bench-{site:02}' AND id = toUUID('{id}')");
        let mut k = 0;
        loop {
            k += 1;
            let next = t202 + Duration::from_millis(20 * k);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let found = match ch.query_with(&sql, &[], Duration::from_secs(10)) {
                Ok((text, _)) => text.parse::<u64>().unwrap_or(0) > 0,
                Err(e) => {
                    v.errors.push(format!("clickhouse: {e}"));
                    false
                }
            };
            let elapsed = t202.elapsed();
            if found {
                seen.push(elapsed.as_secs_f64() * 1000.0);
                break;
            }
            if elapsed > Duration::from_secs(30) {
                v.timeouts += 1;
                break;
            }
        }
    }
    v.errors.truncate(5);
    v.visible = seen.len() as u64;
    v.p50_ms = percentile(&seen, 50.0);
    v.p99_ms = percentile(&seen, 99.0);
    v.max_ms = seen.iter().copied().fold(f64::NAN, f64::max);
    v
}

/// Idle connections: how many opened, failed, and were still open at the end.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Idle {
    /// Opened, answered one `GET /healthz` with 200, kept.
    pub open: u64,
    /// Failed to open or to answer.
    pub failed: u64,
    /// Still open when released (a server that closed them early shows here).
    pub still_open: u64,
}

/// Opens `count` connections to `port`, sends one `GET /healthz` on each and reads the
/// answer; `ready` is called with the counts, then they are held until `stop` is set or
/// `hold` passes.
pub fn hold_idle(
    port: u16,
    count: u64,
    hold: Duration,
    stop: Arc<AtomicBool>,
    ready: impl FnOnce(Idle),
) -> Idle {
    let mut socks = vec![];
    let mut idle = Idle::default();
    for _ in 0..count {
        match open_one(port) {
            Ok(s) => socks.push(s),
            Err(_) => idle.failed += 1,
        }
    }
    idle.open = socks.len() as u64;
    ready(idle);
    let end = Instant::now() + hold;
    while !stop.load(Ordering::SeqCst) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
    }
    for s in &mut socks {
        let _ = s.set_nonblocking(true);
        let mut b = [0u8; 1];
        if let Err(e) = s.read(&mut b) {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                idle.still_open += 1;
            }
        }
    }
    idle
}

fn open_one(port: u16) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: keep-alive\r\n\r\n")?;
    let mut data = vec![];
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        data.extend_from_slice(&buf[..n]);
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
    let need: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while data.len() - head_end < need {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        data.extend_from_slice(&buf[..n]);
    }
    if !head.starts_with("http/1.1 200") {
        return Err(std::io::Error::other(
            head.lines().next().unwrap_or("").to_owned(),
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 100.0);
        assert_eq!(percentile(&v, 99.0), 198.0);
        assert_eq!(percentile(&[5.0], 99.0), 5.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}

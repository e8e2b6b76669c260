//! Loopback ports for the stack's servers: picked at random in
//! [[`PORT_MIN`], the kernel's ephemeral range), so that an outgoing connection never takes a
//! stopped server's port before it starts again, and reserved machine-wide in a file shared
//! with `scripts/lib.sh`'s `alloc_ports` (same path, same format, same `flock`), so that
//! stacks in other folders and the shell scripts never pick the same port before their server
//! has bound it.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::process::Flock;

/// Lowest port handed out.
pub const PORT_MIN: u16 = 20000;
/// How long a reservation keeps a port from being handed out again (scripts/lib.sh: 600 s).
pub const RESERVATION: Duration = Duration::from_secs(600);
/// Random picks tried before giving up.
const TRIES: usize = 10_000;

/// Most ports [`alloc`] hands out at once.
pub const MAX_AT_ONCE: usize = 64;

/// `N` (1..=[`MAX_AT_ONCE`]) distinct free loopback ports, reserved for [`RESERVATION`].
///
/// Errors: N out of range, the reservation file cannot be locked within 30 s or written, or
/// no free port was found in [`TRIES`] picks.
pub fn alloc(n: usize) -> Result<Vec<u16>> {
    if !(1..=MAX_AT_ONCE).contains(&n) {
        return Err(Error::new(format!(
            "ports: {n} asked for, 1..={MAX_AT_ONCE} at once"
        )));
    }
    let hi = ephemeral_low().saturating_sub(1);
    let hi = if hi > PORT_MIN + 1000 {
        hi
    } else {
        PORT_MIN + 10_000
    };
    with_reservations(|taken, now| {
        let busy: Vec<u16> = sockets().map(|(local, _)| local).collect();
        let mut rng = seed();
        let mut out = Vec::with_capacity(n);
        let mut tries = 0;
        while out.len() < n {
            tries += 1;
            if tries > TRIES {
                return Err(Error::new(format!(
                    "no free port found in {PORT_MIN}..{hi}"
                )));
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let p = PORT_MIN + (rng % u64::from(hi - PORT_MIN + 1)) as u16;
            if taken.contains_key(&p) || busy.contains(&p) {
                continue;
            }
            taken.insert(p, now);
            out.push(p);
        }
        Ok(out)
    })
}

/// Reserves `ports` again for [`RESERVATION`] from now: a server's ports while it is
/// stopped, so that no other stack or script is handed them before it starts again.
///
/// Errors: those of the reservation file.
pub fn reserve(ports: &[u16]) -> Result<()> {
    with_reservations(|taken, now| {
        for p in ports {
            taken.insert(*p, now);
        }
        Ok(())
    })
}

/// Runs `f` on the live reservations (port → when reserved, seconds since the epoch) and
/// the time now, under the machine-wide lock, and writes them back when it succeeds.
fn with_reservations<T>(f: impl FnOnce(&mut BTreeMap<u16, u64>, u64) -> Result<T>) -> Result<T> {
    let tmp = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    let reserve = tmp.join("collector-stack-ports.reserved");
    let _lock = Flock::exclusive(&tmp.join("collector-stack-ports.reserved.lock"), 30)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut taken: BTreeMap<u16, u64> = BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(&reserve) {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(Ok(p)), Some(Ok(ts))) = (
                words.next().map(str::parse::<u16>),
                words.next().map(str::parse::<u64>),
            ) else {
                continue;
            };
            if now.saturating_sub(ts) < RESERVATION.as_secs() {
                taken.insert(p, ts);
            }
        }
    }
    let out = f(&mut taken, now)?;
    let tmp_file = reserve.with_extension("reserved.tmp");
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&tmp_file)?;
    for (p, ts) in &taken {
        writeln!(file, "{p} {ts}")?;
    }
    fs_err::rename(&tmp_file, &reserve)?;
    Ok(out)
}

/// Some TCP socket (IPv4 or IPv6, any state) has `port` as its own: a new port must stay
/// clear of it.
pub fn in_use(port: u16) -> bool {
    sockets().any(|(local, _)| local == port)
}

/// Some socket listens on `port`. Before a server starts again on its old port: leftover
/// `TIME_WAIT` connections do not count (the stack's servers bind with `SO_REUSEADDR`).
pub fn listening(port: u16) -> bool {
    // State 0A is TCP_LISTEN (include/net/tcp_states.h).
    sockets().any(|(local, state)| local == port && state == "0A")
}

/// (local port, state) of every socket in /proc/net/tcp and tcp6.
fn sockets() -> impl Iterator<Item = (u16, String)> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .into_iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let cols: Vec<&str> = line.split_whitespace().collect();
                    let local = cols.get(1)?.rsplit_once(':')?.1;
                    let port = u16::from_str_radix(local, 16).ok()?;
                    Some((port, (*cols.get(3)?).to_owned()))
                })
                .collect::<Vec<_>>()
        })
}

/// The first port of the kernel's ephemeral range (32768 when unreadable).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

fn seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    (nanos ^ (u64::from(std::process::id()) << 32)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_in_range() {
        let ports = alloc(5).unwrap();
        assert_eq!(ports.len(), 5);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 5, "{ports:?}");
        assert!(
            ports.iter().all(|p| *p >= PORT_MIN && !listening(*p)),
            "{ports:?}"
        );
    }

    #[test]
    fn a_listening_socket_is_seen() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening(port) && in_use(port));
    }
}

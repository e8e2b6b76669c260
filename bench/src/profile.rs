//! The CPU profile section: `perf report` of a `perf record -g` of the collector, read as
//! stages (inclusive shares of the frames that stand for them), kinds of code (self time) and
//! the top functions.

use std::path::Path;
use std::process::Command;

use regex::Regex;

use crate::error::{fail, Result};

/// Stages of the collector: (label, pattern of the frames that stand for it). The largest
/// inclusive share among matching frames counts (frames nest, so shares never add).
const STAGES: &[(&str, &str)] = &[
    (
        "connection tasks (hyper read/parse/write + router + handler)",
        r"^(collector::server::serve::\{\{closure\}\}::\{\{closure\}\}|poll<collector::server::serve::\{async_fn#0\})",
    ),
    (
        "  hyper: read and parse a request (incl. recv)",
        r"^(hyper::proto::h1::role::Server::parse|parse<hyper_util::rt::tokio::TokioIo|hyper::proto::h1::io::Buffered<.*>::parse$)",
    ),
    (
        "  socket writes of answers (writev)",
        r"^(__GI___writev|__x64_sys_writev)$",
    ),
    (
        "  router and middlewares (incl. handler)",
        r"^(axum::middleware::from_fn::Next::run|<axum::middleware::from_fn::FromFn<)",
    ),
    (
        "    intake stations `intake::accept` (its own task)",
        r"^(collector::endpoints::intake::(post|accept)|poll<collector::endpoints::intake::post::\{async_fn#0\})",
    ),
    (
        "      judge `stations::judge` (parse, the field table's rules)",
        r"^collector::endpoints::intake::stations::judge$",
    ),
    (
        "        body parse `beacon::decode::parse` (serde_json)",
        r"^(collector::beacon::(decode::)?)?parse$",
    ),
    (
        "        URL normalisation `rules::normalise_url`",
        r"^(collector::measurement::rules::)?normalise_url$",
    ),
    (
        "      site stage `stations::settle` (minimise, page group, dimensions)",
        r"^collector::endpoints::intake::stations::settle$",
    ),
    (
        "        site settings `SiteSettings::lookup`",
        r"^(collector::settings::SiteSettings::)?lookup(::\{\{closure\}\})?$",
    ),
    (
        "      dedup window `Dedup::claim`",
        r"^(collector::dedup::Dedup::)?claim$",
    ),
    (
        "      rows encoded once for the spool `measurement::encode` (RowBinary)",
        r"^collector::measurement::(EncodedRows::)?encode",
    ),
    (
        "spool appender thread `Appender::run`",
        r"^(collector::spool::appender::Appender::(run|commit(_group)?)|commit_group)$",
    ),
    ("  fdatasync", r"^__x64_sys_fdatasync$"),
    (
        "waking the group's requests: the committer's `Notify::notify_one`, the leader's `notify_waiters` (incl. unparking the worker)",
        r"^((tokio::sync::notify::Notify::)?notify_(one|waiters)|tokio::runtime::scheduler::multi_thread::park::Unparker::unpark)$",
    ),
    (
        "runtime worker parking and waking `Context::park_internal` (epoll, idle)",
        r"^tokio::runtime::(scheduler::multi_thread::worker::Context|time::Driver)::park_internal$",
    ),
    (
        "writer thread (own runtime, nice +10) `writer::run`",
        r"^(collector::writer::run|collector::writer::spawn::\{\{closure\}\})",
    ),
    (
        "  spool read `SpoolReader::read_available` (pread, no decoding)",
        r"^collector::spool::reader::SpoolReader::read_(available|frames)",
    ),
    (
        "  ClickHouse insert `replicas::insert_rows` (LZ4, HTTP)",
        r"^collector::writer::replicas::insert_rows",
    ),
    (
        "    LZ4 compression (clickhouse client)",
        r"^lz4_flex::block::compress::compress",
    ),
    (
        "decoding at the spool boundary (rows or JSON decoded between intake and ClickHouse)",
        r"^(collector::measurement::(decode_all|row_bounds|Measurement::decode)|collector::spool::format::(to_rowbinary|scan_v1)|serde_json::de::from_slice)",
    ),
    ("socket reads (recv)", r"^(__libc_recv|__x64_sys_recvfrom)$"),
    ("epoll_wait", r"^__x64_sys_epoll_wait$"),
    ("futex (thread wake-ups)", r"^__x64_sys_futex$"),
    ("all system calls", r"^do_syscall_64$"),
];

/// The allocator's entry points, summed inclusively.
const ALLOC: &str = r"^__GI___libc_(malloc|free|realloc)|^__libc_calloc|^_rjem_(malloc|sdallocx|realloc|calloc|free)$|^_rjem_je_(malloc_default|sdallocx_default)$";

/// Kinds of code by self time: (label, pattern); the kernel is the `[k]` frames, first.
const CATEGORIES: &[(&str, &str)] = &[
    (
        "allocator (jemalloc, or glibc malloc/free)",
        r"^_rjem_|malloc|_int_free|cfree|free$|realloc|calloc|unlink_chunk|tcache|consolidate|^free",
    ),
    ("memcpy/memmove/memset", r"mem(cpy|move|set|cmp)"),
    ("moka (caches)", r"moka::"),
    ("serde_json", r"serde_json|serde_core"),
    ("hashing (SipHash)", r"sip::|hash_one"),
    ("url", r"^url::|idna"),
    (
        "hyper/http/axum/tower",
        r"hyper|^http::|httparse|axum|tower",
    ),
    ("tokio", r"tokio::|mio::"),
    ("clickhouse client, lz4", r"clickhouse|(?i)lz4"),
    ("collector code", r"collector::"),
];

/// One frame of `perf report --children --sort symbol`.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Inclusive share, %.
    pub children: f64,
    /// Self share, %.
    pub own: f64,
    /// Kernel frame (`[k]`).
    pub kernel: bool,
    /// The symbol.
    pub symbol: String,
}

/// The frames of a `perf report --children --stdio` text.
pub fn parse_report(text: &str) -> Vec<Frame> {
    let row = Regex::new(r"^\s*([\d.]+)%\s+([\d.]+)%\s+\[(.)\]\s+(.*?)(?:\s+-)*\s*$")
        .expect("a valid pattern");
    text.lines()
        .filter_map(|line| {
            let c = row.captures(line)?;
            Some(Frame {
                children: c[1].parse().ok()?,
                own: c[2].parse().ok()?,
                kernel: &c[3] == "k",
                symbol: c[4].replace("(inlined)", "").trim().to_owned(),
            })
        })
        .collect()
}

/// Drops generic arguments (they make Rust frames unreadable); keeps `<A as B>::f`; at most
/// `n` characters.
pub fn short(sym: &str, n: usize) -> String {
    let keep = usize::from(sym.starts_with('<'));
    let (mut out, mut depth) = (String::new(), 0usize);
    for ch in sym.chars() {
        if ch == '<' {
            depth += 1;
            if depth == keep + 1 {
                out.push_str("<…>");
            }
            if depth > keep {
                continue;
            }
        } else if ch == '>' && depth > 0 {
            depth -= 1;
            if depth >= keep {
                continue;
            }
        } else if depth > keep {
            continue;
        }
        out.push(ch);
    }
    if out.chars().count() <= n {
        out
    } else {
        out.chars().take(n - 1).collect::<String>() + "…"
    }
}

/// The profile section from `frames`; `note` says how the load ran.
pub fn render(frames: &[Frame], note: &str, top: usize) -> String {
    let mut lines = vec![
        format!("CPU profile of the collector under wrk at its best single-beacon connection count (`perf record -e cpu-clock -F 499 --call-graph dwarf`, {note}); shares are of the collector's on-CPU samples (all its threads, all on core 0)."),
        String::new(),
        "Where the time goes, by stage (inclusive; stages nest, so they do not add up):".into(),
        String::new(),
        "| stage | share |".into(),
        "| --- | --- |".into(),
    ];
    for (label, pattern) in STAGES {
        let rx = Regex::new(pattern).expect("a valid pattern");
        let best = frames
            .iter()
            .filter(|f| rx.is_match(&f.symbol))
            .map(|f| f.children)
            .fold(0.0, f64::max);
        lines.push(format!("| {label} | {best:.1} % |"));
    }
    let alloc_rx = Regex::new(ALLOC).expect("a valid pattern");
    let alloc: f64 = frames
        .iter()
        .filter(|f| alloc_rx.is_match(&f.symbol))
        .map(|f| f.children)
        .sum();
    lines.push(format!("| allocator: malloc + free + realloc + calloc (inclusive, summed; glibc or jemalloc) | {alloc:.1} % |"));
    let mut flat: Vec<&Frame> = frames.iter().filter(|f| f.own > 0.0).collect();
    flat.sort_by(|a, b| b.own.total_cmp(&a.own).then(b.symbol.cmp(&a.symbol)));
    lines.extend(
        [
            "",
            "Self time by kind of code (each sample counted once, first match):",
            "",
            "| kind | share |",
            "| --- | --- |",
        ]
        .map(String::from),
    );
    let kinds: Vec<(&str, Regex)> = CATEGORIES
        .iter()
        .map(|(l, p)| (*l, Regex::new(p).expect("a valid pattern")))
        .collect();
    let (mut kernel, mut totals, mut other) = (0.0, vec![0.0; kinds.len()], 0.0);
    for f in &flat {
        if f.kernel {
            kernel += f.own;
        } else if let Some(i) = kinds.iter().position(|(_, rx)| rx.is_match(&f.symbol)) {
            totals[i] += f.own;
        } else {
            other += f.own;
        }
    }
    lines.push(format!("| kernel | {kernel:.1} % |"));
    for ((label, _), total) in kinds.iter().zip(&totals) {
        lines.push(format!("| {label} | {total:.1} % |"));
    }
    lines.push(format!("| other (libc, std, ...) | {other:.1} % |"));
    lines.extend([
        String::new(),
        format!("Top {top} functions by self time:"),
        String::new(),
        "| self | function |".into(),
        "| --- | --- |".into(),
    ]);
    for f in flat.iter().take(top) {
        lines.push(format!(
            "| {:.2} % | `{}`{} |",
            f.own,
            short(&f.symbol, 110),
            if f.kernel { " (kernel)" } else { "" }
        ));
    }
    lines.join("\n") + "\n"
}

/// Runs `perf report` on `data` and renders the section. Errors: perf failed (its stderr).
pub fn from_perf(data: &Path, note: &str) -> Result<String> {
    let out = Command::new("perf")
        .args(["report", "-i"])
        .arg(data)
        .args([
            "--children",
            "--sort",
            "symbol",
            "-g",
            "none",
            "--stdio",
            "--percent-limit",
            "0.05",
        ])
        .output()
        .map_err(|e| fail(format!("perf report -i {}: {e}", data.display())))?;
    if !out.status.success() {
        return Err(fail(format!(
            "perf report -i {}: {}",
            data.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(render(
        &parse_report(&String::from_utf8_lossy(&out.stdout)),
        note,
        25,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders the profile of the last benchmark run again, with the stages as they are now
    /// (after a rename, without measuring again): `PROFILE_NOTE="wrk …" cargo test -p bench
    /// -- --ignored --nocapture render_last_profile`. Fails when there is no
    /// `target/bench-last/perf.data`.
    #[test]
    #[ignore]
    fn render_last_profile() {
        let data =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-last/perf.data");
        let note = std::env::var("PROFILE_NOTE").unwrap_or_default();
        let md = from_perf(&data, &note).unwrap_or_else(|e| panic!("{}: {e}", data.display()));
        println!("{md}");
    }

    // Captured: `perf report --children --sort symbol -g none --stdio` of the collector.
    const REPORT: &str = "# Samples: 7K of event 'cpu-clock'
# Event count (approx.): 15030060120
#
# Children      Self  Symbol
# ........  ........  ......................................
#
    61.02%     0.00%  [.] collector::server::serve::{{closure}}::{{closure}}
    40.11%     0.31%  [k] do_syscall_64
    12.40%     0.10%  [.] collector::endpoints::intake::accept::{{closure}}
     9.80%     9.80%  [k] __x64_sys_fdatasync
     4.21%     4.21%  [.] _rjem_je_malloc_default
     3.00%     2.50%  [.] serde_json::de::Deserializer<R>::parse_struct
     2.10%     2.10%  [.] __memmove_avx_unaligned_erms
     1.50%     1.50%  [.] hashbrown::map::HashMap<K,V,S>::insert (inlined)
";

    #[test]
    fn report_rows() {
        let f = parse_report(REPORT);
        assert_eq!(f.len(), 8);
        assert_eq!(
            f[1],
            Frame {
                children: 40.11,
                own: 0.31,
                kernel: true,
                symbol: "do_syscall_64".into()
            }
        );
        assert_eq!(f[7].symbol, "hashbrown::map::HashMap<K,V,S>::insert");
    }

    #[test]
    fn section_rendered() {
        let md = render(&parse_report(REPORT), "wrk -t1 -c64", 3);
        assert!(md
            .contains("| connection tasks (hyper read/parse/write + router + handler) | 61.0 % |"));
        assert!(md.contains("|   fdatasync | 9.8 % |"));
        assert!(md.contains("| kernel | 10.1 % |"));
        assert!(md.contains("| allocator (jemalloc, or glibc malloc/free) | 4.2 % |"));
        assert!(md.contains("| 9.80 % | `__x64_sys_fdatasync` (kernel) |"));
        assert!(md.contains("Top 3 functions by self time:"));
    }

    #[test]
    fn generics_dropped() {
        assert_eq!(
            short("hashbrown::map::HashMap<K,V,S>::insert", 110),
            "hashbrown::map::HashMap<…>::insert"
        );
        assert_eq!(
            short("<axum::Router<S> as tower::Service<R>>::call", 110),
            "<axum::Router<…> as tower::Service<…>>::call"
        );
    }
}

//! A run's harness: the [`Bench`] context every step measures through (the sites, nginx, the
//! collector, wrk, oha and perf, each started the same way) and the machine's facts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{fail, Result};
use crate::load::{self, Wrk, WrkRun};
use crate::procs::{self, Proc};
use crate::results::Results;
use crate::servers::{Backends, ClickHouse, Collector, Metrics, Nginx};
use crate::{note, section, tools, Plan};

/// A run's context: paths, the stack's addresses, the results, the nonce counter.
#[derive(Debug)]
pub struct Bench {
    /// The repository.
    pub root: PathBuf,
    /// The run's folder (logs, spools, nginx, the stack).
    pub work: PathBuf,
    /// What the mode measures.
    pub plan: Plan,
    /// The figures so far.
    pub results: Results,
    /// PostgreSQL and ClickHouse for the collector.
    pub backends: Backends,
    /// ClickHouse replica 1 (the collector's preferred) and 2.
    pub ch: [ClickHouse; 2],
    /// The release build of the collector.
    pub bin: PathBuf,
    /// scripts/bench/beacon.lua.
    pub lua: PathBuf,
    nonce_base: u32,
    nonce_n: u32,
}

impl Bench {
    /// A run's context over a started stack, its nonces counted from a random base.
    pub fn new(
        root: &Path,
        work: &Path,
        plan: Plan,
        results: Results,
        backends: Backends,
        ch: [ClickHouse; 2],
        bin: PathBuf,
    ) -> Bench {
        Bench {
            root: root.to_path_buf(),
            work: work.to_path_buf(),
            results,
            backends,
            ch,
            bin,
            lua: root.join("scripts/bench/beacon.lua"),
            nonce_base: fastrand::u32(..) & 0x7fff_f000,
            nonce_n: 0,
            plan,
        }
    }

    /// The next run's nonce, 8 hex digits.
    pub fn next_nonce(&mut self) -> String {
        self.nonce_n += 1;
        format!("{:08x}", self.nonce_base + self.nonce_n)
    }

    /// `collector migrate`, then `collector sites add --key bench-NN` for every site.
    pub fn bootstrap_sites(&mut self) -> Result<()> {
        self.results.command("collector migrate")?;
        self.results.command(&format!(
            "for i in 01..{}: collector sites add --key bench-$i",
            self.plan.sites
        ))?;
        let log = self.work.join("collector.log");
        let mut args: Vec<Vec<String>> = vec![vec!["migrate".into()]];
        args.extend((1..=self.plan.sites).map(|i| {
            vec![
                "sites".into(),
                "add".into(),
                "--key".into(),
                format!("bench-{i:02}"),
            ]
        }));
        for a in args {
            let mut cmd = Command::new(&self.bin);
            cmd.args(&a)
                .env("COLLECTOR_DATABASE_URL", &self.backends.database_url)
                .env("COLLECTOR_CLICKHOUSE_URLS", &self.backends.clickhouse_urls);
            let what = format!("collector {}", a.join(" "));
            let p = Proc::spawn(&what, cmd, &log)?;
            let (ok, _) = p.wait_cpu(Duration::from_secs(120))?;
            if !ok {
                return Err(fail(format!("{what} failed (see {})", log.display())));
            }
        }
        eprintln!(
            "bench: registered the sites bench-01..bench-{:02}",
            self.plan.sites
        );
        Ok(())
    }

    /// The machine and the versions, into the results.
    pub fn machine(&mut self) -> Result<()> {
        let mut facts = machine_facts(&self.root);
        facts.push(("clickhouse_version", self.ch[0].query("SELECT version()")?));
        facts.push(("loadavg_start", procs::loadavg()));
        facts.push(("sites", self.plan.sites.to_string()));
        facts.push(("tp_secs", self.plan.tp_secs.to_string()));
        let conns: Vec<String> = self.plan.tp_conns.iter().map(u32::to_string).collect();
        facts.push(("tp_conns", conns.join(", ")));
        facts.push(("lat_secs", self.plan.lat_secs.to_string()));
        for (k, v) in facts {
            self.results.put(k, v)?;
        }
        Ok(())
    }

    /// nginx with one worker on core 0, on a fresh port.
    pub fn start_nginx(&mut self) -> Result<Nginx> {
        let port = stack::ports::alloc(1)?[0];
        self.results.command("taskset -c 0 nginx -p DIR/nginx -e DIR/nginx/error.log -c DIR/nginx/nginx.conf   # worker_processes 1; location / { return 204; }")?;
        Nginx::start(&self.work.join("nginx"), port, &self.work.join("nginx.log"))
    }

    /// A collector (`bin`) on core 0 on fresh ports, spool `DIR/spool_name`, log `DIR/log`,
    /// with `extra` settings.
    pub fn start_collector(
        &mut self,
        bin: &Path,
        spool_name: &str,
        log: &str,
        extra: &[(&str, &str)],
    ) -> Result<Collector> {
        let ports = stack::ports::alloc(2)?;
        Collector::start(
            bin,
            (ports[0], ports[1]),
            &self.work.join(spool_name),
            &self.work.join(log),
            &self.backends,
            extra,
        )
    }

    /// A wrk run to the end, logged; its output in `DIR/wrk-NONCE.txt`.
    pub fn wrk(
        &mut self,
        url: &str,
        conns: u32,
        secs: u64,
        batch: u32,
        script: &Path,
    ) -> Result<WrkRun> {
        let nonce = self.next_nonce();
        let w = Wrk {
            url,
            conns,
            secs,
            batch,
            script,
            nonce: &nonce,
            sites: self.plan.sites,
        };
        self.results.command(&format_cmd(&w.command()))?;
        w.run(&self.work.join(format!("wrk-{nonce}.txt")))
    }

    /// The figures of `pids` now.
    pub fn proc_cpu(pids: &[u32]) -> Result<f64> {
        Ok(procs::figures(pids)?.cpu_secs)
    }

    /// The group commits between the scrapes `before` and `after` (issue 53: the disk's share
    /// of the tail), recorded as `key`; the text for the run's line. An error when `/metrics`
    /// has no sync histogram.
    fn syncs_figure(&mut self, before: &Metrics, after: &Metrics, key: &str) -> Result<String> {
        let syncs = crate::servers::Syncs::between(before, after).ok_or_else(|| {
            fail("no collector_spool_sync_duration_seconds histogram in /metrics")
        })?;
        self.results.put(
            key,
            format!(
                "count:{},p50:{},p99:{},max:{}",
                syncs.count, syncs.p50_ms, syncs.p99_ms, syncs.max_ms
            ),
        )?;
        Ok(format!(
            "; syncs {} (p50 <= {} ms, p99 <= {} ms, max <= {} ms)",
            syncs.count, syncs.p50_ms, syncs.p99_ms, syncs.max_ms
        ))
    }

    /// oha open loop at `rate` req/s over `conns` connections for the plan's latency length
    /// on `url`; puts `KEY_SERVER_{p50,p99,p999,max}_ms` and `KEY_SERVER_errors` (a
    /// collector's duplicates are counted in its note) and, for the collector, the syncs
    /// meanwhile as `KEY_collector_syncs`.
    pub fn latency_run(
        &mut self,
        server: &str,
        url: &str,
        (rate, conns): (u64, u32),
        key: &str,
        collector: &Collector,
    ) -> Result<()> {
        let lat_secs = self.plan.lat_secs;
        let lines = rate * lat_secs * 12 / 10 + 1000;
        collector.wait_drained()?;
        let nonce = self.next_nonce();
        let bodies = self.work.join("bodies.txt");
        load::write_bodies(&bodies, lines, &nonce, self.plan.sites)?;
        let json = self.work.join(format!("oha-{key}-{server}.json"));
        let cmd = load::oha_command(
            &tools::oha_bin(),
            url,
            rate,
            lat_secs,
            conns,
            &bodies,
            &json,
        );
        self.results.command(&format_cmd(&cmd))?;
        let before = (server == "collector")
            .then(|| collector.metrics())
            .transpose()?;
        let log = self.work.join(format!("oha-{key}-{server}.log"));
        let (ok, _) =
            Proc::spawn("oha", cmd, &log)?.wait_cpu(Duration::from_secs(lat_secs + 120))?;
        let text = std::fs::read_to_string(&json).unwrap_or_default();
        let o = match (ok, load::parse_oha(&text)) {
            (true, Ok(o)) => o,
            (_, parsed) => {
                let out = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(fail(format!(
                    "oha failed on {url} ({}; {}): {out}",
                    log.display(),
                    parsed.err().map(|e| e.to_string()).unwrap_or_default()
                )));
            }
        };
        if o.ok + o.non2xx + o.errors >= lines {
            note(&format!(
                "warning: oha sent {} requests but only {lines} bodies exist: ids repeated",
                o.ok + o.non2xx + o.errors
            ));
        }
        let mut extra = String::new();
        if let Some(b) = before {
            let a = collector.metrics()?;
            extra = format!(
                " accepted={} duplicates={}",
                a.accepted - b.accepted,
                a.duplicates - b.duplicates
            );
            extra += &self.syncs_figure(&b, &a, &format!("{key}_{server}_syncs"))?;
        }
        note(&format!(
            "{server}: {:.1} req/s, p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms; 2xx={} other={} errors={}{extra}",
            o.rps, o.p50_ms, o.p99_ms, o.p999_ms, o.max_ms, o.ok, o.non2xx, o.errors
        ));
        let r = &mut self.results;
        for (name, ms) in [
            ("p50", o.p50_ms),
            ("p99", o.p99_ms),
            ("p999", o.p999_ms),
            ("max", o.max_ms),
        ] {
            r.put(&format!("{key}_{server}_{name}_ms"), format!("{ms:.3}"))?;
        }
        r.put(&format!("{key}_{server}_errors"), o.non2xx + o.errors)?;
        let _ = std::fs::remove_file(&bodies);
        Ok(())
    }

    /// perf record of the collector for the plan's profile length under wrk at `conns`;
    /// writes `DIR/profile.md` (nothing when perf is not usable).
    pub fn profile_run(&mut self, collector: &Collector, conns: u32) -> Result<()> {
        let secs = self.plan.profile_secs;
        if !tools::perf_usable() {
            note("perf is not usable here: no profile");
            return Ok(());
        }
        section(&format!(
            "profile: perf record -g (dwarf) of the collector for {secs}s under wrk at c={conns}"
        ));
        self.results.put(
            "perf_version",
            tools::first_line(Command::new("perf").arg("version")),
        )?;
        collector.wait_drained()?;
        let nonce = self.next_nonce();
        let url = collector.url();
        let w = Wrk {
            url: &url,
            conns,
            secs: secs + 4,
            batch: 1,
            script: &self.lua,
            nonce: &nonce,
            sites: self.plan.sites,
        };
        let out = self.work.join("wrk-profile.txt");
        let wrk = w.start(&out)?;
        std::thread::sleep(Duration::from_secs(2));
        self.results.command(&format!("taskset -c 1 perf record -e cpu-clock -F 499 --call-graph dwarf,16384 -p COLLECTOR_PID -o DIR/perf.data -- sleep {secs}"))?;
        let data = self.work.join("perf.data");
        let mut cmd = Command::new("taskset");
        cmd.args([
            "-c",
            "1",
            "perf",
            "record",
            "-q",
            "-e",
            "cpu-clock",
            "-F",
            "499",
            "--call-graph",
            "dwarf,16384",
            "-p",
        ])
        .arg(collector.pid().to_string())
        .arg("-o")
        .arg(&data)
        .args(["--", "sleep", &secs.to_string()]);
        let (ok, _) = Proc::spawn("perf record", cmd, &self.work.join("perf-record.log"))?
            .wait_cpu(Duration::from_secs(secs + 120))?;
        if !ok {
            note("perf record failed");
        }
        let rate = load::finish(wrk, &out, secs + 4)
            .map(|w| {
                format!(
                    "{} req/s with the profiler attached",
                    crate::report::fmt(w.rps(), 0, "")
                )
            })
            .unwrap_or_else(|_| "rate unknown".into());
        if data.metadata().is_ok_and(|m| m.len() > 0) {
            match crate::profile::from_perf(
                &data,
                &format!("wrk -t1 -c{conns}, 1 beacon per request, {rate}"),
            ) {
                Ok(md) => tools::write(&self.work.join("profile.md"), &md)?,
                Err(e) => note(&format!("perf report failed: {e}")),
            }
        }
        Ok(())
    }
}

/// The machine, the git revision and the tools' versions, as results.
fn machine_facts(root: &Path) -> Vec<(&'static str, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let field = |text: &str, key: &str, sep: char| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix(sep))
            .map(|v| v.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| "?".into())
    };
    let mem_kb: f64 = field(&read("/proc/meminfo"), "MemTotal", ':')
        .trim_end_matches(" kB")
        .parse()
        .unwrap_or(f64::NAN);
    let virt = tools::first_line(Command::new("sh").args([
        "-c",
        "lscpu 2>/dev/null | sed -n 's/^Hypervisor vendor:[[:space:]]*//p'; systemd-detect-virt 2>/dev/null",
    ]));
    let git = |args: &[&str]| Command::new("git").current_dir(root).args(args).output();
    let rev = git(&["rev-parse", "--short", "HEAD"])
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let clean = git(&[
        "diff",
        "--quiet",
        "HEAD",
        "--",
        "collector",
        "schema",
        "Cargo.lock",
    ])
    .is_ok_and(|o| o.status.success());
    let version = |bin: &str, arg: &str| tools::first_line(Command::new(bin).arg(arg));
    let nginx = version("nginx", "-v");
    let wrk = version("wrk", "-v");
    let oha = tools::first_line(Command::new(tools::oha_bin()).arg("--version"));
    let nth = |text: &str, n: usize| text.split_whitespace().nth(n).unwrap_or("?").to_owned();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    vec![
        ("date", crate::now_utc()),
        ("nproc", nproc.to_string()),
        (
            "cpu_model",
            field(&read("/proc/cpuinfo"), "model name", ':'),
        ),
        ("mem", format!("{:.1} GiB", mem_kb / 1_048_576.0)),
        ("kernel", version("uname", "-sr")),
        ("virt", virt),
        ("os", field(&read("/etc/os-release"), "PRETTY_NAME", '=')),
        (
            "git_rev",
            format!(
                "{rev}{}",
                if clean {
                    ""
                } else {
                    " (with uncommitted changes)"
                }
            ),
        ),
        (
            "nginx_version",
            format!("nginx {}", nginx.rsplit('/').next().unwrap_or("?")),
        ),
        ("wrk_version", format!("wrk {}", nth(&wrk, 1))),
        ("oha_version", format!("oha {} (-Z in order)", nth(&oha, 1))),
    ]
}

/// A command as one shell-like line (for commands.txt).
pub fn format_cmd(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

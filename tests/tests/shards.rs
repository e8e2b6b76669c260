//! Shards (contract v5 §3) on real servers: two shards of two ClickHouse 18.16 replicas each
//! (cluster `collector`) and two unreplicated 26.x servers (cluster `collector26`), started
//! with `scripts/stack.sh up DIR --shards 2 --replicas 2 --ch26 --ch26-servers 2` and named by
//! `SHARD_STACK_ENV=DIR/stack.env` (the tests fail, saying so, when it is unset).
//!
//! The tests share that stack and break it (kill and stop replicas), so they take turns
//! ([`TURN`]); each starts by repairing the stack and uses its own databases and spools.

use collector_tests::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tokio::sync::{Mutex, MutexGuard};

static TURN: Mutex<()> = Mutex::const_new(());

/// How long acknowledged rows may take to be on every replica of their shard once the faults
/// are repaired (a restarted 18.16 replica fetches what it missed from its peer).
const SETTLE: Duration = Duration::from_secs(120);
/// A browser's User-Agent: a device type that is not `bot`, so reports count the rows.
const UA: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36";

/// Waits for this test's turn, repairs the stack (every server started, every replicated
/// table writable, the 26.x servers answering) and makes fresh, empty databases.
async fn take_turn() -> (MutexGuard<'static, ()>, &'static Stack, TestEnv<'static>) {
    let turn = TURN.lock().await;
    let stack = Stack::sharded();
    stack.restore().await;
    let env = TestEnv::empty(stack).await;
    let ch26: Vec<String> = stack.ch26_servers().iter().map(|c| c.url()).collect();
    wait_until(
        &env.diag,
        "every ClickHouse 26.x server answers SELECT 1",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            for url in &ch26 {
                clickhouse_query(url, "SELECT 1 AS one").await?;
            }
            Ok(())
        },
    )
    .await;
    (turn, stack, env)
}

/// A shard list: names and their replica URLs, in order.
type Shards = Vec<(String, Vec<String>)>;

/// Parses `NAME=URL,URL;NAME=URL` (the stack's `CLICKHOUSE_SHARDS`, `CH26_SHARDS`).
fn parse_shards(text: &str) -> Shards {
    text.split(';')
        .map(|s| {
            let (name, urls) = s.split_once('=').unwrap_or_else(|| panic!("{text}"));
            (name.into(), urls.split(',').map(String::from).collect())
        })
        .collect()
}

/// The shard list as `COLLECTOR_CLICKHOUSE_SHARDS` takes it.
fn setting(shards: &Shards) -> String {
    shards
        .iter()
        .map(|(n, u)| format!("{n}={}", u.join(",")))
        .collect::<Vec<_>>()
        .join(";")
}

/// Value `key` of the stack's `stack.env`.
fn stack_value(stack: &Stack, key: &str) -> String {
    let env = stack.env().unwrap();
    env.get(key)
        .unwrap_or_else(|| panic!("no {key} in {}/stack.env", stack.dir().display()))
        .to_owned()
}

/// The 18.16 shards of the stack (`shard1`, `shard2`).
fn shards_of(stack: &Stack) -> Shards {
    let shards = parse_shards(&stack_value(stack, "CLICKHOUSE_SHARDS"));
    assert_eq!(
        shards.len(),
        2,
        "SHARD_STACK_ENV: a stack of 2 shards: {shards:?}"
    );
    assert!(
        shards.iter().all(|(_, u)| u.len() == 2),
        "2 replicas each: {shards:?}"
    );
    shards
}

/// The server numbers (`stack.replica(i)`) of shard `s` (from 1).
fn servers_of(stack: &Stack, s: usize) -> Vec<usize> {
    stack
        .replicas()
        .iter()
        .filter(|r| r.shard() == s)
        .map(|r| r.i())
        .collect()
}

/// The test's settings with `COLLECTOR_CLICKHOUSE_SHARDS` in place of
/// `COLLECTOR_CLICKHOUSE_URLS`, and `extra` replacing what they name.
fn settings(env: &TestEnv<'_>, shards: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = env.collector_env();
    v.push(("COLLECTOR_CLICKHOUSE_SHARDS".into(), shards.into()));
    for (k, val) in extra {
        v.push(((*k).into(), (*val).into()));
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, val) in v {
        if k == "COLLECTOR_CLICKHOUSE_URLS" {
            continue;
        }
        out.retain(|(o, _)| *o != k);
        out.push((k, val));
    }
    out
}

/// Runs `collector ARGS` with [`settings`].
fn cli(env: &TestEnv<'_>, shards: &str, extra: &[(&str, &str)], args: &[&str]) -> CliOutput {
    let out = std::process::Command::new(collector_bin())
        .args(args)
        .env_remove("COLLECTOR_CLICKHOUSE_URLS")
        .envs(settings(env, shards, extra))
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", collector_bin().display()));
    CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `sites list`: each site's shard.
fn site_shards(env: &TestEnv<'_>, shards: &str) -> HashMap<String, String> {
    let out = cli(env, shards, &[], &["sites", "list"]);
    out.success();
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let key = l.split('\t').next().unwrap().to_owned();
            let shard = l
                .split('\t')
                .find_map(|f| f.strip_prefix("shard="))
                .unwrap_or_else(|| panic!("no shard= in the sites list line {l:?}"));
            (key, shard.to_owned())
        })
        .collect()
}

/// One beacon posted.
#[derive(Clone, Debug)]
struct Sent {
    id: String,
    site: String,
    status: u16,
    /// When its answer came.
    at: Instant,
}

/// POSTs `body` (JSON) to the collector at `url` with a browser's Origin and User-Agent: the
/// answer's status (0: no answer) and its body.
async fn send(url: &str, body: String) -> (u16, String) {
    let answer = http()
        .post(format!("{url}/api/v1/measurements"))
        .header("content-type", "application/json")
        .header("origin", "https://shop.example")
        .header("user-agent", UA)
        .body(body)
        .send()
        .await;
    match answer {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, format!("{e:?}")),
    }
}

/// POSTs one fresh beacon of `site` to the collector at `url` (with a browser's Origin and
/// User-Agent), `lcp_ms` in it when given.
async fn post(url: &str, site: &str, lcp_ms: Option<f64>) -> Sent {
    let (id, mut m) = measurement(site);
    if let Some(lcp) = lcp_ms {
        m["lcp_ms"] = lcp.into();
    }
    let (status, _) = send(url, m.to_string()).await;
    Sent {
        id,
        site: site.into(),
        status,
        at: Instant::now(),
    }
}

/// POSTs one request holding a fresh measurement of each of `sites` (a JSON array): one
/// [`Sent`] per measurement, each with the request's status, and the answer's body.
async fn post_array(url: &str, sites: &[&str]) -> (Vec<Sent>, String) {
    let (ids, items): (Vec<String>, Vec<Value>) = sites.iter().map(|s| measurement(s)).unzip();
    let (status, body) = send(url, Value::Array(items).to_string()).await;
    let at = Instant::now();
    let sent = ids
        .into_iter()
        .zip(sites)
        .map(|(id, site)| Sent {
            id,
            site: (*site).into(),
            status,
            at,
        })
        .collect();
    (sent, body)
}

/// A steady load: one beacon every `every`, cycling over `sites` and, after each round of
/// sites, to the next of `urls`, until `stop`; every answer recorded in `log`.
fn steady(
    urls: Vec<String>,
    sites: Vec<String>,
    every: Duration,
    stop: Arc<AtomicBool>,
    log: Arc<StdMutex<Vec<Sent>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let site = &sites[i % sites.len()];
            let url = &urls[(i / sites.len()) % urls.len()];
            let sent = post(url, site, None).await;
            log.lock().unwrap().push(sent);
            i += 1;
        }
    })
}

/// Answers by status.
fn statuses(log: &[Sent]) -> std::collections::BTreeMap<u16, usize> {
    let mut m = std::collections::BTreeMap::new();
    for s in log {
        *m.entry(s.status).or_default() += 1;
    }
    m
}

/// A [`steady`] load and what it was answered.
struct Load {
    stop: Arc<AtomicBool>,
    log: Arc<StdMutex<Vec<Sent>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(urls: Vec<String>, sites: &[&str], every: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(StdMutex::new(Vec::new()));
        let sites = sites.iter().map(|s| (*s).to_owned()).collect();
        let task = steady(urls, sites, every, stop.clone(), log.clone());
        Load { stop, log, task }
    }

    /// The ids of `site` acknowledged (202) so far.
    fn acked(&self, site: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|x| x.status == 202 && x.site == site)
            .map(|x| x.id.clone())
            .collect()
    }

    /// Stops it: every beacon sent, with its answer.
    async fn stop(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        let log = self.log.lock().unwrap().clone();
        log
    }
}

/// `id -> (site, count)` of the test's table on `url`, under FINAL.
async fn stored(url: &str, db: &str) -> Result<HashMap<String, (String, i64)>, String> {
    let sql = format!(
        "SELECT toString(id) AS id, site, count() AS n FROM {db}.measurements FINAL GROUP BY id, site"
    );
    let rows = clickhouse_query(url, &sql).await?;
    Ok(rows
        .iter()
        .map(|r| {
            let id = col(r, "id").as_str().unwrap().to_owned();
            let site = col(r, "site").as_str().unwrap().to_owned();
            (id, (site, as_i64(col(r, "n")).unwrap()))
        })
        .collect())
}

/// Waits (at most `limit`) until every replica of every shard holds, under FINAL, exactly
/// once each id acknowledged for a site of that shard (`home`: site -> shard index); panics at
/// once when a replica holds an id twice, or an id of a site of another shard.
async fn wait_placed(
    env: &TestEnv<'_>,
    shards: &Shards,
    home: &HashMap<&str, usize>,
    log: &[Sent],
    limit: Duration,
) {
    let acked: Vec<&Sent> = log.iter().filter(|s| s.status == 202).collect();
    let sent_site: HashMap<&str, &str> = log
        .iter()
        .map(|s| (s.id.as_str(), s.site.as_str()))
        .collect();
    wait_until(
        &env.diag,
        &format!("{} acknowledged ids each once on every replica of its site's shard only", acked.len()),
        limit,
        Duration::from_millis(500),
        || async {
            let mut pending = Vec::new();
            for (si, (name, urls)) in shards.iter().enumerate() {
                for url in urls {
                    let rows = stored(url, &env.db).await.map_err(|e| format!("{url}: {e}"))?;
                    for (id, (site, n)) in &rows {
                        assert_eq!(*n, 1, "{url} (shard {name}) holds id {id} of {site} {n} times under FINAL");
                        let from = sent_site.get(id.as_str()).copied();
                        assert_eq!(from, Some(site.as_str()), "{url}: id {id} of {site} was not sent by this test");
                        assert_eq!(home[site.as_str()], si, "{url} (shard {name}) holds id {id} of site {site}, which lives on another shard");
                    }
                    let missing = acked
                        .iter()
                        .filter(|s| home[s.site.as_str()] == si && !rows.contains_key(&s.id))
                        .count();
                    if missing > 0 {
                        pending.push(format!("{url} (shard {name}) lacks {missing}"));
                    }
                }
            }
            if pending.is_empty() {
                Ok(())
            } else {
                Err(pending.join("; "))
            }
        },
    )
    .await;
}

/// Runs a blocking stack action (start, stop) off the runtime's cooperative path.
fn blocking<T>(what: &str, f: impl FnOnce() -> stack::Result<T>) -> T {
    tokio::task::block_in_place(f).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Kill, stop, start, freeze (SIGSTOP) or thaw (SIGCONT) server `i` of the stack, logging
/// when.
fn act(stack: &Stack, t0: Instant, action: &str, i: usize) {
    let r = stack.replica(i);
    let what = format!("{action} ClickHouse server {i} (shard {})", r.shard());
    match action {
        "kill" => blocking(&what, || r.kill()),
        "stop" => blocking(&what, || r.stop()),
        "start" => blocking(&what, || r.start()),
        "freeze" => blocking(&what, || r.freeze()),
        "thaw" => blocking(&what, || r.thaw()),
        other => panic!("{other}"),
    }
    eprintln!("{:>6.1} s: {what} done", t0.elapsed().as_secs_f64());
}

async fn pause(seconds: u64) {
    tokio::time::sleep(Duration::from_secs(seconds)).await;
}

/// Registers each `(site, shard)` with `sites add --shard`.
fn add_sites(env: &TestEnv<'_>, shards: &str, sites: &[(&str, &str)]) {
    for (key, shard) in sites {
        cli(
            env,
            shards,
            &[],
            &["sites", "add", "--key", key, "--shard", shard],
        )
        .success();
    }
}

/// Waits (at most [`REACTIVATION`], as [`Stack::restore`] does) until every server of `urls`
/// (the replicas of one shard) answers within 3 s and sees the test's table as
/// [`Stack::restore`] waits for it (not read-only, its ZooKeeper session not expired) and, from
/// its own session, every replica of the table active: when that was first seen. The active
/// replicas are what tells a live session from one whose expiry the server has not noticed
/// yet: just after a thaw, an 18.16 server showed neither flag set and then, seconds later, its
/// session expired (seen in this test's first run); a frozen replica's `is_active` node is gone
/// with its expired session and comes back only once its table is re-initialized, and a
/// server whose own session is dead reads 0 replicas.
async fn wait_writable(env: &TestEnv<'_>, urls: &[String]) -> Instant {
    let sql = format!(
        "SELECT is_readonly, is_session_expired, total_replicas, active_replicas FROM system.replicas \
         WHERE database = '{}' AND table = 'measurements'",
        env.db
    );
    let live = |r: &Value| {
        let n = |c: &str| as_i64(col(r, c)).unwrap_or(-1);
        n("is_readonly") == 0
            && n("is_session_expired") == 0
            && n("total_replicas") == urls.len() as i64
            && n("active_replicas") == urls.len() as i64
    };
    wait_until(
        &env.diag,
        &format!("{urls:?} answering, the test's table writable and every replica active"),
        REACTIVATION,
        Duration::from_millis(250),
        || async {
            let mut not_yet = Vec::new();
            for url in urls {
                let answer =
                    tokio::time::timeout(Duration::from_secs(3), clickhouse_query(url, &sql));
                match answer.await {
                    Ok(Ok(rows)) if rows.len() == 1 && live(&rows[0]) => {}
                    Ok(Ok(rows)) => not_yet.push(format!("{url}: {rows:?}")),
                    Ok(Err(e)) => not_yet.push(format!("{url}: {e}")),
                    Err(_) => not_yet.push(format!("{url}: no answer within 3 s")),
                }
            }
            if not_yet.is_empty() {
                Ok(Instant::now())
            } else {
                Err(not_yet.join("; "))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_local_table_on_every_replica_and_measurements_all_over_the_cluster() {
    let (_turn, stack, env) = take_turn().await;
    let shards = shards_of(stack);
    let good = setting(&shards);
    cli(&env, &good, &[], &["migrate"]).success();
    for r in stack.replicas() {
        let sql = format!(
            "SELECT name, engine FROM system.tables WHERE database = '{}' ORDER BY name",
            env.db
        );
        let rows = env_query(&r.url(), &sql).await;
        let names: HashMap<&str, &str> = rows
            .iter()
            .map(|r| {
                (
                    col(r, "name").as_str().unwrap(),
                    col(r, "engine").as_str().unwrap(),
                )
            })
            .collect();
        assert!(
            names
                .get("measurements")
                .is_some_and(|e| e.contains("MergeTree")),
            "server {} (shard {}): {rows:?}",
            r.i(),
            r.shard()
        );
        assert_eq!(
            names.get("measurements_all"),
            Some(&"Distributed"),
            "server {} (shard {}): {rows:?}",
            r.i(),
            r.shard()
        );
    }
    // The shards swapped: every server sits in the other place of cluster collector.
    let swapped = setting(&vec![shards[1].clone(), shards[0].clone()]);
    let out = cli(&env, &swapped, &[], &["migrate"]);
    println!("swapped: exit {}\n{}", out.code, out.stderr);
    assert_ne!(
        out.code, 0,
        "migrate with the shards swapped: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains("cluster collector") && out.stderr.contains("shard"),
        "the difference named: {}",
        out.stderr
    );
    // Three shards where the cluster has two.
    let (a, b) = (&shards[0].1, &shards[1].1);
    let three = format!("a={};b={};c={}", a[0], a[1], b.join(","));
    let out = cli(&env, &three, &[], &["migrate"]);
    println!("three shards: exit {}\n{}", out.code, out.stderr);
    assert_ne!(out.code, 0, "migrate with three shards: {}", out.stdout);
    assert!(
        out.stderr.contains("cluster collector has 2 shards"),
        "the difference named: {}",
        out.stderr
    );
}

/// A query's rows on `url`; panics with ClickHouse's answer.
async fn env_query(url: &str, sql: &str) -> Vec<Value> {
    clickhouse_query(url, sql)
        .await
        .unwrap_or_else(|e| panic!("{url}: {sql}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_site_is_stored_on_its_own_shard_once_through_two_collectors_while_replicas_are_killed(
) {
    let (_turn, stack, env) = take_turn().await;
    let shards = shards_of(stack);
    let s = setting(&shards);
    cli(&env, &s, &[], &["migrate"]).success();
    add_sites(&env, &s, &[("s.a", "shard1"), ("s.b", "shard2")]);
    let c1 = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    let c2 = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    // 12.5 beacons a second, alternating sites and collectors.
    let load = Load::start(
        vec![c1.url.clone(), c2.url.clone()],
        &["s.a", "s.b"],
        Duration::from_millis(80),
    );
    let t0 = Instant::now();
    pause(3).await;
    for shard in 1..=2 {
        kill_each_then_both(stack, t0, &servers_of(stack, shard)).await;
    }
    let log = load.stop().await;
    let acked = log.iter().filter(|s| s.status == 202).count();
    println!(
        "sent {} beacons in {:.1} s, answers {:?}",
        log.len(),
        t0.elapsed().as_secs_f64(),
        statuses(&log)
    );
    assert!(
        acked >= 200,
        "a few hundred acknowledged: {:?}",
        statuses(&log)
    );
    let home = HashMap::from([("s.a", 0), ("s.b", 1)]);
    let start = Instant::now();
    wait_placed(&env, &shards, &home, &log, SETTLE).await;
    println!(
        "every one of {acked} acknowledged ids ({} of s.a, {} of s.b) once on both replicas of its shard, none on the other, {:.1} s after the load",
        log.iter().filter(|s| s.status == 202 && s.site == "s.a").count(),
        log.iter().filter(|s| s.status == 202 && s.site == "s.b").count(),
        start.elapsed().as_secs_f64()
    );
}

/// A shard's faults, under whatever load runs: its first replica killed (4 s) and started
/// again, then its second, then both together (5 s) and both started.
async fn kill_each_then_both(stack: &Stack, t0: Instant, servers: &[usize]) {
    for &i in servers {
        act(stack, t0, "kill", i);
        pause(4).await;
        act(stack, t0, "start", i);
        pause(2).await;
    }
    for &i in servers {
        act(stack, t0, "kill", i);
    }
    pause(5).await;
    for &i in servers {
        act(stack, t0, "start", i);
    }
    pause(3).await;
}

/// The `p`-quantile (0..1) of `v` (sorted here): the value at rank ⌈p·n⌉.
fn quantile(v: &mut [Duration], p: f64) -> Duration {
    assert!(!v.is_empty(), "no delays measured");
    v.sort();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A shard failing under load: site `s.a` on shard1 and `s.b` on shard2, one collector, 10
/// beacons a second per site, and shard1's visibility watched.
struct Scenario<'a> {
    env: &'a TestEnv<'static>,
    shards: Shards,
    _collector: Collector,
    load: Load,
    watch: Visibility,
    t0: Instant,
}

impl<'a> Scenario<'a> {
    async fn start(stack: &Stack, env: &'a TestEnv<'static>) -> Scenario<'a> {
        let shards = shards_of(stack);
        let s = setting(&shards);
        cli(env, &s, &[], &["migrate"]).success();
        add_sites(env, &s, &[("s.a", "shard1"), ("s.b", "shard2")]);
        let c = Collector::start_with_env(settings(env, &s, &[]), env.diag.clone()).await;
        let load = Load::start(
            vec![c.url.clone()],
            &["s.a", "s.b"],
            Duration::from_millis(50),
        );
        // Shard1's visibility: every 200 ms, which of its acknowledged ids not yet seen are
        // visible on its first replica (the one the collector writes to).
        let watch = Visibility::start(
            shards[0].1[0].clone(),
            env.db.clone(),
            load.log.clone(),
            "s.a",
        );
        Scenario {
            env,
            shards,
            _collector: c,
            load,
            watch,
            t0: Instant::now(),
        }
    }

    /// Waits (at most 30 s, polled every 250 ms) until every id of `s.b` acknowledged so far
    /// is stored on one of shard2's replicas, none twice under FINAL: their number, and when.
    async fn wait_held(&self, since: &str) -> (usize, Instant) {
        let held = self.load.acked("s.b");
        let (urls, db) = (&self.shards[1].1, &self.env.db);
        let what = format!(
            "{} acknowledged ids of s.b stored on shard2 within 30 s of {since}",
            held.len()
        );
        let at = wait_until(
            &self.env.diag,
            &what,
            Duration::from_secs(30),
            Duration::from_millis(250),
            || async {
                let mut found = std::collections::HashSet::new();
                for url in urls {
                    let rows = stored(url, db).await.map_err(|e| format!("{url}: {e}"))?;
                    for (id, (site, n)) in rows {
                        assert_eq!(n, 1, "{url} holds id {id} of {site} {n} times under FINAL");
                        found.insert(id);
                    }
                }
                let missing = held.iter().filter(|id| !found.contains(*id)).count();
                if missing == 0 {
                    Ok(Instant::now())
                } else {
                    Err(format!("{missing} of {} missing", held.len()))
                }
            },
        )
        .await;
        (held.len(), at)
    }

    /// Goes on 3 s more, stops the load, prints the answers and shard1's delays (202 to
    /// visible on its first replica) over the run and over the ids acknowledged within
    /// `during`, and checks: no 5xx, at least `min` ids of shard1 measured within `during`,
    /// a p99 of at most 2 s over both; then that every acknowledged id is once on every
    /// replica of its site's shard only (within [`SETTLE`]).
    async fn finish(self, during: (Instant, Instant), what: &str, min: usize) {
        pause(3).await;
        let log = self.load.stop().await;
        let delays = self.watch.finish(&self.env.diag, &log).await;
        let answers = statuses(&log);
        println!(
            "answers {answers:?} to {} beacons over {:.1} s",
            log.len(),
            self.t0.elapsed().as_secs_f64()
        );
        let mut inside: Vec<Duration> = delays
            .iter()
            .filter(|(at, _)| *at >= during.0 && *at <= during.1)
            .map(|(_, d)| *d)
            .collect();
        let mut all: Vec<Duration> = delays.iter().map(|(_, d)| *d).collect();
        let (n_all, n_in) = (all.len(), inside.len());
        assert!(n_in >= min, "shard1 ids measured {what}: {n_in}");
        let (p99, max) = (quantile(&mut all, 0.99), *all.last().unwrap());
        let (p99_in, max_in) = (quantile(&mut inside, 0.99), *inside.last().unwrap());
        println!(
            "shard1 (s.a) 202-to-visible delay, polled every 200 ms: p99 {p99:?} (max {max:?}) over {n_all} ids; \
             p99 {p99_in:?} (max {max_in:?}) over the {n_in} ids acknowledged {what} ({:?})",
            during.1 - during.0
        );
        let fives: usize = answers
            .iter()
            .filter(|(s, _)| **s >= 500)
            .map(|(_, n)| n)
            .sum();
        assert_eq!(fives, 0, "no 5xx while the spool has room: {answers:?}");
        // The bound: 2 s; the polling adds up to 0.2 s and a query's time, included in it.
        assert!(
            p99 <= Duration::from_secs(2),
            "p99 {p99:?} of shard1's delay"
        );
        assert!(p99_in <= Duration::from_secs(2), "p99 {p99_in:?} {what}");
        let home = HashMap::from([("s.a", 0), ("s.b", 1)]);
        let start = Instant::now();
        wait_placed(self.env, &self.shards, &home, &log, SETTLE).await;
        println!(
            "every acknowledged id once on both replicas of its shard only, {:.1} s after the load",
            start.elapsed().as_secs_f64()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_down_for_60s_holds_back_only_its_own_sites() {
    let (_turn, stack, env) = take_turn().await;
    let run = Scenario::start(stack, &env).await;
    let two = servers_of(stack, 2);
    pause(10).await;
    for &i in &two {
        act(stack, run.t0, "stop", i);
    }
    let down = Instant::now();
    pause(60).await;
    for &i in &two {
        act(stack, run.t0, "start", i);
    }
    // Started: both answer and their tables are writable (`Replica::start` waits for it).
    let back = Instant::now();
    // Shard2's ids acknowledged so far: all stored once within 30 s (±0.25 s, the polling).
    let (held, delivered) = run.wait_held("shard2's return").await;
    println!(
        "shard2 (s.b): {held} ids held back over the {:?} outage, all stored {:?} after both replicas answered again",
        back - down,
        delivered - back
    );
    run.finish((down, back), "while shard2 was down", 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_frozen_for_6s_holds_back_only_its_own_sites() {
    let (_turn, stack, env) = take_turn().await;
    let run = Scenario::start(stack, &env).await;
    let two = servers_of(stack, 2);
    pause(10).await;
    // SIGSTOP: both of shard2's servers hang with their sockets open.
    for &i in &two {
        act(stack, run.t0, "freeze", i);
    }
    let frozen = Instant::now();
    // Shorter than the stack's ZooKeeper session timeout (10 s) less a heartbeat interval
    // (a third of it): the sessions live, so the thawed replicas write again at once. (Frozen
    // for 15 s, a replica was once read-only for 80 s after the thaw, its session expired:
    // the failover tests cover that path on their own stack.)
    pause(6).await;
    for &i in &two {
        act(stack, run.t0, "thaw", i);
    }
    let thawed = Instant::now();
    // Should a session still expire (a loaded machine), an 18.16 replica keeps its tables
    // read-only for a while after the thaw (up to REACTIVATION, as Stack::restore waits): the
    // 30 s bound counts from the moment both of shard2's servers answer and are writable again.
    let writable = wait_writable(&env, &run.shards[1].1).await;
    let (held, delivered) = run.wait_held("shard2 answering and writable again").await;
    println!(
        "shard2 (s.b): frozen {:?}; both replicas answering and writable {:?} after the thaw; the {held} ids \
         acknowledged by then found all stored {:?} after that (polled every 250 ms; {:?} after the thaw)",
        thawed - frozen,
        writable - thawed,
        delivered.saturating_duration_since(writable),
        delivered - thawed
    );
    // 10 beacons a second for shard1's site over 6 s: at least 40 of them measured.
    run.finish((frozen, thawed), "while shard2 was frozen", 40)
        .await;
}

/// Per acknowledged id of one site, how long after its 202 it became visible on one server.
struct Visibility {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<HashMap<String, Instant>>,
}

impl Visibility {
    fn start(
        url: String,
        db: String,
        log: Arc<StdMutex<Vec<Sent>>>,
        site: &'static str,
    ) -> Visibility {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen: HashMap<String, Instant> = HashMap::new();
            loop {
                let finishing = stopped.load(Ordering::SeqCst);
                let unseen: Vec<String> = log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|s| s.status == 202 && s.site == site && !seen.contains_key(&s.id))
                    .map(|s| format!("'{}'", s.id))
                    .collect();
                if unseen.is_empty() && finishing {
                    return seen;
                }
                if !unseen.is_empty() {
                    let sql = format!(
                        "SELECT toString(id) AS id FROM {db}.measurements WHERE id IN ({})",
                        unseen.join(",")
                    );
                    if let Ok(rows) = clickhouse_query(&url, &sql).await {
                        let now = Instant::now();
                        for r in rows {
                            seen.entry(col(&r, "id").as_str().unwrap().to_owned())
                                .or_insert(now);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Visibility { stop, task }
    }

    /// Waits (at most 30 s) until every acknowledged id was seen: `(acknowledged at, delay)`
    /// of each.
    async fn finish(self, diag: &Diag, log: &[Sent]) -> Vec<(Instant, Duration)> {
        self.stop.store(true, Ordering::SeqCst);
        let seen = match tokio::time::timeout(Duration::from_secs(30), self.task).await {
            Ok(seen) => seen.unwrap(),
            Err(_) => {
                diag.give_up("shard1's acknowledged ids not all visible 30 s after the load ended")
                    .await;
                unreachable!()
            }
        };
        log.iter()
            .filter_map(|s| {
                seen.get(&s.id)
                    .map(|v| (s.at, v.saturating_duration_since(s.at)))
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_third_shard_moves_no_site() {
    let (_turn, stack, env) = take_turn().await;
    let shards = shards_of(stack);
    let two = setting(&shards);
    cli(&env, &two, &[], &["migrate"]).success();
    let keys: Vec<String> = (0..10).map(|i| format!("hashed-{i}")).collect();
    for k in &keys {
        cli(&env, &two, &[], &["sites", "add", "--key", k]).success();
    }
    let before = site_shards(&env, &two);
    println!("placed by hash over two shards: {before:?}");
    placed_by_hash(&shards, &keys, &before).await;
    let position = |name: &str| shards.iter().position(|(n, _)| n == name).unwrap();
    let mut home: HashMap<&str, usize> = keys
        .iter()
        .map(|k| (k.as_str(), position(&before[k])))
        .collect();
    let mut sites: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut log = Vec::new();
    through_a_collector(&env, &shards, &home, &sites, &mut log).await;

    // A third shard: the first 26.x server, its table made by migrate as one default shard
    // in the single-server form.
    let ch26 = stack_value(stack, "CH26_1_URL");
    env.cli_with(
        &[
            ("COLLECTOR_CLICKHOUSE_URLS", ch26.as_str()),
            ("COLLECTOR_CLICKHOUSE_TABLE_FORM", "single"),
        ],
        &["migrate"],
    )
    .success();
    let mut shards3 = shards.clone();
    shards3.push(("shard3".into(), vec![ch26.clone()]));
    sites_stay_put(&env, &setting(&shards3), &keys, &before);
    home.insert("new-3", 2);
    sites.push("new-3");
    through_a_collector(&env, &shards3, &home, &sites, &mut log).await;
    let rows = env_query(
        &ch26,
        &format!(
            "SELECT countIf(site = 'new-3') AS mine, countIf(site != 'new-3') AS others FROM {}.measurements",
            env.db
        ),
    )
    .await;
    let acked3 = log.iter().filter(|x| x.site == "new-3").count() as i64;
    println!("shard3 ({ch26}): {rows:?}");
    assert_eq!(
        as_i64(col(&rows[0], "others")),
        Some(0),
        "no row of an older site on shard3"
    );
    assert_eq!(
        as_i64(col(&rows[0], "mine")),
        Some(acked3),
        "new-3's rows on shard3"
    );
}

/// Each of `keys`, added without `--shard` over two shards, is on the shard at position
/// `cityHash64(key) % 2` of the list, as a shard1 server computes it; and both shards hold
/// some.
async fn placed_by_hash(shards: &Shards, keys: &[String], placed: &HashMap<String, String>) {
    let url = &shards[0].1[0];
    let mut counts = vec![0; shards.len()];
    for k in keys {
        let sql = format!("SELECT cityHash64('{k}') % {} AS p", shards.len());
        let p = as_i64(col(&env_query(url, &sql).await[0], "p")).unwrap() as usize;
        let shard = placed
            .get(k)
            .unwrap_or_else(|| panic!("{k} not listed: {placed:?}"));
        assert_eq!(*shard, shards[p].0, "{k}: cityHash64 % 2 = {p} on {url}");
        counts[p] += 1;
    }
    println!("sites per shard by cityHash64 % 2 on {url}: {counts:?}");
    assert!(
        counts.iter().all(|&n| n >= 1),
        "each shard holds at least one of the sites: {counts:?}"
    );
}

/// With a third shard configured (`three`): every site listed on its old shard, also after
/// being added again without `--shard`; `new-3` added on shard3; moving an existing site
/// refused, naming its shard.
fn sites_stay_put(
    env: &TestEnv<'_>,
    three: &str,
    keys: &[String],
    before: &HashMap<String, String>,
) {
    let after = site_shards(env, three);
    assert_eq!(
        &after, before,
        "the shards listed once shard3 is configured"
    );
    // Added again without --shard: still where it was (hash mod 3 may say otherwise).
    for k in keys {
        cli(env, three, &[], &["sites", "add", "--key", k]).success();
    }
    assert_eq!(
        &site_shards(env, three),
        before,
        "sites added again without --shard"
    );
    add_sites(env, three, &[("new-3", "shard3")]);
    let now = site_shards(env, three);
    assert_eq!(
        now.get("new-3").map(String::as_str),
        Some("shard3"),
        "{now:?}"
    );
    // An existing site is not moved by sites add.
    let k = &keys[0];
    let out = cli(
        env,
        three,
        &[],
        &["sites", "add", "--key", k, "--shard", "shard3"],
    );
    println!(
        "sites add --key {k} --shard shard3: exit {}: {}",
        out.code,
        out.stderr.trim()
    );
    assert_ne!(out.code, 0, "moving {k} refused: {}", out.stdout);
    assert!(
        out.stderr
            .contains(&format!("lives on shard {}", before[k])),
        "{}",
        out.stderr
    );
    let mut now = site_shards(env, three);
    now.remove("new-3");
    assert_eq!(&now, before, "nothing changed by the refused move");
}

/// Starts a collector on `shards`, posts 3 beacons of each of `sites` (each answered 202,
/// added to `log`), waits (at most 30 s) until every id of `log` is once on every replica of
/// its site's shard (`home`) and on no other shard ([`wait_placed`]), and stops the collector
/// (SIGTERM).
async fn through_a_collector(
    env: &TestEnv<'_>,
    shards: &Shards,
    home: &HashMap<&str, usize>,
    sites: &[&str],
    log: &mut Vec<Sent>,
) {
    let settings = settings(env, &setting(shards), &[]);
    let mut c = Collector::start_with_env(settings, env.diag.clone()).await;
    let mut sent = Vec::new();
    for _ in 0..3 {
        for site in sites {
            sent.push(post(&c.url, site, None).await);
        }
    }
    assert!(
        sent.iter().all(|x| x.status == 202),
        "{:?}",
        statuses(&sent)
    );
    log.extend(sent);
    let start = Instant::now();
    wait_placed(env, shards, home, log, Duration::from_secs(30)).await;
    println!(
        "{} shards: {} beacons of {} sites stored, each on its site's shard only, {:.1} s after the last 202 ({} in all)",
        shards.len(),
        3 * sites.len(),
        sites.len(),
        start.elapsed().as_secs_f64(),
        log.len()
    );
    c.signal("TERM");
    let exit = c.wait_exit(Duration::from_secs(30)).await;
    assert!(
        exit.is_some_and(|e| e.success()),
        "the collector drains on SIGTERM: {exit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_mixing_sites_of_two_shards_stores_each_on_its_own() {
    let (_turn, stack, env) = take_turn().await;
    let shards = shards_of(stack);
    let s = setting(&shards);
    cli(&env, &s, &[], &["migrate"]).success();
    add_sites(&env, &s, &[("m.a", "shard1"), ("m.b", "shard2")]);
    let c = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    let mut log = Vec::new();
    for _ in 0..10 {
        let (sent, body) = post_array(&c.url, &["m.a", "m.b"]).await;
        assert_eq!(sent[0].status, 202, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(as_i64(field(&answer, "accepted")), Some(2), "{body}");
        log.extend(sent);
    }
    let home = HashMap::from([("m.a", 0), ("m.b", 1)]);
    let start = Instant::now();
    wait_placed(&env, &shards, &home, &log, Duration::from_secs(30)).await;
    println!(
        "10 requests of [m.a, m.b]: each of the 20 measurements once on both replicas of its own shard only, {:.1} s after the last 202",
        start.elapsed().as_secs_f64()
    );
}

/// The report of `site`, in JSON; panics unless it exits 0.
fn report(env: &TestEnv<'_>, shards: &str, site: &str) -> Value {
    let out = cli(
        env,
        shards,
        &[],
        &["report", "--site", site, "--format", "json"],
    );
    out.success();
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// Page views and the LCP p75 summed over the report's groups (one group here).
fn report_figures(report: &Value) -> (f64, Option<f64>) {
    let groups = field(report, "groups")
        .as_array()
        .expect("groups is a list");
    assert_eq!(groups.len(), 1, "one device type: {report}");
    let g = &groups[0];
    let lcp = field(g, "metrics")
        .as_array()
        .unwrap()
        .iter()
        .find(|m| field(m, "metric").as_str().unwrap().contains("lcp"))
        .unwrap_or_else(|| panic!("no LCP figures: {g}"));
    (
        as_number(field(g, "page_views")).unwrap(),
        as_number(field(lcp, "p75")),
    )
}

const P75: &str = "quantileExactWeighted(0.75)(lcp_ms, toUInt64(round(1000 / sample_rate)))";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_and_a_fleet_query_agree_with_the_sites_shard() {
    let (_turn, stack, env) = take_turn().await;
    let shards = shards_of(stack);
    let s = setting(&shards);
    cli(&env, &s, &[], &["migrate"]).success();
    add_sites(&env, &s, &[("rep.a", "shard1"), ("rep.b", "shard2")]);
    let c = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    let mut log = Vec::new();
    // 120: a report shows a metric's figures from 100 page views on (contract v5 §1).
    for i in 0..120 {
        log.push(post(&c.url, "rep.b", Some(400.0 + 97.0 * i as f64)).await);
    }
    for i in 0..10 {
        log.push(post(&c.url, "rep.a", Some(9000.0 + i as f64)).await);
    }
    assert!(log.iter().all(|x| x.status == 202), "{:?}", statuses(&log));
    let home = HashMap::from([("rep.a", 0), ("rep.b", 1)]);
    wait_placed(&env, &shards, &home, &log, Duration::from_secs(30)).await;

    let shard2 = &shards[1].1[0];
    let direct = env_query(
        shard2,
        &format!(
            "SELECT sum(1 / sample_rate) AS pv, {P75} AS p75 FROM {}.measurements FINAL \
             WHERE site = 'rep.b' AND device_type != 'bot' AND sample_rate > 0",
            env.db
        ),
    )
    .await;
    let (pv, p75) = (
        as_number(col(&direct[0], "pv")).unwrap(),
        as_number(col(&direct[0], "p75")),
    );
    let r = report(&env, &s, "rep.b");
    println!("report: {r}");
    assert_eq!(
        field(&r, "server").as_str(),
        Some(shard2.as_str()),
        "read from shard2's first replica"
    );
    let (rpv, rp75) = report_figures(&r);
    assert!(
        (rpv - pv).abs() < 1e-9 && pv == 120.0,
        "page views: report {rpv}, shard2 {pv}"
    );
    assert_eq!(rp75, p75, "LCP p75: report, shard2");

    // The fleet's table, read on a shard1 server, and shard2's own table agree.
    let fleet = |table: &str| {
        format!(
            "SELECT count() AS n, {P75} AS p75 FROM {}.{table} FINAL WHERE site = 'rep.b' \
             AND page_view_at >= now() - INTERVAL 7 DAY AND device_type != 'bot'",
            env.db
        )
    };
    let all = env_query(&shards[0].1[0], &fleet("measurements_all")).await;
    let own = env_query(shard2, &fleet("measurements")).await;
    println!("through measurements_all on shard1: {all:?}; shard2 alone: {own:?}");
    assert_eq!(as_i64(col(&all[0], "n")), Some(120));
    assert_eq!(
        as_number(col(&all[0], "p75")),
        as_number(col(&own[0], "p75"))
    );
    assert_eq!(as_number(col(&own[0], "p75")), p75);

    // Shard1 down: shard2's site is still reported, shard1's is not.
    let t0 = Instant::now();
    for i in servers_of(stack, 1) {
        act(stack, t0, "stop", i);
    }
    let r = report(&env, &s, "rep.b");
    assert_eq!(
        report_figures(&r),
        (rpv, rp75),
        "the report with shard1 down: {r}"
    );
    let out = cli(
        &env,
        &s,
        &[],
        &["report", "--site", "rep.a", "--format", "json"],
    );
    println!(
        "rep.a with shard1 down: exit {}: {}",
        out.code,
        out.stderr.trim()
    );
    assert_ne!(
        out.code, 0,
        "shard1's site has no report while shard1 is down: {}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ch26_servers_as_two_unreplicated_shards_store_each_site_on_its_own() {
    let (_turn, stack, env) = take_turn().await;
    let shards = parse_shards(&stack_value(stack, "CH26_SHARDS"));
    assert_eq!(shards.len(), 2, "two 26.x servers: {shards:?}");
    let s = setting(&shards);
    let extra = [
        ("COLLECTOR_CLICKHOUSE_TABLE_FORM", "single"),
        (
            "COLLECTOR_CLICKHOUSE_CLUSTER",
            stack_value(stack, "CH26_CLUSTER").leak() as &str,
        ),
    ];
    cli(&env, &s, &extra, &["migrate"]).success();
    let (a, b) = (shards[0].0.as_str(), shards[1].0.as_str());
    cli(
        &env,
        &s,
        &extra,
        &["sites", "add", "--key", "x.a", "--shard", a],
    )
    .success();
    cli(
        &env,
        &s,
        &extra,
        &["sites", "add", "--key", "x.b", "--shard", b],
    )
    .success();
    let c = Collector::start_with_env(settings(&env, &s, &extra), env.diag.clone()).await;
    let mut log = Vec::new();
    for _ in 0..20 {
        log.push(post(&c.url, "x.a", None).await);
        log.push(post(&c.url, "x.b", None).await);
    }
    assert!(log.iter().all(|x| x.status == 202), "{:?}", statuses(&log));
    let home = HashMap::from([("x.a", 0), ("x.b", 1)]);
    wait_placed(&env, &shards, &home, &log, Duration::from_secs(30)).await;
    for (name, urls) in &shards {
        let sql = format!("SELECT count() AS n FROM {}.measurements_all FINAL", env.db);
        let rows = env_query(&urls[0], &sql).await;
        assert_eq!(
            as_i64(col(&rows[0], "n")),
            Some(40),
            "measurements_all on {name}"
        );
    }
}

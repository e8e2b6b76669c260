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

/// POSTs one fresh beacon of `site` to the collector at `url` (with a browser's Origin and
/// User-Agent), `lcp_ms` in it when given.
async fn post(url: &str, site: &str, lcp_ms: Option<f64>) -> Sent {
    let (id, mut m) = measurement(site);
    if let Some(lcp) = lcp_ms {
        m["lcp_ms"] = lcp.into();
    }
    let answer = http()
        .post(format!("{url}/api/v1/measurements"))
        .header("content-type", "application/json")
        .header("origin", "https://shop.example")
        .header("user-agent", UA)
        .body(m.to_string())
        .send()
        .await;
    let status = answer.map_or(0, |r| r.status().as_u16());
    Sent {
        id,
        site: site.into(),
        status,
        at: Instant::now(),
    }
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

/// Kill, stop or start server `i` of the stack, logging when.
fn act(stack: &Stack, t0: Instant, action: &str, i: usize) {
    let r = stack.replica(i);
    let what = format!("{action} ClickHouse server {i} (shard {})", r.shard());
    match action {
        "kill" => blocking(&what, || r.kill()),
        "stop" => blocking(&what, || r.stop()),
        "start" => blocking(&what, || r.start()),
        other => panic!("{other}"),
    }
    eprintln!("{:>6.1} s: {what} done", t0.elapsed().as_secs_f64());
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
    cli(
        &env,
        &s,
        &[],
        &["sites", "add", "--key", "s.a", "--shard", "shard1"],
    )
    .success();
    cli(
        &env,
        &s,
        &[],
        &["sites", "add", "--key", "s.b", "--shard", "shard2"],
    )
    .success();
    let c1 = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    let c2 = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    let (one, two) = (servers_of(stack, 1), servers_of(stack, 2));

    let (stop, log) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(StdMutex::new(Vec::new())),
    );
    // 12.5 beacons a second, alternating sites and collectors.
    let load = steady(
        vec![c1.url.clone(), c2.url.clone()],
        vec!["s.a".into(), "s.b".into()],
        Duration::from_millis(80),
        stop.clone(),
        log.clone(),
    );
    let t0 = Instant::now();
    let pause = |s: u64| tokio::time::sleep(Duration::from_secs(s));
    pause(3).await;
    act(stack, t0, "kill", one[0]);
    pause(4).await;
    act(stack, t0, "start", one[0]);
    pause(2).await;
    act(stack, t0, "kill", two[0]);
    pause(4).await;
    act(stack, t0, "start", two[0]);
    pause(2).await;
    act(stack, t0, "kill", two[0]);
    act(stack, t0, "kill", two[1]);
    pause(5).await;
    act(stack, t0, "start", two[0]);
    act(stack, t0, "start", two[1]);
    pause(3).await;
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();
    let log = log.lock().unwrap().clone();
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

/// The `p`-quantile (0..1) of `v` (sorted here): the value at rank ⌈p·n⌉.
fn quantile(v: &mut [Duration], p: f64) -> Duration {
    assert!(!v.is_empty(), "no delays measured");
    v.sort();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_down_for_60s_holds_back_only_its_own_sites() {
    let (_turn, stack, env) = take_turn().await;
    let shards = shards_of(stack);
    let s = setting(&shards);
    cli(&env, &s, &[], &["migrate"]).success();
    cli(
        &env,
        &s,
        &[],
        &["sites", "add", "--key", "s.a", "--shard", "shard1"],
    )
    .success();
    cli(
        &env,
        &s,
        &[],
        &["sites", "add", "--key", "s.b", "--shard", "shard2"],
    )
    .success();
    let c = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    let two = servers_of(stack, 2);

    let (stop, log) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(StdMutex::new(Vec::new())),
    );
    // 10 beacons a second per site.
    let load = steady(
        vec![c.url.clone()],
        vec!["s.a".into(), "s.b".into()],
        Duration::from_millis(50),
        stop.clone(),
        log.clone(),
    );
    // Shard1's visibility: every 200 ms, which of its acknowledged ids not yet seen are
    // visible on its first replica (the one the collector writes to).
    let watch = Visibility::start(shards[0].1[0].clone(), env.db.clone(), log.clone(), "s.a");
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    for &i in &two {
        act(stack, t0, "stop", i);
    }
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    for &i in &two {
        act(stack, t0, "start", i);
    }
    let back = Instant::now();
    let outage = back - down;
    // Shard2's ids acknowledged so far: all stored once within 30 s (±0.25 s, the polling).
    let held: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|x| x.status == 202 && x.site == "s.b")
        .map(|x| x.id.clone())
        .collect();
    let url2 = shards[1].1[0].clone();
    let db = env.db.clone();
    let delivered = wait_until(
        &env.diag,
        &format!(
            "{} acknowledged ids of s.b stored once on {url2} within 30 s of shard2's return",
            held.len()
        ),
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async {
            let rows = stored(&url2, &db).await?;
            let missing = held.iter().filter(|id| !rows.contains_key(*id)).count();
            if missing == 0 {
                Ok(back.elapsed())
            } else {
                Err(format!("{missing} of {} missing", held.len()))
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();
    let log = log.lock().unwrap().clone();
    let delays = watch.finish(&env.diag, &log).await;

    let answers = statuses(&log);
    println!(
        "answers {answers:?} to {} beacons over {:.1} s",
        log.len(),
        t0.elapsed().as_secs_f64()
    );
    let during: Vec<Duration> = delays
        .iter()
        .filter(|(at, _)| *at >= down && *at <= back)
        .map(|(_, d)| *d)
        .collect();
    let mut all: Vec<Duration> = delays.iter().map(|(_, d)| *d).collect();
    let n_all = all.len();
    let (p99, max) = (quantile(&mut all, 0.99), *all.last().unwrap());
    let n_during = during.len();
    let p99_during = quantile(&mut during.clone(), 0.99);
    println!(
        "shard1 (s.a) 202-to-visible delay, polled every 200 ms: p99 {p99:?} (max {max:?}) over {n_all} ids; \
         p99 {p99_during:?} over the {n_during} ids acknowledged while shard2 was down ({outage:?})"
    );
    println!(
        "shard2 (s.b): {} ids held back, all stored {delivered:?} after both replicas answered again",
        held.len()
    );
    let fives: usize = answers
        .iter()
        .filter(|(s, _)| **s >= 500)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(fives, 0, "no 5xx while the spool has room: {answers:?}");
    assert!(
        n_during >= 300,
        "shard1 ids measured during the outage: {n_during}"
    );
    // The bound: 2 s; the polling adds up to 0.2 s and a query's time, included in it.
    assert!(
        p99 <= Duration::from_secs(2),
        "p99 {p99:?} of shard1's delay"
    );
    assert!(
        p99_during <= Duration::from_secs(2),
        "p99 {p99_during:?} during the outage"
    );
    let home = HashMap::from([("s.a", 0), ("s.b", 1)]);
    wait_placed(&env, &shards, &home, &log, SETTLE).await;
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
    for k in &keys {
        let shard = before
            .get(k)
            .unwrap_or_else(|| panic!("{k} not listed: {before:?}"));
        assert!(shard == "shard1" || shard == "shard2", "{k}: {shard}");
    }
    // A third shard (one server: the settings are what this test checks).
    let three = format!("{two};shard3={}", stack_value(stack, "CH26_1_URL"));
    let after = site_shards(&env, &three);
    assert_eq!(after, before, "the shards listed once shard3 is configured");
    // Added again without --shard: still where it was (hash mod 3 may say otherwise).
    for k in &keys {
        cli(&env, &three, &[], &["sites", "add", "--key", k]).success();
    }
    assert_eq!(
        site_shards(&env, &three),
        before,
        "sites added again without --shard"
    );
    cli(
        &env,
        &three,
        &[],
        &["sites", "add", "--key", "new-3", "--shard", "shard3"],
    )
    .success();
    let now = site_shards(&env, &three);
    assert_eq!(
        now.get("new-3").map(String::as_str),
        Some("shard3"),
        "{now:?}"
    );
    // An existing site is not moved by sites add.
    let k = &keys[0];
    let out = cli(
        &env,
        &three,
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
    let mut now = site_shards(&env, &three);
    now.remove("new-3");
    assert_eq!(now, before, "nothing changed by the refused move");
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
    cli(
        &env,
        &s,
        &[],
        &["sites", "add", "--key", "rep.a", "--shard", "shard1"],
    )
    .success();
    cli(
        &env,
        &s,
        &[],
        &["sites", "add", "--key", "rep.b", "--shard", "shard2"],
    )
    .success();
    let c = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    let mut log = Vec::new();
    for i in 0..30 {
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
        (rpv - pv).abs() < 1e-9 && pv == 30.0,
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
    assert_eq!(as_i64(col(&all[0], "n")), Some(30));
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

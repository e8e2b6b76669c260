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

mod ch26;
mod migrate;
mod outages;
mod placement;
mod report;

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

/// Runs `collector ARGS` with [`settings`] (the test process's own ClickHouse URLs removed).
fn cli(env: &TestEnv<'_>, shards: &str, extra: &[(&str, &str)], args: &[&str]) -> CliOutput {
    run_cli(
        args,
        settings(env, shards, extra),
        &["COLLECTOR_CLICKHOUSE_URLS"],
    )
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

/// A query's rows on `url`; panics with ClickHouse's answer.
async fn env_query(url: &str, sql: &str) -> Vec<Value> {
    clickhouse_query(url, sql)
        .await
        .unwrap_or_else(|e| panic!("{url}: {sql}: {e}"))
}

//! Where sites are placed: a third shard moves none, a request mixing sites of two shards
//! stores each on its own.

use super::*;

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

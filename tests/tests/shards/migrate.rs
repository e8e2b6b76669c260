//! `migrate` on the sharded stack: the local table on every replica, `measurements` over the
//! cluster.

use super::*;

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

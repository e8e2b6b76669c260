//! The cluster readers of many sites go through (contract v5 §3): on every server, the
//! `Distributed` table `measurements_all` over the cluster `COLLECTOR_CLICKHOUSE_CLUSTER` of
//! the servers' `remote_servers`, once that cluster is found to list the configured shards.

/// The `Distributed` table over every shard's `measurements`.
pub const DISTRIBUTED_TABLE: &str = "measurements_all";

/// Where one server stands in the configuration: the place of its shard (0-based) among
/// `shards` configured shards, and how many replicas each configured shard lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The place of the server's shard in the configured order.
    pub shard: usize,
    /// Replicas per configured shard, in the configured order.
    pub replicas: Vec<usize>,
}

/// One row of `system.clusters` for the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clickhouse::Row)]
pub struct Member {
    /// The shard's number in the cluster, from 1.
    pub shard_num: u32,
    /// Whether the row is this server itself (`is_local`).
    pub is_local: u8,
}

/// What differs between the cluster a server defines and the configured shards, in words;
/// `None` when it matches: as many shards, each with as many replicas, in the same order, and
/// this server (where it can tell which row it is) in the shard it is configured in. A server
/// that cannot tell its own row (no row `is_local`, as a server behind an address translation
/// may) is checked on the counts only.
pub fn difference(cluster: &str, members: &[Member], expected: &Expected) -> Option<String> {
    if members.is_empty() {
        return Some(format!(
            "this server's remote_servers has no cluster {cluster} (COLLECTOR_CLICKHOUSE_CLUSTER)"
        ));
    }
    let shards = members.iter().map(|m| m.shard_num).max().unwrap_or(0) as usize;
    if shards != expected.replicas.len() {
        return Some(format!(
            "cluster {cluster} has {shards} shards, COLLECTOR_CLICKHOUSE_SHARDS {}",
            expected.replicas.len()
        ));
    }
    for (i, &want) in expected.replicas.iter().enumerate() {
        let have = members
            .iter()
            .filter(|m| m.shard_num as usize == i + 1)
            .count();
        if have != want {
            return Some(format!(
                "shard {} of cluster {cluster} has {have} replicas, the configured shard at that place {want}",
                i + 1
            ));
        }
    }
    let local: Vec<u32> = members
        .iter()
        .filter(|m| m.is_local == 1)
        .map(|m| m.shard_num)
        .collect();
    if !local.is_empty() && !local.contains(&(expected.shard as u32 + 1)) {
        return Some(format!(
            "this server is in shard {} of cluster {cluster}, but configured in the shard at place {}",
            local[0],
            expected.shard + 1
        ));
    }
    None
}

/// Why `measurements_all` was not made on a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistributedError {
    /// The server's cluster does not list the configured shards ([`difference`]).
    #[error("{0}")]
    Differs(String),
    /// The server defines no such cluster at all.
    #[error("this server's remote_servers has no cluster {0} (COLLECTOR_CLICKHOUSE_CLUSTER)")]
    NoCluster(String),
    /// ClickHouse refused or did not answer (its message).
    #[error("{0}")]
    Failed(String),
}

/// Checks the cluster on the server behind `client` and, when it matches, creates (or, after
/// the local table gained columns, makes anew) `database.measurements_all`. Errors: the
/// difference found ([`difference`]), or ClickHouse's message.
pub async fn apply_distributed(
    client: &clickhouse::Client,
    database: &str,
    cluster: &str,
    expected: &Expected,
) -> Result<(), DistributedError> {
    let chain = |e: clickhouse::error::Error| DistributedError::Failed(crate::logging::chain(&e));
    let members = client
        .query("SELECT shard_num, is_local FROM system.clusters WHERE cluster = ?")
        .bind(cluster)
        .fetch_all::<Member>()
        .await
        .map_err(chain)?;
    if members.is_empty() {
        return Err(DistributedError::NoCluster(cluster.to_owned()));
    }
    if let Some(diff) = difference(cluster, &members, expected) {
        return Err(DistributedError::Differs(diff));
    }
    let columns = |table: &'static str| {
        client
            .query("SELECT name FROM system.columns WHERE database = ? AND table = ?")
            .bind(database)
            .bind(table)
            .fetch_all::<String>()
    };
    let local = columns("measurements").await.map_err(chain)?;
    let distributed = columns(DISTRIBUTED_TABLE).await.map_err(chain)?;
    if !distributed.is_empty() && distributed != local {
        // It holds no data: made anew with the local table's columns.
        client
            .query(&format!(
                "DROP TABLE IF EXISTS {database}.{DISTRIBUTED_TABLE}"
            ))
            .execute()
            .await
            .map_err(chain)?;
    }
    let mut create = client.query(&format!(
        "CREATE TABLE IF NOT EXISTS {database}.{DISTRIBUTED_TABLE} AS {database}.measurements \
         ENGINE = Distributed({cluster}, {database}, measurements)"
    ));
    // 18.16 copies the LowCardinality columns only with the setting the local table needed.
    if super::schema::knows_low_cardinality_setting(client)
        .await
        .map_err(chain)?
    {
        let (name, value) = super::schema::LOW_CARDINALITY;
        create = create.with_setting(name, value);
    }
    create.execute().await.map_err(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(shard_num: u32, is_local: u8) -> Member {
        Member {
            shard_num,
            is_local,
        }
    }

    fn expected(shard: usize, replicas: &[usize]) -> Expected {
        Expected {
            shard,
            replicas: replicas.to_vec(),
        }
    }

    #[test]
    fn a_matching_cluster_passes() {
        let members = [m(1, 0), m(1, 0), m(2, 1), m(2, 0)];
        assert_eq!(difference("c", &members, &expected(1, &[2, 2])), None);
    }

    #[test]
    fn every_difference_is_named() {
        let members = [m(1, 0), m(1, 0), m(2, 1), m(2, 0)];
        let cases = [
            (&[][..], expected(0, &[2]), "no cluster c"),
            (
                &members[..],
                expected(1, &[2, 2, 1]),
                "has 2 shards, COLLECTOR_CLICKHOUSE_SHARDS 3",
            ),
            (
                &members[..],
                expected(1, &[2, 1]),
                "shard 2 of cluster c has 2 replicas",
            ),
            (
                &members[..],
                expected(0, &[2, 2]),
                "this server is in shard 2",
            ),
        ];
        for (members, want, words) in cases {
            let diff = difference("c", members, &want).expect(words);
            assert!(diff.contains(words), "{diff}");
        }
    }

    #[test]
    fn a_server_that_cannot_tell_its_row_is_checked_on_the_counts() {
        let members = [m(1, 0), m(2, 0)];
        assert_eq!(difference("c", &members, &expected(1, &[1, 1])), None);
    }
}

-- Contract v5 §3: the shard a site lives on, chosen once when it is added (`sites add --shard`,
-- or cityHash64(key) mod n over the configured shards) and never changed by the collector.
-- Sites added before shards existed were on the one replica set, the shard named `default`
-- (COLLECTOR_CLICKHOUSE_URLS). Idempotent: applied on every `collector migrate`.
ALTER TABLE sites ADD COLUMN IF NOT EXISTS shard text NOT NULL DEFAULT 'default';

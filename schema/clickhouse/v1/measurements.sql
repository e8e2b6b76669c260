CREATE TABLE IF NOT EXISTS {database}.measurements
(
    id UUID,
    site String,
    received_at DateTime,
    url String,
    ts Nullable(Int64),
    referrer Nullable(String),
    navigation_type Nullable(String),
    ttfb_ms Nullable(Float64),
    fcp_ms Nullable(Float64),
    lcp_ms Nullable(Float64),
    inp_ms Nullable(Float64),
    dom_content_loaded_ms Nullable(Float64),
    load_ms Nullable(Float64),
    cls Nullable(Float64),
    viewport_width Nullable(UInt32),
    effective_connection_type Nullable(String),
    user_agent String,
    sample_rate Float64 DEFAULT 1
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/measurements', '{replica}')
PARTITION BY toYYYYMM(received_at)
ORDER BY id

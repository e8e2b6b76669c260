CREATE TABLE IF NOT EXISTS {database}.measurements
(
    id UUID,
    site String,
    received_at DateTime('UTC'),
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
    sample_rate Float64 DEFAULT 1,
    page_view_at DateTime('UTC') DEFAULT if(isNull(ts), received_at, toDateTime(intDiv(assumeNotNull(ts), 1000), 'UTC')),
    device_type LowCardinality(String) DEFAULT 'unknown',
    browser LowCardinality(String) DEFAULT '',
    browser_version LowCardinality(String) DEFAULT '',
    os LowCardinality(String) DEFAULT '',
    lcp_target Nullable(String),
    inp_target Nullable(String),
    cls_target Nullable(String),
    lcp_url Nullable(String),
    lcp_resource_load_delay_ms Nullable(Float64),
    lcp_resource_load_duration_ms Nullable(Float64),
    lcp_element_render_delay_ms Nullable(Float64),
    inp_type Nullable(String),
    inp_input_delay_ms Nullable(Float64),
    inp_processing_duration_ms Nullable(Float64),
    inp_presentation_delay_ms Nullable(Float64),
    inp_script_url Nullable(String),
    cls_time_ms Nullable(Float64),
    cls_value Nullable(Float64)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/measurements_v2', '{replica}')
PARTITION BY toYYYYMM(page_view_at)
ORDER BY (site, toDate(page_view_at), id)
SETTINGS index_granularity = 8192

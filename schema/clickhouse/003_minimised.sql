CREATE TABLE IF NOT EXISTS {database}.minimised
(
    table_name String,
    partition_id String,
    rules UInt32,
    max_block Int64,
    rows_read UInt64,
    rewritten UInt64,
    done_at DateTime('UTC')
)
ENGINE = {engine}
ORDER BY (table_name, partition_id)

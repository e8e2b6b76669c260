-- Which computation of `crux_days` holds a site's day, and the rows it was computed from
-- (`rows`: the day's stored rows, duplicates not yet folded included; `latest`: their latest
-- `received_at`). Written after the computation's rows; the report reads a day from the roll-up
-- only while both still match the day in `measurements` (docs/queries.md, "The CrUX view").
CREATE TABLE IF NOT EXISTS {database}.crux_day_marks
(
    site String,
    day Date,
    rows UInt64,
    latest DateTime('UTC'),
    computation UInt64
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (site, day, rows, latest, computation)

-- Which computation of `crux_days` holds a site's day, and the rows it was computed from
-- (`rows`: the day's stored rows, duplicates not yet folded included; `parts`: a hash of the
-- names of the table parts holding them, which any insert, merge or mutation touching the day
-- changes), and how many groups the computation stored for the day (`groups`). Written after
-- the computation's groups; the report reads a day from the roll-up only while `rows` and
-- `parts` still match the day in `measurements` and `crux_days` still holds its `groups`
-- (docs/queries.md, "The CrUX view").
CREATE TABLE IF NOT EXISTS {database}.crux_day_marks
(
    site String,
    day Date,
    rows UInt64,
    parts UInt64,
    groups UInt8,
    computation UInt64
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (site, day, rows, parts, computation)

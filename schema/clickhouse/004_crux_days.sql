-- The daily roll-up of `collector report --crux` (docs/queries.md, "The CrUX view"): per site,
-- UTC day and computation, the day's Chromium rows per form factor and navigation kind, each
-- metric's figures as sums and its p75 as a quantile state (`Metric::ALL`'s order). A cache of
-- `measurements`, never the only copy of anything: one per server (not replicated), written by
-- the report, read only through a mark of `crux_day_marks` that matches the day's rows.
CREATE TABLE IF NOT EXISTS {database}.crux_days
(
    site String,
    day Date,
    computation UInt64,
    ff String,          -- device_type: mobile, tablet or desktop
    soft UInt8,         -- 1: soft navigations
    n UInt64,           -- rows
    pv Float64,         -- page views, sum(1 / sample_rate)
    lcp_rows UInt64,
    lcp_page_views Float64,
    lcp_p75 AggregateFunction(quantileExactWeighted(0.75), Float64, UInt64),
    lcp_good Float64,
    lcp_poor Float64,
    inp_rows UInt64,
    inp_page_views Float64,
    inp_p75 AggregateFunction(quantileExactWeighted(0.75), Float64, UInt64),
    inp_good Float64,
    inp_poor Float64,
    cls_rows UInt64,
    cls_page_views Float64,
    cls_p75 AggregateFunction(quantileExactWeighted(0.75), Float64, UInt64),
    cls_good Float64,
    cls_poor Float64,
    fcp_rows UInt64,
    fcp_page_views Float64,
    fcp_p75 AggregateFunction(quantileExactWeighted(0.75), Float64, UInt64),
    fcp_good Float64,
    fcp_poor Float64,
    ttfb_rows UInt64,
    ttfb_page_views Float64,
    ttfb_p75 AggregateFunction(quantileExactWeighted(0.75), Float64, UInt64),
    ttfb_good Float64,
    ttfb_poor Float64
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (site, day, computation, ff, soft)

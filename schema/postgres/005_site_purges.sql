-- Contract v5 §5: `sites purge` reaches every collector's files. Each serving collector says
-- here that it is alive (`collectors`, at every settings reload), and that it has deleted a
-- purged site's records from its kept-aside and damaged-segment files (`site_purges`, one row
-- per site and collector, for the purge of `purged_at`), so that `sites purge` can wait for
-- them and name the ones that have not. A collector is named `HOST:SPOOL_DIR`.
-- Idempotent: applied on every `collector migrate`.
CREATE TABLE IF NOT EXISTS collectors (
    collector text PRIMARY KEY,
    seen_at timestamptz NOT NULL,
    -- how often it says so (its COLLECTOR_SETTINGS_TTL), in seconds
    every_s double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS site_purges (
    site text NOT NULL,
    collector text NOT NULL,
    -- the purge done: the site's purged_at when the collector did it
    purged_at timestamptz NOT NULL,
    done_at timestamptz NOT NULL,
    -- kept-aside and damaged-segment rows of the site it deleted
    rows bigint NOT NULL,
    PRIMARY KEY (site, collector)
);

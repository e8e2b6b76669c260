-- Sites that may send beacons. Idempotent: applied on every `collector migrate`.
CREATE TABLE IF NOT EXISTS sites (
    key             text PRIMARY KEY
                    CONSTRAINT sites_key_format CHECK (key ~ '^[A-Za-z0-9._-]{1,64}$'),
    allowed_origins text[] NOT NULL DEFAULT '{}',
    sample_rate     double precision NOT NULL DEFAULT 1.0
                    CONSTRAINT sites_sample_rate_range CHECK (sample_rate >= 0 AND sample_rate <= 1),
    enabled         boolean NOT NULL DEFAULT true,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Contract v4: what a site keeps of a URL, its page groups and dimensions, and its erasure.
-- Idempotent: applied on every `collector migrate`. Collectors read rows as JSON, so that
-- one of this release started before this file was applied reads the defaults.
ALTER TABLE sites ADD COLUMN IF NOT EXISTS keep_query text[] NOT NULL DEFAULT '{utm_*}';
ALTER TABLE sites ADD COLUMN IF NOT EXISTS page_groups text[] NOT NULL DEFAULT '{}';
ALTER TABLE sites ADD COLUMN IF NOT EXISTS dimensions text[] NOT NULL DEFAULT '{}';
ALTER TABLE sites ADD COLUMN IF NOT EXISTS purged_at timestamptz;

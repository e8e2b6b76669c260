-- Contract v5 §1: a shop's own reverse proxies, trusted for that shop's beacons only
-- (`sites update KEY --trusted-proxy CIDR`): their client-address header names the client of
-- that site's measurements, never of another site's. CIDRs as text (`203.0.113.0/24`,
-- `2001:db8::/48`). Idempotent: applied on every `collector migrate`.
ALTER TABLE sites ADD COLUMN IF NOT EXISTS trusted_proxies text[] NOT NULL DEFAULT '{}';

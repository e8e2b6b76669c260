//! The writer against in-memory ClickHouse servers: batching, bisection of a refused batch,
//! replica choice and failover, catch-up gating.

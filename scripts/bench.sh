#!/usr/bin/env bash
# scripts/bench.sh - the collector's benchmarks, next to nginx answering `return 204`.
#
#   scripts/bench.sh            full run, about 15 minutes: writes docs/benchmarks.md
#   scripts/bench.sh --quick    smoke test, about 2 minutes: prints the table only
#   scripts/bench.sh --ablation the spool append's share of a request: its section of the doc
#   scripts/bench.sh --storage [--rows N]  the read side, v1's layout against v2's
#
# The driver is the Rust program bench/ (`scripts/bench.sh --help`; method: docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p bench
exec "${CARGO_TARGET_DIR:-target}/release/bench" "$@"

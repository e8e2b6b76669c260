#!/usr/bin/env bash
# Runs every test of the project on this machine: formatting and lint, unit tests, and the
# integration tests against real PostgreSQL, ZooKeeper and replicated ClickHouse servers that
# this script installs (if missing) and starts on loopback ports in a temporary folder.
#
#   scripts/test.sh            everything
#   scripts/test.sh intake     the checks and builds, then only the integration tests whose
#                              name contains "intake" (no image checks)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "installing what is missing"
scripts/stack.sh install

step "format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings

step "container files (no engine needed)"
scripts/check-containers.sh

step "alerting rules (promtool: deploy/prometheus)"
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/alerts.yml
for t in deploy/prometheus/*test*.yml; do promtool test rules "$t"; done

step "build"
cargo build -q -p collector --bin collector
cargo test -q --workspace --no-run

# Two stacks: one shared by the tests that leave servers alone, one with three replicas that
# the failure tests kill, freeze and restart (one test at a time).
stack_dir=$(mktemp -d /tmp/collector-test-stack.XXXXXX)
failover_dir=$(mktemp -d /tmp/collector-failover-stack.XXXXXX)
cleanup() {
  scripts/stack.sh down "$stack_dir" --purge >/dev/null 2>&1 || true
  scripts/stack.sh down "$failover_dir" --purge >/dev/null 2>&1 || true
}
trap cleanup EXIT

step "starting the test stacks in $stack_dir and $failover_dir"
scripts/stack.sh up "$stack_dir" --replicas 2 --ch26
scripts/stack.sh up "$failover_dir" --replicas 3
export STACK_ENV="$stack_dir/stack.env"
export FAILOVER_STACK_ENV="$failover_dir/stack.env"
export COLLECTOR_BIN="$PWD/target/debug/collector"

step "tests"
# Two test threads: the machine has two cores and every test runs real servers.
cargo test --workspace -- --test-threads=2 "$@"

step "the contract's intake tests again, on the ClickHouse 26.x server (single-server form)"
TEST_CLICKHOUSE=ch26 cargo test -q -p collector-tests --test intake -- --test-threads=2 "$@"

if [[ $# -gt 0 ]]; then
  echo "(a filtered run: the image checks are skipped; scripts/check-containers.sh --engine runs them)"
  exit 0
fi

step "container image and compose services on podman"
# Builds the Dockerfile with podman (base images made locally, cached) and runs it against
# its own loopback stack; skipped with a note where podman cannot run containers.
scripts/check-containers.sh --engine

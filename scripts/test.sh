#!/usr/bin/env bash
# Runs every test of the project on this machine: formatting and lint, unit tests, and the
# integration tests against real PostgreSQL, ZooKeeper and replicated ClickHouse servers that
# this script installs (if missing) and starts on loopback ports in a temporary folder.
#
#   scripts/test.sh            everything
#   scripts/test.sh NAME       the checks and builds, then: when tests/tests/NAME.rs exists,
#                              every test of that file; else only the tests (unit and
#                              integration) whose function name contains NAME. No image
#                              checks; fails when nothing matched.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

if [[ $# -eq 1 && $1 == containers_engine ]]; then
  echo "the tests of containers_engine.rs are #[ignore]d (podman, one at a time): run" \
    "scripts/check-containers.sh --engine" >&2
  exit 2
fi

step "installing what is missing"
scripts/stack.sh install

step "format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings

step "container files (no engine needed): tests/tests/containers.rs"
scripts/check-containers.sh

step "alerting rules (promtool: deploy/prometheus)"
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/alerts.yml
for t in deploy/prometheus/*test*.yml; do promtool test rules "$t"; done

step "build"
cargo build -q -p collector --bin collector
cargo test -q --workspace --no-run

# Three stacks: one shared by the tests that leave servers alone, one with three replicas that
# the failure tests kill, freeze and restart (one test at a time), and one of two shards of
# two replicas each, with two 26.x servers as two unreplicated shards (tests/tests/shards.rs,
# one test at a time).
stack_dir=$(mktemp -d /tmp/collector-test-stack.XXXXXX)
failover_dir=$(mktemp -d /tmp/collector-failover-stack.XXXXXX)
shard_dir=$(mktemp -d /tmp/collector-shard-stack.XXXXXX)
# A test's own stacks (target/test-stack/own-*) are stopped when the test ends; those of a run
# that was interrupted are stopped here, at the start and at the end of this one.
sweep_own_stacks() {
  local d
  for d in target/test-stack/own-*; do
    if [[ -d $d ]]; then scripts/stack.sh down "$d" --purge >/dev/null 2>&1 || true; fi
  done
  return 0
}
cleanup() {
  scripts/stack.sh down "$stack_dir" --purge >/dev/null 2>&1 || true
  scripts/stack.sh down "$failover_dir" --purge >/dev/null 2>&1 || true
  scripts/stack.sh down "$shard_dir" --purge >/dev/null 2>&1 || true
  sweep_own_stacks
}
trap cleanup EXIT
sweep_own_stacks

step "starting the test stacks in $stack_dir, $failover_dir and $shard_dir"
scripts/stack.sh up "$stack_dir" --replicas 2 --ch26
scripts/stack.sh up "$failover_dir" --replicas 3
scripts/stack.sh up "$shard_dir" --shards 2 --replicas 2 --ch26 --ch26-servers 2
export STACK_ENV="$stack_dir/stack.env"
export FAILOVER_STACK_ENV="$failover_dir/stack.env"
export SHARD_STACK_ENV="$shard_dir/stack.env"
export COLLECTOR_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/collector"

# What a filtered run selects: a test file by its name, or tests by a part of their name.
select=(--workspace)
filter=("$@")
if [[ $# -eq 1 && -f tests/tests/$1.rs ]]; then
  select=(-p collector-tests --test "$1")
  filter=()
fi
log=$(mktemp /tmp/collector-test-log.XXXXXX)
trap 'cleanup; rm -f "$log"' EXIT

step "tests"
# Two test threads: the machine has two cores and every test runs real servers.
# --no-fail-fast: one run names every failing test file, not only the first.
cargo test --no-fail-fast "${select[@]}" -- --test-threads=2 "${filter[@]}" 2>&1 | tee "$log"

if [[ $# -eq 0 || ${select[*]} == *"--test intake"* || ${#filter[@]} -gt 0 ]]; then
  step "the contract's intake tests again, on the ClickHouse 26.x server (single-server form)"
  TEST_CLICKHOUSE=ch26 cargo test -q -p collector-tests --test intake -- --test-threads=2 "${filter[@]}" 2>&1 | tee -a "$log"
fi

if [[ $# -gt 0 ]] && ! grep -qE '^test result: ok\. [1-9][0-9]* passed' "$log"; then
  echo "no test matched: $* (a test file under tests/tests/, or a part of a test function's name)" >&2
  exit 1
fi

if [[ $# -gt 0 ]]; then
  echo "(a filtered run: the image checks are skipped; scripts/check-containers.sh --engine runs them)"
  exit 0
fi

step "container image and compose services on podman: tests/tests/containers_engine.rs"
# Builds the Dockerfile with podman (base images made locally, cached) and runs it against
# its own loopback stack; fails where podman cannot run containers. Those tests are
# #[ignore]d: the run above leaves them out, and this one runs them alone, one at a time.
scripts/check-containers.sh --engine

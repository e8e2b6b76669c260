#!/usr/bin/env bash
# Runs every test of the project on this machine: formatting and lint, unit tests, and the
# integration tests against real PostgreSQL, ZooKeeper and replicated ClickHouse servers that
# this script installs (if missing) and starts on loopback ports in a temporary folder.
#
#   scripts/test.sh            everything
#   scripts/test.sh NAME       the checks and builds, then: when tests/tests/NAME.rs (or the
#                              folder tests/tests/NAME/) exists, every test of that module
#                              (`NAME::*` of the integration binary);
#                              else only the tests (unit and integration) whose name contains
#                              NAME. Starts only the stacks those need; no image checks; fails
#                              when nothing matched.
#
# The tests run under cargo-nextest (.config/nextest.toml, profile `ci`): each test a process
# of its own, more at once than cores, test groups keeping apart what shares a stack it breaks.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

if [[ $# -eq 1 && $1 == containers_engine ]]; then
  echo "the tests of containers_engine/ are #[ignore]d (podman, one at a time): run" \
    "scripts/check-containers.sh --engine" >&2
  exit 2
fi
if [[ $# -eq 1 && $1 == integration ]]; then
  echo "integration.rs only lists the test files: name one of them (scripts/test.sh intake)," \
    "or run scripts/test.sh with no argument for all" >&2
  exit 2
fi

step "installing what is missing"
scripts/stack.sh install

step "format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings

step "alerting rules (promtool: deploy/prometheus)"
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/alerts.yml
for t in deploy/prometheus/*test*.yml; do promtool test rules "$t"; done


# What a filtered run selects: a test file by its name (the module NAME of the integration
# binary: tests/tests/NAME.rs, or the folder tests/tests/NAME/ of a module split by subject),
# or tests by a part of their name. The stacks it starts: those the selection uses.
is_module() { [[ -f tests/tests/$1.rs || -f tests/tests/$1/mod.rs ]]; }
filter=()
files=(tests/tests/*.rs tests/tests/*/*.rs)
if [[ $# -eq 1 ]] && is_module "$1"; then
  filter=(-E "binary_id(collector-tests::integration) & test(/^$1::/)")
  if [[ -f tests/tests/$1.rs ]]; then files=("tests/tests/$1.rs"); else files=(tests/tests/"$1"/*.rs); fi
elif [[ $# -gt 0 ]]; then
  for a in "$@"; do filter+=(-E "test($a)"); done
fi
uses() { grep -lqE "$1" "${files[@]}"; }
want_failover=1 want_shards=1
if [[ $# -eq 1 ]] && is_module "$1"; then
  uses 'Stack::failover\(\)' || want_failover=0
  uses 'Stack::sharded\(\)' || want_shards=0
fi

step "build"
# Every target of the workspace in one build: the binaries (the collector the tests run, the
# stack binary of scripts/stack.sh) with the features the test build has, so that each
# dependency is compiled once (`-p collector` alone, or a plain `cargo build`, resolves other
# features: tokio's test-util, hyper's client, and compiles the dependency graph again).
cargo build -q --workspace --all-targets
cargo test -q --workspace --no-run
# A filtered run that selects no test says so and stops, before any stack starts.
if ((${#filter[@]})); then
  selected=$(cargo nextest list --workspace --cargo-quiet --message-format oneline "${filter[@]}" | grep -c . || true)
  if ((selected == 0)); then
    echo "scripts/test.sh: no test matches '$*' (a test file: tests/tests/NAME.rs or tests/tests/NAME/; or a part of a test's name)" >&2
    exit 2
  fi
  echo "($selected test$( ((selected == 1)) || echo s) selected)"
fi

# Three stacks: one shared by the tests that leave servers alone, one with three replicas that
# the failure tests kill, freeze and restart (one test at a time), and one of two shards of
# two replicas each, with two 26.x servers as two unreplicated shards (tests/tests/shards/,
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
image_pid=
logs=()
cleanup() {
  if [[ -n $image_pid ]] && kill -0 "$image_pid" 2>/dev/null; then
    kill -- -"$image_pid" 2>/dev/null || kill "$image_pid" 2>/dev/null || true
    wait "$image_pid" 2>/dev/null || true
  fi
  scripts/stack.sh down "$stack_dir" --purge >/dev/null 2>&1 || true
  scripts/stack.sh down "$failover_dir" --purge >/dev/null 2>&1 || true
  scripts/stack.sh down "$shard_dir" --purge >/dev/null 2>&1 || true
  sweep_own_stacks
  rm -f "${logs[@]}"
}
trap cleanup EXIT
sweep_own_stacks

# The stacks start side by side (their ports come from one machine-wide allocator).
step "starting the test stacks: $stack_dir$( ((want_failover)) && echo ", $failover_dir")$( ((want_shards)) && echo ", $shard_dir")"
up_pids=()
scripts/stack.sh up "$stack_dir" --replicas 2 --ch26 & up_pids+=($!)
if ((want_failover)); then scripts/stack.sh up "$failover_dir" --replicas 3 & up_pids+=($!); fi
if ((want_shards)); then
  scripts/stack.sh up "$shard_dir" --shards 2 --replicas 2 --ch26 --ch26-servers 2 & up_pids+=($!)
fi
for p in "${up_pids[@]}"; do wait "$p"; done
export STACK_ENV="$stack_dir/stack.env"
((want_failover)) && export FAILOVER_STACK_ENV="$failover_dir/stack.env"
((want_shards)) && export SHARD_STACK_ENV="$shard_dir/stack.env"
export COLLECTOR_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/collector"

nextest=(cargo nextest run --profile ci --workspace --no-fail-fast --cargo-quiet)
failed=()

if [[ $# -gt 0 ]]; then
  step "tests"
  "${nextest[@]}" "${filter[@]}" || failed+=("the tests")
  # The intake tests again on the 26.x server, when the selection holds some of them.
  if [[ ${filter[*]} == *"^intake::"* ]] || { [[ $# -gt 0 ]] && ! is_module "$1" &&
    grep -rqE "$(printf '%s|' "$@" | sed 's/|$//')" tests/tests/intake/; }; then
    step "the contract's intake tests again, on the ClickHouse 26.x server (single-server form)"
    TEST_CLICKHOUSE=ch26 "${nextest[@]}" --no-tests=pass -E "binary_id(collector-tests::integration) & test(/^intake::/)" "${filter[@]}" ||
      failed+=("the intake tests on 26.x")
  fi
  if [[ ${#failed[@]} -gt 0 ]]; then echo "failed: ${failed[*]}" >&2; exit 1; fi
  echo "(a filtered run: the image checks are skipped; scripts/check-containers.sh --engine runs them)"
  exit 0
fi

# First the tests that measure time (group `timing`, two at a time), with nothing beside them:
# their tolerances are stated for two tests at a time. Then the rest, many at once, and beside
# them the image checks (podman: scripts/check-containers.sh --engine, the #[ignore]d tests of
# tests/tests/containers_engine/, one at a time), which build the image (a release build in
# the container, at nice 10) and run it against a loopback stack of their own. Last, the
# intake tests on 26.x: the closing line is nextest's summary.
step "the tests that measure time (group timing), two at a time with nothing beside them"
"${nextest[@]}" -E 'group(timing)' || failed+=("the timing tests")

image_log=$(mktemp /tmp/collector-test-image.XXXXXX)
logs+=("$image_log")
step "container image and compose services on podman (in the background, log: $image_log)"
setsid scripts/check-containers.sh --engine >"$image_log" 2>&1 &
image_pid=$!

step "tests (all but the timing group), beside the image checks"
"${nextest[@]}" -E 'not group(timing)' || failed+=("the tests")

step "container image and compose services on podman: tests/tests/containers_engine/"
image_rc=0
wait "$image_pid" || image_rc=$?
image_pid=
cat "$image_log"
((image_rc == 0)) || failed+=("the image checks (scripts/check-containers.sh --engine, exit $image_rc)")

step "the instruction-count gate: a beacon's cost against bench/intake-cost.txt (scripts/cost-gate.sh)"
scripts/cost-gate.sh || failed+=("the instruction-count gate")

step "the contract's intake tests again, on the ClickHouse 26.x server (single-server form)"
if TEST_CLICKHOUSE=ch26 "${nextest[@]}" -E 'binary_id(collector-tests::integration) & test(/^intake::/)'; then
  [[ ${#failed[@]} -eq 0 ]] || { echo "failed: ${failed[*]}" >&2; exit 1; }
else
  failed+=("the intake tests on 26.x")
  echo "failed: ${failed[*]}" >&2
  exit 1
fi

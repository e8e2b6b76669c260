#!/usr/bin/env bash
# scripts/cost-gate.sh - the instruction-count gate of the intake (issue 53): the instructions one
# beacon costs in process, counted by callgrind (not timed: a count does not depend on the
# machine's load), against the budget in bench/intake-cost.txt. The test command runs it last.
#
#   scripts/cost-gate.sh            # exit 1 when a beacon costs over 5 % more than the budget
#   scripts/cost-gate.sh --update   # writes the count measured now as the budget
#
# What is counted: `cost::intake_cost_counted` (collector/src/cost.rs) in the
# release build of the collector's unit tests: v4 beacons posted one after another through the
# collector's public router over the state production assembles, production's own functions all
# the way: `intake::post` and every station of `accept` (in-flight bound, decode, judge, the site
# stage from the in-memory settings cache, shedding, the rates, the dedup claim, the encoding and
# the append into the spool's open group, committed by the spool's own thread on a tmpfs), then
# the 202. Callgrind counts every thread's user-space instructions and none of the kernel's: the
# disk (`pwrite`, `fdatasync`) is left out by the count itself; so are hyper's HTTP/1 parse and
# write, which need a socket. Per beacon = (the count for 12,000 beacons - the count for 2,000)
# / 10,000, so that the test binary's start and the fixtures' set-up (the user-agent parser's
# compilation, the spool's open) cancel out. A change that makes a beacon dearer on purpose
# (contract work: masking, fairness, shards) raises the budget with --update in the same commit,
# and says why there.
set -euo pipefail
cd "$(dirname "$0")/.."
budget_file=bench/intake-cost.txt
die() { echo "cost-gate: $*" >&2; exit 1; }
command -v valgrind >/dev/null || die "valgrind is missing (scripts/stack.sh install installs it)"
bin=$(cargo test -q --release -p collector --lib --no-run --message-format=json |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and m["target"]["name"] == "collector" and "lib" in m["target"]["kind"]:
        print(m["executable"])')
[[ -n $bin && -x $bin ]] || die "no test binary of the collector library from cargo test --release --no-run"

# The instructions callgrind collects for N beacons.
count() {
  local out
  out=$(COST_BEACONS=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" \
    --ignored --exact cost::intake_cost_counted --test-threads 1 --nocapture 2>&1) ||
    die "callgrind of $bin for $1 beacons failed: $(tail -n 5 <<<"$out")"
  grep -q "$1 beacons, " <<<"$out" || die "the counted test did not run for $1 beacons: $(tail -n 5 <<<"$out")"
  sed -n 's/.*Collected : \([0-9][0-9]*\).*/\1/p' <<<"$out" | tail -n 1
}
small=$(count 2000)
large=$(count 12000)
[[ -n $small && -n $large ]] || die "callgrind printed no count"
per=$(((large - small) / 10000))
if [[ ${1:-} == --update ]]; then
  printf '%s\n' "# Instructions per beacon of cost::intake_cost_counted (scripts/cost-gate.sh):" \
    "# the whole intake in process, from the router to the spool's committed group (the kernel's" \
    "# work, the disk with it, and hyper's HTTP/1 not counted; docs/benchmarks.md)." \
    "# Written by scripts/cost-gate.sh --update on $(date -u +%F), git $(git rev-parse --short HEAD)." \
    "instructions_per_beacon = $per" >"$budget_file"
  echo "cost-gate: $per instructions per beacon, written to $budget_file"
  exit 0
fi
budget=$(sed -n 's/^instructions_per_beacon = \([0-9][0-9]*\)$/\1/p' "$budget_file")
[[ -n $budget ]] || die "$budget_file holds no 'instructions_per_beacon = N' line"
limit=$((budget * 105 / 100))
change=$(python3 -c "print(f'{($per - $budget) / $budget * 100:+.1f}')")
if ((per > limit)); then
  die "a beacon costs $per instructions, $change % against the budget of $budget (limit $limit: +5 %); make it cheaper, or raise the budget with scripts/cost-gate.sh --update and say why in the commit"
fi
echo "cost-gate: $per instructions per beacon, $change % against the budget of $budget (limit $limit)"

#!/usr/bin/env bash
# scripts/check-containers.sh - the container checks: installs with apt-get what they run,
# then runs them, as Rust tests (what each one proves is in the test files):
#
#   scripts/check-containers.sh           the container files without an engine:
#                                         tests/tests/containers/ (docker-compose, caddy,
#                                         PostgreSQL 15; scripts/test.sh runs them with the
#                                         other tests, not through this script)
#   scripts/check-containers.sh --engine  the image and the compose services with podman, run
#                                         by scripts/test.sh beside the tests:
#                                         tests/tests/containers_engine/ (podman, runc,
#                                         debootstrap, docker-compose); its tests are #[ignore]d,
#                                         so that no other `cargo test` runs them, and run here
#                                         with --ignored, one at a time
#
# Needs root (apt-get; PostgreSQL runs as the postgres user). Exits 1 if any check fails; a
# check that cannot run here fails.
set -euo pipefail
SCRIPT_NAME=check-containers
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # log, die
cd "$(dirname "$0")/.."

pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# install_missing PACKAGE...: apt-get install of those not installed, without letting their
# maintainer scripts start Caddy or PostgreSQL as services.
install_missing() {
    local need=() p policy=/usr/sbin/policy-rc.d added=0 rc=0 log
    for p in "$@"; do pkg_installed "$p" || need+=("$p"); done
    [[ ${#need[@]} -eq 0 ]] && return 0
    [[ $EUID -eq 0 ]] || die "run as root to install: ${need[*]}"
    log "installing ${need[*]}"
    if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added=1; fi
    log=$(mktemp /tmp/check-containers-apt.XXXXXX)
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" ||
        { apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; }
    } >"$log" 2>&1 || rc=$?
    [[ $added -eq 1 ]] && rm -f "$policy"
    [[ $rc -eq 0 ]] || { tail -n 20 "$log" >&2; die "apt-get install ${need[*]} failed"; }
    rm -f "$log"
}

if [[ ${1:-} == --engine ]]; then
    install_missing podman runc debootstrap docker-compose
    scripts/stack.sh install
    # --nocapture: what a passing check saw too (timings, sizes, counts).
    # --workspace: the dependencies' features as scripts/test.sh's build has them (with -p alone
    # cargo would build every dependency again, for a feature set of this package only).
    exec cargo test --workspace --test containers_engine -- --ignored --test-threads=1 --nocapture
fi
install_missing docker-compose caddy postgresql-15
exec cargo test --workspace --test integration -- containers::

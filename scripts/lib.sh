# scripts/lib.sh - what the shell scripts of scripts/ share. Sourced, never run:
#
#   SCRIPT_NAME=stack   # the prefix of this script's messages
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
#   log MESSAGE...                 "SCRIPT_NAME: MESSAGE" on stderr
#   die MESSAGE...                 "SCRIPT_NAME: error: MESSAGE" on stderr; exit 1
#   die_with_log MESSAGE FILE...   die, showing the last 25 lines of each non-empty FILE first
#   now_ms                         milliseconds since the epoch
#   wait_until SECONDS WHAT CMD... run CMD (output discarded) every 100 ms until it succeeds;
#                                  dies with "timed out after SECONDS s waiting for: WHAT"
#   port_in_use PORT               some TCP socket (v4 or v6, any state) has PORT as its own
#   port_listening PORT            some socket listens on PORT
#   alloc_ports N                  N distinct free loopback ports on one line, reserved
#                                  machine-wide (see below)
#   bootstrap_site LOG [--if-missing] KEY... [OPTION...]
#                                  `collector migrate`, then `collector sites add` (see below)
#
# The callers run with `set -euo pipefail`; so do these functions.
# shellcheck shell=bash

SCRIPT_NAME=${SCRIPT_NAME:-$(basename "$0" .sh)}

log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2; exit 1; }

die_with_log() {
    local msg=$1 f
    shift
    printf '%s: error: %s\n' "$SCRIPT_NAME" "$msg" >&2
    for f in "$@"; do
        [[ -s $f ]] || continue
        printf -- '----- last lines of %s -----\n' "$f" >&2
        tail -n 25 "$f" >&2
    done
    exit 1
}

now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }

# wait_until SECONDS WHAT CMD...: CMD may be a function. Where a caller must go on after a
# timeout (to say more, or to count a failed check), run it in a subshell: `(wait_until ...)`.
wait_until() {
    local limit=$1 what=$2 deadline
    shift 2
    deadline=$(( $(now_ms) + limit * 1000 ))
    until "$@" >/dev/null 2>&1; do
        (( $(now_ms) < deadline )) || die "timed out after ${limit}s waiting for: $what"
        sleep 0.1
    done
}

# ------------------------------------------------------------------ ports ---

PORT_MIN=20000   # ports are picked in [PORT_MIN, the kernel's ephemeral range)

# port_in_use PORT: used when picking new ports: stay clear of everything.
port_in_use() {
    local hex
    hex=$(printf ':%04X ' "$1")
    grep -qF -- "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# port_listening PORT: used before restarting a server on its old port: leftover TIME_WAIT
# connections of the previous run do not count, since the stack's servers bind with
# SO_REUSEADDR.
port_listening() {
    awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# alloc_ports N: print N distinct free ports, below the kernel's ephemeral range (so outgoing
# connections never steal them between a stop and a start). A machine-wide reservation file
# (under flock) keeps parallel callers (stacks in other DIRs, other scripts) from picking the
# same port before their servers have bound it; reservations expire after 10 minutes.
alloc_ports() {
    local n=$1 hi reserve now
    hi=$(awk '{print $1 - 1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32767)
    (( hi > PORT_MIN + 1000 )) || hi=$(( PORT_MIN + 10000 ))
    reserve=${TMPDIR:-/tmp}/collector-stack-ports.reserved
    now=$(date +%s)
    (
        flock -w 30 8 || die "cannot lock $reserve"
        declare -A taken=()
        local p ts out=() tries=0
        if [[ -f $reserve ]]; then
            while read -r p ts; do
                [[ $p =~ ^[0-9]+$ && $ts =~ ^[0-9]+$ ]] || continue
                (( now - ts < 600 )) && taken[$p]=$ts
            done <"$reserve"
        fi
        while (( ${#out[@]} < n )); do
            (( ++tries < 10000 )) || die "no free port found in $PORT_MIN..$hi"
            p=$(( PORT_MIN + (RANDOM * 32768 + RANDOM) % (hi - PORT_MIN + 1) ))
            [[ -z ${taken[$p]:-} ]] || continue
            port_in_use "$p" && continue
            taken[$p]=$now
            out+=("$p")
        done
        for p in "${!taken[@]}"; do echo "$p ${taken[$p]}"; done >"$reserve.tmp"
        mv -f "$reserve.tmp" "$reserve"
        echo "${out[*]}"
    ) 8>>"$reserve.lock"
}

# --------------------------------------------------------------- a site ---

# bootstrap_site LOG [--if-missing] KEY... [OPTION...]: `collector migrate`, then
# `collector sites add --key KEY OPTION...` for each KEY (the OPTIONs, e.g. --origin URL, are
# the arguments from the first one starting with '-'). `sites add` replaces a site that
# exists; with --if-missing, a KEY that `collector sites list` shows already is left alone.
# The collector is run as the array COLLECTOR holds (e.g. COLLECTOR=("$bin"), or with `env`
# and its settings in front); their output is appended to LOG, and shown if one fails.
bootstrap_site() {
    local logfile=$1 if_missing=0 keys=() registered=() key list=""
    shift
    [[ ${1:-} == --if-missing ]] && { if_missing=1; shift; }
    while [[ $# -gt 0 && $1 != -* ]]; do keys+=("$1"); shift; done
    (( ${#keys[@]} )) || die "bootstrap_site: no site key given"
    [[ -n ${COLLECTOR+set} ]] || die "bootstrap_site: COLLECTOR (the collector command) is not set"
    "${COLLECTOR[@]}" migrate >>"$logfile" 2>&1 || die_with_log "collector migrate failed" "$logfile"
    if (( if_missing )); then
        list=$("${COLLECTOR[@]}" sites list 2>>"$logfile") || list=""
    fi
    for key in "${keys[@]}"; do
        if (( if_missing )) && awk -v k="$key" '$1 == k { f = 1 } END { exit !f }' <<<"$list"; then
            continue
        fi
        "${COLLECTOR[@]}" sites add --key "$key" "$@" >>"$logfile" 2>&1 ||
            die_with_log "collector sites add --key $key failed" "$logfile"
        registered+=("$key")
    done
    if (( ${#registered[@]} )); then log "registered the site(s) ${registered[*]}${*:+ ($*)}"; fi
}

#!/usr/bin/env bash
# scripts/local-base-images.sh - makes, in podman's local image store, the images the
# Dockerfile and the engine checks need, on a machine that reaches Debian's package mirror
# and crates.io but no image registry:
#
#   docker.io/library/debian:bookworm-slim   the Dockerfile's runtime stage: a Debian 12
#                                            minbase root filesystem made by debootstrap,
#                                            slimmed as the official image is (no docs, man
#                                            pages or locales), imported with `podman import`
#   docker.io/library/rust:1-bookworm        the builder stage: that root filesystem plus
#                                            what the official image adds that the build
#                                            uses (build-essential, git, ca-certificates,
#                                            pkg-config) and THIS machine's Rust toolchain
#                                            (rustup layout: RUSTUP_HOME=/usr/local/rustup,
#                                            CARGO_HOME=/usr/local/cargo, cargo on PATH)
#   localhost/postgres-standin:15            a stand-in for the official postgres:15, for
#                                            the part of compose.yaml that runs here:
#                                            Debian's postgresql-15 with an entrypoint that
#                                            does what the official image's does
#                                            (scripts/standin/postgres/docker-entrypoint.sh)
#
# Every image carries the label collector.local-base=KEY, KEY being a hash of its recipe
# (the shell function that makes it and its inputs). An image whose KEY matches is kept
# (a second run takes a second); one with another KEY is made again; an image of the same
# name WITHOUT the label came from a registry and is never touched. The debootstrap root
# filesystem is also kept as a tarball under $CACHE, so that a lost image store costs an
# import, not a bootstrap.
#
#   scripts/local-base-images.sh             make what is missing or out of date
#   scripts/local-base-images.sh --refresh   make all three again (a newer Debian point
#                                            release, security updates)
#
# Needs root, podman (with runc), debootstrap, rustup's toolchain on this machine and the
# Debian mirror of /etc/apt (scripts/check-containers.sh --engine installs the packages).
# The machine's extra CA certificates (/usr/local/share/ca-certificates: a TLS-inspecting
# proxy in front of crates.io) and proxy variables (http_proxy & co, if set) are copied into
# the builder image so that `cargo build` inside it reaches crates.io as the host does.
# Environment: COLLECTOR_IMAGE_CACHE (default /var/cache/collector-images).
set -euo pipefail
SCRIPT_NAME=base-images
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # log, die
cd "$(dirname "$0")/.."
ROOT=$PWD

CACHE=${COLLECTOR_IMAGE_CACHE:-/var/cache/collector-images}
SUITE=bookworm
DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
RUST_IMAGE=docker.io/library/rust:1-bookworm
POSTGRES_IMAGE=localhost/postgres-standin:15
LABEL=collector.local-base
# runc and cgroupfs: this VM has no systemd, and the default runtime settings fail here.
# The VM also refuses podman's default ulimits inside containers (above the host's hard limit).
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
RUN_LIMITS=(--ulimit nofile=20000:20000 --ulimit nproc=4096:4096)

# The Debian mirror apt uses here (deb822 or one-line sources), so that debootstrap goes
# where apt-get already goes.
mirror() {
    local m
    m=$(grep -hoE '^URIs:[[:space:]]*\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '{print $2}' | grep -v -- '-security' | head -n1 || true)
    [[ -n $m ]] || m=$(grep -hoE '^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?\S+' /etc/apt/sources.list 2>/dev/null |
        awk '{print $NF}' | grep -v -- '-security' | head -n1 || true)
    echo "${m:-http://deb.debian.org/debian}"
}

# key NAME INPUTS...: a short hash of the function NAME's text and of INPUTS.
key() {
    { declare -f "$1"; printf '%s\n' "${@:2}"; } | sha256sum | cut -c1-16
}

# state IMAGE KEY: prints "ours" (label matches), "stale" (ours, another key), "foreign"
# (exists, no label: from a registry) or "missing".
state() {
    local got
    if ! "${PODMAN[@]}" image exists "$1"; then echo missing; return; fi
    got=$("${PODMAN[@]}" image inspect --format "{{index .Labels \"$LABEL\"}}" "$1" 2>/dev/null || true)
    if [[ -z $got || $got == "<no value>" ]]; then echo foreign
    elif [[ $got == "$2" ]]; then echo ours
    else echo stale
    fi
}

# ------------------------------------------------------------ debian:bookworm-slim ---

# debootstrap_rootfs TAR: a minbase bookworm root filesystem, slimmed as the official
# -slim image (debuerreotype's slimify: dpkg never installs docs, man pages, locales), as TAR.
debootstrap_rootfs() {
    local tar=$1 dir
    dir=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    log "debootstrap --variant=minbase $SUITE from $(mirror) (about 2 minutes)"
    nice -n 10 debootstrap --variant=minbase --arch=amd64 \
        --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        "$SUITE" "$dir" "$(mirror)" >"$CACHE/debootstrap.log" 2>&1 ||
        { tail -n 20 "$CACHE/debootstrap.log" >&2; rm -rf "$dir"; die "debootstrap failed"; }
    mkdir -p "$dir/etc/dpkg/dpkg.cfg.d" "$dir/etc/apt/apt.conf.d"
    cat >"$dir/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# As in the official -slim images: no documentation, man pages or translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
    printf 'APT::Install-Recommends "false";\nAcquire::Languages "none";\n' >"$dir/etc/apt/apt.conf.d/docker-slim"
    find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
    find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
    rm -rf "$dir"/usr/share/{man,groff,info,lintian,linda,locale}/* "$dir"/var/cache/apt/archives/*.deb \
        "$dir"/var/lib/apt/lists/* "$dir"/var/log/* "$dir"/tmp/* "$dir"/root/.bash_history
    # The same sources as the official image (deb822), so that apt-get in a derived image
    # also gets the security updates.
    rm -f "$dir/etc/apt/sources.list"
    cat >"$dir/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $(mirror)
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $(mirror)-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    : >"$dir/etc/hostname"
    rm -f "$dir/etc/resolv.conf"   # the engine mounts its own
    tar --numeric-owner --xattrs -C "$dir" -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
    rm -rf "$dir"
}

make_debian() {
    local key=$1 tar
    tar=$CACHE/$SUITE-minbase-slim-$(key debootstrap_rootfs "$SUITE").tar
    [[ -s $tar ]] || debootstrap_rootfs "$tar"
    log "podman import $tar as $DEBIAN_IMAGE"
    "${PODMAN[@]}" import --quiet \
        --change 'CMD ["bash"]' \
        --change "LABEL $LABEL=$key" \
        --change 'LABEL org.opencontainers.image.description="Local stand-in for debian:bookworm-slim, made by scripts/local-base-images.sh (debootstrap minbase)"' \
        --message "scripts/local-base-images.sh" \
        "$tar" "$DEBIAN_IMAGE" >/dev/null
    # Tarballs of older recipes.
    find "$CACHE" -maxdepth 1 -name "$SUITE-minbase-slim-*.tar" ! -name "$(basename "$tar")" -delete
}

# ------------------------------------------------------------------ rust:1-bookworm ---

# The host's toolchain: the sysroot of the rustc on PATH (a rustup toolchain folder).
rust_version() { rustc --version | awk '{print $2}'; }
rust_host() { rustc -vV | sed -n 's/^host: //p'; }
ca_digest() { cat /usr/local/share/ca-certificates/*.crt 2>/dev/null | sha256sum | cut -c1-16; }
proxy_env() { env | grep -iE '^(https?|no|all)_proxy=' | sort || true; }

make_rust() {
    local key=$1 sysroot rustup_bin version toolchain ctr
    sysroot=$(rustc --print sysroot)
    rustup_bin=$(command -v rustup) || die "rustup is not on PATH (the builder image copies this machine's rustup toolchain)"
    version=$(rust_version)
    toolchain=$version-$(rust_host)
    ctr=collector-base-rust-$$
    log "making $RUST_IMAGE: build-essential, git and Rust $version from $sysroot"
    local envs=() line
    while IFS= read -r line; do [[ -n $line ]] && envs+=(-e "$line"); done < <(proxy_env)
    "${PODMAN[@]}" rm -f "$ctr" >/dev/null 2>&1 || true
    # The package step reaches the mirror: host network, as the engine checks use.
    # shellcheck disable=SC2016 # expanded by the container's shell
    nice -n 10 "${PODMAN[@]}" run --name "$ctr" --network host "${RUN_LIMITS[@]}" "${envs[@]}" \
        -e TOOLCHAIN="$toolchain" \
        -v "$sysroot:/mnt/toolchain:ro" -v "$rustup_bin:/mnt/rustup:ro" \
        -v /usr/local/share/ca-certificates:/mnt/ca:ro \
        "$DEBIAN_IMAGE" bash -euo pipefail -c '
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends build-essential git ca-certificates pkg-config curl >/dev/null
            cp /mnt/ca/*.crt /usr/local/share/ca-certificates/ 2>/dev/null || true
            update-ca-certificates >/dev/null
            rm -rf /var/lib/apt/lists/*
            mkdir -p /usr/local/cargo/bin "/usr/local/rustup/toolchains/$TOOLCHAIN"
            # The toolchain without its HTML documentation (800 MB).
            tar -C /mnt/toolchain --exclude=./share/doc -cf - . | tar -C "/usr/local/rustup/toolchains/$TOOLCHAIN" -xf -
            install -m 0755 /mnt/rustup /usr/local/cargo/bin/rustup
            for p in cargo rustc rustdoc cargo-clippy clippy-driver cargo-fmt rustfmt rust-gdb rust-lldb; do
                ln -s rustup "/usr/local/cargo/bin/$p"
            done
            printf "version = \"12\"\ndefault_toolchain = \"%s\"\nprofile = \"minimal\"\nauto_self_update = \"disable\"\n" \
                "$TOOLCHAIN" >/usr/local/rustup/settings.toml
            chmod -R a+w /usr/local/rustup /usr/local/cargo
        ' >"$CACHE/rust-image.log" 2>&1 ||
        { tail -n 20 "$CACHE/rust-image.log" >&2; "${PODMAN[@]}" rm -f "$ctr" >/dev/null; die "making $RUST_IMAGE failed"; }
    local changes=(
        --change "ENV RUSTUP_HOME=/usr/local/rustup"
        --change "ENV CARGO_HOME=/usr/local/cargo"
        --change "ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        --change "ENV RUST_VERSION=$version"
        --change 'CMD ["bash"]'
        --change "LABEL $LABEL=$key"
        --change "LABEL org.opencontainers.image.description=\"Local stand-in for rust:1-bookworm (Rust $version), made by scripts/local-base-images.sh\""
    )
    for line in $(proxy_env); do changes+=(--change "ENV $line"); done
    "${PODMAN[@]}" commit --quiet --format docker "${changes[@]}" "$ctr" "$RUST_IMAGE" >/dev/null
    "${PODMAN[@]}" rm -f "$ctr" >/dev/null
}

# ---------------------------------------------------------- postgres-standin:15 ---

make_postgres() {
    local key=$1 ctr=collector-base-postgres-$$
    log "making $POSTGRES_IMAGE: Debian's postgresql-15 and scripts/standin/postgres/docker-entrypoint.sh"
    "${PODMAN[@]}" rm -f "$ctr" >/dev/null 2>&1 || true
    # Users and paths as in the official image: uid/gid 999 "postgres", PGDATA
    # /var/lib/postgresql/data, the server's binaries on PATH, sockets in /var/run/postgresql.
    nice -n 10 "${PODMAN[@]}" run --name "$ctr" --network host "${RUN_LIMITS[@]}" \
        -v "$ROOT/scripts/standin/postgres/docker-entrypoint.sh:/mnt/docker-entrypoint.sh:ro" \
        "$DEBIAN_IMAGE" bash -euo pipefail -c '
            export DEBIAN_FRONTEND=noninteractive
            groupadd -r -g 999 postgres
            useradd -r -g postgres -u 999 -d /var/lib/postgresql -s /bin/bash postgres
            mkdir -p /var/lib/postgresql && chown postgres: /var/lib/postgresql
            # No cluster from the package: the entrypoint makes one in PGDATA.
            mkdir -p /etc/postgresql-common
            echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null
            rm -rf /var/lib/apt/lists/*
            install -d -o postgres -g postgres -m 3777 /var/run/postgresql
            install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data
            install -d /docker-entrypoint-initdb.d
            install -m 0755 /mnt/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
        ' >"$CACHE/postgres-image.log" 2>&1 ||
        { tail -n 20 "$CACHE/postgres-image.log" >&2; "${PODMAN[@]}" rm -f "$ctr" >/dev/null; die "making $POSTGRES_IMAGE failed"; }
    "${PODMAN[@]}" commit --quiet --format docker \
        --change "ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV PGDATA=/var/lib/postgresql/data" \
        --change 'ENTRYPOINT ["docker-entrypoint.sh"]' \
        --change 'CMD ["postgres"]' \
        --change "STOPSIGNAL SIGINT" \
        --change "EXPOSE 5432" \
        --change 'VOLUME ["/var/lib/postgresql/data"]' \
        --change "LABEL $LABEL=$key" \
        --change 'LABEL org.opencontainers.image.description="Stand-in for postgres:15 (Debian postgresql-15), made by scripts/local-base-images.sh"' \
        "$ctr" "$POSTGRES_IMAGE" >/dev/null
    "${PODMAN[@]}" rm -f "$ctr" >/dev/null
}

# ------------------------------------------------------------------------- main ---

# ensure IMAGE KEY MAKER: makes IMAGE with MAKER KEY unless it is ours and current, or foreign.
ensure() {
    local image=$1 key=$2 maker=$3 st t0=$SECONDS old
    st=$(state "$image" "$key")
    [[ $REFRESH -eq 1 && $st == ours ]] && st=stale
    case $st in
        ours)    log "$image: cached (recipe $key)"; return 0 ;;
        foreign) log "$image: present and not made here (a registry's image): kept"; return 0 ;;
    esac
    old=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    "$maker" "$key"
    # The replaced image, unless something still uses it (a container, a derived image).
    if [[ -n $old ]]; then "${PODMAN[@]}" rmi "$old" >/dev/null 2>&1 || true; fi
    log "$image: made in $((SECONDS - t0)) s ($("${PODMAN[@]}" image inspect --format '{{.Size}}' "$image" |
        awk '{printf "%.0f MB", $1 / 1e6}'))"
}

main() {
    REFRESH=0
    case ${1:-} in
        --refresh) REFRESH=1 ;;
        "") ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    esac
    [[ $EUID -eq 0 ]] || die "run as root (podman stores the images system-wide; debootstrap)"
    local t
    for t in podman runc debootstrap rustc; do command -v "$t" >/dev/null || die "$t is missing"; done
    mkdir -p "$CACHE"
    # One run at a time (engineers and CI may share this machine and its image store).
    exec 8>"$CACHE/.lock"
    flock -w 1800 8 || die "timed out waiting for $CACHE/.lock"
    if [[ $REFRESH -eq 1 ]]; then rm -f "$CACHE"/$SUITE-minbase-slim-*.tar; fi

    local debian_key rust_key pg_key
    debian_key=$(key make_debian "$(key debootstrap_rootfs "$SUITE")")
    rust_key=$(key make_rust "$debian_key" "$(rust_version)" "$(rust_host)" "$(ca_digest)" "$(proxy_env)")
    pg_key=$(key make_postgres "$debian_key" "$(sha256sum <scripts/standin/postgres/docker-entrypoint.sh)")
    # A refreshed base makes the others stale too (their keys include its key; --refresh
    # marks them stale anyway).
    ensure "$DEBIAN_IMAGE" "$debian_key" make_debian
    ensure "$RUST_IMAGE" "$rust_key" make_rust
    ensure "$POSTGRES_IMAGE" "$pg_key" make_postgres
}

main "$@"

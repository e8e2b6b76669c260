# The collector's container image.
#
#   docker build -t collector .        (or: podman build -t collector .)
#
# Two stages: a Rust builder and a small Debian runtime holding only the binary and its licence
# notices. The schema (schema/*.sql) and the tracking script (collector/assets/) are compiled
# into the binary with include_str!, so the runtime image needs no other file from the
# repository.

# ---------------------------------------------------------------- builder ---
FROM rust:1-bookworm AS builder
WORKDIR /src

# Dependencies first, in their own layer: it is rebuilt only when a manifest or Cargo.lock
# changes, not on every source edit. The workspace has six members (the collector, the field
# table's derive, the test stack, the fake ClickHouse of the tests, the tests, the benchmarks),
# so every manifest is needed; each gets a stand-in target so that Cargo can load the
# workspace, but the derive, a dependency of the collector, comes whole. The stand-in
# collector's own build outputs are deleted afterwards so that the real sources are always
# compiled (Cargo compares modification times, and COPY keeps those of the build context).
COPY Cargo.toml Cargo.lock ./
COPY collector/Cargo.toml collector/Cargo.toml
COPY stack/Cargo.toml stack/Cargo.toml
COPY tests/Cargo.toml tests/Cargo.toml
COPY fake-clickhouse/Cargo.toml fake-clickhouse/Cargo.toml
COPY bench/Cargo.toml bench/Cargo.toml
COPY field-table field-table
RUN mkdir -p collector/src stack/src tests/src fake-clickhouse/src bench/src \
    && echo 'fn main() {}' > collector/src/main.rs \
    && echo 'fn main() {}' > stack/src/main.rs \
    && echo 'fn main() {}' > bench/src/main.rs \
    && touch collector/src/lib.rs stack/src/lib.rs tests/src/lib.rs \
        fake-clickhouse/src/lib.rs bench/src/lib.rs \
    && cargo build --release -p collector --locked \
    && rm -rf collector/src \
        target/release/collector target/release/collector.d \
        target/release/deps/collector-* target/release/deps/libcollector-* \
        target/release/.fingerprint/collector-*

# Then the sources: schema/ is read by include_str! in collector/src/cli/migrate.rs and collector/src/clickhouse/schema.rs.
COPY schema schema
COPY collector collector
# The `revision` label of collector_build_info (collector/build.rs); the build context has no
# .git: `docker build --build-arg COLLECTOR_REVISION=$(git rev-parse HEAD) .`
ARG COLLECTOR_REVISION=unknown
# The binary keeps its line tables (`debug = "line-tables-only"`: readable backtraces, file and
# line, with RUST_BACKTRACE=1), compressed: of its 66 MB, 51 MB are DWARF, which zlib takes to
# 12 MB; Rust's backtrace reads compressed sections as they are (docs/deployment.md, "Image size").
RUN cargo build --release -p collector --locked \
    && install -D -m 0755 target/release/collector /out/collector \
    && objcopy --compress-debug-sections=zlib /out/collector

# ---------------------------------------------------------------- runtime ---
# The same Debian release as the builder, so the binary's glibc matches. It links nothing
# else (no TLS: PostgreSQL and ClickHouse are reached in plain text on the private network).
# bookworm-slim rather than distroless: the compose file's one-shot `seed` service uses /bin/sh.
FROM debian:bookworm-slim

LABEL org.opencontainers.image.title="collector" \
      org.opencontainers.image.description="Web-performance beacon collector" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed uid/gid, so that a spool volume (or a bind mount chowned to 10001) keeps working
# across image rebuilds. The spool folder is created owned by that user before VOLUME: a new
# named volume is initialised from it and so is writable by the collector.
RUN groupadd --system --gid 10001 collector \
    && useradd --system --uid 10001 --gid collector --no-create-home \
        --home-dir /var/lib/collector --shell /usr/sbin/nologin collector \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/collector /var/lib/collector/spool

COPY --from=builder /out/collector /usr/local/bin/collector
# The licences: the project's, and those of every crate linked into the binary and of the data
# compiled in (collector/THIRD-PARTY-LICENSES, generated from Cargo.lock by
# scripts/third-party-licenses.py; scripts/check-containers.sh checks that it is current).
COPY LICENSE collector/THIRD-PARTY-LICENSES /usr/share/doc/collector/

# The public listener (beacons, the script, site settings) and the operations listener
# (/metrics, /readyz with its reason). The latter stays private (contract v4 §4): the image binds
# it to the container's loopback and does not EXPOSE it; a deployment whose Prometheus scrapes
# over the container network sets COLLECTOR_ADMIN_LISTEN=0.0.0.0:9464 itself (compose.yaml does,
# never publishing it), and no edge forwards it.
ENV COLLECTOR_LISTEN=0.0.0.0:8080 \
    COLLECTOR_ADMIN_LISTEN=127.0.0.1:9464 \
    COLLECTOR_SPOOL_DIR=/var/lib/collector/spool

# The durable spool: measurements answered 202 but not yet confirmed by ClickHouse. It must
# outlive the container; one volume per collector (the spool is locked by its collector).
VOLUME ["/var/lib/collector/spool"]

USER 10001:10001
WORKDIR /var/lib/collector
EXPOSE 8080

# SIGTERM starts the drain: /readyz answers 503 for COLLECTOR_DRAIN_GRACE (5 s), the listener
# closes, in-flight requests finish (at most 10 s), the writer flushes (at most 10 s) and leaves
# the rest in the spool. Give the container a stop timeout above grace + 20 s (compose: 40s).
STOPSIGNAL SIGTERM

# `collector probe`: GET /readyz on COLLECTOR_LISTEN (loopback when it is 0.0.0.0), 200 within
# 2 s or exit 1. No curl/wget in the image. /readyz is 503 until the site settings are loaded,
# hence the start period.
HEALTHCHECK --interval=5s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/collector", "probe"]

ENTRYPOINT ["/usr/local/bin/collector"]
CMD ["serve"]

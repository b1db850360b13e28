#!/usr/bin/env bash
# Builds toolgrid's built-in tools in builtins/tools/ to WebAssembly.
#
#   builtins/build.sh              build in place (builtins/tools/<name>/<name>.wasm) and
#                                  re-pin the sha256 digests in builtins/manifests/ (and
#                                  that of python's driver in builtins/python/)
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
TOOLS_P1=(files js code)   # shipped as WASI preview 1 modules
TOOLS_P2=(web-fetch)   # shipped as WASI preview 2 components (wasi:cli/run, imports wasi:http)
# shellcheck source=../scripts/wasm-build.sh
. "$TOOLS_DIR/../scripts/wasm-build.sh"

# js is QuickJS-NG: its C sources come from the rquickjs-sys crate on crates.io, pinned by
# digest and unpacked once into a cache directory (QUICKJS_SRC=DIR to use another copy).
QUICKJS_CRATE=rquickjs-sys-0.14.0
QUICKJS_CRATE_SHA256=cee271d0eeba64f0915b846cb7ae02e16faf3dfdffdca91731101d9d30fe3423
quickjs_sources() {
    if [ -n "${QUICKJS_SRC:-}" ]; then return 0; fi
    local cache=${XDG_CACHE_HOME:-$HOME/.cache}/toolgrid/$QUICKJS_CRATE
    if [ ! -f "$cache/quickjs/quickjs.c" ]; then
        note "fetching $QUICKJS_CRATE from crates.io"
        mkdir -p "$cache"
        python3 - "$cache" "$QUICKJS_CRATE" "$QUICKJS_CRATE_SHA256" <<'PY' || die "cannot fetch $QUICKJS_CRATE"
import hashlib, io, sys, tarfile, urllib.request
dest, crate, want = sys.argv[1:]
name, version = crate.rsplit("-", 1)
data = urllib.request.urlopen(f"https://static.crates.io/crates/{name}/{crate}.crate", timeout=120).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"{crate}.crate has sha256 {got}, not {want}")
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    for member in tar.getmembers():
        if member.isfile() and member.name.startswith(f"{crate}/quickjs/") and "/" not in member.name[len(crate) + 9:]:
            member.name = member.name[len(crate) + 1:]
            tar.extract(member, dest)
PY
    fi
    QUICKJS_SRC=$cache/quickjs
}

# The shared compile, and js's own: js.c with QuickJS-NG's engine (no quickjs-libc), a
# 1 MiB stack.
eval "shared_compile() $(declare -f compile | tail -n +2)"
compile() {
    # code is js.c with the agent's tools (tools/code/code.c includes it)
    case $1 in js|code) ;; *) shared_compile "$@"; return ;; esac
    quickjs_sources
    note "compiling $1 (QuickJS-NG from $QUICKJS_CRATE)"
    local q=$QUICKJS_SRC
    "${ZIG_CMD[@]}" cc --target=wasm32-wasi -std=gnu11 -O2 -s -Wl,-z,stack-size=1048576 -w \
        -D_GNU_SOURCE -DQUICKJS_NG_BUILD -D_WASI_EMULATED_PROCESS_CLOCKS -D_WASI_EMULATED_SIGNAL \
        -funsigned-char -I "$q" "$q/quickjs.c" "$q/libregexp.c" "$q/libunicode.c" "$q/dtoa.c" \
        "$TOOLS_DIR/tools/$1/$1.c" -lwasi-emulated-process-clocks -lwasi-emulated-signal -o "$2"
}

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

# python's driver (tools/python/run.py) is not built: it is a release file of
# python/python.yaml, mounted at /run and pinned by the digest right below that path.
pin_driver() {
    local m=$TOOLS_DIR/python/python.yaml want
    want=$(sha256 "$TOOLS_DIR/tools/python/run.py")
    if grep -A3 -- "- path: /run\$" "$m" | grep -q "digest: sha256:$want\$"; then
        note "ok: ${m#"$REPO"/} digest of run.py"
    elif [ "$CHECK" = 1 ]; then
        note "STALE DIGEST: ${m#"$REPO"/} run.py (re-pin with builtins/build.sh)"; return 1
    else
        python3 - "$m" "$want" <<'PY'
import re, sys
path, want = sys.argv[1:]
text = open(path).read()
text = re.sub(r"(- path: /run\n(?:.*\n){0,2}?\s*digest: sha256:)[0-9a-f]{64}", lambda m: m.group(1) + want, text, count=1)
open(path, "w").write(text)
PY
        note "pinned: ${m#"$REPO"/} run.py"
    fi
}

if [ "$CHECK" = 1 ]; then
    check_built
    status=$CHECK_STATUS
    pin || status=1
    pin_driver || status=1
    exit "$status"
fi
install_built
[ -n "$OUT" ] || { pin; pin_driver; }

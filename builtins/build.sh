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

# Rewrites, in manifest $1, the digest right below the line $2 (a path or a file) to $3.
repin() {
    python3 - "$@" <<'PY'
import re, sys
path, line, want = sys.argv[1:]
text = open(path).read()
pattern = r"(" + re.escape(line) + r"\n(?:.*\n){0,2}?\s*digest: sha256:)[0-9a-f]{64}"
text, n = re.subn(pattern, lambda m: m.group(1) + want, text, count=1)
if n != 1:
    sys.exit(f"{path}: no digest below {line!r}")
open(path, "w").write(text)
PY
}

# Whether manifest $1 pins digest $3 right below the line $2.
pinned() {
    grep -A3 -- "$2\$" "$1" | grep -q "digest: sha256:$3\$"
}

# Checks (or, without --check, rewrites) the digest each manifest pins for each tool: the
# one right below `file: ../tools/<tool>/<tool>.wasm`.
pin() {
    local status=0 t m want line
    for t in "${ALL_TOOLS[@]}"; do
        [ -f "$TOOLS_DIR/manifests/$t.yaml" ] || die "missing builtins/manifests/$t.yaml"
        want=$(sha256 "$STAGE/tools/$t/$t.wasm")
        line="file: ../tools/$t/$t.wasm"
        # python/code.yaml is the code built-in with Python: it pins code.wasm too
        for m in "$TOOLS_DIR/manifests/$t.yaml" "$TOOLS_DIR/python/$t.yaml"; do
            [ -f "$m" ] || continue
            if pinned "$m" "$line" "$want"; then
                note "ok: ${m#"$REPO"/} digest"
            elif [ "$CHECK" = 1 ]; then
                note "STALE DIGEST: ${m#"$REPO"/} (rebuild with builtins/build.sh)"; status=1
            else
                repin "$m" "$line" "$want"
                note "pinned: ${m#"$REPO"/}"
            fi
        done
    done
    return $status
}

# python's driver (tools/python/run.py) is not built: it is a release file, mounted at
# /run by python/python.yaml and at /python by the code tool's python command
# (python/code.yaml), pinned by the digest right below each path.
pin_driver() {
    local status=0 want m path
    want=$(sha256 "$TOOLS_DIR/tools/python/run.py")
    for m_path in "python/python.yaml:/run" "python/code.yaml:/python"; do
        m=$TOOLS_DIR/${m_path%%:*} path=${m_path#*:}
        if pinned "$m" "- path: $path" "$want"; then
            note "ok: ${m#"$REPO"/} digest of run.py at $path"
        elif [ "$CHECK" = 1 ]; then
            note "STALE DIGEST: ${m#"$REPO"/} run.py at $path (re-pin with builtins/build.sh)"; status=1
        else
            repin "$m" "- path: $path" "$want"
            note "pinned: ${m#"$REPO"/} run.py at $path"
        fi
    done
    return $status
}

# python/code.yaml is manifests/code.yaml with a python command: the same Tool but for that
# command (and the description that names both languages), the same release but for its
# `commands`.
same_code() {
    python3 - "$TOOLS_DIR/manifests/code.yaml" "$TOOLS_DIR/python/code.yaml" <<'PY' || return 1
import sys, yaml
def docs(path):
    return {d["kind"]: d for d in yaml.safe_load_all(open(path)) if d}
js, py = docs(sys.argv[1]), docs(sys.argv[2])
tool_js, tool_py = js["Tool"]["spec"], dict(py["Tool"]["spec"])
tool_py["commands"] = [c for c in tool_py["commands"] if c["name"] != "python"]
tool_py["description"] = tool_js["description"]
release_py = dict(py["ToolRelease"]["spec"])
release_py.pop("commands", None)
wrong = [what for what, a, b in [
    ("Tool", tool_js, tool_py),
    ("ToolRelease", js["ToolRelease"]["spec"], release_py),
    ("names", [js[k]["metadata"] for k in js], [py[k]["metadata"] for k in py]),
] if a != b]
if wrong:
    sys.exit(f"builtins/python/code.yaml differs from builtins/manifests/code.yaml in: {', '.join(wrong)}")
PY
    note "ok: builtins/python/code.yaml is builtins/manifests/code.yaml with python"
}

if [ "$CHECK" = 1 ]; then
    check_built
    status=$CHECK_STATUS
    pin || status=1
    pin_driver || status=1
    same_code || status=1
    exit "$status"
fi
install_built
[ -n "$OUT" ] || { pin; pin_driver; }

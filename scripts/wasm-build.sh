# The build of C tools to WebAssembly shared by examples/build.sh and
# tests/fixtures/build.sh; sourced, not run. The sourcing script sets:
#
#   TOOLS_DIR      the directory holding tools/<name>/<name>.c
#   TOOLS_P1       tools shipped as WASI preview 1 modules
#   TOOLS_P2       tools shipped as WASI preview 2 components (wasi:cli/run),
#                  made with `toolgrid componentize`
#   EXTRA_CFLAGS   (optional) more compiler flags, e.g. include directories
#
# and then calls, in order: parse_args "$@"; regenerate_bindings (only acts, and
# exits, with --regenerate-bindings); find_prerequisites; build_tools;
# check_built (exits with --check); install_built. After install_built, DEST
# is where the .wasm files went.
#
# A tool with tools/<name>/wit/world.wit is built from <name>.c plus the
# wit-bindgen C bindings committed in tools/<name>/bindings/: <world>.c and
# <world>_component_type.o, which embeds the component type of the world (a
# custom section, kept by -s) that `toolgrid componentize` uses for the imports.
#
# The build is deterministic: the same sources, zig version and toolgrid
# version give byte-identical .wasm files (no debug info, no paths, no
# timestamps are embedded; `-s` strips every custom section).

ZIG_VERSION=0.17.1
WIT_BINDGEN_VERSION=0.46.0
# --features for wit-bindgen: wit-parser 0.239 (in wit-bindgen 0.46) cannot
# resolve the @unstable wasi:clocks/timezone import in the wasi:cli@0.2.12 WIT
# without it; it does not change the bindings (no world here imports it).
WIT_FEATURES=clocks-timezone
# -s strips all custom sections (names, producers, debug info). zig's default
# wasm stack is 16 MiB and is part of the initial memory of every instance;
# these tools need far less, so use 256 KiB (the stack sits below the data,
# so an overflow traps instead of corrupting memory).
CFLAGS=(--target=wasm32-wasi -std=c11 -O2 -s -Wl,-z,stack-size=262144 -Wall -Wextra)

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
# How messages name the running script, e.g. examples/build.sh.
SCRIPT=$(cd -- "$(dirname -- "$0")" && pwd -P)/$(basename -- "$0")
SCRIPT=${SCRIPT#"$REPO"/}

die() { echo "build.sh: error: $*" >&2; exit 1; }
note() { echo "build.sh: $*" >&2; }

# Prints the running script's header comment.
usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

# Sets OUT, CHECK and REGEN from the command line.
parse_args() {
    OUT=""
    CHECK=0
    REGEN=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT=$2; shift 2 ;;
            --out=*) OUT=${1#--out=}; shift ;;
            --check) CHECK=1; shift ;;
            --regenerate-bindings) REGEN=1; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
    done
    [ "$CHECK" = 1 ] && [ -n "$OUT" ] && die "--check and --out cannot be combined"
    [ "$REGEN" = 1 ] && { [ "$CHECK" = 1 ] || [ -n "$OUT" ]; } &&
        die "--regenerate-bindings cannot be combined with --check or --out"
    return 0
}

# The WIT world of a tool with generated bindings: the `world NAME {` in
# tools/<name>/wit/world.wit ("" if the tool has none).
bindings_world() {
    local wit=$TOOLS_DIR/tools/$1/wit/world.wit
    [ -f "$wit" ] || return 0
    sed -n -E 's/^[[:space:]]*world[[:space:]]+([a-z0-9-]+)[[:space:]]*\{.*/\1/p' "$wit" | head -n 1
}

# With --regenerate-bindings: regenerates tools/<name>/bindings/ of every tool
# with a WIT world, then exits.
regenerate_bindings() {
    [ "$REGEN" = 1 ] || return 0
    WIT_BINDGEN=${WIT_BINDGEN:-wit-bindgen}
    command -v "$WIT_BINDGEN" >/dev/null 2>&1 || die "wit-bindgen not found. Install it with:
       cargo install wit-bindgen-cli --version $WIT_BINDGEN_VERSION --locked --no-default-features --features c
       (or point WIT_BINDGEN at a wit-bindgen $WIT_BINDGEN_VERSION binary)"
    local wb_version t world tmp
    wb_version=$("$WIT_BINDGEN" --version 2>/dev/null | awk '{print $2}')
    if [ "$wb_version" != "$WIT_BINDGEN_VERSION" ]; then
        [ "${ALLOW_ANY_WIT_BINDGEN:-0}" = 1 ] ||
            die "wit-bindgen $WIT_BINDGEN_VERSION is required, found '$wb_version' (or set ALLOW_ANY_WIT_BINDGEN=1)"
        note "warning: wit-bindgen $wb_version instead of $WIT_BINDGEN_VERSION"
    fi
    for t in "${TOOLS_P1[@]}" "${TOOLS_P2[@]}"; do
        world=$(bindings_world "$t")
        [ -n "$world" ] || continue
        note "generating bindings for $t (world $world)"
        tmp=$(mktemp -d "${TMPDIR:-/tmp}/toolgrid-bindings.XXXXXX")
        "$WIT_BINDGEN" c "$TOOLS_DIR/tools/$t/wit" --world "$world" --features "$WIT_FEATURES" \
            --out-dir "$tmp" >/dev/null || { rm -rf -- "$tmp"; die "wit-bindgen failed for $t"; }
        rm -rf -- "$TOOLS_DIR/tools/$t/bindings"
        mv -- "$tmp" "$TOOLS_DIR/tools/$t/bindings"
        chmod 755 "$TOOLS_DIR/tools/$t/bindings"
        ls -l "$TOOLS_DIR/tools/$t/bindings" >&2
    done
    exit 0
}

# Finds zig (ZIG_CMD), toolgrid (TOOLGRID) and a sha256 command (sha256 FILE).
find_prerequisites() {
    if [ -n "${ZIG:-}" ]; then
        ZIG_CMD=("$ZIG")
    elif command -v python3 >/dev/null 2>&1 && python3 -c 'import ziglang' >/dev/null 2>&1; then
        ZIG_CMD=(python3 -m ziglang)
    else
        die "zig not found. Install it with:  pip install ziglang==$ZIG_VERSION
       (or point ZIG at a zig $ZIG_VERSION binary)"
    fi
    local zig_version
    zig_version=$("${ZIG_CMD[@]}" version 2>/dev/null) || die "cannot run '${ZIG_CMD[*]} version'"
    if [ "$zig_version" != "$ZIG_VERSION" ]; then
        if [ "${ALLOW_ANY_ZIG:-0}" = 1 ]; then
            note "warning: zig $zig_version instead of $ZIG_VERSION; output will not match the committed files"
        else
            die "zig $ZIG_VERSION is required for reproducible output, found $zig_version.
       Install it with:  pip install ziglang==$ZIG_VERSION   (or set ALLOW_ANY_ZIG=1)"
        fi
    fi

    TOOLGRID=${TOOLGRID:-$REPO/target/debug/toolgrid}
    if [ ${#TOOLS_P2[@]} -gt 0 ] && [ ! -x "$TOOLGRID" ]; then
        die "toolgrid not found at $TOOLGRID (needed for 'toolgrid componentize').
       Build it with:  (cd $REPO && cargo build)   or set TOOLGRID=/path/to/toolgrid"
    fi

    if command -v sha256sum >/dev/null 2>&1; then
        sha256() { sha256sum "$1" | cut -d' ' -f1; }
    elif command -v shasum >/dev/null 2>&1; then
        sha256() { shasum -a 256 "$1" | cut -d' ' -f1; }
    else
        die "sha256sum or shasum is required"
    fi
}

# Compiles tool $1 to the preview 1 module $2.
compile() {
    local world sources=("$TOOLS_DIR/tools/$1/$1.c")
    local extra=(${EXTRA_CFLAGS[@]+"${EXTRA_CFLAGS[@]}"})
    world=$(bindings_world "$1")
    if [ -n "$world" ]; then
        local b=$TOOLS_DIR/tools/$1/bindings
        local w=${world//-/_}
        [ -f "$b/$w.c" ] && [ -f "$b/$w.h" ] && [ -f "$b/${w}_component_type.o" ] ||
            die "missing generated bindings in ${b#"$REPO"/} (run: $SCRIPT --regenerate-bindings)"
        sources+=("$b/$w.c" "$b/${w}_component_type.o")
        extra+=(-I "$b")
    fi
    note "compiling $1"
    "${ZIG_CMD[@]}" cc "${CFLAGS[@]}" "${extra[@]}" "${sources[@]}" -o "$2"
}

# Builds every tool into STAGE/tools/<name>/<name>.wasm (STAGE under WORK, a
# temporary directory removed on exit) and sets ALL_TOOLS.
build_tools() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgrid-build.XXXXXX")
    trap 'rm -rf -- "$WORK"' EXIT
    STAGE=$WORK/out            # same layout as TOOLS_DIR: tools/<name>/<name>.wasm
    local t
    for t in "${TOOLS_P1[@]}"; do
        mkdir -p "$STAGE/tools/$t"
        compile "$t" "$STAGE/tools/$t/$t.wasm"
    done
    for t in "${TOOLS_P2[@]}"; do
        mkdir -p "$STAGE/tools/$t" "$WORK/modules"
        compile "$t" "$WORK/modules/$t.wasm"
        note "componentizing $t"
        "$TOOLGRID" componentize "$WORK/modules/$t.wasm" "$STAGE/tools/$t/$t.wasm" \
            || die "'$TOOLGRID componentize' failed for $t"
        # a component starts with \0asm and version/layer 0d 00 01 00
        [ "$(od -An -tx1 -j4 -N4 "$STAGE/tools/$t/$t.wasm" 2>/dev/null | tr -d ' \n')" = 0d000100 ] \
            || die "'$TOOLGRID componentize' did not produce a component for $t"
    done
    ALL_TOOLS=("${TOOLS_P1[@]}" "${TOOLS_P2[@]}")
}

# With --check: compares the built .wasm files with the committed ones and sets
# CHECK_STATUS (0 when all match). The caller may check more, then exits.
check_built() {
    CHECK_STATUS=0
    local t committed
    for t in "${ALL_TOOLS[@]}"; do
        committed=$TOOLS_DIR/tools/$t/$t.wasm
        if [ ! -f "$committed" ]; then
            note "MISSING: ${committed#"$REPO"/}"; CHECK_STATUS=1
        elif ! cmp -s "$committed" "$STAGE/tools/$t/$t.wasm"; then
            note "DIFFERS: ${committed#"$REPO"/} (rebuild with $SCRIPT)"; CHECK_STATUS=1
        else
            note "ok: ${committed#"$REPO"/}"
        fi
    done
}

# Copies the built .wasm files to DEST/tools/ (DEST: --out, or TOOLS_DIR) and
# prints their sizes and digests.
install_built() {
    if [ -n "$OUT" ]; then
        mkdir -p -- "$OUT"
        DEST=$(cd -- "$OUT" && pwd -P)
    else
        DEST=$TOOLS_DIR
    fi
    local t
    for t in "${ALL_TOOLS[@]}"; do
        mkdir -p "$DEST/tools/$t"
        cp -- "$STAGE/tools/$t/$t.wasm" "$DEST/tools/$t/$t.wasm.tmp.$$"
        mv -- "$DEST/tools/$t/$t.wasm.tmp.$$" "$DEST/tools/$t/$t.wasm"
        printf '%8d  sha256:%s  %s\n' "$(wc -c < "$DEST/tools/$t/$t.wasm")" \
            "$(sha256 "$DEST/tools/$t/$t.wasm")" "$DEST/tools/$t/$t.wasm"
    done
}

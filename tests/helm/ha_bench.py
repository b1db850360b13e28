#!/usr/bin/env python3
"""toolgrid bench ha: two control-plane replicas on one PostgreSQL store, the leader killed
with SIGKILL under load, again and again.

Two `toolgrid controller` replicas (controller-0 and controller-1, as the chart's
`replicaCount: 2` runs them) share a PostgreSQL database and elect a leader through a Lease
on a fake Kubernetes API server (fakekube.py). A TCP proxy stands in for the Service: it
sends each new connection to the replica whose /ready answers 200 (the leader). One worker
and the clients dial the proxy. The tool (`slow`) makes three requests per call to a
witness on loopback, which records each by its Idempotency-Key.

Clients call in a loop, each call under its own idempotency key, and call again with the
same key until the call has succeeded. Meanwhile the leader is killed with SIGKILL N
times (then restarted, to be the next standby). Reported: the takeover time of each kill
(from the SIGKILL to the standby's /ready answering 200) as p50/p99/max, the calls made,
and what the witness saw. It fails (exit 1) when a call is lost or stuck, or when a step
of a call reached the witness under two keys (it ran twice); a step sent again under its
one key (a request in flight at the kill, re-sent by the replay) is counted, not failed.

    python3 tests/helm/ha_bench.py --toolgrid target/release/toolgrid \\
        --postgres postgres://postgres@127.0.0.1:5433/toolgrid_test --kills 20

Exit 77 when PyYAML is missing (the fake API server needs it).
"""

import argparse
import base64
import hashlib
import http.server
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import controller_smoke as cs  # noqa: E402  (exits 77 without PyYAML)

LEASE = "toolgrid-controller"
STEPS = 3


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


class Witness:
    """Records each request's run, step and Idempotency-Key."""

    def __init__(self):
        self.seen = []
        self.lock = threading.Lock()
        witness = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                with witness.lock:
                    witness.seen.append((query.get("run", [""])[0], query.get("n", [""])[0],
                                         self.headers.get("Idempotency-Key", "")))
                body = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a worker's connection cut at a kill: nothing to report

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Proxy:
    """A TCP proxy to whichever replica is ready: the Service's part."""

    def __init__(self, targets):
        self.targets = targets  # name -> (grpc port, metrics port)
        self.current = None
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.stop = False
        threading.Thread(target=self.watch, daemon=True).start()
        threading.Thread(target=self.accept, daemon=True).start()

    def ready(self, metrics: int) -> bool:
        try:
            with cs._OPENER.open(f"http://127.0.0.1:{metrics}/ready", timeout=1) as r:
                return r.status == 200
        except Exception:
            return False

    def watch(self):
        while not self.stop:
            ready = [name for name, (_, metrics) in self.targets.items() if self.ready(metrics)]
            self.current = ready[0] if len(ready) == 1 else (self.current if self.current in ready else None)
            time.sleep(0.05)

    def accept(self):
        while not self.stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            target = self.current
            if target is None:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.targets[target][0]), timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def pipe(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class Ha(cs.Smoke):
    def __init__(self, toolgrid, postgres, lease):
        super().__init__(toolgrid, verbose=False, keep=False)
        self.postgres = postgres
        self.lease = lease
        self.names = ["controller-0", "controller-1"]
        self.ports = {n: (cs.free_port(), cs.free_port(), cs.free_port()) for n in self.names}
        self.procs = {}
        self.proxy = Proxy({n: (p[0], p[2]) for n, p in self.ports.items()})
        self.witness = Witness()
        self.env = dict(os.environ, KUBECONFIG=self.kubeconfig, POD_NAMESPACE="toolgrid",
                        RUST_LOG="info", NO_COLOR="1",
                        TOOLGRID_JOIN_TOKEN=secrets.token_hex(32))
        # Both replicas take this operator token; the clients call with it.
        self.env["TOOLGRID_ADMIN_TOKEN"] = self.env["TOOLGRID_TOKEN"] = secrets.token_hex(24)
        for var in ("TOOLGRID_WATCH_NAMESPACE", "TOOLGRID_STORE", "TOOLGRID_LISTEN",
                    "TOOLGRID_HTTP_LISTEN", "TOOLGRID_METRICS_LISTEN",
                    "OTEL_EXPORTER_OTLP_ENDPOINT", "TOOLGRID_CONTROL_PLANE_ADDRESS",
                    "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                    "all_proxy"):
            self.env.pop(var, None)
        self.keys = secrets.token_hex(4)  # this run's idempotency keys: a shared database
        self.calls_done = 0
        self.calls_tried = 0
        self.loading = True
        self.failures = []

    def start_replica(self, name):
        grpc, http, metrics = self.ports[name]
        lease, deadline, every = self.lease
        self.procs[name] = subprocess.Popen(
            [self.toolgrid, "controller",
             "--listen", f"127.0.0.1:{grpc}", "--http-listen", f"127.0.0.1:{http}",
             "--metrics-listen", f"127.0.0.1:{metrics}", "--store", self.postgres,
             "--control-plane-address", f"https://127.0.0.1:{self.proxy.port}",
             "--tls-self-signed=true", "--tls-self-signed-secret", cs.TLS_SECRET,
             "--identity-secret", cs.IDENTITY_SECRET,
             "--leader-lease", lease, "--leader-renew-deadline", deadline,
             "--leader-renew-every", every],
            env=dict(self.env, POD_NAME=name), stdin=subprocess.DEVNULL,
            stdout=open(os.path.join(self.tmp, name + ".log"), "a"), stderr=subprocess.STDOUT,
            preexec_fn=cs._die_with_parent)

    def leader(self):
        lease = self.get("coordination.k8s.io/v1", "Lease", "toolgrid", LEASE)
        return ((lease or {}).get("spec") or {}).get("holderIdentity")

    def seed_tool(self):
        wasm = open(os.path.join(cs.REPO, "tests/fixtures/tools/slow/slow.wasm"), "rb").read()
        digest = "sha256:" + hashlib.sha256(wasm).hexdigest()
        self.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "slow-wasm"},
                     "binaryData": {"slow.wasm": base64.b64encode(wasm).decode()}})
        self.create({"apiVersion": f"{cs.GROUP}/v1alpha1", "kind": "WorkerPool",
                     "metadata": {"name": "default"},
                     "spec": {"replicas": 1, "slotsPerWorker": 16}})
        option = lambda name, t, required=False: dict(  # noqa: E731
            {"name": name, "schema": {"type": t}}, **({"required": True} if required else {}))
        self.create({"apiVersion": f"{cs.GROUP}/v1alpha1", "kind": "Tool",
                     "metadata": {"name": "slow"},
                     "spec": {"effect": "read", "timeout": "120s", "repeatWindow": "0s",
                              "commands": [{"name": "run", "result": {"type": "object"},
                                            "options": [option("base", "string", True),
                                                        option("run", "string", True),
                                                        option("steps", "integer"),
                                                        option("sleep-ms", "integer")]}]}})
        self.create({"apiVersion": f"{cs.GROUP}/v1alpha1", "kind": "ToolRelease",
                     "metadata": {"name": "slow-1.0.0"},
                     "spec": {"tool": "slow", "version": "1.0.0",
                              "artifact": {"configMap": {"name": "slow-wasm", "key": "slow.wasm"},
                                           "digest": digest},
                              "network": {"egress": [{"host": "127.0.0.1",
                                                      "ports": [self.witness.port],
                                                      "allowPrivate": True}]}}})

    def start_worker(self):
        self.worker = subprocess.Popen(
            [self.toolgrid, "worker", "--control-plane", f"https://127.0.0.1:{self.proxy.port}",
             "--pool", "default/default", "--id", "w0", "--cache", os.path.join(self.tmp, "cache")],
            env=self.env, stdin=subprocess.DEVNULL,
            stdout=open(os.path.join(self.tmp, "worker.log"), "w"), stderr=subprocess.STDOUT,
            preexec_fn=cs._die_with_parent)

    def call(self, run: str) -> bool:
        """One attempt of call `run` under its key; True once it has succeeded."""
        try:
            done = subprocess.run(
                [self.toolgrid, "call", "slow", "run", "--base", f"http://127.0.0.1:{self.witness.port}",
                 "--run", run, "--steps", str(STEPS), "--sleep-ms", "100",
                 "--idempotency-key", f"ha-{self.keys}-{run}",
                 "--endpoint", f"https://127.0.0.1:{self.proxy.port}"],
                capture_output=True, text=True, timeout=90, env=self.env)
        except subprocess.TimeoutExpired:
            return False
        if done.returncode != 0:
            self.last_error = f"exit {done.returncode}: {done.stdout[-300:]} {done.stderr[-300:]}"
            return False
        try:
            return json.loads(done.stdout).get("run") == run
        except ValueError:
            return False

    def client(self, index: int):
        n = 0
        while self.loading:
            run = f"c{index}-{n}"
            n += 1
            started = time.monotonic()
            while not self.call(run):
                self.calls_tried += 1
                if time.monotonic() - started > 120:
                    self.failures.append(f"call {run} did not succeed within 120 s")
                    return
                time.sleep(0.2)
            self.calls_tried += 1
            self.calls_done += 1

    def ready_one(self, timeout=120):
        def one():
            return self.proxy.current is not None, self.proxy.current
        return cs.eventually("one replica ready (the leader)", one, timeout=timeout, interval=0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toolgrid", default=os.path.join(cs.REPO, "target", "release", "toolgrid"))
    ap.add_argument("--postgres", default=os.environ.get("TOOLGRID_BENCH_POSTGRES_URL"),
                    help="the store both replicas share (env TOOLGRID_BENCH_POSTGRES_URL)")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--leader-lease", default="3s")
    ap.add_argument("--leader-renew-deadline", default="2s")
    ap.add_argument("--leader-renew-every", default="500ms")
    args = ap.parse_args()
    if not args.postgres:
        print("ha_bench.py: --postgres URL (or TOOLGRID_BENCH_POSTGRES_URL) is required", file=sys.stderr)
        return 2
    ha = Ha(os.path.abspath(args.toolgrid), args.postgres,
            (args.leader_lease, args.leader_renew_deadline, args.leader_renew_every))
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(128 + s)))
    try:
        ha.install_crds()
        ha.seed_tool()
        for name in ha.names:
            ha.start_replica(name)
        first = ha.ready_one()
        log(f"  {first} leads")
        ha.trust_ca()
        ha.start_worker()

        def callable_():
            return ha.call("warm-up"), getattr(ha, "last_error", "not yet")
        cs.eventually("a first call succeeds", callable_, timeout=120, interval=0.5)
        clients = [threading.Thread(target=ha.client, args=(i,), daemon=True)
                   for i in range(args.clients)]
        for c in clients:
            c.start()
        takeovers, served = [], []
        for kill in range(args.kills):
            time.sleep(1.5)  # calls in flight, some mid-request
            leader = ha.proxy.current
            if leader is None or ha.leader() != leader:
                leader = ha.ready_one()
            before = ha.calls_done
            killed_at = time.monotonic()
            ha.procs[leader].send_signal(signal.SIGKILL)
            ha.procs[leader].wait()
            ha.proxy.current = None

            def taken():
                current = ha.proxy.current
                return current is not None and current != leader, current
            new = cs.eventually("the standby takes over", taken, timeout=120, interval=0.02)
            took = time.monotonic() - killed_at
            takeovers.append(took)
            ha.start_replica(leader)
            # Service is back when a call ends again (the worker re-attached, the calls in
            # flight at the kill adopted or moved): the next kill waits for it.
            def serving():
                return ha.calls_done > before, ha.calls_done
            cs.eventually("a call ends after the takeover", serving, timeout=120, interval=0.02)
            back = time.monotonic() - killed_at
            served.append(back)
            log(f"  kill {kill + 1}: {leader} killed, {new} ready after {took:.2f} s, "
                f"a call ended after {back:.2f} s")
        ha.loading = False
        for c in clients:
            c.join(timeout=180)
        if any(c.is_alive() for c in clients):
            ha.failures.append("a client's call was still not done 180 s after the load stopped")

        # What the witness saw: each step of each call under one key.
        keys = {}
        for run, n, key in ha.witness.seen:
            keys.setdefault((run, n), []).append(key)
        twice = {k: v for k, v in keys.items() if len(set(v)) > 1}
        resent = sum(len(v) - 1 for v in keys.values())
        runs = {run for run, _ in keys}
        missing = [(run, str(n)) for run in runs for n in range(1, STEPS + 1)
                   if (run, str(n)) not in keys]
        for k, v in twice.items():
            ha.failures.append(f"step {k} reached the witness under {len(set(v))} keys: it ran twice")
        for k in missing:
            ha.failures.append(f"step {k} never reached the witness")

        p = cs.percentile
        print(f"toolgrid bench ha: 2 controller replicas on PostgreSQL, leader lease "
              f"{args.leader_lease} (renew every {args.leader_renew_every}, step down after "
              f"{args.leader_renew_deadline}), {args.clients} clients, {args.kills} SIGKILLs of the leader")
        print(f"{'':<44}{'p50 s':>9}{'p99 s':>9}{'max s':>9}")
        print(f"{'takeover (SIGKILL to the standby ready)':<44}{p(takeovers, 0.5):>9.2f}"
              f"{p(takeovers, 0.99):>9.2f}{max(takeovers):>9.2f}")
        print(f"{'service (SIGKILL to the next call ended)':<44}{p(served, 0.5):>9.2f}"
              f"{p(served, 0.99):>9.2f}{max(served):>9.2f}")
        print(f"baseline: the lease (a standby may take it over only after it): {args.leader_lease}")
        print(f"calls: {ha.calls_done} succeeded ({ha.calls_tried} attempts, the rest retried under "
              f"their key across a takeover), {len(runs)} reached the witness")
        print(f"witness: {len(ha.witness.seen)} requests, {len(keys)} steps, each under one key; "
              f"{resent} sent again under their key (in flight at a kill)")
        if ha.failures:
            for f in ha.failures:
                print(f"FAILED: {f}", file=sys.stderr)
            for name in ha.names:
                log(f"--- {name}'s log, last lines:\n" + ha.tail(os.path.join(ha.tmp, name + ".log"), 40))
            return 1
        return 0
    except cs.Failed as e:
        print(f"ha_bench.py: FAILED: {e}", file=sys.stderr)
        for name in ha.names:
            log(f"--- {name}'s log, last lines:\n" + ha.tail(os.path.join(ha.tmp, name + ".log"), 60))
        log("--- the worker's log:\n" + ha.tail(os.path.join(ha.tmp, "worker.log"), 40))
        return 1
    finally:
        ha.loading = False
        ha.proxy.stop = True
        for proc in list(ha.procs.values()) + [ha.worker]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        ha.fake.stop()


if __name__ == "__main__":
    sys.exit(main())

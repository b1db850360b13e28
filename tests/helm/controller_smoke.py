#!/usr/bin/env python3
"""Runs `toolgrid controller` against the fake Kubernetes API server (tests/helm/fakekube.py)
and checks what it does to a cluster holding the examples (examples/k8s/*.yaml).

The fake serves real watches, so the controller's reflectors, the kube-rs finalizer
helper and its Controllers work as against a cluster. The fake runs no pods: this script
runs one `toolgrid worker` for the pool default/default itself.

The controller starts before the six CRDs (crds/toolgrid.yaml) exist: it stays up, /health
answers 200, /ready 503 naming the missing CRDs, and a Warning Event MissingCRDs is
recorded. Then the CRDs and the examples are created and, each "eventually, within 60 s":

  - /health and /ready answer 200 on the metrics port; /metrics has the reconcile
    histogram; the Lease toolgrid/toolgrid-controller is held by controller-0;
  - every example resource is Ready=True for its current generation; ToolReleases have a
    digest, a size and the finalizer toolgrid.dev/calls-in-flight; ToolBindings a
    resolvedRelease; the WorkerPool 2 desired workers and 1 attached (ours), and a
    Deployment toolgrid-worker-default with 2 replicas that the pool controls, whose pods
    run as the ServiceAccount default-worker (made by the controller, owned by the pool)
    with no API token and one projected token of audience toolgrid-worker;
  - events.k8s.io Events tell of the Ready transitions;
  - `toolgrid call semver compare 1.2.0 1.10.0` answers order -1;
  - a change of a Tool's spec is observed (generation 2) without moving the Ready
    condition's lastTransitionTime; a WorkerPool scaled to 3 scales its Deployment;
  - a rolling update under load: the pool's slotsPerWorker changes the Deployment's
    template (rolling with maxSurge 1, maxUnavailable 0); played with real workers (the
    fake server runs no pods), the new one attaches, the old one gets SIGTERM, drains and
    exits 0; no call fails and none runs on both workers;
  - ToolReleases naming a missing ConfigMap key or the wrong digest are Ready=False
    (ArtifactNotFound, DigestMismatch), with kstatus Reconciling=True and Stalled=True
    respectively, and the controller keeps running; Ready objects carry neither;
  - deleting the semver ToolRelease lets it go (the finalizer is removed: no call is in
    flight) and the semver Tool becomes Ready=False, NoReadyRelease;
  - TLS as the chart runs it without cert-manager (`--tls-self-signed`): the controller
    makes the Secret toolgrid/toolgrid-self-signed-tls (type kubernetes.io/tls, labelled as
    its own), both ports serve a certificate its `ca.crt` verifies (and a client trusting
    only the system's roots is refused), the pool's Deployment hands its workers that CA,
    and the worker and the CLI reach the control plane over https trusting it;
  - identity keys: the controller makes the Secret toolgrid/toolgrid-identity-keys (type
    Opaque, labelled as its own) and publishes their public halves at
    https://…/.well-known/jwks.json (OKP Ed25519 keys, verified over TLS with the CA);
  - SIGTERM: the controller exits 0 and gives the Lease up; started again, it serves the
    same chain from the same Secret, publishes the same key ids, and writes nothing to
    either Secret.

And of every request the controller made: status is written only by server-side apply
(field manager toolgrid-controller) to the /status subresource, the toolgrid resources
themselves only by JSON patches of /metadata/finalizers; no response carried a Warning
(a field the CRD schema prunes); no request failed but reads of what does not exist and
optimistic-concurrency conflicts; every request is one the controller's RBAC
(deploy/rbac.yaml, rendered from the chart) allows.

    tests/helm/controller_smoke.py [--toolgrid target/debug/toolgrid] [-v] [--keep]

Exit status: 0 when every check passes, 1 when one fails (with the controller's log),
77 (with the reason on stderr) when PyYAML or the toolgrid binary is missing.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SKIP = 77
AGENT = "controller-smoke"  # the User-Agent of this script's own requests
GROUP = "toolgrid.dev"
KINDS = ["Tool", "ToolRelease", "ToolBinding", "Middleware", "Agent", "WorkerPool"]
FINALIZER = "toolgrid.dev/calls-in-flight"
MANAGER = "toolgrid-controller"
TLS_SECRET = "toolgrid-self-signed-tls"  # the chart's name for release `toolgrid`
IDENTITY_SECRET = "toolgrid-identity-keys"  # likewise
TIMEOUT = 60.0


def skip(reason: str):
    print(f"controller_smoke.py: SKIP: {reason}", file=sys.stderr)
    sys.exit(SKIP)


try:
    import yaml
except ImportError:
    skip("PyYAML is not installed (pip install pyyaml)")

sys.path.insert(0, HERE)
import fakekube  # noqa: E402

try:
    import jsonschema  # noqa: F401  (fakekube validates custom resources with it)
    HAVE_JSONSCHEMA = True
except ImportError:
    HAVE_JSONSCHEMA = False
    if os.environ.get("CI", "").lower() in ("true", "1"):
        # without it custom resources go unvalidated; under CI that is no pass
        skip("jsonschema is not installed (pip install jsonschema)")


class Failed(Exception):
    pass


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


def percentile(values, q: float):
    """The nearest-rank `q` quantile (0 to 1) of `values`, as the benchmarks report it."""
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


try:  # looked up now: a child between fork and exec should do no more than call it
    import ctypes
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except Exception:
    _PRCTL = None


def _die_with_parent():
    """In a child: be killed when this script dies, however it dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


# no proxy for 127.0.0.1, whatever the environment says
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eventually(what: str, probe, timeout: float = TIMEOUT, interval: float = 0.2):
    """Calls probe() until it returns (True, value); fails with its last detail."""
    deadline = time.monotonic() + timeout
    detail = None
    while True:
        try:
            ok, detail = probe()
        except Failed:
            raise
        except Exception as e:  # a probe that cannot look yet (e.g. connection refused)
            ok, detail = False, f"{type(e).__name__}: {e}"
        if ok:
            return detail
        if time.monotonic() >= deadline:
            raise Failed(f"{what}: not within {timeout:.0f}s; last seen: {_short(detail)}")
        time.sleep(interval)


def _short(value, limit=2000) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def ready_of(obj: dict | None) -> dict | None:
    return condition_of(obj, "Ready")


def kstatus_of(obj: dict | None) -> list[tuple]:
    """The kstatus conditions (Reconciling, Stalled) as (type, status, reason)."""
    return [(c.get("type"), c.get("status"), c.get("reason"))
            for c in ((obj or {}).get("status") or {}).get("conditions") or []
            if c.get("type") in ("Reconciling", "Stalled")]


def condition_of(obj: dict | None, type_: str) -> dict | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


class Smoke:
    def __init__(self, toolgrid: str, verbose: bool, keep: bool):
        self.toolgrid = toolgrid
        self.verbose = verbose
        self.keep = keep
        self.tmp = tempfile.mkdtemp(prefix="toolgrid-controller-smoke-")
        with open(os.path.join(REPO, "crds", "toolgrid.yaml")) as f:
            self.crds = [d for d in yaml.safe_load_all(f) if d]
        self.fake = fakekube.FakeKube(
            namespaces=["default", "toolgrid"], validate_crs=HAVE_JSONSCHEMA,
            bookmark_interval=1.0, max_watch_seconds=2.0,  # the watches resume often
            log=(lambda m: log("    api: " + m)) if verbose else None)
        self.url = self.fake.start()
        self.kubeconfig = os.path.join(self.tmp, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write(self.fake.kubeconfig(self.url, "default"))
        self.grpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.controller = None
        self.worker = None
        self.controller_log = os.path.join(self.tmp, "controller.log")
        self.worker_log = os.path.join(self.tmp, "worker.log")
        self.examples: list[dict] = []  # every example object, as created

    # ------------------------------------------------------------------ the API
    def path_of(self, api_version: str, kind: str, namespace: str | None, name: str | None = None,
                sub: str | None = None) -> str:
        group, _, version = api_version.rpartition("/")
        for plural, k, namespaced in self.fake.groups.get((group, version), []):
            if k == kind:
                base = f"/apis/{group}/{version}" if group else "/api/v1"
                if namespaced:
                    base += f"/namespaces/{namespace or 'default'}"
                path = f"{base}/{plural}"
                if name:
                    path += f"/{name}"
                if sub:
                    path += f"/{sub}"
                return path
        raise Failed(f"the fake serves no {api_version} {kind}")

    def api(self, method: str, path: str, body=None, ctype="application/json"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Content-Type": ctype, "Accept": "application/json", "User-Agent": AGENT})
        try:
            with _OPENER.open(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def get(self, api_version, kind, namespace, name):
        code, obj = self.api("GET", self.path_of(api_version, kind, namespace, name))
        return obj if code == 200 else None

    def get_cr(self, kind, name, namespace="default"):
        return self.get(f"{GROUP}/v1alpha1", kind, namespace, name)

    def create(self, obj: dict, namespace="default") -> dict:
        path = self.path_of(obj["apiVersion"], obj["kind"], namespace)
        code, out = self.api("POST", path, obj)
        if code != 201:
            raise Failed(f"creating {obj['kind']} {obj['metadata']['name']}: {code} {_short(out)}")
        return out

    # ------------------------------------------------------------------ processes
    def start_controller(self):
        env = dict(os.environ, KUBECONFIG=self.kubeconfig, POD_NAME="controller-0",
                   POD_NAMESPACE="toolgrid", RUST_LOG=os.environ.get("RUST_LOG", "info"),
                   NO_COLOR="1")
        for var in ("TOOLGRID_WATCH_NAMESPACE", "TOOLGRID_STORE", "TOOLGRID_LISTEN",
                    "TOOLGRID_HTTP_LISTEN", "TOOLGRID_METRICS_LISTEN",
                    "OTEL_EXPORTER_OTLP_ENDPOINT", "TOOLGRID_CONTROL_PLANE_ADDRESS",
                    "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                    "all_proxy"):
            env.pop(var, None)
        # The worker link takes a join token until the cluster's TokenReviewer is wired;
        # the worker below inherits it.
        env["TOOLGRID_JOIN_TOKEN"] = secrets.token_hex(32)
        self.env = env
        self.controller = subprocess.Popen(
            [self.toolgrid, "controller",
             "--listen", f"127.0.0.1:{self.grpc}",
             "--http-listen", f"127.0.0.1:{self.http}",
             "--metrics-listen", f"127.0.0.1:{self.metrics}",
             "--store", f"sqlite://{os.path.join(self.tmp, 'db')}",
             "--control-plane-address", f"https://127.0.0.1:{self.grpc}",
             # as the chart runs it without cert-manager: its own CA, kept in a Secret
             "--tls-self-signed=true",
             "--tls-self-signed-secret", TLS_SECRET,
             # as the chart runs it: the identity signing keys, kept in a Secret
             "--identity-secret", IDENTITY_SECRET],
            env=env, stdin=subprocess.DEVNULL, stdout=open(self.controller_log, "a"),
            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def tls_secret(self) -> dict:
        """The controller's Secret with its CA and certificate (waiting for it)."""
        def made():
            secret = self.get("v1", "Secret", "toolgrid", TLS_SECRET)
            return secret is not None, secret
        return eventually(f"the Secret toolgrid/{TLS_SECRET}", made)

    def trust_ca(self):
        """Writes the CA workers trust (the Secret's ca.crt) to a file; the worker and the CLI
        use it (TOOLGRID_TLS_CA)."""
        secret = self.tls_secret()
        self.ca_pem = base64.b64decode(secret["data"]["ca.crt"]).decode()
        self.ca_file = os.path.join(self.tmp, "ca.crt")
        with open(self.ca_file, "w") as f:
            f.write(self.ca_pem)
        self.env["TOOLGRID_TLS_CA"] = self.ca_file

    def handshake(self, port: int) -> dict:
        """The certificate the controller presents on `port`, verified against the CA file."""
        context = ssl.create_default_context(cafile=self.ca_file)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as tcp:
            with context.wrap_socket(tcp, server_hostname="127.0.0.1") as tls:
                return tls.getpeercert()

    def check_tls(self):
        """The Secret is the controller's, both ports serve a certificate its CA verifies, a
        client trusting another CA is refused, and the pool's workers are handed the CA."""
        secret = self.tls_secret()
        if secret.get("type") != "kubernetes.io/tls":
            raise Failed(f"the Secret's type is {secret.get('type')!r}")
        labels = (secret.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") != "toolgrid-controller":
            raise Failed(f"the Secret is not labelled as the controller's: {labels}")
        missing = {"tls.crt", "tls.key", "ca.crt", "ca-signing.crt", "ca-signing.key",
                   "bundle.json"} - set(secret.get("data") or {})
        if missing:
            raise Failed(f"the Secret lacks {sorted(missing)}")
        for port in (self.grpc, self.http):
            try:
                self.handshake(port)
            except (ssl.SSLError, OSError) as e:
                raise Failed(f"port {port} does not serve a certificate the CA verifies: {e}") from None
        try:
            with socket.create_connection(("127.0.0.1", self.http), timeout=10) as tcp:
                ssl.create_default_context().wrap_socket(tcp, server_hostname="127.0.0.1")
            raise Failed("a client trusting only the system's roots completed a handshake")
        except ssl.SSLCertVerificationError:
            pass

        def handed():
            deployment = self.get("apps/v1", "Deployment", "default", "toolgrid-worker-default")
            containers = (((deployment or {}).get("spec") or {}).get("template") or {}) \
                .get("spec", {}).get("containers") or [{}]
            env = {e.get("name"): e.get("value") for e in containers[0].get("env") or []}
            return env.get("TOOLGRID_TLS_CA_PEM") == self.ca_pem, env.get("TOOLGRID_TLS_CA_PEM")
        eventually("the pool's Deployment hands its workers the CA", handed)

    def identity_secret(self) -> dict:
        """The controller's Secret with its identity signing keys (waiting for it)."""
        def made():
            secret = self.get("v1", "Secret", "toolgrid", IDENTITY_SECRET)
            return secret is not None, secret
        return eventually(f"the Secret toolgrid/{IDENTITY_SECRET}", made)

    def jwks(self) -> dict:
        """The JWKS the HTTP port publishes, fetched over TLS verified with the CA file."""
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=self.ca_file)))
        req = urllib.request.Request(f"https://127.0.0.1:{self.http}/.well-known/jwks.json",
                                     headers={"Accept": "application/json"})
        with opener.open(req, timeout=10) as resp:
            return json.loads(resp.read())

    def jwks_kids(self) -> list[str]:
        """The key ids of the published JWKS; fails unless every key is an OKP Ed25519 key."""
        keys = self.jwks().get("keys") or []
        if not keys:
            raise Failed("the JWKS publishes no key")
        for key in keys:
            if key.get("kty") != "OKP" or key.get("crv") != "Ed25519" or not key.get("x") \
                    or not key.get("kid") or "d" in key:
                raise Failed(f"the JWKS holds a key that is not a public OKP Ed25519 key: {key}")
        return [key["kid"] for key in keys]

    def check_identity(self):
        """The identity keys live in the controller's Secret and their public halves are
        published at /.well-known/jwks.json."""
        secret = self.identity_secret()
        if secret.get("type") != "Opaque":
            raise Failed(f"the identity Secret's type is {secret.get('type')!r}")
        labels = (secret.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") != "toolgrid-controller":
            raise Failed(f"the identity Secret is not labelled as the controller's: {labels}")
        if set(secret.get("data") or {}) != {"keys.json"}:
            raise Failed(f"the identity Secret holds {sorted(secret.get('data') or {})}, not keys.json")
        stored = json.loads(base64.b64decode(secret["data"]["keys.json"]))
        try:
            self.kids = self.jwks_kids()
        except (urllib.error.URLError, ssl.SSLError, OSError, ValueError) as e:
            raise Failed(f"cannot fetch the JWKS: {e}") from None
        if stored["current"]["kid"] not in self.kids:
            raise Failed(f"the JWKS {self.kids} lacks the signing key {stored['current']['kid']}")

    def check_restart_keeps_the_ca(self):
        """A controller started again (a restart, a new leader) serves the same chain from the
        same Secret: nothing is written to it, and the CA file clients hold still verifies."""
        before = self.tls_secret()
        identity_before = self.identity_secret()
        self.start_controller()
        self.check_lease()
        def serving():
            self.controller_alive()
            try:
                return True, self.handshake(self.http)
            except (ssl.SSLError, OSError) as e:
                return False, str(e)
        eventually("the restarted controller serves a certificate the same CA verifies", serving)
        after = self.tls_secret()
        if after["metadata"].get("resourceVersion") != before["metadata"].get("resourceVersion"):
            raise Failed("the restarted controller wrote its Secret again")
        def publishing():
            self.controller_alive()
            try:
                return True, self.jwks_kids()
            except (urllib.error.URLError, ssl.SSLError, OSError, ValueError) as e:
                return False, str(e)
        kids = eventually("the restarted controller publishes its JWKS", publishing)
        if kids != self.kids:
            raise Failed(f"the restarted controller publishes {kids}, not {self.kids}")
        identity_after = self.identity_secret()
        if identity_after["metadata"].get("resourceVersion") \
                != identity_before["metadata"].get("resourceVersion"):
            raise Failed("the restarted controller wrote its identity Secret again")

    def start_worker(self):
        self.worker = subprocess.Popen(
            [self.toolgrid, "worker", "--control-plane", f"https://127.0.0.1:{self.grpc}",
             "--pool", "default/default", "--id", "w0",
             "--cache", os.path.join(self.tmp, "cache")],
            env=self.env, stdin=subprocess.DEVNULL, stdout=open(self.worker_log, "w"),
            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def controller_alive(self):
        if self.controller.poll() is not None:
            raise Failed(f"the controller exited with status {self.controller.returncode}")

    def metrics_get(self, path: str):
        with _OPENER.open(f"http://127.0.0.1:{self.metrics}{path}", timeout=5) as r:
            return r.status, r.read().decode()

    def probe(self, path: str):
        """(status, body) of a probe endpoint, whatever the status; the controller must be up."""
        self.controller_alive()
        try:
            return self.metrics_get(path)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def stop(self):
        for proc in (self.worker, self.controller):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        self.fake.stop()
        if not self.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def tail(self, path: str, lines=150) -> str:
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError as e:
            return f"({e})"

    # ------------------------------------------------------------------ checks
    def check_waits_for_crds(self):
        eventually("GET /health answers 200", lambda: (self.probe("/health")[0] == 200, "?"))

        def not_ready():
            code, text = self.probe("/ready")
            return code == 503 and "tools.toolgrid.dev" in text, f"{code} {text}"
        eventually("GET /ready answers 503 naming the missing CRDs", not_ready)

        def warned():
            events = [e for e in self.events() if e.get("reason") == "MissingCRDs"]
            return any(e.get("type") == "Warning" for e in events), self.events()
        eventually("a Warning Event MissingCRDs", warned)
        time.sleep(1.0)
        self.controller_alive()  # waiting, not crash-looping
        ok, detail = not_ready()
        if not ok:
            raise Failed(f"/ready answers {detail} while the CRDs are missing")

    def install_crds(self):
        for crd in self.crds:
            code, out = self.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                 crd)
            if code != 201:
                raise Failed(f"creating the CRD {crd['metadata']['name']}: {code} {_short(out)}")

    def seed(self):
        files = sorted(f for f in os.listdir(os.path.join(REPO, "examples", "k8s"))
                       if f.endswith(".yaml"))
        files.sort(key=lambda f: f != "artifacts.yaml")  # the ConfigMaps first
        for name in files:
            with open(os.path.join(REPO, "examples", "k8s", name)) as f:
                for doc in yaml.safe_load_all(f):
                    if doc:
                        self.examples.append(self.create(doc))

    def example_crs(self):
        return [(o["kind"], o["metadata"]["name"]) for o in self.examples
                if o["apiVersion"].startswith(GROUP + "/")]

    def check_probes(self):
        eventually("GET /health answers 200", lambda: (self.probe("/health")[0] == 200, "?"))

        def ready():
            code, text = self.probe("/ready")
            return code == 200, f"{code} {text}"
        eventually("GET /ready answers 200", ready)

    def check_lease(self):
        def held():
            lease = self.get("coordination.k8s.io/v1", "Lease", "toolgrid", "toolgrid-controller")
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
            return holder == "controller-0", lease
        eventually("the Lease toolgrid/toolgrid-controller is held by controller-0", held)

    def check_ready(self):
        def all_ready():
            self.controller_alive()
            bad = []
            for kind, name in self.example_crs():
                obj = self.get_cr(kind, name)
                ready = ready_of(obj)
                gen = (obj or {}).get("metadata", {}).get("generation")
                status = (obj or {}).get("status") or {}
                if not ready or ready.get("status") != "True":
                    bad.append(f"{kind} {name}: Ready {ready}")
                elif kstatus_of(obj):
                    bad.append(f"{kind} {name}: Ready, but kstatus conditions {kstatus_of(obj)}")
                elif ready.get("observedGeneration") != gen or status.get("observedGeneration") != gen:
                    bad.append(f"{kind} {name}: generation {gen}, observed "
                               f"{status.get('observedGeneration')} (Ready: {ready.get('observedGeneration')})")
                elif kind == "ToolRelease" and not (status.get("digest", "").startswith("sha256:")
                                                    and isinstance(status.get("size"), int)
                                                    and status["size"] > 0):
                    bad.append(f"{kind} {name}: no digest and size in {status}")
                elif kind == "ToolBinding" and not status.get("resolvedRelease"):
                    bad.append(f"{kind} {name}: no resolvedRelease in {status}")
                elif kind == "WorkerPool" and (status.get("desiredWorkers"), status.get("attachedWorkers")) != (2, 1):
                    bad.append(f"{kind} {name}: desiredWorkers {status.get('desiredWorkers')}, "
                               f"attachedWorkers {status.get('attachedWorkers')} (want 2, 1)")
                elif kind == "ToolRelease" and FINALIZER not in (obj["metadata"].get("finalizers") or []):
                    bad.append(f"{kind} {name}: finalizers {obj['metadata'].get('finalizers')}")
            return not bad, bad
        eventually("every example resource is Ready for its generation (with its status fields)",
                   all_ready)
        for kind, name in self.example_crs():
            obj = self.get_cr(kind, name)
            if kind == "ToolRelease":
                want = next(o for o in self.examples if o["kind"] == kind
                            and o["metadata"]["name"] == name)["spec"]["artifact"].get("digest")
                if want and obj["status"]["digest"] != want:
                    raise Failed(f"ToolRelease {name}: status.digest {obj['status']['digest']}, spec says {want}")

    def check_deployment(self):
        def deployed():
            d = self.get("apps/v1", "Deployment", "default", "toolgrid-worker-default")
            if not d:
                return False, "no Deployment default/toolgrid-worker-default"
            pool = self.get_cr("WorkerPool", "default")
            owners = [r for r in d["metadata"].get("ownerReferences") or []
                      if r.get("kind") == "WorkerPool" and r.get("name") == "default"
                      and r.get("uid") == pool["metadata"]["uid"] and r.get("controller") is True
                      and r.get("apiVersion") == f"{GROUP}/v1alpha1"]
            ok = d["spec"].get("replicas") == 2 and bool(owners)
            return ok, {"replicas": d["spec"].get("replicas"),
                        "ownerReferences": d["metadata"].get("ownerReferences")}
        eventually("the Deployment default/toolgrid-worker-default has 2 replicas, controlled by the pool",
                   deployed)

        # The workers run as the pool's ServiceAccount, which the controller made, owned by
        # the pool, and present only a projected token for the worker link.
        d = self.get("apps/v1", "Deployment", "default", "toolgrid-worker-default")
        pod = d["spec"]["template"]["spec"]
        if pod.get("serviceAccountName") != "default-worker" or pod.get("automountServiceAccountToken") is not False:
            raise Failed(f"worker pods run as {pod.get('serviceAccountName')!r}, "
                         f"automount {pod.get('automountServiceAccountToken')!r}")
        tokens = [s["serviceAccountToken"] for v in pod.get("volumes") or []
                  for s in (v.get("projected") or {}).get("sources") or [] if "serviceAccountToken" in s]
        if [t.get("audience") for t in tokens] != ["toolgrid-worker"]:
            raise Failed(f"worker pods' projected tokens: {tokens}")

        def account():
            sa = self.get("v1", "ServiceAccount", "default", "default-worker")
            if not sa:
                return False, "no ServiceAccount default/default-worker"
            pool = self.get_cr("WorkerPool", "default")
            owned = any(r.get("kind") == "WorkerPool" and r.get("uid") == pool["metadata"]["uid"]
                        for r in sa["metadata"].get("ownerReferences") or [])
            return owned, {"ownerReferences": sa["metadata"].get("ownerReferences")}
        eventually("the ServiceAccount default/default-worker, owned by the pool", account)

    def events(self) -> list[dict]:
        out = []
        for api_version in ("events.k8s.io/v1", "v1"):
            code, lst = self.api("GET", self.path_of(api_version, "Event", None).replace(
                "/namespaces/default", ""))
            if code == 200:
                out += lst["items"]
        return out

    def check_events(self):
        def told():
            missing = []
            events = self.events()
            for kind, name in self.example_crs():
                if not any((e.get("regarding") or e.get("involvedObject") or {}).get("kind") == kind
                           and (e.get("regarding") or e.get("involvedObject") or {}).get("name") == name
                           and (e.get("action") == "BecameReady" or e.get("type") == "Normal")
                           for e in events):
                    missing.append(f"{kind} {name}")
            return not missing, {"no Ready event for": missing,
                                 "events": [(e.get("reason"), e.get("action"),
                                             (e.get("regarding") or {}).get("name")) for e in events]}
        eventually("an Event tells of each example resource becoming Ready", told)

    def check_metrics(self):
        eventually("/metrics has toolgrid_reconcile_duration_seconds",
                   lambda: ("toolgrid_reconcile_duration_seconds" in self.metrics_get("/metrics")[1],
                            "not in /metrics"))

    def check_call(self):
        def call():
            self.controller_alive()
            run = subprocess.run(
                [self.toolgrid, "call", "semver", "compare", "1.2.0", "1.10.0",
                 "--endpoint", f"https://127.0.0.1:{self.grpc}"],
                capture_output=True, text=True, timeout=60, env=self.env)
            if run.returncode != 0:
                return False, f"exit {run.returncode}: {run.stdout} {run.stderr}"
            try:
                result = json.loads(run.stdout)
            except ValueError:
                return False, f"not JSON: {run.stdout!r}"
            return result.get("order") == -1, result
        result = eventually("toolgrid call semver compare 1.2.0 1.10.0", call, interval=1.0)
        if result != {"order": -1, "a": "1.2.0", "b": "1.10.0"}:
            raise Failed(f"semver compare answered {result}")

    def check_spec_change(self):
        before = ready_of(self.get_cr("Tool", "semver"))
        time.sleep(1.1)  # a condition written again now would have another time
        path = self.path_of(f"{GROUP}/v1alpha1", "Tool", "default", "semver")
        code, out = self.api("PATCH", path, {"spec": {"timeout": "20s"}},
                             ctype="application/merge-patch+json")
        if code != 200 or out["metadata"]["generation"] != 2:
            raise Failed(f"patching the semver Tool: {code} {_short(out)}")

        def observed():
            tool = self.get_cr("Tool", "semver")
            ready = ready_of(tool)
            status = tool.get("status") or {}
            ok = (status.get("observedGeneration") == 2 and ready
                  and ready.get("observedGeneration") == 2 and ready.get("status") == "True")
            return ok, status
        observed_status = eventually("the semver Tool's new generation (2) is observed", observed)
        after = ready_of({"status": observed_status})
        if after.get("lastTransitionTime") != before.get("lastTransitionTime"):
            raise Failed(f"a spec change moved Ready's lastTransitionTime: {before} -> {after}")

    def check_pool_change(self):
        path = self.path_of(f"{GROUP}/v1alpha1", "WorkerPool", "default", "default")
        code, out = self.api("PATCH", path, {"spec": {"replicas": 3}},
                             ctype="application/merge-patch+json")
        if code != 200 or out["metadata"]["generation"] != 2:
            raise Failed(f"patching the WorkerPool: {code} {_short(out)}")

        def scaled():
            d = self.get("apps/v1", "Deployment", "default", "toolgrid-worker-default")
            pool = self.get_cr("WorkerPool", "default")
            status = pool.get("status") or {}
            ready = ready_of(pool) or {}
            ok = (d["spec"].get("replicas") == 3 and status.get("desiredWorkers") == 3
                  and status.get("observedGeneration") == 2 and ready.get("observedGeneration") == 2
                  and ready.get("status") == "True")
            return ok, {"deployment replicas": d["spec"].get("replicas"), "pool status": status}
        eventually("WorkerPool replicas 3 reach the Deployment and the pool's status", scaled)

    def check_rolling_update(self):
        """The pool's Deployment template changes under load (slotsPerWorker 16 -> 12); the
        fake API server runs no pods, so this plays the ReplicaSet's rolling update
        (maxSurge 1, maxUnavailable 0) with real workers: the new pod's worker attaches, then
        the old one gets SIGTERM, drains and exits 0. No call fails, none runs twice."""
        import threading
        stop = threading.Event()
        failures, made = [], [0]
        endpoint = f"https://127.0.0.1:{self.grpc}"

        def load():
            while not stop.is_set():
                run = subprocess.run(
                    [self.toolgrid, "call", "semver", "compare", "1.2.0", "1.10.0",
                     "--endpoint", endpoint],
                    capture_output=True, text=True, timeout=60, env=self.env)
                made[0] += 1
                if run.returncode != 0:
                    failures.append(f"exit {run.returncode}: {run.stderr.strip()}")
        threads = [threading.Thread(target=load, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            path = self.path_of(f"{GROUP}/v1alpha1", "WorkerPool", "default", "default")
            code, out = self.api("PATCH", path, {"spec": {"slotsPerWorker": 12}},
                                 ctype="application/merge-patch+json")
            if code != 200:
                raise Failed(f"patching the WorkerPool: {code} {_short(out)}")

            def new_template():
                d = self.get("apps/v1", "Deployment", "default", "toolgrid-worker-default")
                container = d["spec"]["template"]["spec"]["containers"][0]
                args = container["args"]
                strategy = d["spec"].get("strategy") or {}
                ok = "12" in args and strategy.get("rollingUpdate") == {"maxSurge": 1, "maxUnavailable": 0}
                return ok, {"command": container.get("command"), "args": args, "strategy": strategy}
            template = eventually("the Deployment's template takes slotsPerWorker 12", new_template)
            # The new pod: its worker attaches beside the old one. It runs the template's own
            # command (the image's toolgrid-worker, built beside toolgrid) and arguments, with
            # the cluster's address and the pod's cache path swapped for this machine's.
            command = template["command"]
            if command != ["toolgrid-worker"]:
                raise Failed(f"the worker pods run {command}, not toolgrid-worker")
            binary = os.path.join(os.path.dirname(self.toolgrid), command[0])
            local = {"--control-plane": endpoint, "--cache": os.path.join(self.tmp, "cache")}
            args = list(template["args"])
            for i in range(len(args) - 1):
                if args[i] in local:
                    args[i + 1] = local[args[i]]
            old = self.worker
            self.worker = subprocess.Popen(
                [binary, *args, "--id", "w1"],
                env=self.env, stdin=subprocess.DEVNULL, stdout=open(self.worker_log + ".w1", "w"),
                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

            def both():
                status = self.get_cr("WorkerPool", "default").get("status") or {}
                return (status.get("attachedWorkers") or 0) >= 2, status
            eventually("the new worker attaches beside the old", both)
            time.sleep(0.5)
            # The old pod is deleted: SIGTERM; it drains and exits 0.
            old.send_signal(signal.SIGTERM)
            try:
                code = old.wait(timeout=40)
            except subprocess.TimeoutExpired:
                old.kill()
                raise Failed("the old worker did not exit within its grace period")
            if code != 0:
                raise Failed(f"the old worker exited {code} after draining")
            time.sleep(1.5)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        if failures:
            raise Failed(f"{len(failures)} of {made[0]} calls failed during the rolling update: "
                         + "; ".join(failures[:5]))
        if made[0] < 5:
            raise Failed(f"only {made[0]} calls were made during the rolling update")
        run = subprocess.run([self.toolgrid, "calls", "--limit", "1000", "-o", "json",
                              "--endpoint", endpoint],
                             capture_output=True, text=True, timeout=60, env=self.env)
        calls = json.loads(run.stdout).get("calls") if run.returncode == 0 else None
        if not isinstance(calls, list):
            raise Failed(f"toolgrid calls: {run.returncode} {run.stdout[:300]} {run.stderr[:300]}")
        # A call offered to the old worker as it stopped is handed back unrun and assigned
        # again; none may have run on both workers.
        import re
        ran = []
        for path in (self.worker_log, self.worker_log + ".w1"):
            with open(path) as f:
                text = f.read()
            ran.append(set(re.findall(r"run\{call=([0-9a-f-]+) [^}]*\}: call ran", text)))
        twice = ran[0] & ran[1]
        if twice:
            raise Failed(f"calls ran on both workers (replayed): {sorted(twice)[:5]}")
        if not ran[0] or not ran[1]:
            raise Failed(f"calls ran on the old worker ({len(ran[0])}) and the new ({len(ran[1])}): both should have")
        if not any(c.get("state") == "succeeded" for c in calls):
            raise Failed("no call succeeded")
        with open(self.worker_log) as f:
            if "draining" not in f.read():
                raise Failed("the old worker's log does not say it drained")

    def check_invalid_releases(self):
        textstats = next(o for o in self.examples if o["kind"] == "ToolRelease"
                         and o["spec"]["tool"] == "textstats")
        missing = copy.deepcopy(textstats)
        missing["metadata"] = {"name": "textstats-0.0.1-missing"}
        missing["spec"]["version"] = "0.0.1"
        missing["spec"]["artifact"]["configMap"] = {
            "name": textstats["spec"]["artifact"]["configMap"]["name"], "key": "no-such-key.wasm"}
        wrong = copy.deepcopy(textstats)
        wrong["metadata"] = {"name": "textstats-0.0.2-wrong-digest"}
        wrong["spec"]["version"] = "0.0.2"
        wrong["spec"]["artifact"]["digest"] = "sha256:" + "0" * 64
        self.create(missing)
        self.create(wrong)
        # A missing ConfigMap key may yet be applied: Reconciling. A wrong digest needs a
        # change to the release: Stalled (what Flux's kstatus health check reads).
        for name, reason, kstatus in (("textstats-0.0.1-missing", "ArtifactNotFound", "Reconciling"),
                                      ("textstats-0.0.2-wrong-digest", "DigestMismatch", "Stalled")):
            def refused(name=name, reason=reason, kstatus=kstatus):
                self.controller_alive()
                obj = self.get_cr("ToolRelease", name)
                ready = ready_of(obj)
                return (bool(ready) and (ready.get("status"), ready.get("reason")) == ("False", reason)
                        and kstatus_of(obj) == [(kstatus, "True", reason)]), (ready, kstatus_of(obj))
            eventually(f"ToolRelease {name} is Ready=False ({reason}), {kstatus}=True", refused)
        time.sleep(1)
        self.controller_alive()
        code, text = self.metrics_get("/ready")
        if code != 200:
            raise Failed(f"/ready answers {code} {text} after the invalid releases")
        # the binding still resolves to a valid release
        ready = ready_of(self.get_cr("ToolBinding", "report-agent-textstats"))
        if not ready or ready.get("status") != "True":
            raise Failed(f"invalid textstats releases made the textstats binding not ready: {ready}")

    def check_delete_release(self):
        path = self.path_of(f"{GROUP}/v1alpha1", "ToolRelease", "default", "semver-1.0.0")
        code, out = self.api("DELETE", path)
        if code not in (200, 202):
            raise Failed(f"deleting ToolRelease semver-1.0.0: {code} {_short(out)}")
        if not (out.get("metadata") or {}).get("deletionTimestamp"):
            raise Failed(f"ToolRelease semver-1.0.0 has no finalizer to delay its deletion: {_short(out)}")

        def gone():
            obj = self.get_cr("ToolRelease", "semver-1.0.0")
            return obj is None, obj and obj["metadata"]
        eventually("the deleted ToolRelease semver-1.0.0 goes away (its finalizer removed)", gone)

        def not_ready():
            obj = self.get_cr("Tool", "semver")
            ready = ready_of(obj)
            return (bool(ready) and (ready.get("status"), ready.get("reason")) == ("False", "NoReadyRelease")
                    and kstatus_of(obj) == [("Reconciling", "True", "NoReadyRelease")]), (ready, kstatus_of(obj))
        eventually("the semver Tool becomes Ready=False (NoReadyRelease), Reconciling=True", not_ready)

    def check_shutdown(self):
        self.controller.send_signal(signal.SIGTERM)
        try:
            code = self.controller.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise Failed("the controller did not exit within 30s of SIGTERM") from None
        if code != 0:
            raise Failed(f"the controller exited with status {code} on SIGTERM")
        lease = self.get("coordination.k8s.io/v1", "Lease", "toolgrid", "toolgrid-controller")
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        if holder:
            raise Failed(f"the Lease is still held by {holder!r} after the controller stopped")

    # ------------------------------------------------------------------ the request log
    def controller_requests(self) -> list[dict]:
        with self.fake.lock:
            return [r for r in self.fake.request_log if r.get("user_agent") != AGENT]

    def check_writes(self):
        """Status only by server-side apply to /status; the objects only by finalizer patches."""
        errs = []
        status_applies = 0
        for r in self.controller_requests():
            url = urllib.parse.urlsplit(r["path"])
            query = dict(urllib.parse.parse_qsl(url.query))
            parsed = self.fake.parse(url.path.rstrip("/"))
            if not parsed or parsed[0] != GROUP or r["method"] in ("GET",):
                continue
            _, _, plural, _, name, sub = parsed
            what = f"{r['method']} {r['path']}"
            ctype = (r["content_type"] or "").split(";")[0].strip()
            if r["method"] in ("POST", "DELETE"):
                errs.append(f"{what}: the controller creates or deletes a {plural} object")
            elif sub == "status":
                if r["method"] != "PATCH" or ctype != "application/apply-patch+yaml":
                    errs.append(f"{what}: a status write that is not server-side apply ({ctype})")
                elif query.get("fieldManager") != MANAGER:
                    errs.append(f"{what}: field manager {query.get('fieldManager')!r}, not {MANAGER!r}")
                else:
                    status_applies += 1
                    body = yaml.safe_load(r["body"] or "{}") or {}
                    extra = set(body) - {"apiVersion", "kind", "metadata", "status"}
                    meta = set(body.get("metadata") or {}) - {"name", "namespace"}
                    if extra or meta:
                        errs.append(f"{what}: a status apply setting {sorted(extra | meta)}")
            elif sub is None and r["method"] == "PATCH" and ctype == "application/json-patch+json":
                ops = json.loads(r["body"] or "[]")
                bad = [op for op in ops if not op.get("path", "").startswith("/metadata/finalizers")]
                if bad:
                    errs.append(f"{what}: a JSON patch touching {[op.get('path') for op in bad]}")
            else:
                errs.append(f"{what}: the controller writes the object itself ({ctype})")
        if not status_applies:
            errs.append("the controller applied no status at all")
        # the applied configurations the fake kept: nothing but status from toolgrid-controller
        with self.fake.lock:
            for key, managers in self.fake.applied.items():
                if key[0] != GROUP:
                    continue
                for slot, applied in managers.items():
                    if slot == MANAGER:
                        errs.append(f"{key}: {MANAGER} applied the object itself: {_short(applied)}")
        if errs:
            raise Failed("the controller's writes:\n  " + "\n  ".join(errs))

    def check_responses(self):
        """No Warning (pruned fields) and no refused request, but for 404 reads and 409s."""
        errs = []
        for r in self.controller_requests():
            if r["warnings"]:
                errs.append(f"{r['method']} {r['path']}: Warning {r['warnings']}")
            code = r["code"]
            if code == 422 and "test failed" in (r.get("message") or "") and \
                    (r["content_type"] or "").startswith("application/json-patch+json"):
                continue  # a JSON patch's test: the finalizer helper's optimistic concurrency
            if code >= 400 and not (code == 404 and r["method"] == "GET") and code != 409:
                errs.append(f"{r['method']} {r['path']}: {code} (body {_short(r['body'] or '', 300)})")
        if errs:
            raise Failed("requests of the controller the API server refused or warned about:\n  "
                         + "\n  ".join(errs[:40]))

    def check_rbac(self):
        """Every request is allowed by the controller's ClusterRole and Role (deploy/)."""
        with open(os.path.join(REPO, "deploy", "rbac.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        cluster_rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d.get("rules", [])]
        ns_rules = {}
        for d in docs:
            if d["kind"] == "Role":
                ns_rules.setdefault(d["metadata"]["namespace"], []).extend(d.get("rules", []))
        errs = set()
        for r in self.controller_requests():
            url = urllib.parse.urlsplit(r["path"])
            path = url.path.rstrip("/")
            query = dict(urllib.parse.parse_qsl(url.query))
            if path.startswith(("/version", "/openapi")):
                continue
            if path == "/api/v1/namespaces" or (path.startswith("/api/v1/namespaces/") and path.count("/") == 4):
                parsed = ("", "v1", "namespaces", "", path.split("/")[4] if path.count("/") == 4 else None, None)
            else:
                parsed = self.fake.parse(path)
            if not parsed:
                continue  # discovery
            group, _, plural, ns, name, sub = parsed
            verb = {"GET": "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list"),
                    "POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete"}[r["method"]]
            resource = plural + (f"/{sub}" if sub else "")

            def allows(rule):
                return ((group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
                        and (resource in rule.get("resources", []) or "*" in rule.get("resources", []))
                        and (verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
                        and (not rule.get("resourceNames") or (name in rule["resourceNames"]
                                                               and verb not in ("list", "watch", "create"))))
            if not any(allows(rule) for rule in cluster_rules + ns_rules.get(ns, [])):
                errs.add(f"{verb} {group or 'core'} {resource}"
                         + (f" {name!r}" if name else "") + (f" in {ns}" if ns else ""))
        if errs:
            raise Failed("requests the controller's RBAC (deploy/rbac.yaml) does not allow:\n  "
                         + "\n  ".join(sorted(errs)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toolgrid", default=os.path.join(REPO, "target", "debug", "toolgrid"),
                    help="the toolgrid binary (default: target/debug/toolgrid)")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every API request")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--dump", metavar="FILE",
                    help="write the API requests (and no-op writes) there as JSON")
    args = ap.parse_args()
    if not (os.path.isfile(args.toolgrid) and os.access(args.toolgrid, os.X_OK)):
        skip(f"no toolgrid binary at {args.toolgrid} (cargo build)")

    def interrupted(signum, _frame):
        raise SystemExit(128 + signum)  # through the finally below: the children stop
    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    smoke = Smoke(os.path.abspath(args.toolgrid), args.verbose, args.keep)
    steps = [
        ("the controller starts before the CRDs", smoke.start_controller),
        ("it waits for the CRDs", smoke.check_waits_for_crds),
        ("the CRDs are installed", smoke.install_crds),
        ("the examples are created", smoke.seed),
        ("the CA from the controller's Secret", smoke.trust_ca),
        ("a worker starts", smoke.start_worker),
        ("/health and /ready", smoke.check_probes),
        ("the leader Lease", smoke.check_lease),
        ("every example resource is Ready, with its status fields and finalizers", smoke.check_ready),
        ("/metrics", smoke.check_metrics),
        ("the pool's Deployment", smoke.check_deployment),
        ("TLS with the controller's own CA", smoke.check_tls),
        ("identity keys in a Secret, the JWKS published", smoke.check_identity),
        ("Events of the Ready transitions", smoke.check_events),
        ("a tool call", smoke.check_call),
        ("a spec change is observed", smoke.check_spec_change),
        ("a WorkerPool scaled", smoke.check_pool_change),
        ("a rolling update of the pool under load", smoke.check_rolling_update),
        ("invalid ToolReleases", smoke.check_invalid_releases),
        ("a ToolRelease deleted", smoke.check_delete_release),
        ("SIGTERM", smoke.check_shutdown),
        ("the controller's writes", smoke.check_writes),
        ("the API server's answers", smoke.check_responses),
        ("RBAC", smoke.check_rbac),
        ("a restarted controller keeps its CA and identity keys",
         smoke.check_restart_keeps_the_ca),
    ]
    failed = []
    try:
        for name, step in steps:
            t = time.monotonic()
            try:
                step()
            except Failed as e:
                failed.append(f"{name}: {e}")
                log(f"  FAIL {name} ({time.monotonic() - t:.1f}s): {e}")
                if name not in ("the controller's writes", "the API server's answers", "RBAC"):
                    break  # the later steps build on this one
                continue
            log(f"  ok   {name} ({time.monotonic() - t:.1f}s)")
        if failed:
            log("\ncontroller_smoke.py: FAILED:\n" + "\n".join(failed))
            kept = f" ({smoke.tmp})" if args.keep else " (--keep keeps it)"
            log(f"\n--- the controller's log{kept}, last lines:\n" + smoke.tail(smoke.controller_log))
            log("--- the worker's log, last lines:\n" + smoke.tail(smoke.worker_log, 40))
            return 1
        log(f"controller_smoke.py: all checks passed in {time.monotonic() - started:.1f}s")
        return 0
    finally:
        if args.dump:
            with smoke.fake.lock, open(args.dump, "w") as f:
                json.dump({"requests": smoke.fake.request_log,
                           "noops": [list(k) + [sub] for k, sub in smoke.fake.noops]}, f, indent=1)
        smoke.stop()


if __name__ == "__main__":
    sys.exit(main())

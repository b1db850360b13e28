#!/usr/bin/env python3
"""Checks the toolgrid Helm chart with real Helm, and prints what it installs.

Helm here is Helm 4's Go library through the PyPI package helm-sdkpy
(`pip install --ignore-requires-python helm-sdkpy`). It can lint and install but not
template, so the chart is rendered by installing it into a fake Kubernetes API server
(tests/helm/fakekube.py) that this script starts on 127.0.0.1 and that records every object
Helm creates. By default Helm installs with server-side apply, as the `helm` 4 CLI does.

    tests/helm/check_chart.py                   everything below; prints the objects of an
                                                install with the default values
    tests/helm/check_chart.py --values JSON     only that case (values merged over the
                                                chart's defaults): lint, install, invariants;
                                                prints its objects
    --output FILE        write the objects there instead of stdout
    --format yaml|json   a YAML stream (default) or a JSON array
    --release NAME, --namespace NS              (default: toolgrid, toolgrid)
    --write-deploy       regenerate deploy/*.yaml (the plain manifests) from the chart
    -v, --verbose        log every API request

What "everything" is:
  1. `helm lint` (errors and warnings fail) with the default values, with a PostgreSQL
     store, with watchNamespace set and no default pool, and the other cases below;
  2. installs of each case into a fresh fake cluster, checking invariants of the objects:
     the standard labels, the controller's args/env/ports/probes (/health, /ready on the
     metrics port), volumes and security context, Service and selectors, RBAC rules
     exactly as the controller's contract lists them, the default WorkerPool, the CRDs;
  3. values that must be refused (replicaCount > 1 with sqlite, postgres without a
     Secret) fail with a clear message, from the schema and from the templates;
  4. a life cycle: install, `helm upgrade` with the same values changes no object, an
     upgrade adopts the default WorkerPool (a post-install hook on the first install) and
     applies a changed pool, `helm uninstall` deletes everything but the CRDs (kept);
  5. deploy/*.yaml is what the chart renders (release toolgrid, namespace toolgrid);
  6. examples/k8s/*.yaml validate against the CRD schemas and their ToolReleases name
     ConfigMap keys that exist, with matching sha256 digests;
  7. when kubectl is installed, the kubectl steps of docs/kubernetes.md work against the
     fake cluster (CRDs, `apply -k deploy/`, the examples) and re-applying is a no-op;
  8. the Argo CD health check (Lua) in docs/gitops.md gives the documented health for
     each case, when lua5.1 is installed; docs/kubernetes.md has a row for every value.

Exit status: 0 when every check passes, 1 when one fails, 77 (with the reason on stderr)
when Helm is not available here, so that a caller can skip.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import copy
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHART = os.path.join(REPO, "charts", "toolgrid")
SKIP = 77


def skip(reason: str):
    print(f"check_chart.py: SKIP: {reason}", file=sys.stderr)
    sys.exit(SKIP)


try:
    import yaml
except ImportError:
    skip("PyYAML is not installed (pip install pyyaml)")

# Helm's Go library reads $HOME (discovery cache, registry config) when it is loaded; keep
# everything it writes in a private directory.
WORK = tempfile.mkdtemp(prefix="toolgrid-helm-")
atexit.register(shutil.rmtree, WORK, True)
for var, sub in (("HOME", ""), ("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"),
                 ("HELM_DATA_HOME", "data")):
    os.environ[var] = os.path.join(WORK, sub)
os.environ["KUBECONFIG"] = os.path.join(WORK, "no-kubeconfig")
os.environ.pop("HELM_DRIVER", None)  # release storage: Secrets, as by default

try:
    import helm_sdkpy
    HELM_VERSION = helm_sdkpy.get_version()  # loads the shared library
except Exception as e:  # ImportError, HelmLibraryNotFound, OSError, ...
    skip(f"helm_sdkpy is not usable here ({type(e).__name__}: {e}); "
         "install it with: pip install --ignore-requires-python helm-sdkpy")

sys.path.insert(0, HERE)
import fakekube  # noqa: E402

try:
    import jsonschema  # noqa: F401  (used by fakekube to validate custom resources)
    HAVE_JSONSCHEMA = True
except ImportError:
    HAVE_JSONSCHEMA = False
    if os.environ.get("CI", "").lower() in ("true", "1"):
        # without it custom resources go unvalidated; under CI that is no pass
        skip("jsonschema is not installed (pip install jsonschema)")

VERBOSE = False


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


class CheckFailed(Exception):
    pass


# ---------------------------------------------------------------------------- values

def deep_merge(base, override):
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = deep_merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(override)


with open(os.path.join(CHART, "values.yaml")) as f:
    DEFAULTS = yaml.safe_load(f)
with open(os.path.join(CHART, "Chart.yaml")) as f:
    CHART_META = yaml.safe_load(f)
APP_VERSION = str(CHART_META["appVersion"])


def fullname(v: dict, release: str) -> str:
    if v.get("fullnameOverride"):
        return v["fullnameOverride"][:63].rstrip("-")
    name = v.get("nameOverride") or CHART_META["name"]
    return (release if name in release else f"{release}-{name}")[:63].rstrip("-")


def load_crds() -> list[dict]:
    with open(os.path.join(REPO, "crds", "toolgrid.yaml")) as f:
        return [d for d in yaml.safe_load_all(f) if d]


# ------------------------------------------------------------------------------ helm

def run(coro):
    return asyncio.run(coro)


class Cluster:
    """A fake API server and a Helm configuration pointing at it."""

    def __init__(self, namespace: str, extra_namespaces=(), preinstalled_crds=False,
                 monitoring=False, cert_manager=False):
        self.namespace = namespace
        self.fake = fakekube.FakeKube(
            namespaces=[namespace, *extra_namespaces],
            crds=load_crds() if preinstalled_crds else (),
            monitoring=monitoring, cert_manager=cert_manager, validate_crs=HAVE_JSONSCHEMA,
            log=(lambda m: log("    api: " + m)) if VERBOSE else None)
        url = self.fake.start()
        fd, self.kubeconfig = tempfile.mkstemp(prefix="kubeconfig-", dir=WORK)
        with os.fdopen(fd, "w") as f:
            f.write(self.fake.kubeconfig(url, namespace))

    def config(self):
        return helm_sdkpy.Configuration(namespace=self.namespace, kubeconfig=self.kubeconfig)

    def install(self, release, values, ssa=True, skip_schema=False):
        return run(helm_sdkpy.Install(self.config()).run(
            release, CHART, values=values or None, wait=False, timeout=120,
            server_side_apply=ssa, skip_schema_validation=skip_schema))

    def upgrade(self, release, values, ssa=True):
        return run(helm_sdkpy.Upgrade(self.config()).run(
            release, CHART, values=values or None, wait=False, timeout=120,
            server_side_apply="true" if ssa else "false", reset_values=True))

    def uninstall(self, release):
        return run(helm_sdkpy.Uninstall(self.config()).run(release, wait=False, timeout=120))

    def stop(self):
        self.fake.stop()

    def chart_objects(self, objs=None):
        """Objects created by the chart: everything but Helm's release records."""
        objs = self.fake.created if objs is None else objs
        return [o for o in objs if not is_release_record(o)]


def is_release_record(o: dict) -> bool:
    return o.get("kind") == "Secret" and (o.get("metadata", {}).get("labels") or {}).get("owner") == "helm"


def lint(values: dict) -> list[dict]:
    """helm lint of a copy of the chart whose values.yaml has `values` merged in (the
    Lint action takes no values). Returns the messages (Severity 1 info, 2 warning,
    3 error; helm-sdkpy drops their text)."""
    tmp = tempfile.mkdtemp(prefix="chart-", dir=WORK)
    dst = os.path.join(tmp, "toolgrid")
    shutil.copytree(CHART, dst)
    if values:
        with open(os.path.join(dst, "values.yaml"), "w") as f:
            yaml.safe_dump(deep_merge(DEFAULTS, values), f, sort_keys=False)
    with helm_sdkpy.Configuration(namespace="toolgrid") as cfg:
        res = run(helm_sdkpy.Lint(cfg).run(dst))
    shutil.rmtree(tmp, ignore_errors=True)
    return res.get("Messages") or []


# -------------------------------------------------------------------------- invariants

STANDARD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                   "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                   "app.kubernetes.io/part-of")
CLUSTER_SCOPED = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Namespace"}
CRD_NAMES = {f"{p}.toolgrid.dev" for p in
             ("tools", "toolreleases", "toolbindings", "middlewares", "agents", "workerpools",
              "toolsources")}
KINDS = ["tools", "toolreleases", "toolbindings", "middlewares", "agents", "workerpools",
         "toolsources"]


def perms(rules) -> set:
    """The permissions a list of PolicyRules grants: (group, resource, verb, name|None)."""
    out = set()
    for r in rules or []:
        for key in ("nonResourceURLs",):
            if r.get(key):
                raise CheckFailed(f"rule with {key}: {r}")
        names = r.get("resourceNames") or [None]
        for g in r.get("apiGroups") or []:
            for res in r.get("resources") or []:
                for verb in r.get("verbs") or []:
                    for n in names:
                        if "*" in (g, res, verb):
                            raise CheckFailed(f"wildcard in RBAC rule {r}")
                        out.add((g, res, verb, n))
    return out


def expected_namespaced_perms() -> set:
    p = set()
    for k in KINDS:
        p |= {("toolgrid.dev", k, v, None) for v in ("get", "list", "watch")}
        p |= {("toolgrid.dev", f"{k}/status", v, None) for v in ("get", "patch", "update")}
    p.add(("toolgrid.dev", "toolreleases", "patch", None))
    p.add(("toolgrid.dev", "toolsources", "patch", None))
    p.add(("toolgrid.dev", "toolreleases/finalizers", "update", None))
    for res in ("configmaps", "secrets", "serviceaccounts"):
        p |= {("", res, v, None) for v in ("get", "list", "watch")}
    p |= {("", "serviceaccounts", v, None) for v in ("create", "patch")}
    p |= {("apps", "deployments", v, None)
          for v in ("get", "list", "watch", "create", "patch", "update", "delete")}
    p |= {("", "pods", v, None) for v in ("list", "patch")}
    p |= {(g, "events", v, None) for g in ("events.k8s.io", "") for v in ("create", "patch")}
    return p


EXPECTED_CLUSTER_PERMS = {
    ("authentication.k8s.io", "tokenreviews", "create", None),
    ("authorization.k8s.io", "subjectaccessreviews", "create", None),
    *{("apiextensions.k8s.io", "customresourcedefinitions", v, None) for v in ("get", "list", "watch")},
}
EXPECTED_LEASE_PERMS = {
    ("coordination.k8s.io", "leases", "create", None),
    *{("coordination.k8s.io", "leases", v, "toolgrid-controller") for v in ("get", "update", "patch")},
}


class Checker:
    def __init__(self, case: str):
        self.case = case
        self.errors: list[str] = []

    def check(self, cond, msg):
        if not cond:
            self.errors.append(msg)
        return cond

    def eq(self, got, want, what):
        return self.check(got == want, f"{what}: got {got!r}, want {want!r}")


def check_objects(objs: list[dict], overrides: dict, release: str, namespace: str, *,
                  monitoring=False, cert_manager=False, first_install=True) -> list[str]:
    v = deep_merge(DEFAULTS, overrides or {})
    c = Checker("")
    fn = fullname(v, release)
    name = v.get("nameOverride") or CHART_META["name"]
    sa = (v["serviceAccount"].get("name") or fn) if v["serviceAccount"]["create"] else v["serviceAccount"]["name"]
    watch = v.get("watchNamespace") or ""
    pool_ns = watch or namespace
    sqlite = v["store"]["type"] == "sqlite"
    # TLS: off (tls.enabled=false), an existing Secret, cert-manager's Secret, or made by
    # the controller and kept in its own Secret (--tls-self-signed)
    if not v["tls"]["enabled"]:
        tls_mode = "off"
    elif v["tls"].get("secretName"):
        tls_mode = "secret"
    elif cert_manager:
        tls_mode = "cert-manager"
    else:
        tls_mode = "self-signed"
    tls = {"secret": v["tls"].get("secretName"), "cert-manager": f"{fullname(v, release)}-tls"}.get(tls_mode, "")
    ca_key = "ca.crt" if tls_mode == "cert-manager" else v["tls"]["caKey"]
    image = (f"{v['image']['repository']}@{v['image']['digest']}" if v["image"].get("digest")
             else f"{v['image']['repository']}:{v['image'].get('tag') or APP_VERSION}")

    by = {}
    for o in objs:
        md = o.get("metadata") or {}
        key = (o.get("kind"), md.get("namespace", ""), md.get("name"))
        c.check(key not in by, f"{key} created twice")
        by[key] = o
        kind = o.get("kind")
        c.check(o.get("apiVersion") and kind and md.get("name"), f"object without apiVersion/kind/name: {o}")
        if kind in CLUSTER_SCOPED:
            c.check(not md.get("namespace"), f"{kind} {md.get('name')} is cluster-scoped but has a namespace")
        else:
            c.check(bool(md.get("namespace")), f"{kind} {md.get('name')} has no metadata.namespace")
        labels = md.get("labels") or {}
        if kind == "CustomResourceDefinition":
            c.eq((md.get("annotations") or {}).get("helm.sh/resource-policy"), "keep",
                 f"CRD {md.get('name')} annotation helm.sh/resource-policy")
            continue
        for lab in STANDARD_LABELS:
            c.check(lab in labels, f"{kind} {md.get('name')} lacks label {lab}")
        c.eq(labels.get("app.kubernetes.io/name"), name, f"{kind} {md.get('name')} label name")
        c.eq(labels.get("app.kubernetes.io/instance"), release, f"{kind} {md.get('name')} label instance")
        c.eq(labels.get("app.kubernetes.io/version"), APP_VERSION, f"{kind} {md.get('name')} label version")
        c.eq(labels.get("app.kubernetes.io/managed-by"), "Helm", f"{kind} {md.get('name')} label managed-by")
        c.eq(labels.get("app.kubernetes.io/part-of"), "toolgrid", f"{kind} {md.get('name')} label part-of")

    # ---- the set of objects
    want = set()
    if v["serviceAccount"]["create"]:
        want.add(("ServiceAccount", namespace, sa))
    want |= {("Deployment", namespace, fn), ("Service", namespace, fn),
             ("ClusterRole", "", fn), ("ClusterRoleBinding", "", fn),
             ("Role", namespace, f"{fn}-leader-election"),
             ("RoleBinding", namespace, f"{fn}-leader-election"),
             # the controller keeps its identity signing keys in one Secret of its namespace
             ("Role", namespace, f"{fn}-identity-keys"),
             ("RoleBinding", namespace, f"{fn}-identity-keys")}
    if watch:
        want |= {("Role", watch, fn), ("RoleBinding", watch, fn)}
    if tls_mode == "self-signed":
        # the controller keeps its CA in one Secret of its namespace
        want |= {("Role", namespace, f"{fn}-self-signed-tls"),
                 ("RoleBinding", namespace, f"{fn}-self-signed-tls")}
    if sqlite:
        want.add(("PersistentVolumeClaim", namespace, f"{fn}-data"))
    if v["crds"]["install"]:
        want |= {("CustomResourceDefinition", "", n) for n in CRD_NAMES}
    if v["defaultWorkerPool"]["enabled"]:
        want.add(("WorkerPool", pool_ns, v["defaultWorkerPool"]["name"]))
    if v["serviceMonitor"]["enabled"] and monitoring:
        want.add(("ServiceMonitor", namespace, fn))
    if tls_mode == "cert-manager":
        want |= {("Issuer", namespace, f"{fn}-selfsigned"), ("Certificate", namespace, f"{fn}-ca"),
                 ("Issuer", namespace, f"{fn}-ca"), ("Certificate", namespace, f"{fn}-tls")}
    got = set(by)
    c.check(got == want, f"objects: missing {sorted(want - got)}, unexpected {sorted(got - want)}")

    # ---- Deployment
    dep = by.get(("Deployment", namespace, fn))
    svc = by.get(("Service", namespace, fn))
    if dep:
        spec = dep["spec"]
        sel = spec["selector"]["matchLabels"]
        tmpl = spec["template"]
        pod_labels = tmpl["metadata"]["labels"]
        c.eq(sel, {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": release,
                   "app.kubernetes.io/component": "controller"}, "Deployment selector")
        c.check(all(pod_labels.get(k) == x for k, x in sel.items()), "pod labels do not match the selector")
        c.eq(spec.get("replicas"), v["replicaCount"], "Deployment replicas")
        c.eq(spec.get("strategy"), {"type": "Recreate"}, "Deployment strategy")
        pod = tmpl["spec"]
        c.eq(pod.get("serviceAccountName"), sa, "serviceAccountName")
        psc = pod.get("securityContext") or {}
        c.eq(psc.get("runAsNonRoot"), True, "pod runAsNonRoot")
        c.eq(psc.get("runAsUser"), 65532, "pod runAsUser")
        c.eq(psc.get("fsGroup"), 65532, "pod fsGroup")
        conts = pod.get("containers") or []
        c.eq([x.get("name") for x in conts], ["controller"], "containers")
        if conts:
            ct = conts[0]
            c.eq(ct.get("image"), image, "controller image")
            args = ct.get("args") or []
            c.eq(args[:1], ["controller"], "first arg (subcommand)")
            flags = {}
            for a in args[1:]:
                m = re.fullmatch(r"--([a-z-]+)=(.*)", a)
                if c.check(m, f"arg {a!r} is not --flag=value"):
                    c.check(m.group(1) not in flags, f"flag --{m.group(1)} given twice")
                    flags[m.group(1)] = m.group(2)
            want_flags = {
                "listen": "0.0.0.0:7070", "http-listen": "0.0.0.0:7071",
                "metrics-listen": "0.0.0.0:9090",
                "worker-image": v.get("workerImage") or image,
                "control-plane-address": f"{'http' if tls_mode == 'off' else 'https'}://{fn}.{namespace}.svc:{v['service']['grpcPort']}",
                "lease": v["workerLease"],
                "max-queued-per-agent": str(v["maxQueuedPerAgent"]),
                "identity-secret": f"{fn}-identity-keys",
            }
            if sqlite:
                want_flags["store"] = "sqlite:///var/lib/toolgrid/toolgrid.db"
            if watch:
                want_flags["watch-namespace"] = watch
            if v["otlp"].get("endpoint"):
                want_flags["otlp-endpoint"] = v["otlp"]["endpoint"]
            if v["store"].get("retain"):
                want_flags["retain"] = v["store"]["retain"]
            if v["builtins"]["enabled"]:
                want_flags["builtins"] = "/usr/share/toolgrid/builtins/manifests" + (
                    ",/usr/share/toolgrid/builtins/python" if v["builtins"]["python"] else "")
                want_flags["builtins-namespace"] = v["builtins"].get("namespace") or watch or namespace
            if tls:
                want_flags["tls-cert"] = "/etc/toolgrid/tls/tls.crt"
                want_flags["tls-key"] = "/etc/toolgrid/tls/tls.key"
                want_flags["worker-tls-ca"] = f"/etc/toolgrid/tls/{ca_key}"
            if tls_mode == "self-signed":
                want_flags["tls-self-signed"] = "true"
                want_flags["tls-self-signed-secret"] = f"{fn}-self-signed-tls"
            art = v["artifacts"]
            if art.get("allowedHosts"):
                want_flags["artifact-hosts"] = ",".join(art["allowedHosts"])
            if art.get("allowPrivate"):
                want_flags["artifact-allow-private"] = "true"
            if art.get("proxy"):
                want_flags["artifact-proxy"] = art["proxy"]
            c.eq(flags, want_flags, "controller flags")
            env = ct.get("env") or []
            names = [e["name"] for e in env]
            c.eq(len(names), len(set(names)), f"duplicate env names {names}")
            envd = {e["name"]: e for e in env}
            c.eq(envd.get("POD_NAME", {}).get("valueFrom"), {"fieldRef": {"fieldPath": "metadata.name"}}, "env POD_NAME")
            c.eq(envd.get("POD_NAMESPACE", {}).get("valueFrom"), {"fieldRef": {"fieldPath": "metadata.namespace"}}, "env POD_NAMESPACE")
            if sqlite:
                c.check("TOOLGRID_STORE" not in envd, "TOOLGRID_STORE set with the sqlite store")
            else:
                c.eq(envd.get("TOOLGRID_STORE", {}).get("valueFrom"),
                     {"secretKeyRef": {"name": v["store"]["postgres"]["existingSecret"],
                                       "key": v["store"]["postgres"]["secretKey"]}}, "env TOOLGRID_STORE")
            ports = {p["name"]: p for p in ct.get("ports") or []}
            c.eq({k: (p["containerPort"], p.get("protocol", "TCP")) for k, p in ports.items()},
                 {"grpc": (7070, "TCP"), "http": (7071, "TCP"), "metrics": (9090, "TCP")}, "container ports")

            def probe_target(p):
                hg = (p or {}).get("httpGet") or {}
                port = hg.get("port")
                if isinstance(port, str):
                    port = ports.get(port, {}).get("containerPort")
                return hg.get("path"), port
            c.eq(probe_target(ct.get("livenessProbe")), ("/health", 9090), "livenessProbe")
            c.eq(probe_target(ct.get("readinessProbe")), ("/ready", 9090), "readinessProbe")
            sc = ct.get("securityContext") or {}
            c.eq(sc.get("readOnlyRootFilesystem"), True, "readOnlyRootFilesystem")
            c.eq(sc.get("allowPrivilegeEscalation"), False, "allowPrivilegeEscalation")
            c.eq((sc.get("capabilities") or {}).get("drop"), ["ALL"], "capabilities.drop")
            c.check(ct.get("resources"), "controller has no resources")
            mounts = {m["mountPath"]: m["name"] for m in ct.get("volumeMounts") or []}
            c.eq(set(mounts), {"/var/lib/toolgrid", "/tmp"} | ({"/etc/toolgrid/tls"} if tls else set()),
                 "volume mounts")
            vols = {x["name"]: x for x in pod.get("volumes") or []}
            data = vols.get(mounts.get("/var/lib/toolgrid"), {})
            if sqlite:
                c.eq(data.get("persistentVolumeClaim"), {"claimName": f"{fn}-data"}, "data volume")
            else:
                c.check("emptyDir" in data, "data volume is not an emptyDir with postgres")
            c.check("emptyDir" in vols.get(mounts.get("/tmp"), {}), "/tmp is not an emptyDir")
            if tls:
                c.eq(vols.get(mounts.get("/etc/toolgrid/tls"), {}).get("secret", {}).get("secretName"),
                     tls, "TLS volume")
    if tls_mode == "cert-manager":
        cert = by.get(("Certificate", namespace, f"{fn}-tls")) or {"spec": {}}
        cs = cert["spec"]
        c.eq(cs.get("secretName"), tls, "Certificate secretName")
        c.eq(cs.get("dnsNames"), [fn, f"{fn}.{namespace}", f"{fn}.{namespace}.svc",
                                  f"{fn}.{namespace}.svc.cluster.local"], "Certificate dnsNames")
        c.eq(cs.get("issuerRef"), {"group": "cert-manager.io", "kind": "Issuer", "name": f"{fn}-ca"},
             "Certificate issuer")
        ca = (by.get(("Certificate", namespace, f"{fn}-ca")) or {"spec": {}})["spec"]
        c.eq(ca.get("isCA"), True, "CA Certificate isCA")
        c.eq((by.get(("Issuer", namespace, f"{fn}-ca")) or {"spec": {}})["spec"].get("ca"),
             {"secretName": f"{fn}-ca"}, "CA Issuer")
    if svc:
        s = svc["spec"]
        if dep:
            c.eq(s.get("selector"), dep["spec"]["selector"]["matchLabels"], "Service selector")
        c.eq(s.get("type"), v["service"]["type"], "Service type")
        c.eq({p["name"]: (p["port"], p["targetPort"]) for p in s.get("ports") or []},
             {"grpc": (v["service"]["grpcPort"], "grpc"), "http": (v["service"]["httpPort"], "http"),
              "metrics": (v["service"]["metricsPort"], "metrics")}, "Service ports")

    # ---- RBAC
    subjects = [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]
    ns_perms = expected_namespaced_perms()
    cr = by.get(("ClusterRole", "", fn))
    if cr:
        c.eq(perms(cr.get("rules")), EXPECTED_CLUSTER_PERMS | (set() if watch else ns_perms),
             "ClusterRole permissions")
    if watch and ("Role", watch, fn) in by:
        c.eq(perms(by[("Role", watch, fn)].get("rules")), ns_perms, f"Role in {watch} permissions")
    lease = by.get(("Role", namespace, f"{fn}-leader-election"))
    if lease:
        c.eq(perms(lease.get("rules")), EXPECTED_LEASE_PERMS, "leader-election Role permissions")
    tls_role = by.get(("Role", namespace, f"{fn}-self-signed-tls"))
    if tls_role:
        c.eq(perms(tls_role.get("rules")),
             {("", "secrets", "create", None),
              *{("", "secrets", v, f"{fn}-self-signed-tls") for v in ("get", "update")}},
             "self-signed TLS Role permissions")
    identity_role = by.get(("Role", namespace, f"{fn}-identity-keys"))
    if identity_role:
        c.eq(perms(identity_role.get("rules")),
             {("", "secrets", "create", None),
              *{("", "secrets", v, f"{fn}-identity-keys") for v in ("get", "update")}},
             "identity keys Role permissions")
    for kind, bns, bname, rkind in (("ClusterRoleBinding", "", fn, "ClusterRole"),
                                    ("RoleBinding", watch, fn, "Role"),
                                    ("RoleBinding", namespace, f"{fn}-leader-election", "Role"),
                                    ("RoleBinding", namespace, f"{fn}-self-signed-tls", "Role"),
                                    ("RoleBinding", namespace, f"{fn}-identity-keys", "Role")):
        b = by.get((kind, bns, bname))
        if b:
            c.eq(b.get("roleRef"), {"apiGroup": "rbac.authorization.k8s.io", "kind": rkind, "name": bname},
                 f"{kind} {bname} roleRef")
            c.eq(b.get("subjects"), subjects, f"{kind} {bname} subjects")

    # ---- PVC
    pvc = by.get(("PersistentVolumeClaim", namespace, f"{fn}-data"))
    if pvc:
        c.eq(pvc["spec"]["resources"]["requests"]["storage"], str(v["store"]["sqlite"]["size"]), "PVC size")
        sc_name = v["store"]["sqlite"].get("storageClass") or ""
        want_sc = {"": None, "-": ""}.get(sc_name, sc_name)
        c.eq(pvc["spec"].get("storageClassName"), want_sc, "PVC storageClassName")

    # ---- WorkerPool
    pool = by.get(("WorkerPool", pool_ns, v["defaultWorkerPool"]["name"]))
    if pool:
        p = v["defaultWorkerPool"]
        c.eq(pool["spec"], {"replicas": p["replicas"], "slotsPerWorker": p["slotsPerWorker"],
                            **({"resources": p["resources"]} if p.get("resources") else {})}, "WorkerPool spec")
        ann = pool["metadata"].get("annotations") or {}
        hook = first_install and v["crds"]["install"]
        c.eq(ann.get("helm.sh/hook"), "post-install" if hook else None, "WorkerPool hook annotation")
        c.eq(ann.get("meta.helm.sh/release-name"), release, "WorkerPool release annotation")

    # ---- ServiceMonitor
    smon = by.get(("ServiceMonitor", namespace, fn))
    if smon and svc:
        c.eq(smon["spec"]["selector"]["matchLabels"], svc["spec"]["selector"], "ServiceMonitor selector")
        c.eq([(e.get("port"), e.get("path")) for e in smon["spec"]["endpoints"]], [("metrics", "/metrics")],
             "ServiceMonitor endpoints")
        svc_labels = svc["metadata"]["labels"]
        c.check(all(svc_labels.get(k) == x for k, x in smon["spec"]["selector"]["matchLabels"].items()),
                "ServiceMonitor selector does not select the Service")
    return c.errors


# ------------------------------------------------------------------------------ cases

PG = {"store": {"type": "postgres", "postgres": {"existingSecret": "toolgrid-postgres"}}}
CASES = [
    # name, values, options
    ("default", {}, {}),
    ("postgres", {**PG, "replicaCount": 2}, {}),
    ("watch-namespace-no-pool", {"watchNamespace": "agents", "defaultWorkerPool": {"enabled": False}}, {}),
    ("watch-namespace", {"watchNamespace": "agents"}, {}),
    ("crds-external", {"crds": {"install": False}}, {"preinstalled_crds": True}),
    ("service-monitor", {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}, {"monitoring": True}),
    ("service-monitor-no-api", {"serviceMonitor": {"enabled": True}}, {}),
    ("customized", {"fullnameOverride": "tg", "image": {"digest": "sha256:" + "ab" * 32},
                    "workerImage": "registry.example/toolgrid-worker:1", "otlp": {"endpoint": "http://otel.observability:4317"},
                    "service": {"grpcPort": 443, "type": "LoadBalancer"}, "workerLease": "5s", "maxQueuedPerAgent": 50,
                    "store": {"sqlite": {"storageClass": "-", "size": "10Gi"}, "retain": "7d"},
                    "serviceAccount": {"name": "toolgrid-controller"},
                    "extraEnv": [{"name": "RUST_LOG", "value": "info"}],
                    "defaultWorkerPool": {"replicas": 5, "slotsPerWorker": 64}}, {}),
    ("client-side-apply", {}, {"ssa": False}),
    ("tls", {"tls": {"secretName": "toolgrid-tls", "caKey": "tls.crt"}}, {}),
    ("tls-cert-manager", {}, {"cert_manager": True}),
    ("tls-off", {"tls": {"enabled": False}}, {}),
    ("artifacts", {"artifacts": {"allowedHosts": ["*.example.org", "ghcr.io"], "allowPrivate": True,
                                 "proxy": "http://proxy.infra:3128"}}, {}),
]
BAD = [
    ("sqlite-replicas", {"replicaCount": 2}, ["replicaCount"],
     "replicaCount is 2 but store.type is sqlite"),
    ("postgres-no-secret", {"store": {"type": "postgres"}}, ["existingSecret"],
     "store.postgres.existingSecret is empty"),
]


def render_case(name, values, opts, release, namespace):
    v = deep_merge(DEFAULTS, values)
    extra = [v["watchNamespace"]] if v.get("watchNamespace") else []
    cluster = Cluster(namespace, extra, preinstalled_crds=opts.get("preinstalled_crds", False),
                      monitoring=opts.get("monitoring", False),
                      cert_manager=opts.get("cert_manager", False))
    try:
        res = cluster.install(release, values, ssa=opts.get("ssa", True))
        objs = cluster.chart_objects()
        errs = check_objects(objs, values, release, namespace, monitoring=opts.get("monitoring", False),
                             cert_manager=opts.get("cert_manager", False), first_install=True)
        notes = (res.get("info") or {}).get("notes") or ""
        if v["serviceMonitor"]["enabled"] and not opts.get("monitoring"):
            if "WARNING: serviceMonitor.enabled" not in notes:
                errs.append("NOTES do not warn that the ServiceMonitor API is missing")
        return objs, res, errs
    finally:
        cluster.stop()


def lint_errors(values) -> list[str]:
    msgs = lint(values)
    sev = {1: "info", 2: "warning", 3: "error"}
    return [f"lint {sev.get(m.get('Severity'), m.get('Severity'))} in {m.get('Path')}"
            for m in msgs if (m.get("Severity") or 0) >= 2]


def lifecycle(release, namespace, ssa=True) -> list[str]:
    """install; upgrade (adopts the default pool, a post-install hook on the first install:
    only its metadata may change); upgrade (changes nothing); upgrade with another pool
    size (changes only the pool); uninstall (leaves only the CRDs)."""
    errs = []
    cl = Cluster(namespace)
    fk = cl.fake
    key = ("toolgrid.dev", "workerpools", namespace, "default")

    def upgrade(values, what, allowed, spec_allowed=()):
        n = len(fk.updated)
        cl.upgrade(release, values, ssa=ssa)
        for k, before, after in fk.updated[n:]:
            if is_release_record(after):
                continue
            if k not in allowed:
                errs.append(f"{what} changed {k}")
            elif k not in spec_allowed and before.get("spec") != after.get("spec"):
                errs.append(f"{what} changed the spec of {k}")

    try:
        cl.install(release, {}, ssa=ssa)
        if key not in fk.objects:
            return ["install: the default WorkerPool was not created"]
        upgrade({}, "the first upgrade (same values)", {key})
        hook = (fk.objects[key]["metadata"].get("annotations") or {}).get("helm.sh/hook")
        if ssa and hook:
            errs.append("the first upgrade left the hook annotation on the adopted pool")
        upgrade({}, "an upgrade with the same values", set())
        upgrade({"defaultWorkerPool": {"replicas": 3}}, "an upgrade of the pool size", {key}, {key})
        pool = fk.objects.get(key)
        if not pool or pool["spec"].get("replicas") != 3:
            errs.append(f"defaultWorkerPool.replicas=3 was not applied: {pool and pool['spec']}")
        cl.uninstall(release)
        left = sorted(k for k in fk.objects if k[1] != "namespaces")
        want = sorted(("apiextensions.k8s.io", "customresourcedefinitions", "", n) for n in CRD_NAMES)
        if left != want:
            errs.append(f"after uninstall: left {left}, want only the CRDs")
    except Exception as e:
        errs.append(f"{type(e).__name__}: {e}")
    finally:
        cl.stop()
    return errs


# ------------------------------------------------------------------------------ deploy

DEPLOY = os.path.join(REPO, "deploy")
DEPLOY_FILES = ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "deployment.yaml",
                "service.yaml", "pvc.yaml", "workerpool.yaml"]
DEPLOY_HEADER = ("# Generated from charts/toolgrid with its default values (release toolgrid,\n"
                 "# namespace toolgrid) by tests/helm/check_chart.py --write-deploy; do not edit.\n")


class Dumper(yaml.SafeDumper):
    """Quotes strings that a YAML 1.1 reader could take for a number or a boolean."""


def _str_representer(dumper, data):
    if re.fullmatch(r"[-+]?[0-9][0-9_.:eE+-]*|(?i:y|n|yes|no|on|off|true|false|null|~)", data) \
            or data == "":
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


Dumper.add_representer(str, _str_representer)


def to_deploy(obj: dict) -> dict:
    """A chart object as a plain manifest: no Helm metadata, managed-by kustomize."""
    obj = copy.deepcopy(obj)

    def fix(meta):
        labels = meta.get("labels")
        if labels:
            labels.pop("helm.sh/chart", None)
            if "app.kubernetes.io/managed-by" in labels:
                labels["app.kubernetes.io/managed-by"] = "kustomize"
        ann = meta.get("annotations")
        if ann is not None:
            for k in list(ann):
                if k.startswith("meta.helm.sh/") or k.startswith("helm.sh/hook"):
                    del ann[k]
            if not ann:
                del meta["annotations"]

    fix(obj["metadata"])
    tmpl = (obj.get("spec") or {}).get("template")
    if isinstance(tmpl, dict) and "metadata" in tmpl:
        fix(tmpl["metadata"])
    return obj


def deploy_files(release="toolgrid", namespace="toolgrid") -> dict[str, str]:
    """deploy/*.yaml as the chart renders them: an install with the default values into a
    cluster that already has the CRDs (so that the WorkerPool is an ordinary object, not a
    first-install hook); the CRDs themselves stay deploy/crds/ (generated by `toolgrid crds`)."""
    cl = Cluster(namespace, preinstalled_crds=True)
    try:
        res = cl.install(release, {"crds": {"install": False}})
    finally:
        cl.stop()
    docs: dict[str, list] = {}
    sources = [("manifest", res.get("manifest") or "")] + \
              [("hook", h.get("manifest", "")) for h in res.get("hooks") or []]
    # The manifest names each document's template: "# Source: toolgrid/templates/<file>".
    for kind, text in sources:
        if kind == "hook":
            for d in yaml.safe_load_all(text):
                if d:
                    docs.setdefault("workerpool.yaml", []).append(d)
            continue
        for chunk in re.split(r"^---\s*$", text, flags=re.M):
            m = re.search(r"^# Source: [^/]+/templates/(\S+)$", chunk, flags=re.M)
            if not m:
                continue
            for d in yaml.safe_load_all(chunk):
                if d and d.get("kind") != "CustomResourceDefinition":
                    docs.setdefault(m.group(1), []).append(d)
    ns_labels = {k: v for k, v in docs["service.yaml"][0]["metadata"]["labels"].items()
                 if k != "app.kubernetes.io/component"}
    docs["namespace.yaml"] = [{"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": namespace, "labels": ns_labels}}]
    out = {}
    for f in DEPLOY_FILES:
        if f not in docs:
            raise CheckFailed(f"the chart rendered nothing for deploy/{f}")
        body = "---\n".join(yaml.dump(to_deploy(d), Dumper=Dumper, sort_keys=False, width=100)
                             for d in docs[f])
        out[f] = DEPLOY_HEADER + body
    extra = set(docs) - set(DEPLOY_FILES) - {"crds.yaml"}
    if extra:
        raise CheckFailed(f"templates {sorted(extra)} render objects that deploy/ does not have")
    return out


def check_deploy(write=False) -> list[str]:
    files = deploy_files()
    errs = []
    for f, text in files.items():
        path = os.path.join(DEPLOY, f)
        if write:
            with open(path, "w") as fh:
                fh.write(text)
            continue
        try:
            with open(path) as fh:
                cur = fh.read()
        except FileNotFoundError:
            cur = None
        if cur != text:
            errs.append(f"deploy/{f} is stale (run tests/helm/check_chart.py --write-deploy)")
    with open(os.path.join(DEPLOY, "kustomization.yaml")) as fh:
        kust = yaml.safe_load(fh)
    want = ["crds/toolgrid.yaml", *DEPLOY_FILES]
    if kust.get("resources") != want:
        errs.append(f"deploy/kustomization.yaml resources: got {kust.get('resources')}, want {want}")
    if kust.get("namespace") != "toolgrid":
        errs.append("deploy/kustomization.yaml does not set namespace: toolgrid")
    return errs


# ---------------------------------------------------------------------------- examples

def check_examples() -> list[str]:
    d = os.path.join(REPO, "examples", "k8s")
    if not os.path.isdir(d):
        return ["examples/k8s/ is missing"]
    crds = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c for c in load_crds()}
    errs, cms, releases = [], {}, []
    for f in sorted(os.listdir(d)):
        if not f.endswith(".yaml"):
            continue
        with open(os.path.join(d, f)) as fh:
            for doc in yaml.safe_load_all(fh):
                if not doc:
                    continue
                kind, api = doc.get("kind"), doc.get("apiVersion", "")
                name = (doc.get("metadata") or {}).get("name")
                where = f"examples/k8s/{f}: {kind} {name}"
                if "namespace" in (doc.get("metadata") or {}):
                    errs.append(f"{where} sets metadata.namespace (the examples go to the current namespace)")
                if kind == "ServiceAccount" and api == "v1":
                    continue
                if kind in ("Role", "RoleBinding") and api == "rbac.authorization.k8s.io/v1":
                    if kind == "Role" and not any(
                            "toolgrid.dev" in r.get("apiGroups", []) and "tools" in r.get("resources", [])
                            and "update" in r.get("verbs", []) for r in doc.get("rules") or []):
                        errs.append(f"{where}: an operator Role must allow update on tools.toolgrid.dev "
                                    "(what the controller's SubjectAccessReview asks)")
                    continue
                if kind == "ConfigMap":
                    cms[name] = doc
                    for k, b64 in (doc.get("binaryData") or {}).items():
                        try:
                            base64.b64decode(b64, validate=True)
                        except Exception:
                            errs.append(f"{where}: binaryData.{k} is not base64")
                    continue
                group, _, version = api.partition("/")
                crd = crds.get((group, kind))
                if not crd:
                    errs.append(f"{where}: not a toolgrid kind, a ConfigMap, a ServiceAccount or RBAC ({api})")
                    continue
                if HAVE_JSONSCHEMA:
                    for e in fakekube.crd_validator(crd, version)(doc) or []:
                        errs.append(f"{where}: {e}")
                if kind == "ToolRelease":
                    releases.append((where, doc))
    # the Tools and ToolReleases are the ones in examples/manifests/, but for the artifact
    mdir = os.path.join(REPO, "examples", "manifests")
    for f in sorted(os.listdir(d)):
        if f.endswith(".yaml") and os.path.exists(os.path.join(mdir, f)):
            with open(os.path.join(d, f)) as a, open(os.path.join(mdir, f)) as b:
                ka = [x for x in yaml.safe_load_all(a) if x]
                kb = [x for x in yaml.safe_load_all(b) if x]
            for x in ka + kb:
                art = (x.get("spec") or {}).get("artifact")
                if isinstance(art, dict):
                    art.pop("file", None)
                    art.pop("configMap", None)
            if any(x.get("kind") == "Tool" for x in kb) and ka != kb:
                errs.append(f"examples/k8s/{f} differs from examples/manifests/{f} (other than the artifact source)")
    for where, rel in releases:
        art = rel["spec"].get("artifact") or {}
        ref = art.get("configMap")
        if not ref:
            errs.append(f"{where}: artifact is not a configMap")
            continue
        cm = cms.get(ref["name"])
        data = ((cm or {}).get("binaryData") or {}).get(ref["key"])
        if data is None:
            errs.append(f"{where}: ConfigMap {ref['name']} key {ref['key']} is not in examples/k8s/")
            continue
        digest = "sha256:" + hashlib.sha256(base64.b64decode(data)).hexdigest()
        if art.get("digest") != digest:
            errs.append(f"{where}: digest {art.get('digest')} but the ConfigMap holds {digest}")
        if len(base64.b64decode(data)) > 1_000_000:
            errs.append(f"{where}: artifact is over 1 MB, too big for a ConfigMap")
    return errs


# --------------------------------------------------------------------------- kubectl

def check_kubectl() -> list[str]:
    """The kubectl steps of docs/kubernetes.md against a fake cluster: the CRDs, then
    `apply -k deploy/`, then the examples; applying each again changes nothing."""
    import subprocess
    kubectl = shutil.which("kubectl")
    if not kubectl:
        log("         (no kubectl here: skipped)")
        return []
    fk = fakekube.FakeKube(namespaces=["agents"], validate_crs=HAVE_JSONSCHEMA)
    url = fk.start()
    home = tempfile.mkdtemp(prefix="kubectl-", dir=WORK)
    kc = os.path.join(home, "kubeconfig")
    with open(kc, "w") as f:
        f.write(fk.kubeconfig(url, "default"))
    env = dict(os.environ, KUBECONFIG=kc, HOME=home)
    errs = []

    def k(*args):
        r = subprocess.run([kubectl, *args], env=env, cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            errs.append(f"kubectl {' '.join(args)}: {(r.stdout + r.stderr).strip()[-800:]}")
        return r.returncode == 0

    def again(*args):
        n = len(fk.updated)
        k(*args)
        changed = [key for key, _, _ in fk.updated[n:]]
        if changed:
            errs.append(f"kubectl {' '.join(args)} again changed {changed}")
    try:
        if (k("apply", "--server-side", "-f", "deploy/crds/toolgrid.yaml")
                and k("wait", "--for", "condition=Established", "--timeout", "30s",
                      "-f", "deploy/crds/toolgrid.yaml")
                and k("apply", "--server-side", "-k", "deploy/")):
            again("apply", "--server-side", "-k", "deploy/")
            if k("-n", "agents", "apply", "-f", "examples/k8s/"):
                again("-n", "agents", "apply", "-f", "examples/k8s/")
        want = {("toolgrid.dev", "workerpools", "toolgrid", "default"),
                ("apps", "deployments", "toolgrid", "toolgrid"),
                ("toolgrid.dev", "toolreleases", "agents", "semver-1.0.0")}
        missing = want - set(fk.objects)
        if missing:
            errs.append(f"not created: {sorted(missing)}")
    finally:
        fk.stop()
    return errs


# ----------------------------------------------------------------------- argo cd lua

LUA_CASES = [  # (object, expected health) for the rows of docs/gitops.md's table
    ({"metadata": {"generation": 1}}, "Progressing"),
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "True"}]}}, "Progressing"),
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": []}}, "Progressing"),
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": [
        {"type": "Ready", "status": "True", "reason": "Released", "message": "ok", "observedGeneration": 2}]}},
     "Healthy"),
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": [
        {"type": "Ready", "status": "False", "reason": "DigestMismatch", "message": "bad digest"}]}},
     "Degraded"),
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": [
        {"type": "Ready", "status": "False", "reason": "DigestMismatch", "message": "bad digest"},
        {"type": "Stalled", "status": "True", "reason": "DigestMismatch", "message": "bad digest"}]}},
     "Degraded"),
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": [
        {"type": "Ready", "status": "False", "reason": "ArtifactNotFound", "message": "no ConfigMap"},
        {"type": "Reconciling", "status": "True", "reason": "ArtifactNotFound", "message": "no ConfigMap"}]}},
     "Progressing"),
    ({"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": [
        {"type": "Reconciling", "status": "False"},
        {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "bad"}]}},
     "Degraded"),
    ({"metadata": {"generation": 3}, "status": {"observedGeneration": 3, "conditions": [
        {"type": "Ready", "status": "True", "observedGeneration": 2}]}}, "Progressing"),
    ({"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "Unknown"}]}}, "Progressing"),
    ({"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "conditions": [
        {"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]}}, "Healthy"),
]


def _lua_literal(v) -> str:
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "{" + ", ".join(_lua_literal(x) for x in v) + "}"
    return "{" + ", ".join(f"[{json.dumps(k)}] = {_lua_literal(x)}" for k, x in v.items()) + "}"


def check_argocd_health() -> list[str]:
    """The Argo CD health check in docs/gitops.md: one script for all six kinds, and it
    gives the documented health for each case (run with Lua 5.1, as Argo CD's gopher-lua)."""
    import subprocess
    with open(os.path.join(REPO, "docs", "gitops.md")) as f:
        text = f.read()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    cms = [yaml.safe_load(b) for b in blocks if "argocd-cm" in b]
    if not cms:
        return ["docs/gitops.md has no argocd-cm ConfigMap"]
    data = cms[0]["data"]
    keys = [f"resource.customizations.health.toolgrid.dev_{k}" for k in
            ("Tool", "ToolRelease", "ToolBinding", "Middleware", "Agent", "WorkerPool")]
    errs = [f"argocd-cm lacks {k}" for k in keys if k not in data]
    scripts = {data.get(k) for k in keys}
    if len(scripts) != 1:
        errs.append("argocd-cm: the six kinds do not share one script")
    script = data.get(keys[0]) or ""
    lua = next((shutil.which(x) for x in ("lua5.1", "luajit", "lua") if shutil.which(x)), None)
    if not lua:
        log("         (no lua5.1 here: the script was not run)")
        return errs
    for obj, want in LUA_CASES:
        prog = (f"obj = {_lua_literal(obj)}\nlocal function check()\n{script}\nend\n"
                "local hs = check()\nio.write(hs.status, '|', hs.message or '')\n")
        out = subprocess.run([lua, "-"], input=prog, capture_output=True, text=True, timeout=30)
        got = out.stdout.split("|")[0]
        if out.returncode != 0 or got != want:
            errs.append(f"health of {json.dumps(obj)}: got {out.stdout!r} {out.stderr.strip()}, want {want}")
    return errs


# ---------------------------------------------------------------------- values docs

def check_values_docs() -> list[str]:
    """docs/kubernetes.md's values table has a row for every value, and no other rows."""
    with open(os.path.join(REPO, "docs", "kubernetes.md")) as f:
        text = f.read()
    m = re.search(r"^## Values\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    if not m:
        return ["docs/kubernetes.md has no '## Values' section"]
    rows = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", m.group(1), flags=re.M))
    errs, seen = [], set()

    def walk(node, prefix):
        for k, v in node.items():
            path = f"{prefix}{k}"
            if path in rows:
                seen.add(path)
            elif isinstance(v, dict) and v:
                walk(v, path + ".")
            else:
                errs.append(f"docs/kubernetes.md: no row for the value {path}")
    walk(DEFAULTS, "")
    errs += [f"docs/kubernetes.md: row {r} is not a value" for r in sorted(rows - seen)]
    schema_path = os.path.join(CHART, "values.schema.json")
    with open(schema_path) as f:
        schema = json.load(f)
    if HAVE_JSONSCHEMA:
        import jsonschema as js
        js.Draft7Validator.check_schema(schema)
        errs += [f"values.yaml breaks values.schema.json: {e.message}"
                 for e in js.Draft7Validator(schema).iter_errors(DEFAULTS)]
    return errs


# ---------------------------------------------------------------------------------- main

# Helm's install order of kinds (others after them), for a stable output order
KIND_ORDER = ["Namespace", "ServiceAccount", "Secret", "ConfigMap", "PersistentVolumeClaim",
              "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role",
              "RoleBinding", "Service", "Deployment"]


def dump(objs, fmt) -> str:
    def key(o):
        kind = o.get("kind")
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        md = o.get("metadata") or {}
        return (rank, kind, md.get("namespace") or "", md.get("name") or "")
    objs = sorted(objs, key=key)
    if fmt == "json":
        return json.dumps(objs, indent=2) + "\n"
    return yaml.dump_all(objs, Dumper=Dumper, sort_keys=False, explicit_start=True, width=100)


def main():
    global VERBOSE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--values", help="values as a JSON object, merged over the chart's defaults")
    ap.add_argument("--output", help="write the objects to FILE instead of stdout")
    ap.add_argument("--format", choices=("yaml", "json"), default="yaml")
    ap.add_argument("--release", default="toolgrid")
    ap.add_argument("--namespace", default="toolgrid")
    ap.add_argument("--cert-manager", action="store_true",
                    help="with --values: the fake cluster serves cert-manager.io/v1")
    ap.add_argument("--write-deploy", action="store_true", help="regenerate deploy/*.yaml")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    VERBOSE = a.verbose
    if a.values is not None:
        try:
            values = json.loads(a.values)
        except json.JSONDecodeError as e:
            ap.error(f"--values is not JSON: {e}")
        if not isinstance(values, dict):
            ap.error("--values must be a JSON object")
    t_all = time.monotonic()
    log(f"check_chart.py: Helm {HELM_VERSION} (helm-sdkpy), chart {CHART}")
    if not HAVE_JSONSCHEMA:
        log("check_chart.py: note: jsonschema is not installed; custom resources are not validated against the CRD schemas")

    if a.write_deploy:
        check_deploy(write=True)
        log("check_chart.py: wrote " + ", ".join(f"deploy/{f}" for f in DEPLOY_FILES))
        return 0

    failures: list[str] = []
    timings: list[tuple[str, float]] = []

    def step(label, fn):
        t = time.monotonic()
        try:
            errs = fn()
        except CheckFailed as e:
            errs = [str(e)]
        except Exception as e:
            errs = [f"{type(e).__name__}: {e}"]
        dt = time.monotonic() - t
        timings.append((label, dt))
        status = "ok" if not errs else "FAIL"
        log(f"  {status:4} {label} ({dt:.2f}s)")
        for e in errs:
            log(f"         - {e}")
            failures.append(f"{label}: {e}")
        return errs

    primary = {}

    def install_step(name, values, opts, keep=False):
        def fn():
            lerr = lint_errors(values)
            if lerr:
                # the Lint action loses the messages; an install says what is wrong
                cl = Cluster(a.namespace)
                try:
                    cl.install(a.release, values)
                except Exception as e:
                    lerr.append(f"install says: {e}")
                finally:
                    cl.stop()
                return lerr
            objs, res, errs = render_case(name, values, opts, a.release, a.namespace)
            if keep:
                primary["objs"] = objs
            return errs
        return step(f"lint + install: {name}", fn)

    if a.values is not None:
        install_step("--values", values, {"cert_manager": a.cert_manager}, keep=True)
    else:
        log("check_chart.py: lint and install each case into a fresh fake cluster")
        for name, values, opts in CASES:
            install_step(name, values, opts, keep=(name == "default"))

        log("check_chart.py: values that must be refused")
        for name, values, schema_words, template_msg in BAD:
            def bad(values=values, schema_words=schema_words, template_msg=template_msg):
                errs = []
                if not lint_errors(values):
                    errs.append("helm lint accepted them")
                for skip_schema in (False, True):
                    cl = Cluster(a.namespace)
                    try:
                        cl.install(a.release, values, skip_schema=skip_schema)
                        errs.append(f"install (skip_schema_validation={skip_schema}) succeeded")
                    except helm_sdkpy.HelmError as e:
                        msg = str(e)
                        want = [template_msg] if skip_schema else schema_words
                        if not all(w in msg for w in want):
                            errs.append(f"unclear error (skip_schema_validation={skip_schema}): {msg}")
                        elif VERBOSE:
                            log(f"         refused: {msg}")
                    finally:
                        cl.stop()
                    if cl.fake.created:
                        errs.append("objects were created")
                return errs
            step(f"refused: {name}", bad)

        log("check_chart.py: life cycle")
        for ssa in (True, False):
            step(f"install, upgrade x3, uninstall ({'server' if ssa else 'client'}-side apply)",
                 lambda ssa=ssa: lifecycle(a.release, a.namespace, ssa))
        log("check_chart.py: plain manifests and examples")
        step("deploy/ is what the chart renders", check_deploy)
        step("examples/k8s/ validate against the CRDs", check_examples)
        step("kubectl: the CRDs, apply -k deploy/, the examples, each twice", check_kubectl)
        step("the Argo CD health check in docs/gitops.md", check_argocd_health)
        step("docs/kubernetes.md documents every value", check_values_docs)

    total = time.monotonic() - t_all
    if primary.get("objs") is not None:
        text = dump(primary["objs"], a.format)
        if a.output:
            with open(a.output, "w") as fh:
                fh.write(text)
        else:
            sys.stdout.write(text)
    slowest = sorted(timings, key=lambda x: -x[1])[:3]
    log(f"check_chart.py: {len(timings)} checks in {total:.1f}s (slowest: "
        + ", ".join(f"{n} {t:.1f}s" for n, t in slowest) + ")")
    if failures:
        log(f"check_chart.py: FAILED ({len(failures)} problems)")
        return 1
    log("check_chart.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A minimal, in-memory Kubernetes API server for rendering a chart with real Helm.

It serves just enough of the API for `helm install` / `upgrade` / `uninstall` (Helm 4,
server-side or client-side apply, no --wait) and for `kubectl apply`, over plain HTTP on
127.0.0.1, and records every request:

- /version, and discovery (/api, /api/v1, /apis, /apis/<group>/<version>) in the legacy,
  non-aggregated format, which client-go falls back to;
- the built-in kinds a chart like toolgrid's uses, plus any group a CustomResourceDefinition
  adds: like a real cluster, a CRD's kind is served only once the CRD has been created (or
  was seeded with `crds=`), so creating a CRD and an object of its kind in one go fails
  here as it does on a cluster ("ensure CRDs are installed first");
- TokenReviews and SubjectAccessReviews are answered from `tokens` (token -> (username,
  audiences)) and `operators` (users or groups allowed), which tests fill; any other token
  is not authenticated, anyone else is not allowed;
- custom resources are validated against their CRD's schema, strictly (an unknown field
  is an error, as with `fieldValidation=Strict`);
- /openapi/v3 (an index and, per group/version, PATCH operations that accept
  `fieldValidation`, so clients leave field validation to the server);
- GET (one object, or a list filtered by labelSelector / fieldSelector metadata.name /
  metadata.namespace, in pages with `limit` and `continue`), metadata-only GET and list
  (`Accept: ...;as=PartialObjectMetadata` / `PartialObjectMetadataList`: objects of kind
  PartialObjectMetadata, meta.k8s.io/v1), POST (create: 409 if it exists, 404 if its namespace does not), PUT, PATCH (server-side
  apply with per-manager field removal, JSON merge patch, strategic merge patch
  approximated as a merge patch, JSON patch), DELETE; `?dryRun=All` stores nothing;
- watches (`?watch=true`) as client-go and kube-rs use them: newline-delimited JSON events
  (ADDED, MODIFIED, DELETED) in a chunked response, flushed one by one, of every change
  after the `resourceVersion` asked for ("" or "0": from now on), filtered by namespace,
  labelSelector (an object that starts or stops matching is ADDED or DELETED, as on a
  cluster) and fieldSelector; periodic BOOKMARK events with `allowWatchBookmarks=true`;
  the stream ends cleanly after `timeoutSeconds`. `sendInitialEvents` (watch-list) is
  refused, so clients list, then watch;
- optimistic concurrency: a PUT, patch or apply naming a resourceVersion other than the
  current one is a 409 Conflict;
- deletion as on a cluster: an object with finalizers gets metadata.deletionTimestamp
  (and a new generation) and goes away once its last finalizer is removed; no finalizer
  may be added meanwhile. There is no garbage collector: deleting an owner deletes
  nothing else;
- the status subresource of custom resources (CRDs with `subresources.status`): writes to
  the object leave its status alone (a create drops it), writes to /status change only
  the status; fields the schema does not declare are pruned with a `Warning` header (or
  refused with `fieldValidation=Strict`), as a cluster does, and recorded in `warnings`;
- a little validation of built-in kinds (object names, labels, ownerReferences;
  Deployments, events.k8s.io Events, Leases) where a cluster would refuse a request;
- Helm's release records are Secrets, which client-go sends as protobuf: enough of it is
  decoded for a v1 Secret.

Objects are stored as sent (plus uid, resourceVersion, generation, creationTimestamp).
`created` lists every object created, as sent; `updated` every real change (a no-op update
changes nothing, not even resourceVersion); `deleted` every deletion; `requests` every
request as (method, path, code) and `request_log` the same with its headers and body;
`applied` the last configuration each field manager applied, by object and subresource
(`applied[key][manager]` for the object, `applied[key][(manager, "status")]` for its
status); `watch_events` every change a watch can see; `noops` every write that changed
nothing; `warnings` every Warning header sent.
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import re
import select
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# (group, version) -> [(plural, kind, namespaced, verbs, singular)]
BUILTIN = {
    ("", "v1"): [
        ("namespaces", "Namespace", False),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("secrets", "Secret", True),
        ("configmaps", "ConfigMap", True),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("persistentvolumes", "PersistentVolume", False),
        ("pods", "Pod", True),
        ("events", "Event", True),
        ("endpoints", "Endpoints", True),
        ("nodes", "Node", False),
    ],
    ("apps", "v1"): [
        ("deployments", "Deployment", True),
        ("statefulsets", "StatefulSet", True),
        ("daemonsets", "DaemonSet", True),
        ("replicasets", "ReplicaSet", True),
    ],
    ("batch", "v1"): [("jobs", "Job", True), ("cronjobs", "CronJob", True)],
    ("rbac.authorization.k8s.io", "v1"): [
        ("clusterroles", "ClusterRole", False),
        ("clusterrolebindings", "ClusterRoleBinding", False),
        ("roles", "Role", True),
        ("rolebindings", "RoleBinding", True),
    ],
    ("apiextensions.k8s.io", "v1"): [
        ("customresourcedefinitions", "CustomResourceDefinition", False),
    ],
    ("coordination.k8s.io", "v1"): [("leases", "Lease", True)],
    ("events.k8s.io", "v1"): [("events", "Event", True)],
    ("authentication.k8s.io", "v1"): [("tokenreviews", "TokenReview", False)],
    ("authorization.k8s.io", "v1"): [("subjectaccessreviews", "SubjectAccessReview", False)],
    ("networking.k8s.io", "v1"): [
        ("networkpolicies", "NetworkPolicy", True),
        ("ingresses", "Ingress", True),
    ],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    ("storage.k8s.io", "v1"): [("storageclasses", "StorageClass", False)],
}

# The Prometheus Operator's ServiceMonitor, served only when asked for (`monitoring=True`).
MONITORING = {
    ("monitoring.coreos.com", "v1"): [
        ("servicemonitors", "ServiceMonitor", True),
        ("podmonitors", "PodMonitor", True),
    ],
}

# cert-manager's kinds, served only when asked for (`cert_manager=True`).
CERT_MANAGER = {
    ("cert-manager.io", "v1"): [
        ("issuers", "Issuer", True),
        ("clusterissuers", "ClusterIssuer", False),
        ("certificates", "Certificate", True),
    ],
}

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class _Watch(Exception):
    """A watch request, served by the HTTP handler: what to stream and for how long."""

    def __init__(self, timeout: float, group="", plural="", namespace="", kind="",
                 api_version="", label_selector="", field_selector="", since=0,
                 bookmarks=False, partial=False):
        super().__init__("watch")
        self.timeout = timeout
        self.group, self.plural, self.namespace = group, plural, namespace
        self.kind, self.api_version = kind, api_version
        self.label_selector, self.field_selector = label_selector, field_selector
        self.since, self.bookmarks, self.partial = since, bookmarks, partial

    def _matches(self, obj) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        return (_selector_matches(self.label_selector, meta.get("labels") or {})
                and _field_selector_matches(self.field_selector, meta))

    def render(self, event: dict):
        """The event as this watch sees it (a JSON line), or None."""
        group, plural, ns, _ = event["key"]
        if group != self.group or plural != self.plural or (self.namespace and ns != self.namespace):
            return None
        kind, obj, old = event["type"], event["object"], event.get("old")
        now, before = self._matches(obj), self._matches(old)
        if kind == "MODIFIED":
            if now and not before:
                kind = "ADDED"
            elif before and not now:
                kind = "DELETED"
            elif not now:
                return None
        elif not now:
            return None
        if self.partial:
            obj = _partial(obj)
        return json.dumps({"type": kind, "object": obj}).encode() + b"\n"

    def bookmark(self, rv: int) -> bytes:
        kind, api_version = ((("PartialObjectMetadata", "meta.k8s.io/v1")) if self.partial
                             else (self.kind, self.api_version))
        return json.dumps({"type": "BOOKMARK", "object": {
            "kind": kind, "apiVersion": api_version,
            "metadata": {"resourceVersion": str(rv)}}}).encode() + b"\n"


def _partial(obj: dict) -> dict:
    """An object as a metadata-only request sees it."""
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": copy.deepcopy(obj.get("metadata") or {})}


def _field_selector_matches(selector: str, meta: dict) -> bool:
    """metadata.name and metadata.namespace field selectors (=, ==, !=)."""
    for term in (t.strip() for t in (selector or "").split(",")):
        if not term:
            continue
        m = re.fullmatch(r"(metadata\.name|metadata\.namespace)\s*(==|=|!=)\s*(.*)", term)
        if not m:
            raise ApiError(400, "BadRequest", f'"{term}" is not a known field selector: only "metadata.name", "metadata.namespace"')
        value = meta.get(m.group(1).split(".")[1]) or ""
        if (m.group(2) == "!=") == (value == m.group(3)):
            return False
    return True


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


def _merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    for k, v in patch.items():
        if k.startswith("$"):  # strategic-merge directives ($patch, $retainKeys, ...)
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_patch(out.get(k), v)
    return out


def _json_patch(doc, ops):
    """RFC 6902 JSON patch (add, remove, replace, test)."""
    doc = copy.deepcopy(doc)

    def walk(path):
        parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        return parent, parts[-1]

    for op in ops:
        parent, key = walk(op["path"])
        kind = op["op"]
        if isinstance(parent, list):
            idx = len(parent) if key == "-" else int(key)
            if kind == "add":
                parent.insert(idx, op["value"])
            elif kind == "remove":
                parent.pop(idx)
            elif kind == "replace":
                parent[idx] = op["value"]
            elif kind == "test" and parent[idx] != op["value"]:
                raise ApiError(422, "Invalid", f"test failed at {op['path']}")
        else:
            if kind in ("add", "replace"):
                parent[key] = op["value"]
            elif kind == "remove":
                parent.pop(key, None)
            elif kind == "test" and parent.get(key) != op["value"]:
                raise ApiError(422, "Invalid", f"test failed at {op['path']}")
    return doc


# Lists that server-side apply merges by key (a duplicate key is an error, as on a cluster).
_LIST_KEYS = {"containers": "name", "initContainers": "name", "env": "name",
              "volumes": "name", "volumeMounts": "mountPath", "ports": None,
              "imagePullSecrets": "name", "tolerations": None}


def _check_duplicate_keys(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, list) and _LIST_KEYS.get(k):
                seen = set()
                for item in v:
                    if isinstance(item, dict) and _LIST_KEYS[k] in item:
                        kv = item[_LIST_KEYS[k]]
                        if kv in seen:
                            raise ApiError(422, "Invalid", f"{path}.{k}: duplicate entries for key [{_LIST_KEYS[k]}={kv!r}]")
                        seen.add(kv)
            _check_duplicate_keys(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            _check_duplicate_keys(item, f"{path}[{i}]")


def _removed_fields(previous, applied):
    """A merge patch removing the fields `previous` set that `applied` no longer sets."""
    out = {}
    for k, v in (previous or {}).items():
        if k not in (applied or {}):
            out[k] = None
        elif isinstance(v, dict) and isinstance(applied[k], dict):
            sub = _removed_fields(v, applied[k])
            if sub:
                out[k] = sub
    return out


def _apply_merge(live, applied):
    """Maps merge recursively; lists and scalars are replaced by the applied value."""
    _check_duplicate_keys(applied)
    if not (isinstance(live, dict) and isinstance(applied, dict)):
        return copy.deepcopy(applied)
    out = dict(live)
    for k, v in applied.items():
        out[k] = _apply_merge(live.get(k), v) if isinstance(v, dict) else copy.deepcopy(v)
    return out


def _selector_matches(selector: str, labels: dict) -> bool:
    """Equality- and set-based label selectors (=, ==, !=, in, notin, key, !key)."""
    if not selector:
        return True
    # split on commas that are not inside parentheses
    terms, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    for term in (t.strip() for t in terms):
        if not term:
            continue
        m = re.fullmatch(r"([^\s!=]+)\s+(in|notin)\s+\((.*)\)", term)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            present = key in labels and labels[key] in vals
            if (op == "in") != present:
                return False
            continue
        if term.startswith("!"):
            if term[1:] in labels:
                return False
            continue
        m = re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*(.*)", term)
        if m:
            key, op, val = m.group(1), m.group(2), m.group(3)
            if op == "!=":
                if labels.get(key) == val:
                    return False
            elif labels.get(key) != val:
                return False
            continue
        if term not in labels:
            return False
    return True


# ---------------------------------------------------------------------- protobuf
# client-go's typed clients (Helm's release storage: Secrets) send protobuf. Only what a
# Secret needs is decoded: the runtime.Unknown envelope, v1.Secret and v1.ObjectMeta.

def _pb_fields(buf: bytes):
    """Yields (field number, wire type, value) of one protobuf message."""
    i = 0

    def varint():
        nonlocal i
        shift = result = 0
        while True:
            b = buf[i]
            i += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    while i < len(buf):
        tag = varint()
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            yield num, wt, varint()
        elif wt == 2:
            n = varint()
            yield num, wt, buf[i:i + n]
            i += n
        elif wt == 1:
            yield num, wt, buf[i:i + 8]
            i += 8
        elif wt == 5:
            yield num, wt, buf[i:i + 4]
            i += 4
        else:
            raise ApiError(400, "BadRequest", f"protobuf wire type {wt} is not supported")


def _pb_map_entry(buf: bytes):
    k, v = "", b""
    for num, _, val in _pb_fields(buf):
        if num == 1:
            k = val.decode()
        elif num == 2:
            v = val
    return k, v


def _pb_object_meta(buf: bytes) -> dict:
    meta: dict = {}
    names = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    for num, _, val in _pb_fields(buf):
        if num in names and val:
            meta[names[num]] = val.decode()
        elif num == 11:
            k, v = _pb_map_entry(val)
            meta.setdefault("labels", {})[k] = v.decode()
        elif num == 12:
            k, v = _pb_map_entry(val)
            meta.setdefault("annotations", {})[k] = v.decode()
        elif num == 14:
            meta.setdefault("finalizers", []).append(val.decode())
    return meta


def _decode_protobuf(body: bytes) -> dict:
    if not body.startswith(b"k8s\x00"):
        raise ApiError(400, "BadRequest", "protobuf body without the k8s envelope")
    api_version = kind = ""
    raw = b""
    for num, _, val in _pb_fields(body[4:]):
        if num == 1:
            for n2, _, v2 in _pb_fields(val):
                if n2 == 1:
                    api_version = v2.decode()
                elif n2 == 2:
                    kind = v2.decode()
        elif num == 2:
            raw = val
    if (api_version, kind) != ("v1", "Secret"):
        raise ApiError(415, "UnsupportedMediaType", f"protobuf is decoded only for v1 Secret, not {api_version} {kind}")
    obj: dict = {"apiVersion": "v1", "kind": "Secret", "metadata": {}}
    for num, _, val in _pb_fields(raw):
        if num == 1:
            obj["metadata"] = _pb_object_meta(val)
        elif num == 2:
            k, v = _pb_map_entry(val)
            obj.setdefault("data", {})[k] = base64.b64encode(v).decode()
        elif num == 3:
            obj["type"] = val.decode()
        elif num == 4:
            k, v = _pb_map_entry(val)
            obj.setdefault("stringData", {})[k] = v.decode()
        elif num == 5:
            obj["immutable"] = bool(val)
    return obj


# ------------------------------------------------------------ CRD schema validation

def structural_to_jsonschema(schema: dict, root: bool = False) -> dict:
    """A CRD's structural openAPIV3Schema as a draft-07 JSON Schema with the API server's
    strict field validation: unknown fields are errors (unless
    x-kubernetes-preserve-unknown-fields), `nullable` allows null,
    x-kubernetes-int-or-string allows an integer or a string."""
    if not isinstance(schema, dict):
        return schema
    out: dict = {}
    for k, v in schema.items():
        if k in ("properties",):
            out[k] = {n: structural_to_jsonschema(s) for n, s in v.items()}
        elif k == "additionalProperties":
            out[k] = structural_to_jsonschema(v) if isinstance(v, dict) else v
        elif k == "items":
            out[k] = structural_to_jsonschema(v)
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [structural_to_jsonschema(s) for s in v]
        elif k == "not":
            out[k] = structural_to_jsonschema(v)
        elif k in ("type", "enum", "required", "pattern", "minimum", "maximum",
                   "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                   "minItems", "maxItems", "uniqueItems", "minProperties",
                   "maxProperties", "multipleOf"):
            out[k] = v
        # description, default, format, example, nullable, x-kubernetes-* handled below
    if root:
        props = out.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (schema.get("type") == "object" and "properties" in out
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if schema.get("nullable"):
        out = {"anyOf": [{"type": "null"}, out]}
    return out


def crd_validator(crd: dict, version: str):
    """A callable(obj) -> [error strings] for objects of `crd` at `version`."""
    import jsonschema
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            js = structural_to_jsonschema(v["schema"]["openAPIV3Schema"], root=True)
            validator = jsonschema.Draft7Validator(js)

            def validate(obj):
                errs = []
                for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
                    path = ".".join(str(p) for p in e.absolute_path) or "<root>"
                    errs.append(f"{path}: {e.message}")
                return errs
            return validate
    return None


def prune_unknown(value, schema, path: str, unknown: list):
    """`value` without the fields a structural schema does not declare, as the API server
    prunes custom resources; appends the paths of the pruned fields to `unknown`."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema
                                    or "additionalProperties" in schema):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
        out = {}
        for k, v in value.items():
            if props is not None and k in props:
                out[k] = prune_unknown(v, props[k], f"{path}.{k}", unknown)
            elif isinstance(extra, dict):
                out[k] = prune_unknown(v, extra, f"{path}.{k}", unknown)
            elif keep:
                out[k] = v
            else:
                unknown.append(f"{path}.{k}")
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_unknown(v, schema["items"], f"{path}[{i}]", unknown)
                for i, v in enumerate(value)]
    return value


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_QUALIFIED_NAME = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                             r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def validate_metadata(kind: str, meta: dict) -> list[str]:
    """What the API server checks of every object's metadata (a part of it)."""
    errs = []
    name = meta.get("name") or ""
    if kind not in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding") and \
            (len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name)):
        errs.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'")
    for k, v in (meta.get("labels") or {}).items():
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.fullmatch(v):
            errs.append(f"metadata.labels: Invalid value: {v!r}: a valid label must be an empty string or 63 characters or less, alphanumeric, '-', '_' or '.'")
        if len(k.split("/")[-1]) > 63 or not _QUALIFIED_NAME.fullmatch(k):
            errs.append(f"metadata.labels: Invalid value: {k!r}: name part must be 63 characters or less")
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for field in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(field):
                errs.append(f"metadata.ownerReferences[{i}].{field}: Required value")
        if ref.get("controller"):
            controllers += 1
    if controllers > 1:
        errs.append("metadata.ownerReferences: Invalid value: only one reference can have Controller set to true")
    for f in meta.get("finalizers") or []:
        if not isinstance(f, str) or not _QUALIFIED_NAME.fullmatch(f):
            errs.append(f"metadata.finalizers: Invalid value: {f!r}: must be a qualified name")
    return errs


def validate_builtin(group: str, kind: str, obj: dict, current: dict | None) -> list[str]:
    """A few of the checks the API server makes of built-in kinds."""
    errs = []
    spec = obj.get("spec") or {}
    if (group, kind) == ("apps", "Deployment"):
        sel = (spec.get("selector") or {})
        match = sel.get("matchLabels") or {}
        if not match and not sel.get("matchExpressions"):
            errs.append("spec.selector: Required value")
        tmpl = spec.get("template") or {}
        labels = ((tmpl.get("metadata") or {}).get("labels")) or {}
        if any(labels.get(k) != v for k, v in match.items()):
            errs.append("spec.template.metadata.labels: Invalid value: `selector` does not match template `labels`")
        containers = ((tmpl.get("spec") or {}).get("containers")) or []
        if not containers:
            errs.append("spec.template.spec.containers: Required value")
        for i, c in enumerate(containers):
            if not c.get("name") or not _DNS_LABEL.fullmatch(c.get("name", "")):
                errs.append(f"spec.template.spec.containers[{i}].name: Invalid value")
            if not c.get("image"):
                errs.append(f"spec.template.spec.containers[{i}].image: Required value")
        if isinstance(spec.get("replicas"), int) and spec["replicas"] < 0:
            errs.append("spec.replicas: Invalid value: must be greater than or equal to 0")
        ru = ((spec.get("strategy") or {}).get("rollingUpdate")) or {}
        if ru and ru.get("maxSurge") in (0, "0%") and ru.get("maxUnavailable") in (0, "0%"):
            errs.append("spec.strategy.rollingUpdate.maxUnavailable: may not be 0 when maxSurge is 0")
        if current is not None and (current.get("spec") or {}).get("selector") != spec.get("selector"):
            errs.append("spec.selector: Invalid value: field is immutable")
    elif (group, kind) == ("events.k8s.io", "Event"):
        for field in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
            if not obj.get(field):
                errs.append(f"{field}: Required value")
        for field in ("reportingInstance", "action", "reason"):
            if len(obj.get(field) or "") > 128:
                errs.append(f"{field}: Too long: may not be more than 128 bytes")
        if obj.get("type") not in ("Normal", "Warning"):
            errs.append(f"type: Unsupported value: {obj.get('type')!r}: supported values: \"Normal\", \"Warning\"")
        if len((obj.get("note") or "").encode()) > 1024:
            errs.append("note: Too long: may not be more than 1024 bytes")
        series = obj.get("series")
        if series is not None and (series.get("count", 0) < 2 or not series.get("lastObservedTime")):
            errs.append("series: Invalid value: count must be at least 2, with a lastObservedTime")
    elif (group, kind) == ("coordination.k8s.io", "Lease"):
        d = spec.get("leaseDurationSeconds")
        if d is not None and d <= 0:
            errs.append("spec.leaseDurationSeconds: Invalid value: must be greater than 0")
        t = spec.get("leaseTransitions")
        if t is not None and t < 0:
            errs.append("spec.leaseTransitions: Invalid value: must be greater than or equal to 0")
    return errs


class FakeKube:
    """The API server state and an HTTP server serving it in a background thread."""

    def __init__(self, namespaces=("default",), crds=(), monitoring=False, cert_manager=False,
                 version=(1, 31, 0), log=None, validate_crs=True, bookmark_interval=3.0,
                 max_watch_seconds=None):
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)  # notified on every change
        self.watch_events: list[dict] = []  # {rv, type, key, object, old}, in rv order
        self.request_log: list[dict] = []  # every request, with headers and body
        self.warnings: list[tuple] = []  # (method, path, warning) of every Warning sent
        self.noops: list[tuple] = []  # (key, subresource) of every write that changed nothing
        self.schemas: dict = {}  # (group, version, kind) -> openAPIV3Schema
        self.status_subresource: set = set()  # (group, plural) of CRs with /status
        self.bookmark_interval = bookmark_interval
        # end every watch after this long, whatever the client asked (clients must re-watch)
        self.max_watch_seconds = max_watch_seconds
        self._local = threading.local()
        self.version = version
        self.groups = copy.deepcopy(BUILTIN)
        if monitoring:
            self.groups.update(copy.deepcopy(MONITORING))
        if cert_manager:
            self.groups.update(copy.deepcopy(CERT_MANAGER))
        self.objects: dict[tuple, dict] = {}  # (group, plural, namespace, name) -> object
        self.created: list[dict] = []  # every object created, as sent
        self.updated: list[tuple] = []  # (key, before, after) of every real change
        self.applied: dict = {}  # key -> {field manager: last applied configuration}
        self.deleted: list[dict] = []
        self.requests: list[tuple[str, str, int]] = []
        self.rv = 1
        self.log = log
        self.validate_crs = validate_crs
        self.validators: dict = {}  # (group, version, kind) -> callable
        for ns in ["default", "kube-system", "kube-public", *namespaces]:
            key = ("", "namespaces", "", ns)
            if key not in self.objects:
                self.objects[key] = self._stamp({
                    "apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": ns}, "status": {"phase": "Active"},
                })
        for crd in crds:  # pre-installed CRDs (e.g. crds.install=false)
            self.objects[("apiextensions.k8s.io", "customresourcedefinitions", "",
                          crd["metadata"]["name"])] = self._stamp(copy.deepcopy(crd))
            self._serve_crd(crd)
        # TokenReview answers: token -> (username, audiences it was issued for); any other
        # token is not authenticated. SubjectAccessReview answers: the users (or groups) in
        # `operators` are allowed, everyone else is not. Tests fill both.
        self.tokens: dict[str, tuple[str, list[str]]] = {}
        self.operators: set[str] = set()
        self.httpd = None
        self.thread = None

    def review_token(self, review: dict) -> dict:
        """A TokenReview answered as the API server does: authenticated only for a known
        token, with the audiences both the review and the token name."""
        spec = review.get("spec") or {}
        known = self.tokens.get(spec.get("token") or "")
        if known is None:
            status = {"authenticated": False, "error": "invalid bearer token"}
        else:
            username, token_audiences = known
            wanted = spec.get("audiences") or []
            common = [a for a in wanted if a in token_audiences]
            if wanted and not common:
                status = {"authenticated": False, "error": "token audiences are invalid"}
            else:
                ns = username.split(":")[2] if username.startswith("system:serviceaccount:") else None
                groups = ["system:authenticated"] + (
                    ["system:serviceaccounts", f"system:serviceaccounts:{ns}"] if ns else [])
                status = {"authenticated": True, "audiences": common or token_audiences,
                          "user": {"username": username, "uid": f"uid-{username}", "groups": groups}}
        return {**review, "status": status}

    def review_access(self, review: dict) -> dict:
        """A SubjectAccessReview: allowed when the user or one of its groups is an operator."""
        spec = review.get("spec") or {}
        subjects = {spec.get("user"), *(spec.get("groups") or [])}
        allowed = bool(subjects & self.operators)
        return {**review, "status": {"allowed": allowed} if allowed else {"allowed": False, "reason": "not an operator"}}

    # ------------------------------------------------------------------ state helpers
    def _stamp(self, obj: dict, new=True) -> dict:
        self.rv += 1
        meta = obj.setdefault("metadata", {})
        if new:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            meta["generation"] = 1
        meta["resourceVersion"] = str(self.rv)
        return obj

    def _emit(self, kind: str, key: tuple, obj: dict, old: dict | None = None):
        """Records a change for the watches (with the lock held) and wakes them."""
        self.watch_events.append({"rv": int(obj["metadata"]["resourceVersion"]), "type": kind,
                                  "key": key, "object": copy.deepcopy(obj),
                                  "old": copy.deepcopy(old)})
        self.cond.notify_all()

    def _warn(self, text: str):
        """A warning for the response to the request being served."""
        getattr(self._local, "warnings", []).append(text)

    def _serve_crd(self, crd: dict):
        spec = crd["spec"]
        names = spec["names"]
        for v in spec.get("versions", []):
            if not v.get("served", True):
                continue
            if self.validate_crs and v.get("schema"):
                self.validators[(spec["group"], v["name"], names["kind"])] = crd_validator(crd, v["name"])
            if v.get("schema"):
                self.schemas[(spec["group"], v["name"], names["kind"])] = v["schema"]["openAPIV3Schema"]
            if "status" in (v.get("subresources") or spec.get("subresources") or {}):
                self.status_subresource.add((spec["group"], names["plural"]))
            res = self.groups.setdefault((spec["group"], v["name"]), [])
            if not any(r[0] == names["plural"] for r in res):
                res.append((names["plural"], names["kind"], spec.get("scope") == "Namespaced"))

    def lookup(self, group: str, version: str, plural: str):
        for r in self.groups.get((group, version), []):
            if r[0] == plural:
                return r
        return None

    # ------------------------------------------------------------------ discovery
    def discovery(self, path: str):
        if path == "/version":
            major, minor, patch = self.version
            return {
                "major": str(major), "minor": str(minor),
                "gitVersion": f"v{major}.{minor}.{patch}", "gitCommit": "0" * 40,
                "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
                "goVersion": "go1.23.0", "compiler": "gc", "platform": "linux/amd64",
            }
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if path == "/apis":
            by_group: dict[str, list[str]] = {}
            for (g, v) in self.groups:
                if g:
                    by_group.setdefault(g, []).append(v)
            groups = []
            for g in sorted(by_group):
                versions = [{"groupVersion": f"{g}/{v}", "version": v} for v in by_group[g]]
                groups.append({"name": g, "versions": versions,
                               "preferredVersion": versions[0]})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        m = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if m:
            group, version = ("", "v1") if m.group(1) else (m.group(2), m.group(3))
            if (group, version) not in self.groups:
                return None
            resources = []
            for plural, kind, namespaced in self.groups[(group, version)]:
                resources.append({
                    "name": plural, "singularName": kind.lower(), "namespaced": namespaced,
                    "kind": kind, "verbs": VERBS,
                })
                if plural != "namespaces" and kind not in ("TokenReview", "SubjectAccessReview"):
                    resources.append({"name": f"{plural}/status", "singularName": "",
                                      "namespaced": namespaced, "kind": kind,
                                      "verbs": ["get", "patch", "update"]})
            return {"kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": f"{group}/{version}" if group else "v1",
                    "resources": resources}
        return None

    def openapi_v3(self, path: str) -> dict:
        """The OpenAPI v3 index, and per group/version a document with one PATCH operation
        per kind that accepts `fieldValidation` (as every cluster since 1.27 does), so
        clients leave field validation to the server: see _validate."""
        with self.lock:
            gvs = sorted(self.groups)
        if path == "/openapi/v3":
            return {"paths": {
                (f"apis/{g}/{v}" if g else "api/v1"):
                    {"serverRelativeURL": f"/openapi/v3/{'apis/' + g + '/' + v if g else 'api/v1'}?hash=0"}
                for g, v in gvs}}
        m = re.fullmatch(r"/openapi/v3/(?:api/(v1)|apis/([^/]+)/([^/]+))", path)
        if not m:
            raise ApiError(404, "NotFound", f"no OpenAPI document at {path}")
        group, version = ("", "v1") if m.group(1) else (m.group(2), m.group(3))
        if (group, version) not in self.groups:
            raise ApiError(404, "NotFound", f"no OpenAPI document at {path}")
        prefix = f"/apis/{group}/{version}" if group else "/api/v1"
        paths, schemas = {}, {}
        for plural, kind, namespaced in self.groups[(group, version)]:
            gvk = {"group": group, "version": version, "kind": kind}
            item = (f"{prefix}/namespaces/{{namespace}}/{plural}/{{name}}" if namespaced
                    else f"{prefix}/{plural}/{{name}}")
            paths[item] = {"patch": {
                "operationId": f"patch{kind}",
                "x-kubernetes-group-version-kind": gvk,
                "x-kubernetes-action": "patch",
                "parameters": [
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "OK"}},
            }}
            schemas[f"{group or 'core'}.{version}.{kind}"] = {
                "type": "object", "x-kubernetes-group-version-kind": [gvk]}
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.31.0"},
                "paths": paths, "components": {"schemas": schemas}}

    # ------------------------------------------------------------------ resources
    def parse(self, path: str):
        """(group, version, plural, namespace, name, subresource) or None."""
        m = re.fullmatch(
            r"/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))"
            r"(?:/namespaces/(?P<ns>[^/]+)(?=/))?"
            r"/(?P<res>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?", path)
        if not m:
            # a Namespace itself: /api/v1/namespaces/<name>
            return None
        group = m.group("g") or ""
        version = m.group("cv") or m.group("v")
        return group, version, m.group("res"), m.group("ns") or "", m.group("name"), m.group("sub")

    def handle(self, method: str, rawpath: str, body: bytes, headers) -> tuple[int, dict]:
        url = urlsplit(rawpath)
        path = url.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if method == "GET":
            d = self.discovery(path)
            if d is not None:
                return 200, d
            if path.startswith("/openapi/v3"):
                return 200, self.openapi_v3(path)
            if path.startswith("/openapi"):
                raise ApiError(404, "NotFound", "only /openapi/v3 is served by this fake")
        if path == "/api/v1/namespaces" or re.fullmatch(r"/api/v1/namespaces/[^/]+", path):
            parsed = ("", "v1", "namespaces", "", path.split("/")[4] if path.count("/") == 4 else None, None)
        else:
            parsed = self.parse(path)
        if not parsed:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {path})")
        group, version, plural, ns, name, sub = parsed
        info = self.lookup(group, version, plural)
        if info is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {path})")
        _, kind, namespaced = info
        if namespaced != bool(ns) and not (method in ("GET",) and not ns and name is None):
            raise ApiError(404, "NotFound", f"{plural} is {'namespaced' if namespaced else 'cluster-scoped'} ({method} {path})")
        api_version = f"{group}/{version}" if group else version
        dry_run = query.get("dryRun") == "All"
        partial = "as=PartialObjectMetadata" in (headers.get("Accept") or "")
        strict = query.get("fieldValidation") == "Strict"
        if sub is not None and sub != "status":
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {path})")
        if sub == "status" and (plural == "namespaces" or kind in ("TokenReview", "SubjectAccessReview")):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({method} {path})")

        with self.lock:
            if ns and ("", "namespaces", "", ns) not in self.objects and method in ("POST", "PUT", "PATCH"):
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
            key = (group, plural, ns, name)
            if method == "GET" and name is not None and query.get("watch") in ("true", "1"):
                # the deprecated watch of one object: a watch with a metadata.name selector
                query["fieldSelector"] = ",".join(
                    f for f in (query.get("fieldSelector"), f"metadata.name={name}") if f)
                name = None
            if method == "GET" and name is None:
                _field_selector_matches(query.get("fieldSelector", ""), {})  # 400 if unknown
                if query.get("watch") in ("true", "1"):
                    if query.get("sendInitialEvents") == "true":
                        # no watch-list streaming here; clients fall back to list + watch
                        raise ApiError(400, "BadRequest", "sendInitialEvents is not supported by this fake")
                    rv = query.get("resourceVersion") or "0"
                    try:
                        since = int(rv)
                    except ValueError:
                        raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv!r}") from None
                    if since == 0:
                        since = self.rv  # from now on
                    raise _Watch(float(query.get("timeoutSeconds") or 1800), group=group,
                                 plural=plural, namespace=ns, kind=kind,
                                 api_version=api_version,
                                 label_selector=query.get("labelSelector", ""),
                                 field_selector=query.get("fieldSelector", ""), since=since,
                                 bookmarks=query.get("allowWatchBookmarks") == "true",
                                 partial=partial)
                items = [copy.deepcopy(o) for (g, p, n, _), o in sorted(self.objects.items())
                         if g == group and p == plural and (not ns or n == ns)
                         and _selector_matches(query.get("labelSelector", ""),
                                               o["metadata"].get("labels") or {})
                         and _field_selector_matches(query.get("fieldSelector", ""), o["metadata"])]
                list_meta = {"resourceVersion": str(self.rv)}
                start = 0
                if query.get("continue"):
                    try:
                        token = json.loads(base64.urlsafe_b64decode(query["continue"]))
                        start, list_meta["resourceVersion"] = int(token["start"]), str(token["rv"])
                    except (ValueError, KeyError, TypeError):
                        raise ApiError(400, "BadRequest", "invalid continue token") from None
                limit = int(query.get("limit") or 0)
                if limit > 0 and len(items) > start + limit:
                    list_meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                        {"start": start + limit, "rv": list_meta["resourceVersion"]}).encode()).decode()
                    list_meta["remainingItemCount"] = len(items) - start - limit
                    items = items[start:start + limit]
                else:
                    items = items[start:]
                if partial:
                    return 200, {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                                 "metadata": list_meta, "items": [_partial(o) for o in items]}
                return 200, {"kind": f"{kind}List", "apiVersion": api_version,
                             "metadata": list_meta, "items": items}
            if method == "GET":
                if key not in self.objects:
                    raise ApiError(404, "NotFound", f'{plural}.{group or "core"} "{name}" not found')
                obj = copy.deepcopy(self.objects[key])
                return 200, _partial(obj) if partial else obj
            if method == "POST":
                obj = self._decode(body, headers)
                if name is not None:
                    raise ApiError(405, "MethodNotAllowed", f"POST to {path}")
                meta = obj.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                if kind == "TokenReview":
                    return 201, self.review_token(obj)
                if kind == "SubjectAccessReview":
                    return 201, self.review_access(obj)
                return 201, self._create(group, version, plural, kind, namespaced, ns, obj,
                                         dry_run, query.get("fieldManager"))
            if method == "PATCH" and self._ctype(headers) == "application/apply-patch+yaml":
                # server-side apply: create, or merge the applied configuration into the
                # object and drop the fields this manager applied before but not now
                applied = self._decode(body, headers)
                manager = query.get("fieldManager")
                if not manager:
                    raise ApiError(422, "Invalid", "fieldManager is required for apply requests")
                if (applied.get("metadata") or {}).get("name") != name:
                    raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
                if applied.get("kind") != kind or applied.get("apiVersion") != api_version:
                    raise ApiError(400, "BadRequest",
                                   f"{applied.get('apiVersion')}/{applied.get('kind')} applied to {plural} ({api_version}/{kind})")
                if namespaced and ((applied.get("metadata") or {}).get("namespace") or ns) != ns:
                    raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
                if key not in self.objects:
                    if sub is not None:  # a subresource of an object that does not exist
                        raise ApiError(404, "NotFound", f'{plural}.{group or "core"} "{name}" not found')
                    return 201, self._create(group, version, plural, kind, namespaced, ns,
                                             applied, dry_run, manager)
                current = self.objects[key]
                self._check_rv(applied, current, key)
                slot = manager if sub is None else (manager, sub)
                previous = self.applied.get(key, {}).get(slot, {})
                new = _merge_patch(current, _removed_fields(previous, applied))
                new = _apply_merge(new, applied)
                return 200, self._update(key, group, version, kind, namespaced, ns, sub,
                                         current, new, dry_run, manager, applied, strict)
            if method in ("PUT", "PATCH"):
                if key not in self.objects:
                    raise ApiError(404, "NotFound", f'{plural}.{group or "core"} "{name}" not found')
                current = self.objects[key]
                patch = self._decode(body, headers)
                ctype = self._ctype(headers)
                if method == "PUT":
                    new = patch
                    if (new.get("kind") or kind) != kind or (new.get("apiVersion") or api_version) != api_version:
                        raise ApiError(400, "BadRequest",
                                       f"{new.get('apiVersion')}/{new.get('kind')} sent to {plural}")
                    if ((new.get("metadata") or {}).get("name") or name) != name:
                        raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
                elif ctype == "application/json-patch+json":
                    new = _json_patch(current, patch)
                else:  # merge patch; a strategic merge patch is treated as one
                    new = _merge_patch(current, patch)
                self._check_rv(new, current, key)
                return 200, self._update(key, group, version, kind, namespaced, ns, sub,
                                         current, new, dry_run, None, None, strict)
            if method == "DELETE":
                if key not in self.objects:
                    raise ApiError(404, "NotFound", f'{plural}.{group or "core"} "{name}" not found')
                current = self.objects[key]
                try:
                    options = json.loads(body) if body else {}
                except ValueError:  # e.g. protobuf DeleteOptions: not looked at
                    options = {}
                pre = (options if isinstance(options, dict) else {}).get("preconditions") or {}
                if pre.get("uid") and pre["uid"] != current["metadata"].get("uid"):
                    raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {current['metadata'].get('uid')}")
                if pre.get("resourceVersion") and pre["resourceVersion"] != current["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Conflict", f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, ResourceVersion in object meta: {current['metadata']['resourceVersion']}")
                if dry_run:
                    return 200, copy.deepcopy(current)
                if current["metadata"].get("finalizers"):
                    # graceful: marked for deletion, gone when the finalizers are
                    if current["metadata"].get("deletionTimestamp"):
                        return 200, copy.deepcopy(current)
                    new = copy.deepcopy(current)
                    meta = new["metadata"]
                    meta["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    meta["deletionGracePeriodSeconds"] = 0
                    meta["generation"] = meta.get("generation", 1) + 1
                    self._stamp(new, new=False)
                    self.objects[key] = new
                    self.updated.append((key, copy.deepcopy(current), copy.deepcopy(new)))
                    self._emit("MODIFIED", key, new, current)
                    return 200, copy.deepcopy(new)
                return 200, self._remove(key)
        raise ApiError(405, "MethodNotAllowed", f"{method} {path}")

    def _remove(self, key) -> dict:
        """Deletes an object now (with the lock held); returns it as last seen."""
        obj = self.objects.pop(key)
        self.applied.pop(key, None)
        self._stamp(obj, new=False)  # a deletion is a change: a new resourceVersion
        self.deleted.append(copy.deepcopy(obj))
        self._emit("DELETED", key, obj)
        return copy.deepcopy(obj)

    @staticmethod
    def _check_rv(new: dict, current: dict, key: tuple):
        """Optimistic concurrency: a write naming another resourceVersion conflicts."""
        rv = (new.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            group, plural, _, name = key
            resource = f"{plural}.{group}" if group else plural
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on {resource} "{name}": '
                           "the object has been modified; please apply your changes to the latest version and try again")

    def _create(self, group, version, plural, kind, namespaced, ns, obj, dry_run, manager):
        api_version = f"{group}/{version}" if group else version
        meta = obj.setdefault("metadata", {})
        oname = meta.get("name")
        if not oname:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if obj.get("kind") != kind or obj.get("apiVersion") != api_version:
            raise ApiError(400, "BadRequest",
                           f"{obj.get('apiVersion')}/{obj.get('kind')} sent to {plural}")
        if namespaced:
            if meta.get("namespace", ns) != ns:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace on the request")
            meta["namespace"] = ns
        elif "namespace" in meta and meta["namespace"]:
            raise ApiError(400, "BadRequest", f"{kind} is cluster-scoped but has metadata.namespace {meta['namespace']!r}")
        key = (group, plural, ns, oname)
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'{plural}.{group or "core"} "{oname}" already exists')
        self._validate(group, version, kind, obj)
        self._validate_builtin(group, kind, obj, None)
        sent = copy.deepcopy(obj)
        stored = self._stamp(copy.deepcopy(obj))
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            stored["metadata"].pop(k, None)
        if (group, plural) in self.status_subresource:
            stored.pop("status", None)  # a create sets no status of a custom resource
        if kind == "CustomResourceDefinition":
            stored.setdefault("status", {})["conditions"] = [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
            ]
            stored["status"]["acceptedNames"] = obj["spec"]["names"]
        if dry_run:
            return stored
        self.objects[key] = stored
        if manager:
            self.applied.setdefault(key, {})[manager] = copy.deepcopy(sent)
        self.created.append(sent)
        self._emit("ADDED", key, stored)
        if kind == "CustomResourceDefinition":
            self._serve_crd(obj)
        return copy.deepcopy(stored)

    def _update(self, key, group, version, kind, namespaced, ns, sub, current, new,
                dry_run, manager, applied, strict=False):
        custom = (group, key[1]) in self.status_subresource
        if sub == "status":
            merged = copy.deepcopy(current)
            merged["status"] = new.get("status")
            if merged["status"] is None:
                merged.pop("status")
            new = merged
            schema = self.schemas.get((group, version, kind))
            if custom and schema and "status" in new:
                unknown: list = []
                status_schema = (schema.get("properties") or {}).get("status") or {"type": "object"}
                new["status"] = prune_unknown(new["status"], status_schema, ".status", unknown)
                if unknown and strict:
                    raise ApiError(422, "Invalid", f'{kind}.{group} "{key[3]}" is invalid: ' +
                                   "; ".join(f"{u}: field not declared in schema" for u in unknown))
                for u in unknown:
                    self._warn(f'unknown field "{u.lstrip(".")}"')
            self._validate(group, version, kind, new)
        elif "status" in current:  # the main resource never changes status
            new["status"] = copy.deepcopy(current["status"])
        elif custom:
            new.pop("status", None)
        if sub is None:
            self._validate(group, version, kind, new)
        meta = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "name", "deletionTimestamp",
                  "deletionGracePeriodSeconds"):
            if k in current["metadata"]:
                meta[k] = current["metadata"][k]
            else:
                meta.pop(k, None)
        if namespaced:
            meta["namespace"] = ns
        if sub is None:
            self._validate_builtin(group, kind, new, current)
        deleting = bool(current["metadata"].get("deletionTimestamp"))
        if deleting and set(meta.get("finalizers") or []) - set(current["metadata"].get("finalizers") or []):
            raise ApiError(422, "Invalid", f'{kind}.{group} "{key[3]}" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted')
        meta["generation"] = current["metadata"].get("generation", 1)
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        if new == current:  # a no-op: nothing changes, not even resourceVersion
            if not dry_run:
                self.noops.append((key, sub))
            return copy.deepcopy(current)
        if sub is None and {k: v for k, v in new.items() if k not in ("metadata", "status")} != \
                {k: v for k, v in current.items() if k not in ("metadata", "status")}:
            meta["generation"] += 1
        self._stamp(new, new=False)
        if not dry_run:
            self.objects[key] = new
            self.updated.append((key, copy.deepcopy(current), copy.deepcopy(new)))
            if manager:
                self.applied.setdefault(key, {})[manager if sub is None else (manager, sub)] = \
                    copy.deepcopy(applied)
            if deleting and not meta.get("finalizers"):
                # the last finalizer is gone: the deletion completes (watches see it
                # as one DELETED event)
                return self._remove(key)
            self._emit("MODIFIED", key, new, current)
            if kind == "CustomResourceDefinition":
                self._serve_crd(new)
        return copy.deepcopy(new)

    def _validate_builtin(self, group, kind, obj, current):
        errs = validate_metadata(kind, obj.get("metadata") or {}) + \
            validate_builtin(group, kind, obj, current)
        if errs:
            name = (obj.get("metadata") or {}).get("name")
            raise ApiError(422, "Invalid", f'{kind}.{group or "core"} "{name}" is invalid: ' + "; ".join(errs))

    @staticmethod
    def _ctype(headers) -> str:
        return (headers.get("Content-Type") or "application/json").split(";")[0].strip()

    def _validate(self, group, version, kind, obj):
        validate = self.validators.get((group, version, kind))
        if validate:
            errs = validate(obj)
            if errs:
                name = (obj.get("metadata") or {}).get("name")
                raise ApiError(422, "Invalid",
                               f'{kind}.{group} "{name}" is invalid: ' + "; ".join(errs))

    @staticmethod
    def _decode(body: bytes, headers):
        ctype = (headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if ctype == "application/vnd.kubernetes.protobuf":
            return _decode_protobuf(body)
        if ctype not in ("application/json", "application/merge-patch+json",
                         "application/strategic-merge-patch+json",
                         "application/json-patch+json", "application/apply-patch+yaml"):
            raise ApiError(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ctype})")
        if ctype == "application/apply-patch+yaml":
            import yaml
            return yaml.safe_load(body or b"{}") or {}
        return json.loads(body or b"{}")

    # ------------------------------------------------------------------ HTTP server
    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else each response waits for a delayed ACK

            def _read_body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _record(self, code, body, warnings, payload=None):
                with fake.lock:
                    fake.requests.append((self.command, self.path, code))
                    try:
                        text = body.decode() if body else ""
                    except UnicodeDecodeError:
                        text = None  # protobuf
                    fake.request_log.append({
                        "method": self.command, "path": self.path, "code": code,
                        "content_type": self.headers.get("Content-Type"),
                        "accept": self.headers.get("Accept"),
                        "user_agent": self.headers.get("User-Agent"),
                        "body": text, "warnings": list(warnings), "time": time.time(),
                        "message": (payload or {}).get("message") if code >= 400 else None,
                    })
                    for w in warnings:
                        fake.warnings.append((self.command, self.path, w))
                if fake.log:
                    fake.log(f"{self.command} {self.path} -> {code} [{self.headers.get('Content-Type')}; accept {self.headers.get('Accept')}]")

            def _serve(self):
                body = self._read_body()
                fake._local.warnings = []
                try:
                    code, payload = fake.handle(self.command, self.path, body, self.headers)
                except _Watch as w:
                    self._record(200, body, [])
                    self._stream_watch(w)
                    return
                except ApiError as e:
                    code, payload = e.code, e.status()
                except Exception as e:  # a bug here must not hang Helm
                    code, payload = 500, ApiError(500, "InternalError", f"fake API server: {e!r}").status()
                warnings = fake._local.warnings
                self._record(code, body, warnings, payload)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for w in warnings:
                        self.send_header("Warning", '299 - "' + w.replace('"', '\\"') + '"')
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (e.g. a watch it gave up on)

            def _chunk(self, data: bytes):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _client_gone(self) -> bool:
                # poll, not select: a client with many connections open has descriptors
                # past select's limit of 1024
                poller = select.poll()
                poller.register(self.connection, select.POLLIN)
                readable = poller.poll(0)
                return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)

            def _stream_watch(self, w: _Watch):
                """Streams the events of a watch until its timeout, the client leaves or
                the server stops."""
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.flush()
                    start = time.monotonic()
                    deadline = start + min(w.timeout, fake.max_watch_seconds or w.timeout)
                    next_bookmark = start + fake.bookmark_interval
                    with fake.lock:
                        # the first event after the resourceVersion asked for
                        pos = bisect.bisect_right([e["rv"] for e in fake.watch_events], w.since)
                    while fake.httpd is not None:
                        now = time.monotonic()
                        if now >= deadline:
                            break
                        lines = []
                        with fake.cond:
                            if pos >= len(fake.watch_events):
                                wait = min(0.5, deadline - now)
                                if w.bookmarks:
                                    wait = min(wait, max(0.0, next_bookmark - now))
                                fake.cond.wait(timeout=wait)
                            batch = fake.watch_events[pos:]
                            pos += len(batch)
                            for event in batch:
                                line = w.render(event)
                                if line is not None:
                                    lines.append(line)
                            if w.bookmarks and time.monotonic() >= next_bookmark:
                                lines.append(w.bookmark(fake.rv))
                                next_bookmark = time.monotonic() + fake.bookmark_interval
                        for line in lines:
                            self._chunk(line)
                        if not lines and self._client_gone():
                            self.close_connection = True
                            return
                    # the end of the stream; the connection stays open for the next request,
                    # as with a real API server (HTTP/1.1 keep-alive)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, *args):  # quiet
                pass

        class Server(ThreadingHTTPServer):
            # A client with many requests at once (a controller reconciling a thousand
            # objects) opens many connections: with the default backlog of 5 the kernel
            # drops the ones it cannot queue after the client has sent its request, which
            # then waits for the client's timeout (minutes). An API server's backlog is
            # large; so is this one's.
            request_queue_size = 1024

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def kubeconfig(self, url: str, namespace: str) -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                       "namespace": namespace}}],
            "current-context": "fake",
        })
